package inbox

// The Processor's statements, for tests that EXPLAIN them.
const (
	ClaimSQL = claimSQL
	LockSQL  = lockSQL
)
