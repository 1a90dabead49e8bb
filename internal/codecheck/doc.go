// Package codecheck holds no code. Its tests check rules about the
// repository's shape that the compiler does not:
//
//   - imports point down the layers (tools and bench, then sockets, nic,
//     pin and stats, shm and internal/bpfmon, the rest of internal, then
//     internal/sys, and internal/feature, internal/quiesce, internal/gopool
//     and internal/lockrank at the bottom), only internal/sys imports
//     golang.org/x/sys/unix, and only shm and internal use unsafe
//     (TestImportsPointDown);
//   - no function of a library package is over 80 lines
//     (TestFunctionLength);
//   - the repository stands on its own: no file points into documents or
//     seed material outside it (TestSelfContained).
//
// They read the source files, whatever their build tags, and need no
// build of the packages they check.
package codecheck
