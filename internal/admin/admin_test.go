package admin

import (
	"errors"
	"testing"
)

func TestPurgeBatch(t *testing.T) {
	t.Parallel()
	for in, want := range map[int]int{0: DefaultPurgeBatchSize, 1: 1, 70_000: 70_000} {
		if got, err := PurgeBatch(in); err != nil || got != want {
			t.Errorf("PurgeBatch(%d) = %d, %v; want %d", in, got, err, want)
		}
	}
	if _, err := PurgeBatch(-1); !errors.Is(err, ErrInvalidBatchSize) {
		t.Errorf("PurgeBatch(-1): %v, want ErrInvalidBatchSize", err)
	}
}
