//go:build !race

package sockets

// count adds n to counter c. The caller is the counter's one writer of the
// moment (stats): a plain add, which readers' atomic loads see whole.
func (s *stats) count(c counter, n uint64) { s.v[c] += n }
