package main

import (
	"context"
	"fmt"
	"time"

	"github.com/sandirect/sandirect/nic"
	"github.com/sandirect/sandirect/shm"
)

// The measuring loops. posted[i] is stamped just before the i-th post, as
// perftest's tposted; completed[i] when the i-th completion is polled.

// sendPingPong is send_lat on either side: the client sends first and
// waits for the echo; the server waits and echoes. Both stamp their posts.
func (e *endpoint) sendPingPong(ctx context.Context, size int, posted []int64, client bool) error {
	wr := nic.SendWR{Op: nic.OpSend, Local: e.local[:size], LKey: e.lmr.LKey}
	from := "wait for the " + e.peerName() + "'s message"
	for i := range posted {
		if !client {
			if err := e.recvData(ctx, size, from); err != nil {
				return err
			}
		}
		posted[i] = e.now()
		if err := e.qp.PostSend(wr); err != nil {
			return e.qpErr("post send", err)
		}
		if err := e.waitSends(ctx, 1, active); err != nil {
			return err
		}
		if client {
			if err := e.recvData(ctx, size, from); err != nil {
				return err
			}
		}
	}
	return nil
}

// recvData receives one message of the test and checks its size.
func (e *endpoint) recvData(ctx context.Context, size int, what string) error {
	_, n, err := e.recv(ctx, active, true, what)
	if err != nil {
		return err
	}
	if n != size {
		return fmt.Errorf("%w: a %d-byte message where the test sends %d", errBadMessage, n, size)
	}
	return nil
}

// writePingPong is write_lat on either side, as perftest's: each side RDMA
// Writes size bytes to the end of the peer's buffer, the last byte a
// sequence number, and polls the last byte of its own buffer for the
// peer's. The sequence runs on across sizes, so a size never mistakes the
// previous size's last byte for its first.
func (e *endpoint) writePingPong(ctx context.Context, size int, posted []int64, client bool) error {
	wr := nic.SendWR{
		Op:     nic.OpWrite,
		Local:  e.local[:size],
		LKey:   e.lmr.LKey,
		Remote: e.peer.bufAddr + uint64(e.peerLen-size),
		RKey:   e.peer.rkey,
	}
	outstanding := 0
	for i := range posted {
		seq := e.wseq + 1
		if !client {
			if err := e.pollFlag(ctx, seq); err != nil {
				return err
			}
		}
		e.local[size-1] = seq
		posted[i] = e.now()
		if err := e.qp.PostSend(wr); err != nil {
			return e.qpErr("post RDMA Write", err)
		}
		outstanding++
		if client {
			if err := e.pollFlag(ctx, seq); err != nil {
				return err
			}
		}
		e.wseq = seq
		// The write completed before the peer answered it, or nearly:
		// collect completions without waiting.
		n := e.scq.Poll(e.cbuf[:])
		if err := e.reapSends(e.cbuf[:n]); err != nil {
			return err
		}
		outstanding -= n
	}
	return e.waitSends(ctx, outstanding, active)
}

// pollFlag spins until the last byte of this side's buffer is seq: the
// peer's write has landed.
func (e *endpoint) pollFlag(ctx context.Context, seq uint8) error {
	off := len(e.remote) - 8
	var deadline time.Time
	if e.cfg.timeout > 0 {
		deadline = time.Now().Add(e.cfg.timeout)
	}
	for i := 1; ; i++ {
		// Little-endian: the buffer's last byte is the word's top byte.
		if uint8(shm.LoadUint64(e.remote, off)>>56) == seq {
			return nil
		}
		if i%4096 == 0 {
			if e.qp.State() != nic.QPReady {
				return e.qpErr("wait for the "+e.peerName()+"'s RDMA Write", e.qp.Err())
			}
			if err := e.check(ctx, deadline, "wait for the "+e.peerName()+"'s RDMA Write"); err != nil {
				return err
			}
		}
		shm.Pause() // leaves the loop sooner once the write lands
	}
}

// readLatency is read_lat's client: post one RDMA Read, wait for its
// completion, again.
func (e *endpoint) readLatency(ctx context.Context, size int, posted []int64) error {
	wr := nic.SendWR{
		Op:     nic.OpRead,
		Local:  e.local[:size],
		LKey:   e.lmr.LKey,
		Remote: e.peer.bufAddr + uint64(e.peerLen-size),
		RKey:   e.peer.rkey,
	}
	for i := range posted {
		posted[i] = e.now()
		if err := e.qp.PostSend(wr); err != nil {
			return e.qpErr("post RDMA Read", err)
		}
		if err := e.waitSends(ctx, 1, active); err != nil {
			return err
		}
	}
	return nil
}

// stream is the client of the bandwidth tests: it keeps up to txDepthBW
// operations in flight until len(posted) have completed.
func (e *endpoint) stream(ctx context.Context, size int, posted, completed []int64) error {
	wr := nic.SendWR{Op: nic.OpSend, Local: e.local[:size], LKey: e.lmr.LKey}
	switch e.cfg.test {
	case writeBW:
		wr.Op = nic.OpWrite
	case readBW:
		wr.Op = nic.OpRead
	}
	if wr.Op != nic.OpSend {
		wr.Remote, wr.RKey = e.peer.bufAddr+uint64(e.peerLen-size), e.peer.rkey
	}
	n := len(posted)
	np, nc := 0, 0
	for nc < n {
		for np < n && np-nc < txDepthBW {
			posted[np] = e.now()
			if err := e.qp.PostSend(wr); err != nil {
				return e.qpErr("post "+wr.Op.String(), err)
			}
			np++
		}
		cs, err := e.wait(ctx, e.scq, e.cbuf[:], active, true, "wait for a send-queue completion")
		if err != nil {
			return err
		}
		t := e.now()
		if err := e.reapSends(cs); err != nil {
			return err
		}
		for range cs {
			completed[nc] = t
			nc++
		}
	}
	return nil
}

// receiveStream is send_bw's server: it takes len(received) messages,
// stamping each receive completion and posting its receive again.
func (e *endpoint) receiveStream(ctx context.Context, size int, received []int64) error {
	n := len(received)
	for nr := 0; nr < n; {
		// Never more than the test's messages: the client's row follows.
		cs, err := e.wait(ctx, e.rcq, e.cbuf[:min(len(e.cbuf), n-nr)], active, true, "wait for the client's sends")
		if err != nil {
			return err
		}
		t := e.now()
		for i := range cs {
			if err := cs[i].Err(); err != nil {
				return e.qpErr("receive", err)
			}
			if cs[i].Bytes != size {
				return fmt.Errorf("%w: a %d-byte message where the test sends %d", errBadMessage, cs[i].Bytes, size)
			}
			received[nr] = t
			nr++
			if err := e.postRecv(); err != nil {
				return err
			}
		}
	}
	return nil
}
