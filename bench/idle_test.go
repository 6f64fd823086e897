package main

import (
	"testing"
	"time"
)

// The idle-cost figure's arithmetic and verdict: a 10 s invocation a minute at 512 MB is about
// $2.89 a month (docs/deploy.md), within the target; a relay that polls all month is not.
func TestIdleCostArithmeticAndVerdict(t *testing.T) {
	if got := monthly(10 * time.Second); got < 2.88 || got > 2.90 {
		t.Fatalf("monthly(10s) = %.4f, want about 2.89", got)
	}
	r := &Report{IdleCost: &IdleCostResult{AlwaysOnDollars: 86.4, Runs: []IdleRun{{IdleStop: 10 * time.Second, Took: 10 * time.Second, Dollars: monthly(10 * time.Second)}}}}
	if ts := r.idleCostTargets(); len(ts) != 1 || ts[0].Status != "met" {
		t.Fatalf("targets = %+v, want one met", ts)
	}
	r.IdleCost.Runs[0].Dollars = monthly(5 * time.Minute)
	if ts := r.idleCostTargets(); ts[0].Status == "met" {
		t.Fatalf("a 5-minute run a minute (%.2f $) must not meet the target", r.IdleCost.Runs[0].Dollars)
	}
}
