package pin

// Test-only views of the cache's internals.

// entryID identifies the entry behind a handle: a hit returns the same id.
func (h Handle) entryID() uint64 {
	if h.e == nil {
		return 0
	}
	return h.e.id
}

// sync applies the monitor's pending events, as the next Register would.
func (c *Cache) sync() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.epoch.Load() != c.applied {
		c.drainLocked()
	}
}

// lockForTest holds the cache's lock until the returned func is called.
func (c *Cache) lockForTest() func() {
	c.mu.Lock()
	return c.mu.Unlock
}

// pinCount returns the pin count of the page at addr.
func (c *Cache) pinCount(addr uintptr) int32 {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := c.pins.search(addr)
	if i < len(c.pins.segs) && c.pins.segs[i].lo <= addr {
		return c.pins.segs[i].n
	}
	return 0
}

// cachedLen returns the number of entries in the index.
func (c *Cache) cachedLen() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.idx.len()
}
