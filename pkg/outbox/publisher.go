package outbox

import (
	"context"
	"errors"
)

// Publisher sends events to a broker. The relay calls PublishBatch with at most 10 events of
// one destination, each from a different partition key, and several calls at once.
type Publisher interface {
	// PublishBatch publishes events to destination (an SNS topic ARN) and returns one error
	// per event, in order: nil means the broker acknowledged that event. Wrap errors that can
	// never succeed on retry with Permanent so the row is quarantined at once.
	PublishBatch(ctx context.Context, destination string, events []*Event) []error
}

// permanentError marks a publish failure that retrying cannot fix.
type permanentError struct{ err error }

func (e *permanentError) Error() string { return e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err as a failure that cannot succeed on retry (message too large, unknown
// topic, invalid parameter): the relay quarantines the row at once instead of backing off.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err: err}
}

// IsPermanent reports whether err was marked with Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}

// fillErrors returns n copies of err: a whole-call failure applies to every entry.
func fillErrors(n int, err error) []error {
	errs := make([]error, n)
	for i := range errs {
		errs[i] = err
	}
	return errs
}
