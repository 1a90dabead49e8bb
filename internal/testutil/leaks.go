package testutil

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sandirect/sandirect/internal/sys"
)

// Resources is a count of what a process holds that tests must give back.
type Resources struct {
	Fds      []string // targets of /proc/self/fd links
	Mappings []string // /proc/self/maps lines of memfd and deleted shared files
}

// Snapshot records the process's open fds and shared-memory mappings.
func Snapshot() Resources {
	var r Resources
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		t, err := os.Readlink("/proc/self/fd/" + e.Name())
		if err != nil {
			continue // the fd of ReadDir itself, closed by now
		}
		r.Fds = append(r.Fds, t)
	}
	maps, _ := os.ReadFile("/proc/self/maps")
	for _, l := range strings.Split(string(maps), "\n") {
		if strings.Contains(l, "/memfd:") || strings.Contains(l, "/dev/shm/") {
			r.Mappings = append(r.Mappings, l)
		}
	}
	slices.Sort(r.Fds)
	return r
}

// CheckLeaks compares the process now with the snapshot r and returns an
// error naming what is held now that was not then. Finalizers and exiting
// goroutines get a short grace period, polled, not slept blindly.
func (r Resources) CheckLeaks() error {
	var err error
	deadline := time.Now().Add(2 * time.Second)
	for {
		err = r.diff(Snapshot())
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(10 * time.Millisecond) // poll: fds closed by finalizers or exiting children
	}
}

func (r Resources) diff(now Resources) error {
	var extra []string
	left := slices.Clone(r.Fds)
	for _, f := range now.Fds {
		if i := slices.Index(left, f); i >= 0 {
			left = slices.Delete(left, i, i+1)
			continue
		}
		extra = append(extra, "fd "+f)
	}
	if len(now.Mappings) > len(r.Mappings) {
		for _, m := range now.Mappings {
			if !slices.Contains(r.Mappings, m) {
				extra = append(extra, "mapping "+m)
			}
		}
	}
	if len(extra) > 0 {
		return fmt.Errorf("%d leaked: %s", len(extra), strings.Join(extra, "; "))
	}
	return nil
}

// ResidentKiB returns how much of mem is resident (mincore): for a mapping
// of shared memory, the pages its file holds, whoever touched them.
func ResidentKiB(mem []byte) (int, error) {
	vec, err := sys.Mincore(mem)
	if err != nil {
		return 0, err
	}
	n := 0
	for _, v := range vec {
		n += int(v & 1)
	}
	return n * sys.PageSize / 1024, nil
}

// Threads returns the number of OS threads of this process, as the
// kernel counts them (/proc/self/status).
func Threads() (int, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, errors.New("no Threads line in /proc/self/status")
}
