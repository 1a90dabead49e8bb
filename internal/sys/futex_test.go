package sys

import (
	"runtime"
	"testing"
	"time"
)

// TestPrivateFutexWaitv: a futex_waitv waiter on a private word is woken
// by FutexWakePrivate (a shared wake would not find it: the kernel keys
// the two kinds differently).
func TestPrivateFutexWaitv(t *testing.T) {
	word := new(uint32)
	*word = 1
	woke := make(chan error, 1)
	go func() {
		ws := make([]FutexWaiter, 1)
		ws[0].SetPrivateWord(word, 1)
		_, err := FutexWaitv(ws, 10*time.Second)
		woke <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for {
		// A shared wake never counts the private waiter.
		if n, err := FutexWake(word, 1); err != nil || n != 0 {
			t.Fatalf("shared wake of a private waiter: %d, %v", n, err)
		}
		n, err := FutexWakePrivate(word, 1)
		if err != nil {
			t.Fatal(err)
		}
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the waiter never slept, or the private wake does not reach it")
		}
		runtime.Gosched()
	}
	if err := <-woke; err != nil {
		t.Fatalf("waiter: %v", err)
	}
}
