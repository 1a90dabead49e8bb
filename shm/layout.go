package shm

// Shared-memory layouts of this package. docs/layout.md repeats these
// diagrams; layout_test.go checks that the constants chain and that the Go
// views agree with them.
//
// Segment header, at offset 0 of every segment (one 128-byte line):
//
//	 0               8       12      16              24      28     128
//	+---------------+-------+-------+---------------+-------+------+
//	| magic u64     | vers  | kind  | size u64      | pid   | 0... |
//	+---------------+-------+-------+---------------+-------+------+
//
// magic is "SANDIRCT" read as a little-endian uint64; vers is the layout
// version; kind tells which layout follows (rings, registration table, …);
// size is the whole segment in bytes and must equal the memfd's size; pid
// is the creator's, for diagnostics only.
const (
	segMagicOff   = 0
	segVersionOff = segMagicOff + 8
	segKindOff    = segVersionOff + 4
	segSizeOff    = segKindOff + 4
	segPidOff     = segSizeOff + 8
	segHeaderEnd  = segPidOff + 4

	// SegmentHeaderSize is the space the segment header occupies; layouts
	// start at or after it.
	SegmentHeaderSize = 128

	segMagic   = 0x54435249444e4153 // "SANDIRCT"
	segVersion = 1
)

// Ring region, at a 128-byte aligned offset inside a segment. Each line is
// 128 bytes so that words written by different sides never share a cache
// line (nor an adjacent-line prefetch pair):
//
//	offset  line              written by   words
//	     0  control           creator;     magic u32 | version u32 | capacity u64 |
//	                          closers;     producer closed u32 | consumer closed u32 |
//	                          consumer     consumer spins u32
//	   128  producer line     producer     tail u64 (observers only)
//	   256  consumer line     consumer     head u64
//	   384  consumer doorbell both         u32: the sleeping consumer's Waiter slot + 1, or 0
//	   512  producer doorbell both         u32: the sleeping producer's Waiter slot + 1, or 0
//	   640  data area         producer     capacity bytes, a power of two
//
// The control line is written at creation and once more by each side's
// Close, so polling its closed flags costs a cache hit. "Consumer spins"
// is 1 while the consumer waits by spinning only and never sleeps
// (Consumer.SetSpinning): the producer may then publish a record with a
// release store instead of a sequentially consistent one (Commit). The
// consumer writes it when it declares that and when it takes it back.
//
// Records in the data area, 8-byte aligned, never straddling its end:
//
//	 0                      4        6       7       8
//	+----------------------+--------+-------+-------+---------------------+
//	| length u32           | tag u16| 0     | flags | payload, length B   |
//	+----------------------+--------+-------+-------+---------------------+
//	 \__________ header: one uint64, stored last, atomically ___________/
//
// flags bit 7 (header bit 63) is "committed" and is set in every live
// header, so a zero word means "nothing here yet"; flags bit 6 (header bit
// 62) marks a padding record that fills the area up to its end. Bits 48..61
// are zero. A record occupies align8(8+length) bytes. The producer keeps 8
// bytes free after every record and zeroes them before it commits, so the
// slot after the last record always reads zero and the consumer needs no
// other signal (and never has to clear what it consumed).
const (
	ringMagicOff    = 0
	ringVersionOff  = ringMagicOff + 4
	ringCapacityOff = ringVersionOff + 4
	ringPClosedOff  = ringCapacityOff + 8
	ringCClosedOff  = ringPClosedOff + 4
	ringCSpinsOff   = ringCClosedOff + 4
	ringPFencesOff  = ringCSpinsOff + 4
	ringControlEnd  = ringPFencesOff + 4

	lineSize = 128

	ringProducerLine = lineSize
	ringTailOff      = ringProducerLine

	ringConsumerLine = ringProducerLine + lineSize
	ringHeadOff      = ringConsumerLine

	ringConsumerBell = ringConsumerLine + lineSize
	ringProducerBell = ringConsumerBell + lineSize

	// RingHeaderSize is the bytes a ring uses before its data area.
	RingHeaderSize = ringProducerBell + lineSize

	ringMagic   = 0x474e4952 // "RING"
	ringVersion = 1

	recHeaderSize = 8
	recAlign      = 8

	hdrCommitted = uint64(1) << 63
	hdrPadding   = uint64(1) << 62
	hdrTagShift  = 32
	hdrLenMask   = uint64(0xffffffff)
	hdrReserved  = (uint64(1)<<62 - 1) &^ (uint64(1)<<48 - 1) // bits 48..61

	// MinRingCapacity and MaxRingCapacity bound a ring's data area.
	MinRingCapacity = 256
	MaxRingCapacity = 1 << 30
)

// RingSize returns the bytes a ring region with the given data capacity
// occupies.
func RingSize(capacity int) int { return RingHeaderSize + capacity }

// maxPayload is the largest payload a ring of capacity bytes accepts: any
// record plus the padding before it plus the 8-byte gap always fits in an
// empty ring.
func maxPayload(capacity int) int { return capacity/2 - 2*recHeaderSize }

func recordSize(n int) int { return (recHeaderSize + n + recAlign - 1) &^ (recAlign - 1) }

// Wake hub segment (KindWake), one per Hub: how peers wake this process's
// parked waiters (hub.go). After the segment header, in 128-byte lines:
//
//	offset  line      written by           words
//	   128  control   creator              magic u32 | version u32 | slots u32
//	   256  doorbell  leader, wakers       u32: 1 = the leader is parked;
//	                                       at 264, u64: when a waker last
//	                                       signalled the pipe (wall clock, ns)
//	   384  summary   wakers, leader       hubSlots/4096 u64: bit i of word j set =
//	                                       pending word 64j+i may have bits set
//	   512  pending   wakers, leader       hubSlots/64 u64: bit i of word j set =
//	                                       slot 64j+i was woken
//
// A waker sets the slot's pending bit, then its summary bit (atomic ORs),
// then takes the doorbell (swap to 0) and signals the hub's pipe if it
// was set. The leader announces on the doorbell, then swaps summary
// words to zero and the pending words they name, and wakes those slots'
// waiters; it parks on the pipe only when it found nothing since its last
// announcement. A waker that signals the pipe first stores the time; a
// woken waiter reads it to tell how long its wait lasted without its own
// wake-up (WaitStrategy). It is advice, checked against the waiter's own
// clock, and nothing depends on it for correctness.
const (
	hubMagicOff    = SegmentHeaderSize
	hubVersionOff  = hubMagicOff + 4
	hubSlotsOff    = hubVersionOff + 4
	hubBellOff     = SegmentHeaderSize + lineSize
	hubSignalOff   = hubBellOff + 8
	hubSummaryOff  = hubBellOff + lineSize
	hubPendingOff  = hubSummaryOff + lineSize
	hubSlots       = 1 << 16
	hubSegmentSize = hubPendingOff + hubSlots/8

	hubMagic   = 0x454b4157 // "WAKE"
	hubVersion = 1
)
