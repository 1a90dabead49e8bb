package pin_test

import (
	"fmt"

	"github.com/sandirect/sandirect/pin"
)

// A buffer from pin.Alloc is cached whatever monitor runs: the second
// registration is a hit.
func Example() {
	c, err := pin.New(nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer c.Close()
	buf, err := pin.Alloc(64 << 10)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer pin.Free(buf)
	for range 2 {
		h, err := c.Register(buf, pin.AccessLocalWrite)
		if err != nil {
			fmt.Println(err)
			return
		}
		// … post RDMA work on h.Region() …
		c.Deregister(h)
	}
	st := c.Stats()
	fmt.Println("gets", st.Gets, "hits", st.Hits, "misses", st.Misses)
	// Output: gets 2 hits 1 misses 1
}
