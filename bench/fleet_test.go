package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/pgcluster"
	"github.com/sluicehq/sluice/pkg/fleet"
)

// The suite at a tiny size, at the fleet's default budget, on its own TLS and scram-sha-256
// server: every quiet event and every backlog published, each event under its writer's tenant
// header, the fleet never above its budget, and the cost counters read.
func TestFleetSuiteSmoke(t *testing.T) {
	ctx, log := clusterTest(t, 8*time.Minute)
	c, err := pgcluster.Start(ctx, pgcluster.Options{})
	if err != nil {
		t.Fatal(err)
	}
	env := &Env{AdminURL: c.URL, Source: "test cluster", cluster: c, log: log}
	t.Cleanup(env.Close)

	fs := fleetSize{Tenants: []int{4, 6}, Runs: 1, QuietRate: 10, Backlog: FleetBacklog{Rows: 2_000, Transactions: 40, Keys: 50, Writers: 2},
		IdleWindow: 2 * time.Second, QuietWindow: 3 * time.Second, Timeout: 2 * time.Minute, DrainBox: 2 * time.Minute}
	res, err := measureFleet(ctx, log, env, fs)
	if err != nil {
		t.Fatal(err)
	}
	if res.Budget != fleet.DefaultServerConnections || !strings.Contains(res.Auth, "scram-sha-256 over TLS") {
		t.Errorf("budget %d (want the default %d), auth %q", res.Budget, fleet.DefaultServerConnections, res.Auth)
	}
	if len(res.Runs) != 2 || res.Runs[0].Tenants != 4 || res.Runs[1].Tenants != 6 {
		t.Fatalf("runs: %+v", res.Runs)
	}
	for _, r := range res.Runs {
		for _, p := range []FleetPhase{r.Without, r.With} {
			if p.QuietEvents == 0 || p.Missing != 0 || p.Quiet.N != p.QuietEvents || p.QuietTenants != r.Tenants-1 {
				t.Errorf("%d tenants, %s: %d quiet events, %d never published, %d measured, %d quiet tenants", r.Tenants, p.Name, p.QuietEvents, p.Missing, p.Quiet.N, p.QuietTenants)
			}
			if p.Statements <= 0 || p.Xacts <= 0 {
				t.Errorf("%d tenants, %s: %.1f statements/s, %.1f transactions/s", r.Tenants, p.Name, p.Statements, p.Xacts)
			}
		}
		for name, d := range map[string]FleetDrain{"fleet": r.With.Drain, "reference": r.Reference, "cold": r.Cold, "cold reference": r.ColdReference} {
			if d.TimedOut || d.Rows != fs.Backlog.Rows || d.Rate() <= 0 {
				t.Errorf("%d tenants, %s drain: %+v", r.Tenants, name, d)
			}
		}
		if r.With.Drain.Write <= 0 || r.With.QuietDuringDrain.N == 0 || r.Reference.Pipelines != 2 {
			t.Errorf("%d tenants, the drain with quiet writers: written in %s, %d quiet events during it, reference pipelines %d",
				r.Tenants, r.With.Drain.Write, r.With.QuietDuringDrain.N, r.Reference.Pipelines)
		}
		if r.Connects < r.Tenants || r.ConnectTime <= 0 {
			t.Errorf("%d tenants: %d connects timed (%s), fewer than a first turn each", r.Tenants, r.Connects, r.ConnectTime)
		}
		var claims int
		for _, st := range r.HotStatements {
			if st.Kind == stmtLock {
				claims = st.N
			}
		}
		if claims == 0 {
			t.Errorf("%d tenants: the hot tenant's claims were not traced: %+v", r.Tenants, r.HotStatements)
		}
		if r.HeaderMismatches != 0 {
			t.Errorf("%d tenants: %d events carried another tenant's header", r.Tenants, r.HeaderMismatches)
		}
		if r.BudgetPeak == 0 || r.BudgetPeak > res.Budget || r.ConnsMax == 0 || r.ConnsMax > res.Budget {
			t.Errorf("%d tenants: budget %d: granted at most %d at once, %d sessions seen", r.Tenants, res.Budget, r.BudgetPeak, r.ConnsMax)
		}
		if r.Idle.Tenants != r.Tenants || r.Idle.ActivityConnsMax != 1 || r.Idle.Statements < 0 {
			t.Errorf("%d tenants, idle: %+v", r.Tenants, r.Idle)
		}
	}
	var b strings.Builder
	res.markdown(func(f string, a ...any) { fmt.Fprintf(&b, f, a...) })
	if !strings.Contains(b.String(), "## 17. Fleet: 4 and 6 tenant databases on one server") || !strings.Contains(b.String(), "| | 4 tenants, run 1 | 6 tenants, run 1 |") {
		t.Errorf("section:\n%s", b.String())
	}
	if ts := res.targets(); len(ts) != 6 || ts[2].Status != "met" || ts[5].Status != "met" {
		t.Errorf("targets: %+v", ts)
	}
}

