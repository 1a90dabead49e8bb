// Command grpc is a gRPC service and its client over sandirect: the Echo
// service of echopb (a unary Say, a bidirectional Chat) and gRPC's
// standard health service. The server is grpc.NewServer().Serve on a
// sandirect listener; the client passes grpc.WithContextDialer. Those two
// lines (marked "sandirect:" below) are the only change from a program
// over package net.
//
//	go run ./grpc                         # both ends: the server in a second process
//	go run ./grpc -server -addr /tmp/grpc.sock
//	go run ./grpc -client -addr /tmp/grpc.sock -msg hello
//
// Run from the examples directory (go -C examples run ./grpc from the
// repository's root).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sandirect/sandirect/examples/grpc/echopb"
	"github.com/sandirect/sandirect/sockets"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Stdout, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "grpc:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, stdout io.Writer, args []string) error {
	fs := flag.NewFlagSet("grpc", flag.ContinueOnError)
	server := fs.Bool("server", false, "serve only")
	client := fs.Bool("client", false, "check the server's health, Say -msg and Chat it, print the answers")
	addr := fs.String("addr", "", "the server's Unix socket path (default: a new one in a temporary directory)")
	msg := fs.String("msg", "hello over shared memory", "the message the client sends")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case *server && *client:
		return errors.New("-server and -client: pick one, or neither for both ends")
	case *server:
		return serve(ctx, *addr, stdout)
	case *client:
		return talk(ctx, *addr, *msg, stdout)
	}
	if *addr == "" {
		dir, err := os.MkdirTemp("", "sandirect-grpc-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		*addr = filepath.Join(dir, "grpc.sock")
	}
	srv, err := startServer(ctx, *addr)
	if err != nil {
		return err
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	return talk(ctx, *addr, *msg, stdout)
}

// echoServer implements echopb.EchoServer.
type echoServer struct {
	echopb.UnimplementedEchoServer
}

func (echoServer) Say(_ context.Context, m *echopb.Message) (*echopb.Message, error) {
	return &echopb.Message{Body: append([]byte(fmt.Sprintf("process %d says: ", os.Getpid())), m.GetBody()...)}, nil
}

func (echoServer) Chat(s grpc.BidiStreamingServer[echopb.Message, echopb.Message]) error {
	for {
		m, err := s.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := s.Send(m); err != nil {
			return err
		}
	}
}

// newServer is the example's gRPC server: Echo and health.
func newServer() *grpc.Server {
	gs := grpc.NewServer()
	echopb.RegisterEchoServer(gs, echoServer{})
	healthpb.RegisterHealthServer(gs, health.NewServer()) // SERVING for "" until shut down
	return gs
}

// serve serves until ctx ends.
func serve(ctx context.Context, addr string, stdout io.Writer) error {
	if addr == "" {
		return errors.New("-server needs -addr")
	}
	// sandirect: with package net this line is net.Listen("unix", addr).
	ln, err := sockets.Listen("sandirect", addr)
	if err != nil {
		return err
	}
	gs := newServer()
	fmt.Fprintf(stdout, "listening on %s\n", ln.Addr())
	go func() { <-ctx.Done(); gs.Stop() }()
	return gs.Serve(ln)
}

// dial returns a client connection to the server at addr.
func dial(addr string) (*grpc.ClientConn, error) {
	return grpc.NewClient("passthrough:///"+addr,
		// sandirect: with package net this option is left out (or dials "unix").
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			return (&sockets.Dialer{}).DialContext(ctx, "sandirect", a)
		}),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
}

// talk checks the server's health, says msg and chats it word by word.
func talk(ctx context.Context, addr, msg string, stdout io.Writer) error {
	if addr == "" {
		return errors.New("-client needs -addr")
	}
	cc, err := dial(addr)
	if err != nil {
		return err
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	h, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		return fmt.Errorf("health check: %w", err)
	}
	fmt.Fprintf(stdout, "health: %s\n", h.GetStatus())
	echo := echopb.NewEchoClient(cc)
	m, err := echo.Say(ctx, &echopb.Message{Body: []byte(msg)})
	if err != nil {
		return fmt.Errorf("say: %w", err)
	}
	fmt.Fprintf(stdout, "say: %s\n", m.GetBody())
	st, err := echo.Chat(ctx)
	if err != nil {
		return fmt.Errorf("chat: %w", err)
	}
	for _, w := range []string{"one", "two", "three"} {
		if err := st.Send(&echopb.Message{Body: []byte(w)}); err != nil {
			return fmt.Errorf("chat: %w", err)
		}
		m, err := st.Recv()
		if err != nil {
			return fmt.Errorf("chat: %w", err)
		}
		fmt.Fprintf(stdout, "chat: %s\n", m.GetBody())
	}
	return st.CloseSend()
}

// startServer runs this program with -server in a second process, which
// dies with this one, and returns once it listens.
func startServer(ctx context.Context, addr string) (*exec.Cmd, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.CommandContext(ctx, self, "-server", "-addr", addr)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	// Its first line says that it listens.
	if _, err := bufio.NewReader(out).ReadString('\n'); err != nil {
		cmd.Process.Kill()
		cmd.Wait()
		return nil, fmt.Errorf("server process: %w", err)
	}
	return cmd, nil
}
