//go:build race

package sockets

import "sync/atomic"

// count adds n to counter c. Under the race detector the add is atomic: a
// plain one, read by other goroutines' atomic loads, is a race it reports,
// benign as it is (stats_fast.go).
func (s *stats) count(c counter, n uint64) { atomic.AddUint64(&s.v[c], n) }

// store publishes v. Atomic under the race detector, as count is.
func (p *pub32) store(v uint32) { atomic.StoreUint32(&p.v, v) }