// The verdicts follow the bounds, per number of tenants and over every run of it: fairness on
// what the backlog adds at p99 over the whole window and over its drain (and any event never
// published fails it), the drain on 80% of the reference relay, the budget on both the fleet's
// count and the server's.
func TestFleetTargets(t *testing.T) {
	t.Parallel()
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	run := func(tenants, n int, withP99, drainP99 time.Duration, fleetDrain time.Duration) FleetRun {
		return FleetRun{Tenants: tenants, Run: n, BudgetPeak: 20, ConnsMax: 20,
			Without: FleetPhase{Quiet: Latencies{N: 10, P50: ms(400), P99: ms(1200), Max: ms(1500)}},
			With: FleetPhase{Quiet: Latencies{N: 10, P50: ms(700), P99: withP99}, QuietDuringDrain: Latencies{N: 5, P99: drainP99}, Window: 30 * time.Second,
				Drain: FleetDrain{Rows: 100_000, Elapsed: fleetDrain}},
			Reference: FleetDrain{Rows: 100_000, Pipelines: 2, Elapsed: 8 * time.Second}}
	}
	status := func(r *FleetResult) []string {
		var s []string
		for _, t := range r.targets() {
			s = append(s, t.Status)
		}
		return s
	}
	res := &FleetResult{Budget: 20, Backlog: FleetBacklog{Rows: 100_000}, Runs: []FleetRun{
		run(200, 1, ms(2200), ms(2200), 10*time.Second), run(200, 2, ms(1500), ms(2000), 9*time.Second), run(1000, 1, ms(2201), ms(1000), 10*time.Second)}}
	got := status(res)
	if len(got) != 6 || got[0] != "met" || got[1] != "met" || got[2] != "met" || got[3] == "met" || got[4] != "met" {
		t.Errorf("200 tenants at +1 s and 80%%, 1,000 at +1.001 s: %v, want 200 all met, 1,000 fairness not met", got)
	}
	// The drain part of the window counts as much as the whole window.
	res.Runs[1].With.QuietDuringDrain.P99 = ms(2201)
	if got := status(res); got[0] == "met" {
		t.Errorf("+1.001 s during the drain in run 2: %v, want fairness not met", got)
	}
	res.Runs[1].With.QuietDuringDrain.P99 = ms(2000)
	res.Runs[0].With.Drain.Elapsed = 10_001 * time.Millisecond
	res.Runs[1].With.Missing = 1
	res.Runs[2].ConnsMax = 21
	if got := status(res); got[0] == "met" || got[1] == "met" || got[5] == "met" {
		t.Errorf("79.99%% of the relay, an event never published, 21 sessions on 20: %v, want fairness, drain and budget not met", got)
	}
	var b strings.Builder
	res.markdown(func(f string, a ...any) { fmt.Fprintf(&b, f, a...) })
	for _, want := range []string{"| | 200 tenants, run 1 | 200 tenants, run 2 | 1,000 tenants, run 1 |",
		"| **added by the backlog at p99** (whole window / during the drain; target ≤ 1 s) | **+1.00 s / +1.00 s** | **+300.00 ms / +800.00 ms** | **+1.00 s / −200.00 ms** |",
		"| **fleet ÷ reference** (target ≥ 80%) | **80%** | **89%** | **80%** |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("the section lacks %q:\n%s", want, b.String())
		}
	}
}
