// Command echo is an echo server and its client over sandirect: the
// client writes a line, the server writes it back. The only change from a
// program over package net is the Listen and the Dial (marked "sandirect:"
// below); everything else is the net.Conn and net.Listener it had.
//
//	go run ./echo                       # both ends: the server in a second process
//	go run ./echo -server -addr /tmp/echo.sock
//	go run ./echo -client -addr /tmp/echo.sock -msg hello
//
// Run from the examples directory (go -C examples run ./echo from the
// repository's root).
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/sandirect/sandirect/sockets"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Stdout, os.Args[1:])
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "echo:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, stdout io.Writer, args []string) error {
	fs := flag.NewFlagSet("echo", flag.ContinueOnError)
	server := fs.Bool("server", false, "serve only")
	client := fs.Bool("client", false, "send -msg to the server at -addr, print the answer")
	addr := fs.String("addr", "", "the server's Unix socket path (default: a new one in a temporary directory)")
	msg := fs.String("msg", "hello over shared memory", "the line the client sends")
	if err := fs.Parse(args); err != nil {
		return err
	}
	switch {
	case *server && *client:
		return errors.New("-server and -client: pick one, or neither for both ends")
	case *server:
		return serve(ctx, *addr, stdout)
	case *client:
		return ask(ctx, *addr, *msg, stdout)
	}
	// Both ends: this process is the client, the server runs as a
	// second process of this same program.
	if *addr == "" {
		dir, err := os.MkdirTemp("", "sandirect-echo-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		*addr = filepath.Join(dir, "echo.sock")
	}
	srv, err := startServer(ctx, *addr)
	if err != nil {
		return err
	}
	defer func() { srv.Process.Kill(); srv.Wait() }()
	return ask(ctx, *addr, *msg, stdout)
}

// serve echoes every connection's bytes back to it until ctx ends.
func serve(ctx context.Context, addr string, stdout io.Writer) error {
	if addr == "" {
		return errors.New("-server needs -addr")
	}
	// sandirect: with package net this line is net.Listen("unix", addr).
	ln, err := sockets.Listen("sandirect", addr)
	if err != nil {
		return err
	}
	defer ln.Close()
	fmt.Fprintf(stdout, "listening on %s\n", ln.Addr())
	go func() { <-ctx.Done(); ln.Close() }()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		go func() {
			defer c.Close()
			io.Copy(c, c)
		}()
	}
}

// ask sends msg and a newline, and prints the line that comes back.
func ask(ctx context.Context, addr, msg string, stdout io.Writer) error {
	if addr == "" {
		return errors.New("-client needs -addr")
	}
	var d sockets.Dialer
	// sandirect: with package net this line is (&net.Dialer{}).DialContext(ctx, "unix", addr).
	c, err := d.DialContext(ctx, "sandirect", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, msg+"\n"); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return fmt.Errorf("read the echo: %w", err)
	}
	fmt.Fprint(stdout, line)
	return nil
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
