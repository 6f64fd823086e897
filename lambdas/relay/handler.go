package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/aws/aws-lambda-go/events"

	"github.com/sluicehq/sluice/pkg/outbox"
	"github.com/sluicehq/sluice/pkg/partition"
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
	// db and partitions maintain a partitioned outbox_event at each invocation (nil: never, the
	// default: only a relay explicitly given SLUICE_OUTBOX_RETENTION or
	// SLUICE_OUTBOX_PARTITION_INTERVAL, which then needs the table owner's privileges).
	db         partition.DB
	partitions *partition.Options
}

// maintainBudget bounds an invocation's partition maintenance.
const maintainBudget = 10 * time.Second

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

// stopTime is when an invocation that started at start stops: stopBefore ahead of its
// deadline (noDeadlineRun after start without one, as when invoked by hand).
func stopTime(ctx context.Context, start time.Time, stopBefore time.Duration) time.Time {
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = start.Add(noDeadlineRun + stopBefore)
	}
	return deadline.Add(-stopBefore)
}

// Handle runs the relay until stopBefore ahead of the invocation's deadline. When less time
// than that is left, it drains once with what remains. It fails only when the outbox cannot
// be read at all, so that the invocation's error metric tells an operator.
func (h *handler) Handle(ctx context.Context, ev events.EventBridgeEvent) (Result, error) {
	start := time.Now()
	stopAt := stopTime(ctx, start, h.stopBefore)
	h.log.InfoContext(ctx, "relay invocation", "event_id", ev.ID, "scheduled_at", ev.Time, "stop_at", stopAt)
	maintained := make(chan struct{})
	go func() {
		defer close(maintained)
		h.maintain(ctx)
	}()
	defer func() { <-maintained }()
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

// maintain keeps a partitioned outbox_event's partitions created ahead, and drops the expired
// ones when a retention is set, alongside the relay, when the relay was asked to (partitions
// set); on a plain table it costs one catalog read. It never fails the invocation: problems are
// logged, and the next invocation tries again (rows beyond the partitions created go to the
// default partition meanwhile, nothing fails). In the CDK stack the relay is not asked: its
// role may not create or drop tables, and the migrate function's schedule maintains both
// tables as their owner.
func (h *handler) maintain(ctx context.Context) {
	if h.partitions == nil || h.db == nil {
		return
	}
	mctx, cancel := context.WithTimeout(ctx, maintainBudget)
	defer cancel()
	rep, err := partition.Maintain(mctx, h.db, partition.Outbox, h.partitions)
	for _, p := range rep.Created {
		h.log.InfoContext(ctx, "outbox partition created", "partition", p.String())
	}
	for _, p := range rep.Dropped {
		h.log.InfoContext(ctx, "outbox partition dropped", "partition", p.String(), "rows_estimate", p.Rows)
	}
	for _, k := range rep.Kept {
		h.log.DebugContext(ctx, "outbox partition kept", "partition", k.String(), "reason", k.Reason)
	}
	if rep.Purged > 0 {
		h.log.InfoContext(ctx, "expired rows deleted from the outbox's default partition", "rows", rep.Purged)
	}
	for _, w := range rep.Warnings {
		h.log.WarnContext(ctx, "outbox partitions: "+w)
	}
	if err != nil {
		h.log.WarnContext(ctx, "outbox partition maintenance failed; the next invocation tries again", "error", err)
	}
}
