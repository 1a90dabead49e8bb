//go:build amd64 || arm64

package shm

// pause is one PAUSE (amd64) or YIELD (arm64) instruction (pause_*.s).
func pause()
