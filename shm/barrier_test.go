package shm

import (
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
)

// holdBarriers makes the rings attached from now on find the process's
// registration for global barriers in state *st (barrierState), until the
// test ends.
func holdBarriers(t *testing.T, st *int32) {
	t.Helper()
	if sys.MembarrierState() != sys.MembarrierReady {
		t.Skip("no global memory barriers here: the rings always fence")
	}
	barrierState = func() int32 { return *st }
	t.Cleanup(func() { barrierState = sys.MembarrierState })
}

// roundTrip writes one record, reads it back and releases it.
func roundTrip(t *testing.T, p *Producer, c *Consumer, v byte) {
	t.Helper()
	if err := p.Write(0, []byte{v, v, v}, time.Time{}); err != nil {
		t.Fatal(err)
	}
	rec, ok, err := c.Poll()
	if !ok || err != nil || len(rec.Data) != 3 || rec.Data[0] != v {
		t.Fatalf("record %d: ok %v err %v data %v", v, ok, err, rec.Data)
	}
	c.Release()
}

// TestBarriersRegisteredLater: rings attached while the process's
// registration for global barriers is under way (it runs in the
// background, so that a first connection does not wait the milliseconds
// it takes) fence every commit and release, and take the fence-free ways
// at their first commit and release after it is through — a consumer's
// spinning declaration made meanwhile included, unless a park took it
// back first. Each assertion fails if a ring takes a way before the
// barriers reach this process, or never takes it after.
func TestBarriersRegisteredLater(t *testing.T) {
	st := sys.MembarrierPending
	holdBarriers(t, &st)

	t.Run("upgrade", func(t *testing.T) {
		st = sys.MembarrierPending
		p, c := newRing(t, MinRingCapacity, WaitConfig{Mode: WaitBlock}, WaitConfig{Mode: WaitBlock})
		if err := c.SetSpinning(); err != nil {
			t.Fatalf("SetSpinning while the registration is under way: %v", err)
		}
		for i := range 3 {
			roundTrip(t, p, c, byte(i))
			if p.fenceFree || load32(p.pFences) != 0 || c.unfenced || load32(c.cSpins) != 0 {
				t.Fatalf("before the registration: producer fence-free %v (word %d), consumer unfenced %v, spins word %d",
					p.fenceFree, load32(p.pFences), c.unfenced, load32(c.cSpins))
			}
		}
		st = sys.MembarrierReady
		roundTrip(t, p, c, 10)
		if !p.fenceFree || load32(p.pFences) != 1 {
			t.Fatalf("after the registration the producer still fences (fence-free %v, word %d)", p.fenceFree, load32(p.pFences))
		}
		if !c.unfenced || load32(c.cSpins) != 1 {
			t.Fatalf("after the registration: consumer unfenced %v, spins word %d (the declaration was not made)", c.unfenced, load32(c.cSpins))
		}
		if p.watch || c.watch || c.spinDue {
			t.Fatal("still watching the registration after it was through")
		}
		roundTrip(t, p, c, 11) // the fence-free ways deliver too
	})

	t.Run("parked before", func(t *testing.T) {
		st = sys.MembarrierPending
		p, c := newRing(t, MinRingCapacity, WaitConfig{Mode: WaitBlock}, WaitConfig{Mode: WaitBlock})
		if err := c.SetSpinning(); err != nil {
			t.Fatal(err)
		}
		c.armBell(c.waiter.Bell()) // a wait that parks takes the declaration back
		c.armBell(0)
		st = sys.MembarrierReady
		roundTrip(t, p, c, 1)
		if load32(c.cSpins) != 0 {
			t.Fatal("a declaration taken back by a park was made after the registration")
		}
		if !p.fenceFree || !c.unfenced {
			t.Fatalf("fence-free %v, unfenced %v after the registration", p.fenceFree, c.unfenced)
		}
	})

	t.Run("failed", func(t *testing.T) {
		st = sys.MembarrierPending
		p, c := newRing(t, MinRingCapacity, WaitConfig{Mode: WaitBlock}, WaitConfig{Mode: WaitBlock})
		if err := c.SetSpinning(); err != nil {
			t.Fatal(err)
		}
		st = sys.MembarrierFailed
		roundTrip(t, p, c, 1)
		if p.fenceFree || c.unfenced || load32(p.pFences) != 0 || load32(c.cSpins) != 0 {
			t.Fatal("a ring took a fence-free way without global barriers")
		}
		if p.watch || c.watch || c.spinDue {
			t.Fatal("still watching a registration that failed")
		}
	})
}
