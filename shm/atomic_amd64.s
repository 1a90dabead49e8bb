#include "textflag.h"

// func storeRelease64(p *uint64, v uint64)
// A plain store: under x86's total store order it is a release store. An
// assembly function, so that the compiler cannot move it past the stores
// before it.
TEXT ·storeRelease64(SB), NOSPLIT, $0-16
	MOVQ	p+0(FP), AX
	MOVQ	v+8(FP), BX
	MOVQ	BX, 0(AX)
	RET
