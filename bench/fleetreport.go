package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/sluicehq/sluice/pkg/fleet"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// The fleet suite's section and targets (issues 24 and 42): every run side by side, one column
// each, and a verdict per target and number of tenants.

// label names a run's column.
func (r FleetRun) label() string {
	return fmt.Sprintf("%s tenants, run %d", num(float64(r.Tenants)), r.Run)
}

// added is what the backlog added to the quiet tenants' p50 and p99: over the whole window
// with it, and over the events committed while it was pending (the window's first part).
func (r FleetRun) added() (p50, p99, drainP99 time.Duration) {
	w, o := r.With, r.Without.Quiet
	p50, p99 = w.Quiet.P50-o.P50, w.Quiet.P99-o.P99
	if w.QuietDuringDrain.N > 0 {
		drainP99 = w.QuietDuringDrain.P99 - o.P99
	}
	return p50, p99, drainP99
}

// drainRatio is the fleet's drain rate of the backlog over the reference relay's.
func (r FleetRun) drainRatio() float64 {
	if r.Reference.Rate() == 0 {
		return 0
	}
	return r.With.Drain.Rate() / r.Reference.Rate()
}

// missing counts the quiet events never published within a minute.
func (r FleetRun) missing() int { return r.Without.Missing + r.With.Missing }

// missingCell renders missing, and the events still unpublished when the fleet stopped.
func (r FleetRun) missingCell() string {
	s := fmt.Sprint(r.missing())
	if r.Unpublished > 0 {
		s += fmt.Sprintf(" (%d still not when the fleet stopped, two minutes after the last window)", r.Unpublished)
	}
	return s
}

// bySize groups the runs by their number of tenants, in the order run.
func (r *FleetResult) bySize() (sizes []int, runs map[int][]FleetRun) {
	runs = map[int][]FleetRun{}
	for _, x := range r.Runs {
		if _, ok := runs[x.Tenants]; !ok {
			sizes = append(sizes, x.Tenants)
		}
		runs[x.Tenants] = append(runs[x.Tenants], x)
	}
	return sizes, runs
}

// targets are issue 42's goals with their verdicts, per number of tenants: met when every run
// of that size met it.
func (r *FleetResult) targets() []target {
	if r == nil || len(r.Runs) == 0 {
		return nil
	}
	var ts []target
	sizes, runs := r.bySize()
	for _, n := range sizes {
		var fair, drain, budget []string
		okFair, okDrain, okBudget := true, true, true
		for _, x := range runs[n] {
			d50, d99, dd99 := x.added()
			worst := max(d99, dd99)
			m := fmt.Sprintf("run %d: p99 %s → %s (%s) over the %s window, %s over the backlog's %s drain; p50 %s",
				x.Run, dur(x.Without.Quiet.P99), dur(x.With.Quiet.P99), signed(d99), x.With.Window.Round(time.Second), signed(dd99),
				x.With.Drain.Elapsed.Round(100*time.Millisecond), signed(d50))
			if mi := x.missing(); mi > 0 {
				m += fmt.Sprintf("; %d events never published", mi)
				okFair = false
			}
			okFair = okFair && worst <= fleetTargetDelay && x.With.Quiet.N > 0
			fair = append(fair, m)
			ratio := x.drainRatio()
			okDrain = okDrain && ratio >= fleetTargetRatio && !x.With.Drain.TimedOut
			drain = append(drain, fmt.Sprintf("run %d: %s events/s against %s (%d pipelines on %d connections): %.0f%%", x.Run,
				num(x.With.Drain.Rate()), num(x.Reference.Rate()), x.Reference.Pipelines, x.Reference.Pipelines, 100*ratio))
			okBudget = okBudget && x.BudgetPeak <= r.Budget && x.ConnsMax <= r.Budget
			budget = append(budget, fmt.Sprintf("run %d: %d granted, %d sessions seen", x.Run, x.BudgetPeak, x.ConnsMax))
		}
		size := fmt.Sprintf("%s tenants", num(float64(n)))
		ts = append(ts,
			target{42, fmt.Sprintf("Fleet at its defaults, %s: a %s-row backlog's effect on the quiet tenants", size, num(float64(r.Backlog.Rows))),
				fmt.Sprintf("≤ %s added to their commit-to-publish at p99 (whole window and during the drain), every event published", dur(fleetTargetDelay)),
				strings.Join(fair, "; "), verdict(okFair)},
			target{42, fmt.Sprintf("Fleet at its defaults, %s: the backlog's drain rate", size),
				fmt.Sprintf("≥ %.0f%% of one relay given the same connections", 100*fleetTargetRatio), strings.Join(drain, "; "), verdict(okDrain)},
			target{42, fmt.Sprintf("Fleet at its defaults, %s: connections within the budget", size), fmt.Sprintf("never above the budget (%d)", r.Budget),
				strings.Join(budget, "; "), verdict(okBudget)})
	}
	return ts
}

