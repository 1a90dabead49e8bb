// SPDX-License-Identifier: (MIT OR GPL-2.0-only)
//
// sdtrace: one uprobe program for every traced function of a Go program.
// Each attachment carries a cookie: the probe's number in the low 16 bits,
// and flags. The program copies the Go register ABI's argument registers
// (amd64: RAX, RBX, RCX, RDI, RSI, R8, R9, R10, R11), the goroutine pointer
// (R14) and a timestamp into a ring buffer record; user space (../probes.go)
// knows what each probe's registers mean. With COOKIE_DEREF_RBX it also
// copies the first 64 bytes of the object RBX points at (a pin entry, a
// work request), and with COOKIE_STACK the first 64 bytes of the stack
// arguments (at SP+8 on entry: arguments that did not fit in registers).
//
// Entry probes only: a uretprobe rewrites the return address on the
// goroutine's stack, which the Go runtime moves and unwinds, and kills the
// target. Latency is measured between two entry probes in user space.
//
// The layout of struct event is mirrored in ../event.go and tested there.
// Rebuild with `go generate ./tools/sdtrace` (scripts/bpfgen.sh installs
// clang first); the generated objects are committed.

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "Dual MIT/GPL";

#define COOKIE_PROBE_MASK 0xffff
#define COOKIE_DEREF_RBX  (1ULL << 16)
#define COOKIE_STACK      (1ULL << 17)

// Bits of event.copied.
#define COPIED_DEREF 1
#define COPIED_STACK 2

struct event {
	__u64 ts;      // bpf_ktime_get_ns (CLOCK_MONOTONIC)
	__u64 cookie;  // the attachment's cookie
	__u64 g;       // R14: the current goroutine
	__u32 tid;     // the thread, global id
	__u32 copied;  // COPIED_*: which of deref and stack hold data
	__u64 regs[9]; // RAX, RBX, RCX, RDI, RSI, R8, R9, R10, R11
	__u64 deref[8]; // the 64 bytes at RBX
	__u64 stack[8]; // the 64 bytes at SP+8
};

// Puts struct event in the object's BTF, for bpf2go (-type event) and the
// layout test.
const struct event *unused_event __attribute__((unused));

// x86_64 struct pt_regs: the uprobe context.
struct uregs {
	__u64 r15, r14, r13, r12, bp, bx, r11, r10, r9, r8, ax, cx, dx, si, di;
	__u64 orig_ax, ip, cs, flags, sp, ss;
};

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 4 << 20); // set by the loader
} events SEC(".maps");

// lost[0]: records lost to a full ring.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} lost SEC(".maps");

SEC("uprobe")
int go_entry(struct uregs *ctx)
{
	__u64 cookie = bpf_get_attach_cookie(ctx);
	struct event *e = bpf_ringbuf_reserve(&events, sizeof(*e), 0);
	if (!e) {
		__u32 zero = 0;
		__u64 *n = bpf_map_lookup_elem(&lost, &zero);
		if (n)
			__sync_fetch_and_add(n, 1);
		return 0;
	}
	e->ts = bpf_ktime_get_ns();
	e->cookie = cookie;
	e->g = ctx->r14;
	e->tid = (__u32)bpf_get_current_pid_tgid();
	e->regs[0] = ctx->ax;
	e->regs[1] = ctx->bx;
	e->regs[2] = ctx->cx;
	e->regs[3] = ctx->di;
	e->regs[4] = ctx->si;
	e->regs[5] = ctx->r8;
	e->regs[6] = ctx->r9;
	e->regs[7] = ctx->r10;
	e->regs[8] = ctx->r11;
	e->copied = 0;
	if (!(cookie & COOKIE_DEREF_RBX) ||
	    bpf_probe_read_user(e->deref, sizeof(e->deref), (void *)ctx->bx) != 0)
		__builtin_memset(e->deref, 0, sizeof(e->deref));
	else
		e->copied |= COPIED_DEREF;
	if (!(cookie & COOKIE_STACK) ||
	    bpf_probe_read_user(e->stack, sizeof(e->stack), (void *)(ctx->sp + 8)) != 0)
		__builtin_memset(e->stack, 0, sizeof(e->stack));
	else
		e->copied |= COPIED_STACK;
	bpf_ringbuf_submit(e, 0);
	return 0;
}
