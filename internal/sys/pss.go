package sys

import (
	"bytes"
	"errors"
	"os"
	"strconv"
)

// Pss returns the proportional set size, in bytes, of the process pid
// ("self" for this one): its resident memory with each shared page divided
// among the processes that map it (/proc/PID/smaps_rollup).
func Pss(pid string) (int64, error) {
	raw, err := os.ReadFile("/proc/" + pid + "/smaps_rollup")
	if err != nil {
		return 0, err
	}
	for line := range bytes.Lines(raw) {
		if f := bytes.Fields(line); len(f) >= 2 && string(f[0]) == "Pss:" {
			kb, err := strconv.ParseInt(string(f[1]), 10, 64)
			return kb << 10, err
		}
	}
	return 0, errors.New("no Pss in /proc/" + pid + "/smaps_rollup")
}
