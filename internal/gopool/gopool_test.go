package gopool

import (
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"testing"
	"time"
)

// created returns how many goroutines the program has started.
func created() uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// waitFor polls cond, yielding the processor between looks, and fails t
// when it is still false after ten seconds.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("still not %s after 10 s", what)
		}
		runtime.Gosched()
	}
}

// runAndWait runs f through Go and returns once it has run.
func runAndWait(f func()) {
	done := make(chan struct{})
	Go(func() {
		f()
		close(done)
	})
	<-done
}

// TestIdleWorkerTakesTheNextTask: a task given while a worker waits runs
// on that worker: no goroutine is started for it, and it runs on the
// goroutine that ran the one before.
func TestIdleWorkerTakesTheNextTask(t *testing.T) {
	runtime.GC() // the collector's own goroutines, started before counting
	drain(t)
	var first, second []byte
	runAndWait(func() { first = stackTop() })
	// The worker counts itself idle just before it waits on work: wait
	// for the wait itself.
	waitFor(t, "waiting for work", func() bool { return waitingWorkers() == 1 })
	n := created()
	runAndWait(func() { second = stackTop() })
	if got := created() - n; got != 0 {
		t.Errorf("%d goroutines started for a task an idle worker could take", got)
	}
	if string(first) != string(second) {
		t.Errorf("the second task ran on %q, the first on %q", second, first)
	}
}

// drain makes the workers that wait, from the tests before, exit: each
// takes a task that ends once all have one, then waits a millisecond. A
// worker that was about to wait, still holding the timer of an earlier
// linger, takes one in the next round.
func drain(t *testing.T) {
	t.Helper()
	old := linger.Swap(int64(time.Millisecond))
	defer linger.Store(old)
	deadline := time.Now().Add(10 * time.Second)
	for Idle() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d workers still waiting after 10 s", Idle())
		}
		runBlocked(Idle() + 1)
		for end := time.Now().Add(50 * time.Millisecond); Idle() != 0 && time.Now().Before(end); {
			runtime.Gosched()
		}
	}
}

// waitingWorkers counts the workers blocked waiting for a task, from a
// dump of every goroutine's stack.
func waitingWorkers() int {
	buf := make([]byte, 1<<20)
	n := 0
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, "[select") && strings.Contains(g, "gopool.worker(") {
			n++
		}
	}
	return n
}

// stackTop returns the first line of the calling goroutine's stack: its
// id.
func stackTop() []byte {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	for i, c := range buf {
		if c == '[' {
			return buf[:i]
		}
	}
	return buf
}

// TestTasksRunConcurrently: Go does not wait for a worker: tasks that
// each wait until all of them run do all run.
func TestTasksRunConcurrently(t *testing.T) {
	ran := make(chan int, 1)
	go func() { ran <- runBlocked(20) }()
	select {
	case <-ran:
	case <-time.After(10 * time.Second):
		t.Fatal("20 tasks given to Go did not all run at once within 10 s")
	}
}

// TestIdleWorkersBounded: after more tasks than maxIdle ran at once, at
// most maxIdle workers wait; the rest exit at once, not after linger.
func TestIdleWorkersBounded(t *testing.T) {
	runtime.GC() // the collector's own goroutines, started before counting
	old := linger.Swap(int64(time.Hour))
	const n = maxIdle + 16
	running := runBlocked(n)
	waitFor(t, "down to the idle bound", func() bool {
		return runtime.NumGoroutine() <= running-(n-maxIdle)
	})
	if got := Idle(); got > maxIdle {
		t.Errorf("%d idle workers, want at most %d", got, maxIdle)
	}
	// The workers left wait an hour: let them go.
	linger.Store(old)
	drain(t)
}

// runBlocked runs n tasks through Go that each wait until all of them
// run, and returns the count of goroutines while they all ran.
func runBlocked(n int) (running int) {
	release := make(chan struct{})
	var started, done sync.WaitGroup
	started.Add(n)
	done.Add(n)
	for range n {
		Go(func() {
			started.Done()
			<-release
			done.Done()
		})
	}
	started.Wait()
	running = runtime.NumGoroutine()
	close(release)
	done.Wait()
	return running
}

// TestIdleWorkersExit: a worker that no task reaches within linger exits.
func TestIdleWorkersExit(t *testing.T) {
	drain(t)
	old := linger.Swap(int64(time.Millisecond))
	defer linger.Store(old)
	runAndWait(func() {})
	waitFor(t, "the worker gone", func() bool { return Idle() == 0 })
	n := created()
	runAndWait(func() {})
	if created() == n {
		t.Error("a task ran on a worker that should have exited")
	}
}
