package sockets_test

import (
	"bytes"
	"fmt"
	"io"
	"os"

	"github.com/sandirect/sandirect/sockets"
)

// Large writes from a buffer of AllocBuffer are read by the peer in place.
func ExampleAllocBuffer() {
	addr := fmt.Sprintf("@example-allocbuffer-%d", os.Getpid())
	ln, err := sockets.Listen("sandirect", addr)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer ln.Close()
	got := make(chan []byte)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- nil
			return
		}
		defer c.Close()
		b, _ := io.ReadAll(c)
		got <- b
	}()
	conn, err := sockets.Dial("sandirect", addr)
	if err != nil {
		fmt.Println(err)
		return
	}
	buf, err := sockets.AllocBuffer(conn, 4<<20)
	if err != nil {
		fmt.Println(err)
		return
	}
	copy(buf, bytes.Repeat([]byte("sandirect "), len(buf)/10))
	conn.Write(buf) // the peer copies it straight out of buf
	conn.(*sockets.Conn).CloseWrite()
	b := <-got
	fmt.Println(len(b), bytes.Equal(b, buf), conn.(*sockets.Conn).Stats().ZeroShared > 0)
	conn.Close()
	fmt.Println(sockets.FreeBuffer(buf))
	// Output:
	// 4194304 true true
	// <nil>
}
