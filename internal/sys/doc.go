// Package sys is the project's only door to golang.org/x/sys/unix: a thin shim
// over the system calls the transport needs (memfd, seals, mmap, futex,
// SCM_RIGHTS, mlock, madvise, process_vm_readv/writev, pidfd, rlimits).
//
// Every function is a direct system call with its errno returned unwrapped as
// a syscall.Errno (which satisfies errors.Is against the syscall constants),
// so callers can wrap it with context. Functions are safe for concurrent use;
// they keep no state.
//
// On other systems the package has the same names (sys_other.go), so that
// the library builds there, and every call that would be a system call
// fails with an error that matches feature.ErrNotSupported and names the
// call, as cilium/ebpf does off Linux.
package sys

// The states of this process's registration for global memory barriers
// (MembarrierState).
const (
	MembarrierPending int32 = iota // not started, or under way
	MembarrierReady                // registered: global barriers reach this process
	MembarrierFailed               // not available here (MembarrierRegister says why)
)
