// Package bpfmon is the kernel side of the registration cache's eBPF
// invalidation monitor: BPF programs at the entry of the system calls that
// take pages away from a range of an address space, a loader that attaches
// them by the best method the kernel allows, and a reader of what they
// report.
//
// # What is reported
//
// For each watched process (AddPid; the opening process by default), at the
// entry of:
//
//   - munmap(addr, len): [addr, PAGE_ALIGN(len)).
//   - mremap(old, oldLen, newLen, flags, newAddr): the old range
//     [old, PAGE_ALIGN(oldLen)) always (shrink, move or MREMAP_DONTUNMAP all
//     change the pages behind it), and with MREMAP_FIXED a second event
//     for the destination [newAddr, PAGE_ALIGN(newLen)), with Dest set.
//   - madvise(addr, len, advice) with MADV_DONTNEED, MADV_FREE,
//     MADV_REMOVE, MADV_DONTNEED_LOCKED or MADV_GUARD_INSTALL (6.13).
//   - brk(addr) below the current break: [PAGE_ALIGN(addr),
//     PAGE_ALIGN(brk)), the current break read through CO-RE
//     (task->mm->brk). brk(0), the query, and growth report nothing.
//   - mmap(addr, len, …) with MAP_FIXED: the range it replaces.
//     MAP_FIXED_NOREPLACE fails instead of replacing and is not reported.
//   - shmdt(addr): the attachment at addr, its length found with
//     bpf_find_vma (Linux 5.17); on older kernels Length runs to the top of
//     the address space (Unknown set).
//
// Events are reported at entry, before the kernel checks the arguments: a
// call that then fails still produced its event. Ranges are filtered to
// watched 2 MiB granules (Watch; WatchAll reports everything), so the Go
// runtime's own madvise traffic outside registered memory costs a map lookup
// and nothing more.
//
// # The epoch protocol
//
// Each program reserves a ring buffer record, then increments the epoch
// word of a BPF_F_MMAPABLE array with a fetching (fully ordered) atomic add,
// stores the epoch it produced in the record and submits it. When the ring
// is full it increments the overflow word, then the epoch. Every reported
// event therefore moves the epoch before the system call does its work, and
// so before it returns: a reader that loads the epoch after munmap has
// returned in any thread sees it moved ("effectively synchronous"), without
// waiting for the ring buffer's wake-up.
//
// The programs ask for that wake-up only while a Wait is asleep on the ring
// (a waiters word in the same array, which Wait raises before it looks for
// records and the programs load after their fully ordered add): the
// wake-up is an irq_work whose self-IPI, an APIC write, exits to the
// hypervisor on a VM, which had made every probed munmap more than twice
// as slow (docs/performance.md, "internal/bpfmon").
//
// A cache built on it keeps the epoch it is up to date with. A lookup loads
// the epoch (Epoch, or an atomic load of *EpochWord) and compares; when it
// differs, Sync drains every event the epoch covers (spinning briefly on a
// record that is reserved but not yet submitted), calls the flush function
// if events were lost, and returns the epoch the caller now reflects.
// Synced returns the same for readers that did not call Sync themselves.
//
// # Attach methods
//
// Open tries, in Config.Methods order (default: all, in this order):
// kprobes on the __x64_sys_* wrappers, the syscalls/sys_enter_*
// tracepoints (one program per watched call; tracefs, mounted at
// /sys/kernel/tracing when the process is root and it is absent), and
// tp_btf/sys_enter and raw_tracepoint/sys_enter (one program for every
// system call of the machine, dispatching on the call number; no
// tracefs). Method tells which one runs and Reasons why the others before
// it did not.
//
// What each costs the rest of the host, beyond the reported calls:
// kprobes cost only the six calls. Any tracepoint puts every task on the
// kernel's traced system call path while attached; with the per-call
// tracepoints the kernel then checks one bit for a call we do not watch
// and runs nothing, while the one-program methods run the program (and
// return after one compare) at every system call of the machine. A
// program run's cost is mostly the process lookup and the register read
// (BenchmarkProgram; docs/performance.md). The bench pin suite's hosttax
// rows measure an unrelated process's getppid with and without a monitor
// attached. When none can attach, Open fails with an error that matches
// ErrNotSupported (internal/feature) and names what is missing.
//
// Detaching a tracepoint waits for the kernel's RCU grace periods, tens
// of milliseconds per link: Close detaches the links concurrently.
//
// Requirements: x86_64, Linux 5.12 (ring buffers, fetching atomics), kernel
// BTF (CO-RE for brk; tp_btf), and CAP_BPF with CAP_PERFMON, or
// CAP_SYS_ADMIN.
//
// # Concurrency
//
// A Monitor is safe for concurrent use. Drain and Sync serialise on one
// consumer lock; Wait does not take it. AddPid, RemovePid, Watch and Unwatch
// serialise on a second lock. Epoch, EpochWord, Synced and Overflowed are
// lock-free. After Close, EpochWord's word stays readable (moved once more,
// with the overflow word set, so that a cache that checks it flushes) and
// everything else returns ErrClosed.
package bpfmon