func signed(d time.Duration) string {
	if d < 0 {
		return "−" + dur(-d)
	}
	return "+" + dur(d)
}

// markdown renders the suite's section.
func (r *FleetResult) markdown(w func(string, ...any)) {
	if r == nil || len(r.Runs) == 0 {
		return
	}
	sizes, _ := r.bySize()
	names := make([]string, len(sizes))
	for i, n := range sizes {
		names[i] = num(float64(n))
	}
	w("## 17. Fleet: %s tenant databases on one server, at the fleet's defaults (issues 24 and 42)\n\n", strings.Join(names, " and "))
	w("One `fleet.Fleet` (pkg/fleet) serves every tenant database of one PostgreSQL server, each a copy of one migrated database "+
		"(`CREATE DATABASE ... TEMPLATE`). Its settings: %s. It logs in %s. The broker is an in-process stub that waits %s per "+
		"`PublishBatch` call and records when it acknowledged each event and which tenant `%s` named. "+
		"One tenant, *hot*, gets backlogs of %s rows over %s partition keys, each written in %s transactions of %s rows by %d connections at once; "+
		"the other, *quiet*, tenants write %s events a second in all (each its own transaction with `outbox.Write`, on a connection of its own, "+
		"spread evenly: one event every %s per tenant at 200 tenants, every %s at 1,000). Each run, the fleet started afresh: "+
		"**cold start** on a backlog already in the hot tenant's database; **idle** for %s (nobody writes); the quiet tenants **without a backlog** "+
		"for %s; then **with** one, written from the window's start, the window lasting at least as long and until the backlog was drained. "+
		"The **reference** is one `outbox.Relay` on the hot tenant's database, logging in the same way, given as many connections as the fleet gives "+
		"one tenant at most (BurstPipelines: its pipelines on a pool of as many connections): started on the same cold backlog before the fleet, "+
		"and draining the same backlog written the same way beside the same quiet writers right after the fleet's window (the fleet stopped).\n\n",
		r.Settings, r.Auth, r.Delay, outbox.TenantHeader, num(float64(r.Backlog.Rows)), num(float64(r.Backlog.Keys)), num(float64(r.Backlog.Transactions)),
		num(float64(r.Backlog.Rows/max(1, r.Backlog.Transactions))), r.Backlog.Writers, num(r.QuietRate),
		time.Duration(float64(time.Second)*199/max(1, r.QuietRate)).Round(time.Millisecond), time.Duration(float64(time.Second)*999/max(1, r.QuietRate)).Round(time.Millisecond),
		r.Runs[0].Idle.Window.Round(time.Second), r.Runs[0].Without.Window.Round(time.Second))

	head := "| | " + strings.Join(mapRuns(r.Runs, func(x FleetRun) string { return x.label() }), " | ") + " |\n"
	w("%s|---|%s\n", head, strings.Repeat("---:|", len(r.Runs)))
	row := func(name string, f func(FleetRun) string) {
		w("| %s | %s |\n", name, strings.Join(mapRuns(r.Runs, f), " | "))
	}
	section := func(name string) { w("| **%s** |%s\n", name, strings.Repeat(" |", len(r.Runs))) }

	section("quiet tenants' commit-to-publish (Commit returned → the stub's acknowledgement)")
	row("without the backlog: events, p50 / p99 / max", func(x FleetRun) string { return phaseLatency(x.Without.QuietEvents, x.Without.Quiet) })
	row("with the backlog (whole window): events, p50 / p99 / max", func(x FleetRun) string { return phaseLatency(x.With.QuietEvents, x.With.Quiet) })
	row("with the backlog, events committed during its drain: events, p50 / p99 / max", func(x FleetRun) string {
		return phaseLatency(x.With.QuietDuringDrain.N, x.With.QuietDuringDrain)
	})
	row("**added by the backlog at p99** (whole window / during the drain; target ≤ 1 s)", func(x FleetRun) string {
		_, d99, dd99 := x.added()
		return fmt.Sprintf("**%s / %s**", signed(d99), signed(dd99))
	})
	row("added at p50 (whole window)", func(x FleetRun) string { d50, _, _ := x.added(); return signed(d50) })
	row("quiet events not published within a minute of their window's end", func(x FleetRun) string { return x.missingCell() })

	section("the backlog's drain")
	row("written in (its transactions' commits, while served)", func(x FleetRun) string { return x.With.Drain.Write.Round(time.Millisecond).String() })
	row("fleet: drained in, events/s", func(x FleetRun) string { return drainCell(x.With.Drain) })
	row("fleet: first event acknowledged after; hot tenant's relay sessions at most", func(x FleetRun) string {
		return fmt.Sprintf("%s; %d", x.With.Drain.FirstAck.Round(time.Millisecond), x.With.Drain.Pipelines)
	})
	row("reference relay: drained in, events/s (pipelines = connections)", func(x FleetRun) string {
		return drainCell(x.Reference) + fmt.Sprintf(" (%d)", x.Reference.Pipelines)
	})
	row("**fleet ÷ reference** (target ≥ 80%)", func(x FleetRun) string { return fmt.Sprintf("**%.0f%%**", 100*x.drainRatio()) })
	row("hot tenant's statements in the window: poll / sweep / claim / settle (n, time)", func(x FleetRun) string { return stmtCell(x.HotStatements) })

	section("cold start (the backlog present before the fleet started)")
	row("every tenant's first turn ended after", func(x FleetRun) string { return x.Startup.Round(time.Millisecond).String() })
	row("fleet: backlog drained after, events/s", func(x FleetRun) string { return drainCell(x.Cold) })
	row("reference relay started on it: drained after, events/s", func(x FleetRun) string { return drainCell(x.ColdReference) })
	row("fleet ÷ reference", func(x FleetRun) string {
		return fmt.Sprintf("%.0f%%", 100*rateRatio(x.Cold.Rate(), x.ColdReference.Rate()))
	})

	section("sessions the fleet opened (pg_stat_database.sessions of the tenant databases)")
	row("idle, per s", func(x FleetRun) string { return fmt.Sprintf("%.2f", x.Idle.Sessions) })
	row("without the backlog, per s", func(x FleetRun) string { return fmt.Sprintf("%.1f", x.Without.Sessions) })
	row("with the backlog, per s", func(x FleetRun) string { return fmt.Sprintf("%.1f", x.With.Sessions) })
	row("the fleet's connects without / with the backlog: mean time each (TCP, TLS, scram-sha-256)", func(x FleetRun) string {
		return meanConnect(x.Without) + " / " + meanConnect(x.With)
	})
	row("the fleet's connects over the run (cold start to stop): mean time each", func(x FleetRun) string {
		if x.Connects == 0 {
			return "none"
		}
		return fmt.Sprintf("%s × %s", num(float64(x.Connects)), dur(x.ConnectTime/time.Duration(x.Connects)))
	})
	row("the fleet's sessions held without / with the backlog, mean / max", func(x FleetRun) string {
		return fmt.Sprintf("%.1f / %d; %.1f / %d", x.Without.ConnsMean, x.Without.ConnsMax, x.With.ConnsMean, x.With.ConnsMax)
	})
	row("the fleet's statements per quiet event, without the backlog", func(x FleetRun) string {
		if x.Without.Statements < 0 || x.Without.QuietEvents == 0 {
			return "—"
		}
		return fmt.Sprintf("%.1f", x.Without.Statements*x.Without.Window.Seconds()/float64(x.Without.QuietEvents))
	})
	row("quiet tenants' turns per tenant per s, without the backlog", func(x FleetRun) string {
		return fmt.Sprintf("%.2f", perTenantPerSecond(x.Without.Turns, x.Without.QuietTenants, x.Without.Window))
	})

	section("idle cost (no tenant writes)")
	row("the fleet's statements/s (pg_stat_statements), in all / per tenant", func(x FleetRun) string {
		if x.Idle.Statements < 0 {
			return "—"
		}
		return fmt.Sprintf("%.1f / %.3f", x.Idle.Statements, x.Idle.Statements/float64(max(1, x.Idle.Tenants)))
	})
	row("transactions/s in the tenant databases, in all / per tenant (busiest)", func(x FleetRun) string {
		return fmt.Sprintf("%.1f / %.3f (%s %.1f)", x.Idle.Xacts, x.Idle.Xacts/float64(max(1, x.Idle.Tenants)), x.Idle.XactsMaxDB, x.Idle.XactsMax)
	})
	row("relay sessions held, mean / max (per tenant)", func(x FleetRun) string {
		return fmt.Sprintf("%.2f / %d (%.4f)", x.Idle.RelayConnsMean, x.Idle.RelayConnsMax, x.Idle.RelayConnsMean/float64(max(1, x.Idle.Tenants)))
	})
	row("activity poll sessions, mean / max", func(x FleetRun) string {
		return fmt.Sprintf("%.2f / %d", x.Idle.ActivityConnsMean, x.Idle.ActivityConnsMax)
	})
	row("turns per tenant per minute", func(x FleetRun) string {
		return fmt.Sprintf("%.2f", float64(x.Idle.Turns)/max(1e-9, x.Idle.Window.Minutes())/float64(max(1, x.Idle.Tenants)))
	})

	section("the run")
	row("tenant databases created in", func(x FleetRun) string {
		if x.CreateDatabases == 0 {
			return "(reused)"
		}
		return x.CreateDatabases.Round(100 * time.Millisecond).String()
	})
	row(fmt.Sprintf("budget (%d): most granted at once / most sluice-fleet-* sessions seen", r.Budget), func(x FleetRun) string {
		return fmt.Sprintf("%d / %d", x.BudgetPeak, x.ConnsMax)
	})
	row("duplicate publishes / events under another tenant's header", func(x FleetRun) string {
		return fmt.Sprintf("%d / %d", x.Duplicates, x.HeaderMismatches)
	})
	w("\n")
	for _, x := range r.Runs {
		if len(x.Problems) > 0 {
			w("Warnings logged by the fleet and its relays in the %s: %s. The first: %s.\n\n", x.label(), sortedCounts(x.Problems), strings.Join(x.ProblemSamples, "; "))
		}
	}
	w("Sessions opened count every session the tenant databases saw begin in the window (the producers connected before it and stay); "+
		"the fleet's connects are timed by a pgx connect tracer on its pools. Idle tenants are swept every %s to %s (SweepInterval randomised "+
		"down to half); the activity poll reads the server's statistics every %s.\n\n", fleet.DefaultSweepInterval/2, fleet.DefaultSweepInterval, fleet.DefaultDetectInterval)
}

