package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sandirect/sandirect/examples/grpc/echopb"
)

func TestMain(m *testing.M) {
	// run's both-ends mode starts this binary with -server: be the server.
	if len(os.Args) > 1 && os.Args[1] == "-server" {
		if err := run(context.Background(), os.Stdout, os.Args[1:]); err != nil {
			os.Stderr.WriteString("grpc server: " + err.Error() + "\n")
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// The example as its doc runs it: health, Say and Chat answered by a
// server in a second process.
func TestGRPCBothEnds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := run(ctx, &out, []string{"-msg", "hi", "-addr", filepath.Join(t.TempDir(), "grpc.sock")}); err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile(`^health: SERVING\nsay: process (\d+) says: hi\nchat: one\nchat: two\nchat: three\n$`)
	m := re.FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("output %q", out.String())
	}
	if m[1] == fmt.Sprint(os.Getpid()) {
		t.Errorf("answered by this process, not a server process")
	}
}

// startServerProcess starts the example's server in a second process and
// waits until it listens.
func startServerProcess(t *testing.T) string {
	t.Helper()
	addr := filepath.Join(t.TempDir(), "grpc.sock")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(self, "-server", "-addr", addr)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "listening on") {
		t.Fatalf("server process: %q, %v", line, err)
	}
	return addr
}

// A gRPC service over sandirect, as CI checks it: the health check, a
// unary call with a 1 MiB payload, and a bidirectional stream of messages
// of every size up to 1 MiB sent and received from two goroutines at
// once, both directions hash-checked.
func TestGRPCService(t *testing.T) {
	addr := startServerProcess(t)
	cc, err := dial(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	h, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil || h.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health check: %v, %v", h.GetStatus(), err)
	}

	echo := echopb.NewEchoClient(cc)
	rng := rand.New(rand.NewPCG(1, 2))
	big := make([]byte, 1<<20)
	for i := range big {
		big[i] = byte(rng.Uint32())
	}
	m, err := echo.Say(ctx, &echopb.Message{Body: big})
	if err != nil {
		t.Fatalf("say 1 MiB: %v", err)
	}
	if got := m.GetBody(); len(got) < len(big) || sha256.Sum256(got[len(got)-len(big):]) != sha256.Sum256(big) {
		t.Fatalf("say 1 MiB: answer of %d bytes does not end with the request", len(got))
	}

	st, err := echo.Chat(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sent, recv := sha256.New(), sha256.New()
	var sentN, recvN int
	sendErr := make(chan error, 1)
	go func() {
		rng := rand.New(rand.NewPCG(3, 4))
		for i := range 200 {
			n := rng.IntN(1 << (i % 21)) // 0 B to 1 MiB, all magnitudes
			if i == 0 {
				n = 1 << 20
			}
			body := make([]byte, n)
			for j := range body {
				body[j] = byte(rng.Uint32())
			}
			sent.Write(body)
			sentN += n
			if err := st.Send(&echopb.Message{Body: body}); err != nil {
				sendErr <- err
				return
			}
		}
		sendErr <- st.CloseSend()
	}()
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("chat: receive: %v", err)
		}
		recv.Write(m.GetBody())
		recvN += len(m.GetBody())
	}
	if err := <-sendErr; err != nil {
		t.Fatalf("chat: send: %v", err)
	}
	if !bytes.Equal(sent.Sum(nil), recv.Sum(nil)) {
		t.Fatalf("chat: sent %d bytes, received %d, hashes differ", sentN, recvN)
	}
	t.Logf("chat: %d bytes each way, hashes equal", recvN)
}
