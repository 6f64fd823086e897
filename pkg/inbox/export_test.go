package inbox

import "time"

// SetClock makes c read the time from now (the deadline checks), so tests control time.
func SetClock(c *Consumer, now func() time.Time) { c.now = now }

// DefaultBackoff is ProcessorConfig.Backoff's default.
var DefaultBackoff = defaultBackoff

// The Processor's statements, for tests that EXPLAIN them.
const (
	ClaimSQL = claimSQL
	LockSQL  = lockSQL
)
