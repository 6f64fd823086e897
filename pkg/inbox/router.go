package inbox

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sort"

	"github.com/jackc/pgx/v5"
)

// Handler applies one message inside the open transaction tx, which also holds the message's
// inbox row. Do every database effect through tx and neither commit nor roll it back: the
// consumer commits after the handler returns nil and rolls back (inbox row included) when it
// returns an error or panics. In the batched mode tx is the batch transaction, or a savepoint
// of it: after a handler of the batch fails, the consumer rolls the batch back and applies it
// again with a savepoint per record, so a handler can run twice for one delivery (its database
// effects are committed once).
//
// Side effects outside the database (HTTP calls, e-mails) are not covered by the transaction
// and may happen more than once; make them idempotent or put them in an outbox.
type Handler func(ctx context.Context, tx pgx.Tx, msg Message) error

// UnknownPolicy decides what happens to a message whose event type has no handler.
type UnknownPolicy int

const (
	// FailUnknown fails the record (it comes back, and reaches the DLQ after maxReceiveCount).
	// Nothing is silently dropped. The default.
	FailUnknown UnknownPolicy = iota
	// SkipUnknown records the message in the inbox as processed without running a handler.
	// Use it when the topic carries event types this consumer does not care about.
	SkipUnknown
)

// Router maps event types to handlers. Register every handler before the router is used;
// a Router is safe for concurrent use once registration is done.
type Router struct {
	// OnUnknown decides what happens to an event type without a handler. Defaults to FailUnknown.
	OnUnknown UnknownPolicy

	handlers map[string]Handler
}

// NewRouter returns an empty Router with the given policy for unknown event types.
func NewRouter(onUnknown UnknownPolicy) *Router {
	return &Router{OnUnknown: onUnknown, handlers: map[string]Handler{}}
}

// Handle registers h for eventType. Like http.ServeMux, it panics on an empty event type, a nil
// handler or a second registration of the same type: these are programming errors.
func (r *Router) Handle(eventType string, h Handler) {
	if eventType == "" {
		panic("inbox: Router.Handle with an empty event type")
	}
	if h == nil {
		panic("inbox: Router.Handle with a nil handler for " + eventType)
	}
	if r.handlers == nil {
		r.handlers = map[string]Handler{}
	}
	if _, dup := r.handlers[eventType]; dup {
		panic("inbox: Router.Handle called twice for " + eventType)
	}
	r.handlers[eventType] = h
}

// EventTypes returns the registered event types, sorted.
func (r *Router) EventTypes() []string {
	out := make([]string, 0, len(r.handlers))
	for t := range r.handlers {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// lookup returns the handler for eventType, or nil with skip=true when the message is to be
// recorded without effect, or an error wrapping ErrUnknownEventType.
func (r *Router) lookup(eventType string) (h Handler, skip bool, err error) {
	if h, ok := r.handlers[eventType]; ok {
		return h, false, nil
	}
	if r.OnUnknown == SkipUnknown {
		return nil, true, nil
	}
	return nil, false, fmt.Errorf("%w %q", ErrUnknownEventType, eventType)
}

// PanicError is the error of a handler that panicked. It wraps ErrHandlerPanic.
type PanicError struct {
	// Value is what the handler passed to panic.
	Value any
	// Stack is the goroutine's stack at the panic.
	Stack []byte
}

func (e *PanicError) Error() string { return fmt.Sprintf("%v: %v", ErrHandlerPanic, e.Value) }

// Unwrap returns ErrHandlerPanic.
func (e *PanicError) Unwrap() error { return ErrHandlerPanic }

// call runs h and turns a panic into a *PanicError.
func call(ctx context.Context, h Handler, tx pgx.Tx, msg Message) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &PanicError{Value: p, Stack: debug.Stack()}
		}
	}()
	return h(ctx, tx, msg)
}

// errSwallowed is the failure of a handler that returned nil although one of its statements
// failed: PostgreSQL has aborted the transaction, so its work cannot commit.
var errSwallowed = errors.New("handler returned nil after a failed statement (the transaction is aborted)")

// runHandler calls h for msg in tx and returns the record's failure, naming the message: the
// handler's error or panic, or errSwallowed when it returned nil but left tx aborted. Every mode
// calls handlers through it, so a swallowed error fails its record the same way everywhere.
func runHandler(ctx context.Context, h Handler, tx pgx.Tx, msg Message) error {
	err := call(ctx, h, tx, msg)
	if err == nil && tx.Conn().PgConn().TxStatus() == 'E' {
		err = errSwallowed
	}
	if err != nil {
		return &handlerError{err: err, text: fmt.Sprintf("message %s (%s): handler: %v", msg.ID, msg.EventType, err)}
	}
	return nil
}

// handlerError is a handler's failure, as runHandler reports it: the dead letter's class says
// the handler failed (ClassHandler) whatever its error wraps.
type handlerError struct {
	err  error
	text string
}

func (e *handlerError) Error() string { return e.text }
func (e *handlerError) Unwrap() error { return e.err }
