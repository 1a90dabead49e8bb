package main

import (
	"fmt"
	"reflect"

	"github.com/sandirect/sandirect/nic"
)

// Where Go's register ABI (ABIInternal, amd64) puts the fields of a struct
// argument at a function's entry. Integer-class values take the integer
// registers in order (RAX, RBX, RCX, RDI, RSI, R8, R9, R10, R11): a pointer
// or integer one, a string or interface two, a slice three, a struct its
// fields in turn. An argument that does not fit in the registers left goes
// whole to the stack, laid out as in memory, after the return address.
// The layouts below are computed from the nic types this tool is built
// with, so that a field added to a work request moves the probe's reading
// with it.

// intWords returns how many integer registers a value of t takes, and
// false when t is not register-assigned to integer registers alone.
func intWords(t reflect.Type) (int, bool) {
	switch t.Kind() {
	case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
		reflect.Pointer, reflect.UnsafePointer, reflect.Chan, reflect.Map, reflect.Func:
		return 1, true
	case reflect.String, reflect.Interface:
		return 2, true
	case reflect.Slice:
		return 3, true
	case reflect.Struct:
		n := 0
		for i := range t.NumField() {
			w, ok := intWords(t.Field(i).Type)
			if !ok {
				return 0, false
			}
			n += w
		}
		return n, true
	case reflect.Array:
		switch t.Len() {
		case 0:
			return 0, true
		case 1:
			return intWords(t.Elem())
		}
	}
	return 0, false
}

const intRegs = 9

// fieldLoc is where one word of a field of a struct argument is: in
// register reg (0 for RAX, …) or, when the argument is on the stack, at
// stack offset off.
type fieldLoc struct {
	inReg bool
	reg   int
	off   uintptr
}

// structArg describes a struct argument that follows before integer
// registers of earlier arguments (1 for a method's receiver).
type structArg struct {
	t      reflect.Type
	inRegs bool
	before int
}

func newStructArg(v any, before int) structArg {
	t := reflect.TypeOf(v)
	w, ok := intWords(t)
	return structArg{t: t, inRegs: ok && before+w <= intRegs, before: before}
}

// loc returns where word `word` of field name is: the first word of a
// slice (0) is its pointer, the second its length.
func (a structArg) loc(name string, word int) fieldLoc {
	f, ok := a.t.FieldByName(name)
	if !ok || len(f.Index) != 1 {
		panic(fmt.Sprintf("sdtrace: %v has no field %s", a.t, name))
	}
	if !a.inRegs {
		return fieldLoc{off: f.Offset + uintptr(8*word)}
	}
	reg := a.before
	for i := range f.Index[0] {
		w, _ := intWords(a.t.Field(i).Type)
		reg += w
	}
	return fieldLoc{inReg: true, reg: reg + word}
}

// get reads the location from a record: a register, or the stack words.
func (l fieldLoc) get(r *record) (uint64, bool) {
	if l.inReg {
		return r.regs[l.reg], true
	}
	return word(&r.stack, l.off), r.stackOK
}

// The arguments the probes read.
var (
	// PostSend(qp, wr SendWR): the receiver in RAX, then wr.
	sendArg = newStructArg(nic.SendWR{}, 1)
	sendID  = sendArg.loc("ID", 0)
	sendOp  = sendArg.loc("Op", 0)
	sendLen = sendArg.loc("Local", 1)
	// PostRecv(qp, wr RecvWR).
	recvArg = newStructArg(nic.RecvWR{}, 1)
	recvID  = recvArg.loc("ID", 0)
	recvLen = recvArg.loc("Buf", 1)
)
