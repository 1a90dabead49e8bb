//go:build !amd64

package shm

import "sync/atomic"

func storeRelease64(p *uint64, v uint64) { atomic.StoreUint64(p, v) }
