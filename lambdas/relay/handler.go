package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/sluicehq/sluice/pkg/outbox"
)

// noDeadlineRun bounds an invocation whose context has no deadline (never the case in Lambda).
const noDeadlineRun = 50 * time.Second

// runner is what the handler needs of *outbox.Relay.
type runner interface {
	Run(ctx context.Context) error
	RunOnce(ctx context.Context) (outbox.Stats, error)
}

var _ runner = (*outbox.Relay)(nil)

// handler runs the relay for one scheduled invocation.
type handler struct {
	relay      runner
	lag        outbox.Querier
	stopBefore time.Duration
	log        *slog.Logger
}

// Result is the invocation's response: what was left when the relay stopped.
type Result struct {
	// RanFor is how long the relay ran, e.g. "54.9s".
	RanFor string `json:"ranFor"`
	// Pending is the number of unpublished, unquarantined rows when it stopped.
	Pending int64 `json:"pending"`
	// OldestPendingAgeSeconds is the age of the oldest of them.
	OldestPendingAgeSeconds float64 `json:"oldestPendingAgeSeconds"`
	// Quarantined is the number of quarantined rows.
	Quarantined int64 `json:"quarantined"`
}

// Handle runs the relay until stopBefore ahead of the invocation's deadline. When less time
// than that is left, it drains once with what remains. It fails only when the outbox cannot
// be read at all, so that the invocation's error metric tells an operator.
func (h *handler) Handle(ctx context.Context, ev events.EventBridgeEvent) (Result, error) {
	start := time.Now()
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = start.Add(noDeadlineRun + h.stopBefore)
	}
	stopAt := deadline.Add(-h.stopBefore)
	h.log.InfoContext(ctx, "relay invocation", "event_id", ev.ID, "scheduled_at", ev.Time, "stop_at", stopAt)
	if time.Until(stopAt) <= 0 {
		if _, err := h.relay.RunOnce(ctx); err != nil {
			return Result{}, fmt.Errorf("drain outbox: %w", err)
		}
	} else {
		runCtx, cancel := context.WithDeadline(ctx, stopAt)
		err := h.relay.Run(runCtx)
		cancel()
		if err != nil {
			return Result{}, fmt.Errorf("run relay: %w", err)
		}
	}
	res := Result{RanFor: time.Since(start).Round(100 * time.Millisecond).String()}
	lagCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	lag, err := outbox.LagOf(lagCtx, h.lag)
	if err != nil {
		return Result{}, fmt.Errorf("read outbox lag: %w", err)
	}
	res.Pending, res.OldestPendingAgeSeconds, res.Quarantined = lag.Pending, lag.OldestPendingAge.Seconds(), lag.Quarantined
	return res, nil
}
