package stats

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

// Environment variables read once, when the package is first used, to
// override DefaultConfig for the process-wide publisher. Configure
// overrides both.
const (
	// EnvDisable set to a true boolean ("1", "true") turns publishing off.
	EnvDisable = "SANDIRECT_STATS_OFF"
	// EnvInterval is the refresh period as a Go duration ("250ms").
	EnvInterval = "SANDIRECT_STATS_INTERVAL"
)

// Config configures the process-wide publisher. The zero value is not
// valid; a nil *Config means DefaultConfig.
type Config struct {
	// Interval is how often the background goroutine asks every source
	// for its counters and rewrites the table: 1 ms … 1 h.
	Interval time.Duration
	// Disable turns publishing off: sources stay registered but no
	// goroutine, socket or segment exists.
	Disable bool
}

// DefaultConfig returns the defaults: a refresh every 100 ms, publishing on.
func DefaultConfig() Config { return Config{Interval: 100 * time.Millisecond} }

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	if c.Interval < time.Millisecond || c.Interval > time.Hour {
		return fmt.Errorf("stats: Interval %v outside [1ms, 1h]", c.Interval)
	}
	return nil
}

// envConfig is DefaultConfig overridden by the environment; a bad value is
// ignored and reported.
func envConfig() (Config, error) {
	c := DefaultConfig()
	var err error
	if v := os.Getenv(EnvDisable); v != "" {
		off, perr := strconv.ParseBool(v)
		if perr != nil {
			err = fmt.Errorf("stats: %s=%q: not a boolean", EnvDisable, v)
		}
		c.Disable = off
	}
	if v := os.Getenv(EnvInterval); v != "" {
		d, perr := time.ParseDuration(v)
		if perr == nil {
			cd := c
			cd.Interval = d
			perr = cd.Validate()
		}
		if perr != nil {
			err = fmt.Errorf("stats: %s=%q: want a duration in [1ms, 1h]", EnvInterval, v)
		} else {
			c.Interval = d
		}
	}
	return c, err
}
