//go:build linux

package sys

import (
	"runtime"
	"testing"
)

// TestNiceThread: NiceThread lowers the calling thread's priority and
// no other thread's (Linux keeps nice per thread): the test's own thread,
// held so that the other goroutine cannot run on it, keeps its own. The
// restore puts the old priority back, so the thread can serve on. A
// thread that could not raise its priority back is refused.
func TestNiceThread(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	before := threadNice(t)
	done := make(chan int)
	go func() {
		runtime.LockOSThread()
		old := threadNice(t)
		restore, err := NiceThread(19)
		if !canRenice(old) {
			// Unprivileged, RLIMIT_NICE at its default: it must refuse,
			// and change nothing.
			if err == nil {
				t.Error("NiceThread(19) without the right to restore: no error")
				restore()
			}
			if got := threadNice(t); got != old {
				t.Errorf("nice after a refusal = %d, want %d", got, old)
			}
			runtime.UnlockOSThread()
			done <- -2
			return
		}
		if err != nil {
			t.Error(err)
			done <- -1
			return
		}
		done <- threadNice(t)
		if _, err := NiceThread(19); err == nil {
			t.Error("NiceThread(19) at nice 19: no error")
		}
		if err := restore(); err != nil {
			t.Error(err)
		}
		if got := threadNice(t); got != old {
			t.Errorf("nice after the restore = %d, want %d", got, old)
		}
		runtime.UnlockOSThread()
		done <- 0
	}()
	switch got := <-done; got {
	case -2:
		t.Log("no right to raise a thread's priority back: NiceThread refused, as it must")
	case 19:
		<-done
	default:
		t.Fatalf("the thread's nice after NiceThread(19) = %d, want 19", got)
	}
	if after := threadNice(t); after != before {
		t.Fatalf("the test's thread's nice went from %d to %d", before, after)
	}
}

// threadNice is ThreadNice of the calling thread, failing the test on an
// error.
func threadNice(t *testing.T) int {
	t.Helper()
	n, err := ThreadNice(Gettid())
	if err != nil {
		t.Fatal(err)
	}
	return n
}
