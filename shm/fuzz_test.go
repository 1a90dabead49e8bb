package shm

import (
	"errors"
	"testing"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
)

// FuzzConsumer fills a ring's data area and head with arbitrary bytes, as a
// hostile producer could, and reads: the consumer returns records inside
// the data area or an error matching ErrCorrupt, never panics.
func FuzzConsumer(f *testing.F) {
	f.Add(uint64(0), []byte{})
	f.Add(uint64(0), []byte{5, 0, 0, 0, 1, 0, 0, 0x80, 'h', 'e', 'l', 'l', 'o', 0, 0, 0})
	f.Add(uint64(248), []byte{0x80})
	f.Add(uint64(8), []byte{0, 0, 0, 0, 0, 0, 0, 0, 0xf0, 0, 0, 0, 0, 0, 0, 0xc0})
	const capacity = MinRingCapacity
	s, err := CreateSegment("fuzz", KindRings, SegmentHeaderSize+RingSize(capacity))
	if err != nil {
		f.Fatal(err)
	}
	defer s.Close()
	region, _ := s.Region(SegmentHeaderSize, RingSize(capacity))
	f.Fuzz(func(t *testing.T, head uint64, data []byte) {
		if err := InitRing(region, capacity); err != nil {
			t.Fatal(err)
		}
		copy(region[RingHeaderSize:], data)
		store64(word64(region, ringHeadOff), head)
		c, err := NewConsumer(region, WaitConfig{Mode: WaitBusyPoll})
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("NewConsumer: %v", err)
			}
			return
		}
		data0 := uintptrOf(&region[RingHeaderSize])
		for i := 0; i < 64; i++ {
			rec, ok, err := c.Poll()
			if err != nil {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("Poll: %v", err)
				}
				return
			}
			if !ok {
				return
			}
			if len(rec.Data) > 0 {
				start := uintptrOf(&rec.Data[0])
				if start < data0 || start+uintptr(len(rec.Data)) > data0+capacity {
					t.Fatalf("record outside the data area")
				}
			}
			if i%3 == 0 {
				c.Release()
			}
		}
	})
}

// FuzzAttach feeds arbitrary ring control lines and positions to both sides.
func FuzzAttach(f *testing.F) {
	f.Add(uint32(ringMagic), uint32(ringVersion), uint64(4096), uint64(0), uint64(0))
	f.Add(uint32(ringMagic), uint32(ringVersion), uint64(1<<40), uint64(0), uint64(0))
	f.Add(uint32(ringMagic), uint32(ringVersion), uint64(4096), uint64(8), uint64(0))
	const capacity = 4096
	s, err := CreateSegment("fuzz", KindRings, SegmentHeaderSize+RingSize(capacity))
	if err != nil {
		f.Fatal(err)
	}
	defer s.Close()
	region, _ := s.Region(SegmentHeaderSize, RingSize(capacity))
	f.Fuzz(func(t *testing.T, magic, version uint32, capacity, head, tail uint64) {
		clear(region)
		store32(word32(region, ringMagicOff), magic)
		store32(word32(region, ringVersionOff), version)
		store64(word64(region, ringCapacityOff), capacity)
		store64(word64(region, ringHeadOff), head)
		store64(word64(region, ringTailOff), tail)
		if p, err := NewProducer(region, WaitConfig{Mode: WaitBusyPoll}); err == nil {
			// A producer that attached writes within its area or fails.
			for i := 0; i < 8; i++ {
				err := p.Write(0, make([]byte, 100), time.Now().Add(-time.Second))
				if err != nil && !errors.Is(err, ErrCorrupt) && !errors.Is(err, ErrDeadlineExceededAlias) {
					t.Fatalf("Write: %v", err)
				}
			}
		} else if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("NewProducer: %v", err)
		}
		if _, err := NewConsumer(region, WaitConfig{}); err != nil && !errors.Is(err, ErrCorrupt) {
			t.Fatalf("NewConsumer: %v", err)
		}
	})
}

// FuzzSegmentHeader maps sealed segments with arbitrary headers: OpenSegment
// accepts exactly the valid ones and refuses the rest with ErrBadSegment.
func FuzzSegmentHeader(f *testing.F) {
	f.Add(uint64(segMagic), uint32(segVersion), KindRings, uint64(4096))
	f.Add(uint64(segMagic), uint32(segVersion), KindRings, uint64(8192))
	f.Add(uint64(0), uint32(0), uint32(0), uint64(0))
	f.Fuzz(func(t *testing.T, magic uint64, version, kind uint32, size uint64) {
		s, err := CreateSegment("fuzz", kind, 4096)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		store64(word64(s.Bytes(), segMagicOff), magic)
		store32(word32(s.Bytes(), segVersionOff), version)
		store64(word64(s.Bytes(), segSizeOff), size)
		fd, err := sys.Dup(s.Fd())
		if err != nil {
			t.Fatal(err)
		}
		o, err := OpenSegment(fd, KindRings, 0)
		valid := magic == segMagic && version == segVersion && kind == KindRings && size == 4096
		switch {
		case err == nil && !valid:
			o.Close()
			t.Fatal("opened an invalid segment")
		case err == nil:
			o.Close()
		case valid:
			t.Fatalf("refused a valid segment: %v", err)
		case !errors.Is(err, ErrBadSegment):
			t.Fatalf("error %v does not match ErrBadSegment", err)
		}
	})
}
