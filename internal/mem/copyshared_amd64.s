#include "textflag.h"

// func copyRep(dst, src *byte, n uintptr)
// A forward string move of n > 0 bytes; the slices do not overlap and the
// direction flag is clear (Go's ABI).
TEXT ·copyRep(SB), NOSPLIT, $0-24
	MOVQ	dst+0(FP), DI
	MOVQ	src+8(FP), SI
	MOVQ	n+16(FP), CX
	REP; MOVSB
	RET
