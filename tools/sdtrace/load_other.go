//go:build !386 && !amd64

package main

import (
	"errors"

	"github.com/cilium/ebpf"
)

// loadSdtrace stands in for the generated loader where there is no
// object: the probes read amd64 registers, and run refuses other
// architectures before calling it.
func loadSdtrace() (*ebpf.CollectionSpec, error) {
	return nil, errors.New("sdtrace: no BPF object for this architecture")
}
