package main

import (
	"encoding/binary"
	"math"
	"reflect"
	"strings"
	"testing"
)

func validParams() params {
	return params{test: writeBW, flags: flagShm, iters: 5000, bufAddr: 0x7f0000000000, rkey: 0x1234000001, bufLen: 65536, sizes: []int{65536}}
}

func TestParamsRoundTrip(t *testing.T) {
	for _, p := range []params{
		validParams(),
		{test: sendLat, flags: flagEvents, iters: 1000, bufAddr: 4096, rkey: 1, bufLen: maxSize, sizes: allSizes()},
	} {
		got, err := parseParams(p.marshal())
		if err != nil {
			t.Fatalf("parseParams(marshal(%+v)): %v", p, err)
		}
		if !reflect.DeepEqual(got, p) {
			t.Errorf("round trip: got %+v, want %+v", got, p)
		}
	}
}

func TestParamsMalformed(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func([]byte) []byte
		says string
	}{
		{"short", func(b []byte) []byte { return b[:20] }, "parameters of 20 bytes"},
		{"magic", func(b []byte) []byte { b[0] ^= 1; return b }, "not an sdperf peer"},
		{"version", func(b []byte) []byte { b[4] = 9; return b }, "protocol version 9"},
		{"test", func(b []byte) []byte { b[6] = 7; return b }, "test 7"},
		{"flags", func(b []byte) []byte { b[7] = 0x80; return b }, "flags"},
		{"iterations", func(b []byte) []byte { binary.LittleEndian.PutUint64(b[8:], 0); return b }, "0 iterations"},
		{"nsizes", func(b []byte) []byte { binary.LittleEndian.PutUint32(b[40:], 2); return b }, "2 sizes"},
		{"trailing", func(b []byte) []byte { return append(b, 0, 0, 0, 0) }, "1 sizes in 56 bytes"},
		{"size", func(b []byte) []byte { binary.LittleEndian.PutUint32(b[48:], maxSize+1); return b }, "size 8388609"},
		{"buffer short", func(b []byte) []byte { binary.LittleEndian.PutUint64(b[32:], 100); return b }, "buffer of 100 bytes"},
		{"buffer wraps", func(b []byte) []byte { binary.LittleEndian.PutUint64(b[16:], math.MaxUint64-10); return b }, "buffer of"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := validParams()
			_, err := parseParams(c.edit(p.marshal()))
			if err == nil || !strings.Contains(err.Error(), c.says) {
				t.Errorf("error %v, want one saying %q", err, c.says)
			}
		})
	}
}

func TestWords(t *testing.T) {
	p := validParams()
	if w := p.words(); w != "write_bw -s 65536 -n 5000" {
		t.Errorf("words %q", w)
	}
	p.sizes = allSizes()
	if w := p.words(); w != "write_bw -a -n 5000" {
		t.Errorf("words %q", w)
	}
}

func FuzzParseParams(f *testing.F) {
	p := validParams()
	f.Add(p.marshal())
	p.sizes = allSizes()
	f.Add(p.marshal())
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := parseParams(b)
		if err != nil {
			return
		}
		// What parses re-encodes to the same bytes.
		if got := p.marshal(); string(got) != string(b) {
			t.Fatalf("re-encoded %x, parsed from %x", got, b)
		}
	})
}

func FuzzParseRow(f *testing.F) {
	r := row{kind: rowBW, size: 64, iters: 5000, v: [7]float64{1, 2, 3}}
	f.Add(r.marshal())
	r = row{kind: rowLat, size: 2, iters: 1000, v: [7]float64{0.3, 9, 0.4, 0.5, 0.1, 2, 8}}
	f.Add(r.marshal())
	f.Add(readyMsg(64))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := parseRow(b)
		if err != nil {
			return
		}
		if got := r.marshal(); string(got) != string(b) {
			t.Fatalf("re-encoded %x, parsed from %x", got, b)
		}
		parseReady(b, r.size) // must not panic
	})
}

func TestReady(t *testing.T) {
	if err := parseReady(readyMsg(64), 64); err != nil {
		t.Error(err)
	}
	if err := parseReady(readyMsg(64), 128); err == nil {
		t.Error("ready for the wrong size accepted")
	}
	r := row{kind: rowLat, size: 2, iters: 5}
	if err := parseReady(r.marshal(), 2); err == nil {
		t.Error("a row accepted as ready")
	}
}
