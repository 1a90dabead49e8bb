package nic

import (
	"reflect"
	"testing"
	"time"
)

// TestConfigDefaults: a zero field means its default, merged field by
// field, and a partly filled Config opens a device.
func TestConfigDefaults(t *testing.T) {
	d := DefaultConfig()
	for _, tc := range []struct {
		name string
		cfg  *Config
		want func(c *Config)
	}{
		{"nil", nil, func(*Config) {}},
		{"zero", &Config{}, func(*Config) {}},
		{"regions", &Config{MaxRegions: 16}, func(c *Config) { c.MaxRegions = 16 }},
		{"no-read", &Config{NoRDMARead: true, RNRTimeout: time.Millisecond}, func(c *Config) { c.NoRDMARead, c.RNRTimeout = true, time.Millisecond }},
		{"none-inline", &Config{MaxInline: -1, InlineExec: -1}, func(c *Config) { c.MaxInline, c.InlineExec = 0, 0 }},
		{"ring", &Config{RingCapacity: 64 << 10}, func(c *Config) { c.RingCapacity = 64 << 10 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dev, err := Open(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer dev.Close()
			want := d
			tc.want(&want)
			if got := dev.Config(); !reflect.DeepEqual(got, want) {
				t.Fatalf("config in force %+v, want %+v", got, want)
			}
			if dev.Attr().RDMARead == want.NoRDMARead {
				t.Fatalf("RDMARead %v with NoRDMARead %v", dev.Attr().RDMARead, want.NoRDMARead)
			}
		})
	}
	if err := (Config{RingCapacity: 3000}).Validate(); err == nil {
		t.Fatal("a ring capacity that is no power of two validates")
	}
}
