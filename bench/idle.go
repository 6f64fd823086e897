package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/sluicehq/sluice/pkg/outbox"
)

// IdleCostResult is the idle-cost figure of issue 25 (item 4): what a scheduled relay in the
// idle mode (RelayConfig.IdleStop) costs on an outbox with nothing to publish, measured as the
// relay Lambda runs it (Run until idle), and what the always-running relay costs.
type IdleCostResult struct {
	// Runs are the measured idle runs, one per IdleStop value.
	Runs []IdleRun
	// AlwaysOnDollars is the default stack's relay: 5 overlapping 5-minute invocations of
	// 512 MB all month (docs/deploy.md's cost table).
	AlwaysOnDollars float64
}

// IdleRun is one IdleStop value's measurement: Samples runs of Relay.Run on an empty outbox.
type IdleRun struct {
	IdleStop time.Duration
	Samples  int
	// Took is the longest of the runs (start to return); Statements the most statements (and
	// batches) one run sent.
	Took       time.Duration
	Statements int64
	// Dollars is a month of one such run a minute at 512 MB: requests and GB-seconds.
	Dollars float64
}

// Lambda's us-east-1 prices (arm64 is cheaper still; the cost table uses these), and the
// schedule: one invocation a minute, EventBridge's floor.
const (
	lambdaGBSecond      = 0.0000133334
	lambdaPerRequest    = 0.20 / 1e6
	relayMemoryGB       = 0.5
	invocationsPerMonth = 43_200
	// idleCostTarget is issue 25's "a few dollars a month" for an idle outbox.
	idleCostTarget = 5.0
)

// monthly is the cost of invocationsPerMonth invocations of d each at relayMemoryGB.
func monthly(d time.Duration) float64 {
	return invocationsPerMonth * (d.Seconds()*relayMemoryGB*lambdaGBSecond + lambdaPerRequest)
}

// runIdleCostSuite runs Relay.Run with IdleStop on an empty outbox, as the relay Lambda's
// invocation does in the idle mode, and records how long it takes to give up and how many
// statements it sends meanwhile.
func runIdleCostSuite(ctx context.Context, log *slog.Logger, env *Env, _ Sizes, rep *Report) error {
	tracer := newRelayTracer()
	pool, _, err := env.NewDatabase(ctx, "idlecost", 8, tracer)
	if err != nil {
		return err
	}
	defer pool.Close()
	res := &IdleCostResult{AlwaysOnDollars: 5 * 2_592_000 * relayMemoryGB * lambdaGBSecond}
	for _, stop := range []time.Duration{time.Second, 10 * time.Second} {
		run := IdleRun{IdleStop: stop, Samples: 3}
		for range run.Samples {
			r, err := outbox.NewRelay(pool, outbox.RelayConfig{Publisher: &ackPublisher{book: newWaitBook()},
				Topics: map[string]string{"orders": ordersARN}, IdleStop: stop})
			if err != nil {
				return err
			}
			tracer.reset()
			start := time.Now()
			if err := r.Run(ctx); err != nil {
				return err
			}
			run.Took = max(run.Took, time.Since(start))
			run.Statements = max(run.Statements, tracer.traced())
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
		run.Dollars = monthly(run.Took)
		log.Info("idle cost", "idle_stop", stop, "took", run.Took, "statements", run.Statements, "dollars_per_month", fmt.Sprintf("%.2f", run.Dollars))
		res.Runs = append(res.Runs, run)
	}
	rep.IdleCost = res
	return nil
}

// idleCostMarkdown writes the idle-cost section.
func (r *Report) idleCostMarkdown(w func(string, ...any)) {
	ic := r.IdleCost
	if ic == nil {
		return
	}
	w("## 14. Idle cost of the relay's idle mode (issue 25)\n\n")
	w("`Relay.Run` with `RelayConfig.IdleStop` on an empty outbox (a stub broker, the relay's other settings at their defaults), " +
		"what one relay Lambda invocation runs in the idle mode: it returns once no round is in flight and none claimed a row for " +
		"`IdleStop`. Each row is the longest of its runs and the most statements one run sent (BEGIN and COMMIT included). The month " +
		"is one such invocation a minute (EventBridge's floor) at 512 MB, us-east-1 prices ($0.0000133334 per GB-s, $0.20 per million " +
		"requests), before Lambda's start-up and the network round trip to RDS, which the cost table in docs/deploy.md allows for.\n\n")
	w("| IdleStop | runs | longest run | statements per run | $ per month |\n|---:|---:|---:|---:|---:|\n")
	for _, run := range ic.Runs {
		w("| %s | %d | %s | %d | **$%.2f** |\n", run.IdleStop, run.Samples, dur(run.Took), run.Statements, run.Dollars)
	}
	w("| always running (the default) | | 5 overlapping 5-minute invocations | | $%.2f |\n\n", ic.AlwaysOnDollars)
	w("The trade-off: the first event after a quiet spell waits for the next scheduled invocation, up to a minute plus a cold " +
		"start; under traffic an invocation keeps publishing until its timeout, as without the mode.\n\n")
}

// idleCostTargets is the idle-cost row of the targets table.
func (r *Report) idleCostTargets() []target {
	ic := r.IdleCost
	if ic == nil || len(ic.Runs) == 0 {
		return nil
	}
	worst := ic.Runs[len(ic.Runs)-1]
	return []target{{25, "An idle outbox costs almost nothing (the relay's idle mode)",
		fmt.Sprintf("a few dollars a month (≤ $%.0f) for the relay of an idle outbox", idleCostTarget),
		fmt.Sprintf("$%.2f a month with IdleStop %s (%s per invocation), against $%.2f always running", worst.Dollars, worst.IdleStop, dur(worst.Took), ic.AlwaysOnDollars),
		verdict(worst.Dollars <= idleCostTarget)}}
}

// traced returns the statements and batches traced since the last reset.
func (t *relayTracer) traced() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return int64(t.count)
}
