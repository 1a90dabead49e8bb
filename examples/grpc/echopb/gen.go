// Package echopb is the generated code of echo.proto, the gRPC example's
// service.
package echopb

//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative echo.proto
