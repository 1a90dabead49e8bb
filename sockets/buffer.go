package sockets

import (
	"fmt"
	"net"

	"github.com/sandirect/sandirect/internal/lockrank"
	"github.com/sandirect/sandirect/internal/mem"
)

// Buffers in shared memory.
//
// A large Write from an ordinary buffer reaches the peer in two copies
// (into temporary shared memory in pieces, pipelined across the two CPUs,
// and out again) or in one copy through process_vm_readv: either way at
// most what the machine's two-core pipeline moves, and at 16 MiB that is
// about half of what one CPU's copy() does. A buffer from AllocBuffer is
// device memory, a shared segment that the peer maps: the peer reads a
// Write from it straight out of the mapping, one copy in all, whatever
// its size — the zero-copy loan of iceoryx2 or shmipc-go's buffers, behind
// a plain Write.

var buffers struct {
	mu lockrank.Mutex
	m  map[uintptr]bufferOwner // by the address of the first byte
}

func init() { buffers.mu.Init(lockrank.Buffers) }

type bufferOwner struct {
	dev *device // nil: ordinary memory (the connection is not ours)
	buf []byte  // the whole buffer
}

// AllocBuffer returns n bytes to Write to c, or to any connection of this
// process with the same Config, from shared memory that the peer reads in
// place: large writes from it are not copied on the way (see above). For
// a connection that is not ours — the TCP path, for instance — it returns
// ordinary memory, so that one program runs either way.
//
// The buffer stays valid until FreeBuffer, also after c is closed; it must
// not be unmapped by other means (the nic copies it without fault
// protection, see the package documentation). Every
// peer connected to this process's connections of that Config maps it, as
// it maps the temporary memory writes are copied into, and could write
// it too: put in it only what those peers may see. They are processes of
// our own user, who could read our memory anyway (ptrace); the switch
// admits no other. A failure is an error matching syscall.ENOBUFS. Each
// buffer is a segment every peer maps: allocate a few large buffers and
// reuse them, not one per write.
func AllocBuffer(c net.Conn, n int) ([]byte, error) {
	if n <= 0 {
		return nil, fmt.Errorf("sockets: AllocBuffer of %d bytes", n)
	}
	var b []byte
	var d *device
	if sc, ok := c.(*Conn); !ok {
		b = make([]byte, n)
	} else {
		sc.mu.Lock()
		closed := sc.closed
		sc.mu.Unlock()
		d = sc.dev
		if closed || !d.tryHold() {
			return nil, fmt.Errorf("sockets: AllocBuffer: %w", net.ErrClosed)
		}
		var err error
		if b, err = d.nic.Alloc(n); err != nil {
			d.release()
			return nil, enobufs("shared buffer", err)
		}
	}
	buffers.mu.Lock()
	if buffers.m == nil {
		buffers.m = map[uintptr]bufferOwner{}
	}
	buffers.m[bufferAddr(b)] = bufferOwner{dev: d, buf: b}
	buffers.mu.Unlock()
	return b, nil
}

// FreeBuffer gives back a buffer from AllocBuffer (b must start where the
// buffer does). It fails, and the buffer stays, while a write from it is
// in flight.
func FreeBuffer(b []byte) error {
	if len(b) == 0 {
		return fmt.Errorf("sockets: FreeBuffer of an empty slice")
	}
	buffers.mu.Lock()
	dev, err := freeBufferLocked(bufferAddr(b))
	buffers.mu.Unlock()
	// The device's hold goes after buffers.mu: devices.mu comes before it.
	if dev != nil {
		dev.release()
	}
	return err
}

// freeBufferLocked frees the buffer at addr and forgets it, returning the
// device whose hold it had, for the caller to release.
func freeBufferLocked(addr uintptr) (*device, error) {
	o, ok := buffers.m[addr]
	if !ok {
		return nil, fmt.Errorf("sockets: FreeBuffer of memory not from AllocBuffer")
	}
	if o.dev != nil {
		// Registrations the cache keeps of it go first (the nic frees no
		// memory a region still covers) — unless a write from it is in
		// flight: revoking its registration would fail that write.
		if cache := o.dev.nic.Cache(); cache != nil && !cache.InvalidateIdle(addr, uintptr(len(o.buf))) {
			return nil, fmt.Errorf("sockets: FreeBuffer: a write from the buffer is in flight")
		}
		if err := o.dev.nic.Free(o.buf); err != nil {
			return nil, fmt.Errorf("sockets: FreeBuffer: %w", err)
		}
	}
	delete(buffers.m, addr)
	return o.dev, nil
}

func bufferAddr(b []byte) uintptr { return mem.Addr(b) }

// sharedSource tells whether a write's source lies in a buffer from
// AllocBuffer on this connection's device.
func (c *Conn) sharedSource(body []byte) bool { return c.dev.nic.DeviceMemory(body) }
