// SPDX-License-Identifier: (MIT OR GPL-2.0-only)
//
// bpfmon: syscall-entry probes that report address-space changes which
// invalidate registered memory (munmap, mremap, madvise with a discarding
// advice, brk shrink, mmap MAP_FIXED, shmdt) of watched processes.
//
// Every program ends in emit(): filter by watched granule, reserve a ring
// buffer record, bump the epoch word with a fetching atomic add (the record
// carries the epoch it produced), submit. A failed reserve bumps the overflow
// word and then the epoch. The state array is BPF_F_MMAPABLE: user space reads
// the epoch with one load of the mapped word.
//
// The layouts of struct event and struct state are mirrored in Go
// (../event.go, ../monitor.go) and tested there. x86_64 only: syscall
// numbers and struct pt_regs are the x86_64 ones.
//
// Rebuild with `go generate ./internal/bpfmon` (scripts/bpfgen.sh installs
// clang first); the generated objects are committed.

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

char LICENSE[] SEC("license") = "Dual MIT/GPL";

// x86_64 system call numbers (arch/x86/entry/syscalls/syscall_64.tbl).
#define NR_MMAP    9
#define NR_MUNMAP  11
#define NR_BRK     12
#define NR_MREMAP  25
#define NR_MADVISE 28
#define NR_SHMDT   67

#define MAP_FIXED_ 0x10
#define MREMAP_FIXED_ 2

#define MADV_DONTNEED_        4
#define MADV_FREE_            8
#define MADV_REMOVE_          9
#define MADV_DONTNEED_LOCKED_ 24
#define MADV_GUARD_INSTALL_   102

// Event flags.
#define EVF_DEST    1 // mremap: the MREMAP_FIXED destination range
#define EVF_UNKNOWN 2 // the length is not known: to the top of the address space

#define GRANULE_SHIFT 21 // 2 MiB watch granules
#define MAX_SCAN 64      // granules looked up per event; longer ranges always pass

// Set by the loader before load (frozen .rodata).
volatile const __u64 page_size = 4096;
volatile const __u64 pidns_dev = 0; // pid namespace of the monitor (stat of /proc/self/ns/pid)
volatile const __u64 pidns_ino = 0; // 0: use the initial namespace's ids
volatile const __u32 have_find_vma = 0;

struct event {
	__u64 start;
	__u64 len;
	__u64 epoch; // the epoch this event's increment produced
	__u32 tid;
	__u16 nr;    // system call number
	__u16 flags; // EVF_*
	__u32 arg;   // madvise advice; mmap and mremap flags
	__u32 _pad;
};

// One 128-byte value: the words bumped by the probes on the first 64 bytes,
// the words set by user space on the next 64.
struct state {
	__u64 epoch;    // 0: bumped once per reported event (delivered or lost)
	__u64 overflow; // 8: events lost to a full ring since user space last cleared it
	__u64 lost_epoch; // 16: the epoch of the last event lost
	__u64 _hot[5];
	__u64 watch_all; // 64: report every range, ignoring the granule map
	__u64 waiters;   // 72: readers asleep on the ring: wake them on submit
	__u64 _cold[6];
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024); // set by the loader
} events SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct state);
} state SEC(".maps");

// Watched processes: tgid (in the monitor's pid namespace) → unused.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64); // set by the loader
	__type(key, __u32);
	__type(value, __u32);
} pids SEC(".maps");

// Watched 2 MiB granules: address >> 21 → reference count (user space's).
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 65536); // set by the loader
	__type(key, __u64);
	__type(value, __u32);
} granules SEC(".maps");

// The user registers of a system call (x86_64 struct pt_regs, a stable
// layout: it is the ptrace ABI).
struct uregs {
	__u64 r15, r14, r13, r12, bp, bx, r11, r10, r9, r8, ax, cx, dx, si, di;
	__u64 orig_ax, ip, cs, flags, sp, ss;
};