func mapRuns(runs []FleetRun, f func(FleetRun) string) []string {
	out := make([]string, len(runs))
	for i, x := range runs {
		out[i] = f(x)
	}
	return out
}

func phaseLatency(n int, l Latencies) string {
	if n == 0 {
		return "—"
	}
	return fmt.Sprintf("%s: %s / %s / %s", num(float64(n)), dur(l.P50), dur(l.P99), dur(l.Max))
}

func drainCell(d FleetDrain) string {
	if d.Elapsed == 0 {
		return "—"
	}
	s := fmt.Sprintf("%s, %s", d.Elapsed.Round(10*time.Millisecond), num(d.Rate()))
	if d.TimedOut {
		s += " (time limit: not drained)"
	}
	return s
}

func stmtCell(st []FleetStmtTime) string {
	traced := 0
	for _, s := range st {
		traced += s.N
	}
	if traced == 0 { // runs before the tracer saw the relay's batches
		return "—"
	}
	var parts []string
	for _, s := range st {
		parts = append(parts, fmt.Sprintf("%s, %s", num(float64(s.N)), s.Total.Round(time.Millisecond)))
	}
	if len(parts) == 0 {
		return "—"
	}
	return strings.Join(parts, " / ")
}

func meanConnect(p FleetPhase) string {
	if p.Connects == 0 {
		return "none"
	}
	return fmt.Sprintf("%s × %s", num(float64(p.Connects)), dur(p.ConnectTime/time.Duration(p.Connects)))
}

func rateRatio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func perTenantPerSecond(n, tenants int, d time.Duration) float64 {
	if tenants == 0 || d <= 0 {
		return 0
	}
	return float64(n) / float64(tenants) / d.Seconds()
}
