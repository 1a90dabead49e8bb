package main

// pingpong/netpoll (floor and ring suites): two processes wake each other
// through pipes, each side's goroutine parked in the Go netpoller on its
// read end (an *os.File) and woken by a one-byte write from the other
// side, raw, as the wake hub signals (shm.Hub, sys.PipeSignal). It is the
// floor of a wait that parks a goroutine and holds no thread, which is how
// the rings, the nic and the sockets layer sleep (docs/performance.md,
// "shm: waiting"): what their sleeping round trip is measured against,
// beside the futex pair that blocks a thread.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
)

// pollPipes is one side's ends of the two pipes.
type pollPipes struct {
	in    *os.File // read end: parked on in the netpoller
	outFd int      // write end, written raw
	out   *os.File // owns outFd
	wake  *os.File // the parent's: a write end of its own in, to end a read when the peer is gone
}

func (p *pollPipes) close() error {
	var errs []error
	for _, f := range []*os.File{p.in, p.out, p.wake} {
		if f != nil {
			errs = append(errs, f.Close())
		}
	}
	return errors.Join(errs...)
}

// newPollPipes makes the two pipes: the parent's ends, and the peer's, to
// pass it as files (ping's read end, then pong's write end).
func newPollPipes() (parent pollPipes, child []*os.File, err error) {
	pingR, pingW, err := sys.Pipe()
	if err != nil {
		return pollPipes{}, nil, fmt.Errorf("pipe: %w", err)
	}
	pongR, pongW, err := sys.Pipe()
	if err != nil {
		sys.Close(pingR)
		sys.Close(pingW)
		return pollPipes{}, nil, fmt.Errorf("pipe: %w", err)
	}
	wake, err := sys.Dup(pongW)
	if err != nil {
		for _, fd := range []int{pingR, pingW, pongR, pongW} {
			sys.Close(fd)
		}
		return pollPipes{}, nil, fmt.Errorf("dup: %w", err)
	}
	// Non-blocking fds: os.NewFile reads them through the netpoller.
	parent = pollPipes{in: os.NewFile(uintptr(pongR), "pong-r"), outFd: pingW, out: os.NewFile(uintptr(pingW), "ping-w"),
		wake: os.NewFile(uintptr(wake), "pong-w")}
	child = []*os.File{os.NewFile(uintptr(pingR), "ping-r"), os.NewFile(uintptr(pongW), "pong-w")}
	return parent, child, nil
}

// openPollPipes is the peer's side: the two files it inherited at fds
// first (ping's read end) and first+1 (pong's write end).
func openPollPipes(first int) pollPipes {
	return pollPipes{in: os.NewFile(uintptr(first), "ping-r"), outFd: first + 1, out: os.NewFile(uintptr(first+1), "pong-w")}
}

// pollStop on a pipe ends the peer's loop; a round trip's byte is
// sys.PipeSignal's, 1.
const pollStop = 2

// netpollRounds measures round trips through the pipes for about budget or
// laps round trips after warm ones, adding to smp's samples (start it
// first), the parent's goroutine pinned to its CPU as the rings' is.
func netpollRounds(ctx context.Context, env *Env, p *peer, pp *pollPipes, warm int, budget time.Duration, laps int, smp *sampler) error {
	var abort atomic.Pointer[error] // why the peer's side ended
	onAbort := func(err error) {
		abort.Store(&err)
		pp.wake.Write([]byte{pollStop}) // ends a read parked on the answer of a peer that is gone
	}
	return p.run(ctx, ctlMsg{Op: "netpoll"}, onAbort, func() error {
		return pinned(env.cpus[0], func() error {
			var b [1]byte
			rt := func() error {
				if err := sys.PipeSignal(pp.outFd); err != nil {
					return fmt.Errorf("pipe write: %w", err)
				}
				if _, err := io.ReadFull(pp.in, b[:]); err != nil {
					return fmt.Errorf("pipe read: %w", err)
				}
				if err := abort.Load(); err != nil {
					return fmt.Errorf("%w: %w", errAborted, *err)
				}
				return nil
			}
			for range warm {
				if err := rt(); err != nil {
					return err
				}
			}
			smp.resume(budget, laps)
			for {
				if err := rt(); err != nil {
					return err
				}
				if !smp.lap() {
					break
				}
			}
			_, err := pp.out.Write([]byte{pollStop})
			return err
		})
	})
}

// servePollPipes is the peer's side of netpollRounds: it answers every
// byte on its in with one on its out, until the stop byte.
func servePollPipes(pc *peerConn, pp *pollPipes) error {
	if err := pc.ready(); err != nil {
		return err
	}
	var b [1]byte
	for {
		if _, err := io.ReadFull(pp.in, b[:]); err != nil {
			return fmt.Errorf("pipe read: %w", err)
		}
		if b[0] == pollStop {
			return nil
		}
		if err := sys.PipeSignal(pp.outFd); err != nil {
			return fmt.Errorf("pipe write: %w", err)
		}
	}
}

// netpollRTT measures the floor suite's row.
func netpollRTT(ctx context.Context, env *Env, p *peer, pp *pollPipes) (*Latency, error) {
	smp := newSampler(env.plan.blockMax)
	smp.start(0)
	if err := netpollRounds(ctx, env, p, pp, env.plan.blockWarm, env.plan.blockTime, env.plan.blockMax, smp); err != nil {
		return nil, err
	}
	return summarize(smp.result()), nil
}
