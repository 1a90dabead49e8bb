//go:build !386 && !amd64

package bpfmon

import (
	"errors"

	"github.com/cilium/ebpf"
)

// loadBpfmon stands in for the generated loader where there is no object:
// Open refuses every architecture but amd64 before calling it.
func loadBpfmon() (*ebpf.CollectionSpec, error) {
	return nil, errors.New("bpfmon: no BPF object for this architecture")
}