// Kernel types read through CO-RE: only the fields used, relocated against
// the running kernel's BTF at load.
struct mm_struct {
	unsigned long brk;
} __attribute__((preserve_access_index));

struct task_struct {
	struct mm_struct *mm;
} __attribute__((preserve_access_index));

struct inode {
	long long i_size;
} __attribute__((preserve_access_index));

struct file {
	struct inode *f_inode;
} __attribute__((preserve_access_index));

struct vm_area_struct {
	unsigned long vm_start;
	unsigned long vm_end;
	struct file *vm_file;
} __attribute__((preserve_access_index));

static __always_inline __u64 page_up(__u64 x)
{
	return (x + page_size - 1) & ~(page_size - 1);
}

// watched_tid returns the calling thread's id if its process is watched, else 0.
static __always_inline __u32 watched_tid(void)
{
	__u32 tgid, tid;
	if (pidns_ino) {
		struct bpf_pidns_info ns = {};
		if (bpf_get_ns_current_pid_tgid(pidns_dev, pidns_ino, &ns, sizeof(ns)))
			return 0; // another pid namespace: not ours
		tgid = ns.tgid;
		tid = ns.pid;
	} else {
		__u64 id = bpf_get_current_pid_tgid();
		tgid = id >> 32;
		tid = (__u32)id;
	}
	if (!bpf_map_lookup_elem(&pids, &tgid))
		return 0;
	return tid; // never 0: the idle task makes no system calls
}

static __always_inline int range_watched(struct state *st, __u64 start, __u64 len)
{
	if (st->watch_all)
		return 1;
	__u64 end = start + len;
	if (end < start)
		end = ~0ULL;
	__u64 g = start >> GRANULE_SHIFT;
	__u64 last = (end - 1) >> GRANULE_SHIFT;
	if (last - g >= MAX_SCAN)
		return 1;
	for (int i = 0; i < MAX_SCAN; i++) {
		__u64 key = g + i;
		if (key > last)
			break;
		if (bpf_map_lookup_elem(&granules, &key))
			return 1;
	}
	return 0;
}

static __always_inline void emit(__u32 tid, __u16 nr, __u64 start, __u64 len, __u32 arg, __u16 flags)
{
	__u32 zero = 0;
	struct state *st = bpf_map_lookup_elem(&state, &zero);
	if (!st || len == 0)
		return;
	if (!range_watched(st, start, len))
		return;
	struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		// Lost: say so before the epoch moves, so that a reader who sees
		// the new epoch also sees the overflow.
		// The epoch's add fetches (a fully ordered atomic on every JIT)
		// and keeps the epoch of the loss for the curious.
		__sync_fetch_and_add(&st->overflow, 1);
		st->lost_epoch = __sync_fetch_and_add(&st->epoch, 1) + 1;
		return;
	}
	e->start = start;
	e->len = len;
	e->tid = tid;
	e->nr = nr;
	e->flags = flags;
	e->arg = arg;
	e->_pad = 0;
	e->epoch = __sync_fetch_and_add(&st->epoch, 1) + 1;
	// Wake only a reader that sleeps on the ring: the wake-up is an
	// irq_work whose self-IPI (an APIC write: a VM exit on a guest) cost
	// most of what the probe added to a munmap. The load comes after the
	// fully ordered add, and a reader stores its flag before it looks for
	// records: either it sees this record, or we see its flag.
	__u64 wake = *(volatile __u64 *)&st->waiters ? 0 : BPF_RB_NO_WAKEUP;
	bpf_ringbuf_submit(e, wake);
}

struct shm_vma {
	__u64 start;
	__u64 len;
};

static long shm_vma_cb(struct task_struct *task, struct vm_area_struct *vma, void *data)
{
	struct shm_vma *s = data;
	s->start = BPF_CORE_READ(vma, vm_start);
	struct file *f = BPF_CORE_READ(vma, vm_file);
	if (f)
		s->len = BPF_CORE_READ(f, f_inode, i_size);
	else
		s->len = BPF_CORE_READ(vma, vm_end) - s->start;
	return 0;
}

