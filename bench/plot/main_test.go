package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A request draws one figure per suite with something to draw, titled
// with the suite's doc and panel titles, in both formats.
func TestRunDraws(t *testing.T) {
	dir := t.TempDir()
	in := `{"hardware":"Test CPU","suites":[{"name":"app","doc":"apps","latency_title":"call, median","latency_label":"per call"}],
	"references":["cacheline"],"records":[
	{"suite":"app","case":"unary","transport":"grpc/sandirect","size":64,"metric":"lat_p50_ns","value":2000},
	{"suite":"app","case":"unary","transport":"grpc/sandirect","size":4096,"metric":"lat_p50_ns","value":3000},
	{"suite":"app","case":"unary","transport":"cacheline","size":8,"metric":"lat_p50_ns","value":60},
	{"suite":"app","case":"idle","transport":"unix","size":0,"metric":"threads","value":7},
	{"suite":"none","case":"idle","transport":"unix","size":0,"metric":"threads","value":7}]}`
	var out bytes.Buffer
	if err := run(context.Background(), strings.NewReader(in), &out, []string{"-out", dir}); err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(dir, "app.svg") + "\n" + filepath.Join(dir, "app.png") + "\n"
	if out.String() != want {
		t.Fatalf("printed %q, want %q", out.String(), want)
	}
	svg, err := os.ReadFile(filepath.Join(dir, "app.svg"))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"app: apps", "Test CPU", "call, median", "per call", "grpc/sandirect"} {
		if !bytes.Contains(svg, []byte(s)) {
			t.Errorf("app.svg lacks %q", s)
		}
	}
	if bytes.Contains(svg, []byte(">cacheline<")) {
		t.Errorf("app.svg draws the reference cacheline as a row")
	}
}

func TestRunBadRequest(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`{"records":[{"suite":"a","bogus":1}]}`, "unknown field"},
		{`[1,2]`, "read request"},
		{``, "read request"},
	} {
		err := run(context.Background(), strings.NewReader(tc.in), &bytes.Buffer{}, []string{"-out", t.TempDir()})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("request %q: %v, want an error with %q", tc.in, err, tc.want)
		}
	}
}
