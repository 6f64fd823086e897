package outbox

import (
	"context"
	"errors"
)

// Publisher sends events to a broker (SNS, EventBridge, Kinesis, Kafka, or your own). The
// relay calls PublishBatch with at most as many events of one destination as its Limits allow
// (a Publisher that is not a LimitedPublisher gets SNS's 10 entries and 256 KiB), each from a
// different partition key, and several calls at once.
type Publisher interface {
	// PublishBatch publishes events to destination (one of RelayConfig.Topics' values) and
	// returns one error per event, in order: nil means the broker acknowledged that event. Wrap
	// errors that can never succeed on retry with Permanent so the row is quarantined at once.
	// When the request failed as a whole (a throttle, a timeout), return CallFailed(len(events),
	// err): it then counts as no attempt of the rows.
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

// callError marks an error as its call's: the request failed as a whole, not an entry of it.
type callError struct{ err error }

func (e *callError) Error() string { return e.err.Error() }
func (e *callError) Unwrap() error { return e.err }

// CallFailed returns what a Publisher returns for a call of n events whose request failed as a
// whole (a throttle, a timeout, a 5xx): n copies of err, marked as the call's failure. The relay
// then counts no attempt against the rows: they back off, or, when nothing sent to the
// destination succeeds, the destination does.
func CallFailed(n int, err error) []error {
	ce := &callError{err: err}
	errs := make([]error, n)
	for i := range errs {
		errs[i] = ce
	}
	return errs
}