// handle reports what system call nr with arguments a[0..4] is about to do.
// nr is a constant wherever the caller knows it, so the switch folds away.
static __always_inline void handle(__u32 tid, long nr, const __u64 *a)
{
	switch (nr) {
	case NR_MUNMAP:
		emit(tid, NR_MUNMAP, a[0], page_up(a[1]), 0, 0);
		break;
	case NR_MREMAP: {
		// a: old_address, old_size, new_size, flags, new_address.
		// Whatever it does to the old range (shrink, move, DONTUNMAP),
		// its pages may no longer be the ones registered.
		emit(tid, NR_MREMAP, a[0], page_up(a[1]), (__u32)a[3], 0);
		if (a[3] & MREMAP_FIXED_)
			emit(tid, NR_MREMAP, a[4], page_up(a[2]), (__u32)a[3], EVF_DEST);
		break;
	}
	case NR_MADVISE: {
		__u32 adv = (__u32)a[2];
		if (adv == MADV_DONTNEED_ || adv == MADV_FREE_ || adv == MADV_REMOVE_ ||
		    adv == MADV_DONTNEED_LOCKED_ || adv == MADV_GUARD_INSTALL_)
			emit(tid, NR_MADVISE, a[0], page_up(a[1]), adv, 0);
		break;
	}
	case NR_BRK: {
		// brk(addr) below the current break unmaps
		// [PAGE_ALIGN(addr), PAGE_ALIGN(brk)); brk(0), the query, touches
		// nothing. (An address below the kernel's minimum fails; it is
		// reported all the same rather than second-guess that minimum.)
		struct task_struct *task = (struct task_struct *)bpf_get_current_task();
		__u64 cur = BPF_CORE_READ(task, mm, brk);
		__u64 nb = page_up(a[0]), ob = page_up(cur);
		if (a[0] != 0 && nb < ob)
			emit(tid, NR_BRK, nb, ob - nb, 0, 0);
		break;
	}
	case NR_MMAP: {
		// a: addr, length, prot, flags. MAP_FIXED_NOREPLACE (without
		// MAP_FIXED) fails rather than replace, so it is not reported.
		__u32 fl = (__u32)a[3];
		if (fl & MAP_FIXED_)
			emit(tid, NR_MMAP, a[0], page_up(a[1]), fl, 0);
		break;
	}
	case NR_SHMDT: {
		// The segment's length is found from the mapping at the address
		// (bpf_find_vma, Linux 5.17); without it the range runs to the top.
		__u64 addr = a[0];
		if (have_find_vma) {
			struct shm_vma s = {};
			struct task_struct *task = bpf_get_current_task_btf();
			if (bpf_find_vma(task, addr, shm_vma_cb, &s, 0) == 0 && s.start == addr)
				emit(tid, NR_SHMDT, addr, page_up(s.len), 0, 0);
			// No mapping starts at addr: shmdt fails with EINVAL.
		} else {
			emit(tid, NR_SHMDT, addr, 0 - addr, 0, EVF_UNKNOWN);
		}
		break;
	}
	}
}

static __always_inline int interesting(long nr)
{
	return nr == NR_MUNMAP || nr == NR_MADVISE || nr == NR_MREMAP || nr == NR_MMAP ||
	       nr == NR_BRK || nr == NR_SHMDT;
}

// from_regs reads the arguments from the user registers at regs and handles
// the call.
static __always_inline void from_regs(long nr, const struct uregs *regs)
{
	__u32 tid = watched_tid();
	if (!tid)
		return;
	__u64 a[5];
	// r10 .. di are contiguous: r10 r9 r8 ax cx dx si di.
	__u64 r[8];
	if (bpf_probe_read_kernel(r, sizeof(r), &regs->r10))
		return;
	a[0] = r[7]; // di
	a[1] = r[6]; // si
	a[2] = r[5]; // dx
	a[3] = r[0]; // r10
	a[4] = r[2]; // r8
	handle(tid, nr, a);
}

