// Package admin is what the operator functions of pkg/outbox and pkg/inbox share, so that the
// same idea has the same value and meaning in both: the purge batch default, the refusal of a
// negative batch size, the error of an empty selection, and the batched row purges that
// Purge and partition maintenance (pkg/partition, for a default partition) both run, and the
// reads of how long a Kinesis stream or a Kafka topic keeps its records, which bound how long
// an inbox must keep its rows (the CLI's retention guard).
package admin

import (
	"errors"
	"fmt"
)

// DefaultPurgeBatchSize is the most rows one DELETE statement of a purge removes: short enough
// that no statement holds its locks or writes its WAL for long (tens of milliseconds), large
// enough that the per-statement cost does not matter (the outbox purges about 420,000 rows/s
// in batches of this size, BENCHMARKS.md section 5).
const DefaultPurgeBatchSize = 5000

// ErrInvalidBatchSize refuses a negative batch size. Zero means the default.
var ErrInvalidBatchSize = errors.New("batch size must not be negative (0 means the default)")

// ErrNothingSelected refuses an empty selection of rows to act on: "retry these rows" with no
// rows is a mistake (a filter that matched nothing), never "retry all", which has functions of
// its own.
var ErrNothingSelected = errors.New("no rows selected")

// PurgeBatch returns the batch size a purge uses for BatchSize n: DefaultPurgeBatchSize for 0,
// n when positive, and an error wrapping ErrInvalidBatchSize when negative.
func PurgeBatch(n int) (int, error) {
	switch {
	case n < 0:
		return 0, fmt.Errorf("%w, got %d", ErrInvalidBatchSize, n)
	case n == 0:
		return DefaultPurgeBatchSize, nil
	}
	return n, nil
}
