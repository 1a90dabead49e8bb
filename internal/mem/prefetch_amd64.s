#include "textflag.h"

// func prefetch(p *byte, lines int)
// PREFETCHT0 of lines > 0 consecutive 64-byte lines from p.
TEXT ·prefetch(SB), NOSPLIT, $0-16
	MOVQ	p+0(FP), AX
	MOVQ	lines+8(FP), CX
loop:
	PREFETCHT0	(AX)
	ADDQ	$64, AX
	DECQ	CX
	JNZ	loop
	RET