// Method 1: BTF-typed raw tracepoint, sys_enter(struct pt_regs *regs, long id).
SEC("tp_btf/sys_enter")
int tpbtf_sys_enter(__u64 *ctx)
{
	long nr = (long)ctx[1];
	if (!interesting(nr))
		return 0;
	from_regs(nr, (const struct uregs *)ctx[0]);
	return 0;
}

// Method 2: raw tracepoint, the same arguments untyped.
SEC("raw_tracepoint/sys_enter")
int rawtp_sys_enter(struct bpf_raw_tracepoint_args *ctx)
{
	long nr = (long)ctx->args[1];
	if (!interesting(nr))
		return 0;
	from_regs(nr, (const struct uregs *)ctx->args[0]);
	return 0;
}

// Method 3: the per-call syscall tracepoints (tracefs).
struct sys_enter_ctx {
	__u64 common; // struct trace_entry
	long id;
	__u64 args[6];
};

static __always_inline void from_tp(long nr, struct sys_enter_ctx *ctx)
{
	__u32 tid = watched_tid();
	if (!tid)
		return;
	__u64 a[5] = {ctx->args[0], ctx->args[1], ctx->args[2], ctx->args[3], ctx->args[4]};
	handle(tid, nr, a);
}

SEC("tracepoint/syscalls/sys_enter_munmap")
int tp_munmap(struct sys_enter_ctx *ctx) { from_tp(NR_MUNMAP, ctx); return 0; }
SEC("tracepoint/syscalls/sys_enter_mremap")
int tp_mremap(struct sys_enter_ctx *ctx) { from_tp(NR_MREMAP, ctx); return 0; }
SEC("tracepoint/syscalls/sys_enter_madvise")
int tp_madvise(struct sys_enter_ctx *ctx) { from_tp(NR_MADVISE, ctx); return 0; }
SEC("tracepoint/syscalls/sys_enter_brk")
int tp_brk(struct sys_enter_ctx *ctx) { from_tp(NR_BRK, ctx); return 0; }
SEC("tracepoint/syscalls/sys_enter_mmap")
int tp_mmap(struct sys_enter_ctx *ctx) { from_tp(NR_MMAP, ctx); return 0; }
SEC("tracepoint/syscalls/sys_enter_shmdt")
int tp_shmdt(struct sys_enter_ctx *ctx) { from_tp(NR_SHMDT, ctx); return 0; }

// Method 4: kprobes on the syscall wrappers __x64_sys_*(const struct pt_regs
// *regs): the first argument (di) points at the user registers.
static __always_inline void from_kprobe(long nr, struct uregs *ctx)
{
	from_regs(nr, (const struct uregs *)ctx->di);
}

SEC("kprobe/__x64_sys_munmap")
int kp_munmap(struct uregs *ctx) { from_kprobe(NR_MUNMAP, ctx); return 0; }
SEC("kprobe/__x64_sys_mremap")
int kp_mremap(struct uregs *ctx) { from_kprobe(NR_MREMAP, ctx); return 0; }
SEC("kprobe/__x64_sys_madvise")
int kp_madvise(struct uregs *ctx) { from_kprobe(NR_MADVISE, ctx); return 0; }
SEC("kprobe/__x64_sys_brk")
int kp_brk(struct uregs *ctx) { from_kprobe(NR_BRK, ctx); return 0; }
SEC("kprobe/__x64_sys_mmap")
int kp_mmap(struct uregs *ctx) { from_kprobe(NR_MMAP, ctx); return 0; }
SEC("kprobe/__x64_sys_shmdt")
int kp_shmdt(struct uregs *ctx) { from_kprobe(NR_SHMDT, ctx); return 0; }
