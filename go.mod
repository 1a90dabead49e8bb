module github.com/sandirect/sandirect

go 1.26.8

require (
	github.com/cilium/ebpf v0.22.0
	golang.org/x/sys v0.50.0
)

require golang.org/x/net v0.62.0

require golang.org/x/sync v0.24.0 // indirect
