//go:build !race

package sockets

// count adds n to counter c. The caller is the counter's one writer of the
// moment (stats): a plain add, which readers' atomic loads see whole.
func (s *stats) count(c counter, n uint64) { s.v[c] += n }

// store publishes v: a plain store, which the other side's atomic loads
// see whole (pub32).
func (p *pub32) store(v uint32) { p.v = v }
