package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/pkg/fleet"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// The fleet suite's section and targets. Report.Markdown and Report.targets do not call them
// yet (report.go is outside issue 24's bench item): a Fleet *FleetResult field, a call of
// markdown beside the other sections and of targets beside the others, and a case in
// mergeOnto are what wiring them in takes. Until then the suite writes them beside the
// report (writeFleetSidecars).

// single returns the single-database run of the given pipelines without writers, if measured.
func (r *FleetResult) single(pipelines int) (FleetSingle, bool) {
	for _, s := range r.Single {
		if s.Pipelines == pipelines && s.Writers == 0 {
			return s, true
		}
	}
	return FleetSingle{}, false
}

// baseline is the reference of the aggregate target: the single-database relay at its defaults
// serving the fleet's workload on one database (the backlog beside as many writers as quiet
// tenants), or, in results from before that run was measured, the relay alone (the first run).
func (r *FleetResult) baseline() (FleetSingle, bool) {
	for _, s := range r.Single {
		if s.Writers > 0 {
			return s, true
		}
	}
	if len(r.Single) == 0 {
		return FleetSingle{}, false
	}
	return r.Single[0], true
}

// pairsRatio is the median of the pairs' ratios: the aggregate target's measure (0 without
// pairs).
func (r *FleetResult) pairsRatio() float64 {
	if len(r.Pairs) == 0 {
		return 0
	}
	v := make([]float64, len(r.Pairs))
	for i, p := range r.Pairs {
		v[i] = p.Ratio()
	}
	return median(v)
}

// reference is the quiet tenants' commit-to-publish without the backlog, each figure the
// better of the windows before and after it (when measured): the backlog's effect is judged
// against the quieter of the two, never against an average that drift inflated.
func (r *FleetResult) reference() Latencies {
	ref := r.Without.Quiet
	if a := r.WithoutAfter.Quiet; a.N > 0 {
		ref.P50, ref.P95, ref.P99, ref.Max = min(ref.P50, a.P50), min(ref.P95, a.P95), min(ref.P99, a.P99), min(ref.Max, a.Max)
	}
	return ref
}

// added is what the backlog added to the quiet tenants' commit-to-publish at p50, p95, p99
// and max, against reference.
func (r *FleetResult) added() (p50, p95, p99, maxd time.Duration) {
	w, o := r.With.Quiet, r.reference()
	return w.P50 - o.P50, w.P95 - o.P95, w.P99 - o.P99, w.Max - o.Max
}

// targets are issue 24's goals with their verdicts.
func (r *FleetResult) targets() []target {
	if r == nil {
		return nil
	}
	var ts []target
	d50, _, d99, dmax := r.added()
	ref := r.reference()
	fair := fmt.Sprintf("quiet tenants' p50 %s without → %s with (%s), p99 %s → %s (%s); max %s → %s (%s)",
		dur(ref.P50), dur(r.With.Quiet.P50), signed(d50), dur(ref.P99), dur(r.With.Quiet.P99), signed(d99),
		dur(ref.Max), dur(r.With.Quiet.Max), signed(dmax))
	ok := d50 <= fleetTargetDelay && d99 <= fleetTargetDelay
	if missing := r.With.Missing + r.Without.Missing + r.WithoutAfter.Missing; missing > 0 {
		fair += fmt.Sprintf("; %d events never published", missing)
		ok = false
	}
	ts = append(ts, target{24, fmt.Sprintf("Fleet fairness beside a %s-row backlog", num(float64(r.HotRows))),
		fmt.Sprintf("≤ %s added to another tenant's commit-to-publish (p50 and p99, same tenants without the backlog)", fleetTargetDelay), fair, verdict(ok)})
	if len(r.Pairs) > 0 {
		ratio := r.pairsRatio()
		var each []string
		for _, p := range r.Pairs {
			each = append(each, fmt.Sprintf("%.0f%%", 100*p.Ratio()))
		}
		m := fmt.Sprintf("median %.0f%% over %d pairs of windows measured one right after the other (%s): the fleet draining the backlog in one tenant's "+
			"database beside %d quiet tenants, against one relay on one database serving the same workload (the backlog beside %d writers of 1 event/s)",
			100*ratio, len(r.Pairs), strings.Join(each, ", "), r.Pairs[0].Fleet.Writers, r.Pairs[0].Reference.Writers)
		ts = append(ts, target{24, "Fleet aggregate vs a single-database relay", fmt.Sprintf("≥ %.0f%% on the same server", 100*fleetTargetRatio), m,
			verdict(ratio >= fleetTargetRatio)})
	} else if b, okb := r.baseline(); okb && b.Rate() > 0 {
		agg := r.With.Aggregate()
		what := "one relay on one database"
		if b.Writers > 0 {
			what = fmt.Sprintf("one relay on one database serving the same workload (the backlog beside %d writers of 1 event/s)", b.Writers)
		}
		m := fmt.Sprintf("%s events/s (hot tenant %s events/s + quiet tenants) vs %s events/s for %s (%d pipelines): %.0f%%",
			num(agg), num(r.With.HotRate()), num(b.Rate()), what, b.Pipelines, 100*agg/b.Rate())
		if a, oka := r.single(b.Pipelines); oka && b.Writers > 0 && a.Rate() > 0 {
			m += fmt.Sprintf("; vs that relay draining the backlog alone on an idle server (%s events/s): %.0f%%", num(a.Rate()), 100*agg/a.Rate())
		}
		if p1, ok1 := r.single(1); ok1 && p1.Pipelines != b.Pipelines && p1.Rate() > 0 {
			m += fmt.Sprintf("; vs it alone with 1 pipeline (%s events/s): %.0f%%", num(p1.Rate()), 100*agg/p1.Rate())
		}
		ts = append(ts, target{24, "Fleet aggregate vs a single-database relay", fmt.Sprintf("≥ %.0f%% on the same server", 100*fleetTargetRatio), m,
			verdict(agg >= fleetTargetRatio*b.Rate())})
	}
	ts = append(ts, target{24, "Fleet connections within the server's budget", fmt.Sprintf("never above the budget (%d)", r.Budget),
		fmt.Sprintf("most granted at once %d; most sluice-fleet-* sessions seen in pg_stat_activity %d", r.BudgetPeak, r.ConnsMax),
		verdict(r.BudgetPeak <= r.Budget && r.ConnsMax <= r.Budget)})
	return ts
}

// withEnd says how the window with the backlog ended.
func withEnd(r *FleetResult) string {
	if r.With.TimeBoxed {
		return fmt.Sprintf("for a time box of %s, the backlog not drained by then (%s of %s rows published in it, the rest left pending)",
			r.With.Window.Round(time.Second), num(float64(r.With.HotEvents)), num(float64(r.HotRows)))
	}
	return "until the hot tenant's last event was acknowledged"
}

func signed(d time.Duration) string {
	if d < 0 {
		return "−" + dur(-d)
	}
	return "+" + dur(d)
}

// markdown renders the suite's section.
func (r *FleetResult) markdown(w func(string, ...any)) {
	if r == nil {
		return
	}
	quiet := r.Databases - 1
	w("## 17. Fleet: %d tenant databases on one server (issue 24)\n\n", r.Databases)
	w("One `fleet.Fleet` (pkg/fleet) serves %d databases on the benchmark's PostgreSQL server, each a copy of one migrated database "+
		"(`CREATE DATABASE ... TEMPLATE`; making them took %s). Its settings: %s. The broker is an in-process stub that waits %s per "+
		"`PublishBatch` call, as in section 1, and records when it acknowledged each event and which tenant `%s` named. "+
		"One tenant, *hot*, gets a %s-row backlog over %s partition keys committed in one `INSERT`; the %d *quiet* tenants each commit "+
		"one event a second with `outbox.Write`, in a transaction of its own, on a connection of their own, spread evenly over each second. "+
		"The fleet runs throughout: an idle window first (nobody writes), then the quiet tenants alone for %s, then with the backlog, "+
		"from its commit %s, then the quiet tenants alone again for as long.\n\n",
		r.Databases, r.CreateDatabases.Round(time.Second), r.Settings, r.Delay, outbox.TenantHeader, num(float64(r.HotRows)), num(float64(r.HotKeys)),
		quiet, r.Without.Window.Round(time.Second), withEnd(r))

	w("**Quiet tenants' commit-to-publish** (their producer's `Commit` returning to the stub's acknowledgement, the stub's %s included):\n\n", r.Delay)
	w("| window | length | quiet events | p50 | p95 | p99 | max | not published within a minute | quiet tenants' turns per tenant per s | transactions in the quiet tenants' databases per quiet event | fleet sessions, mean / max |\n")
	w("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, p := range []FleetPhase{r.Without, r.With, r.WithoutAfter} {
		if p.Name == "" {
			continue
		}
		w("| %s | %s | %s | %s | %s | **%s** | %s | %d | %.2f | %s | %.1f / %d |\n", p.Name, p.Window.Round(100*time.Millisecond), num(float64(p.QuietEvents)),
			dur(p.Quiet.P50), dur(p.Quiet.P95), dur(p.Quiet.P99), dur(p.Quiet.Max), p.Missing, perTenantPerSecond(p.Turns, p.QuietTenants, p.Window),
			xactsPerEvent(p), p.ConnsMean, p.ConnsMax)
	}
	d50, d95, d99, dmax := r.added()
	w("| **added by the backlog** (against the better window without it, figure by figure) | | | **%s** | %s | **%s** | %s | | | | |\n\n", signed(d50), signed(d95), signed(d99), signed(dmax))
	if r.Without.QuietXacts > 0 {
		w("A quiet event costs its database one transaction of its producer's; the rest are the fleet's: the turn's read-only pass, "+
			"the round's claim (its keys' locks and rows in one round trip) and settle (the round's session settings were taken once, when the tenant's "+
			"pool connected: outbox.DedicatePool), sometimes a look at the outbox (a parked tenant looks when the activity poll, every %s, saw its "+
			"database's sessions do something), and a few fruitless turns. A single-database "+
			"relay publishes the same writers' events inside its rounds: what these transactions cost the server is what the aggregate below "+
			"loses on a machine whose cores PostgreSQL and the relay share.\n\n", fleet.DefaultDetectInterval)
	}

	w("**Throughput** on the same server: the single-database relay (`outbox.Relay.Run` on one pool, the same stub) drained the same " +
		"backlog in the hot tenant's database before the fleet started, committed the same way (one `INSERT`, no `VACUUM` after it): " +
		"alone, and beside as many writers as the fleet has quiet tenants, each committing one event " +
		"a second into that database, the relay running before anything was written, timed from the backlog's commit until no row up to it " +
		"was pending, every event published in that time counted:\n\n")
	w("| run | pipelines | events | time | events/s | fleet aggregate ÷ this |\n|---|---:|---:|---:|---:|---:|\n")
	agg := r.With.Aggregate()
	for _, s := range r.Single {
		w("| %s | %d | %s | %s | %s | %.0f%% |\n", s.Name, s.Pipelines, num(float64(s.Events)), s.Elapsed.Round(time.Millisecond), num(s.Rate()), 100*agg/s.Rate())
	}
	pipelines := strconv.Itoa(max(1, r.HotWeight))
	if n := r.With.HotSessionsMax; n > max(1, r.HotWeight) {
		pipelines += fmt.Sprintf(", grew to %d (relay sessions seen)", n)
	}
	w("| fleet: the hot tenant (%s%s) | %s | %s | %s | %s | |\n", turnCount(r.With.HotTurns), map[bool]string{true: ", time-boxed"}[r.With.TimeBoxed], pipelines, num(float64(r.With.HotEvents)), r.With.Window.Round(time.Millisecond), num(r.With.HotRate()))
	w("| **fleet: every tenant (aggregate)** | | %s | %s | **%s** | |\n\n", num(float64(r.With.Published)), r.With.Window.Round(time.Millisecond), num(agg))
	if len(r.Pairs) > 0 {
		lo, hi := r.Pairs[0].Reference.Rate(), r.Pairs[0].Reference.Rate()
		for _, p := range r.Pairs {
			lo, hi = min(lo, p.Reference.Rate()), max(hi, p.Reference.Rate())
		}
		w("**The aggregate, measured in pairs.** This shared machine's speed drifts between windows minutes apart by more than the target's "+
			"margin (in this run the single-database relay's own windows below measured from %s to %s events/s), so the ratios above, whose "+
			"references ran minutes before the fleet's window, are not what the target is judged on. After the windows above, the fleet was "+
			"stopped and the aggregate measured in %d pairs of windows, each pair one right after the other, alternating which came first: "+
			"the single-database relay at its defaults draining the backlog in the hot tenant's database beside %d writers of one event a "+
			"second into it, and a fleet started afresh draining the same backlog there while its %d quiet tenants wrote one event a second "+
			"each into their own databases (nothing of the fleet running during the relay's window). Each window began 5 s after its writers "+
			"started, with the table emptied and the backlog committed in one `INSERT`, and ended when the same check (every 20 ms) first found "+
			"none of the backlog's rows pending, every event published in it counted. The target is judged on the median of the pairs' ratios:\n\n",
			num(lo), num(hi), len(r.Pairs), r.Pairs[0].Reference.Writers, r.Pairs[0].Fleet.Writers)
		w("| pair | first | single-database relay: events, time, events/s | fleet: events, time, events/s | fleet: the backlog's first event acknowledged after | hot tenant's relay sessions | fleet ÷ relay |\n|---:|---|---:|---:|---:|---:|---:|\n")
		for i, p := range r.Pairs {
			first := "relay"
			if p.FleetFirst {
				first = "fleet"
			}
			ack := "–" // runs before it was measured
			if p.Fleet.FirstAck > 0 {
				ack = p.Fleet.FirstAck.Round(time.Millisecond).String()
			}
			w("| %d | %s | %s in %s: %s | %s in %s: %s | %s | %d | %.0f%% |\n", i+1, first,
				num(float64(p.Reference.Events)), p.Reference.Elapsed.Round(time.Millisecond), num(p.Reference.Rate()),
				num(float64(p.Fleet.Events)), p.Fleet.Elapsed.Round(time.Millisecond), num(p.Fleet.Rate()), ack, p.Fleet.Pipelines, 100*p.Ratio())
		}
		w("| **median** | | | | | | **%.0f%%** |\n\n", 100*r.pairsRatio())
	}
	if len(r.HotStatements) > 0 {
		var parts []string
		var sum time.Duration
		for _, s := range r.HotStatements {
			kind := s.Kind
			if kind == stmtLock {
				kind = "claim (the keys' locks and rows)" // one round trip since the read joined the lock
			}
			if kind == stmtRead && s.N == 0 {
				continue // runs before the read joined the lock counted it apart
			}
			parts = append(parts, fmt.Sprintf("%s %s in %s", kind, num(float64(s.N)), s.Total.Round(time.Millisecond)))
			sum += s.Total
		}
		w("Where the hot tenant's window went: its relays' statements (a pgx tracer on its pools, by kind: statements, time) were %s; "+
			"%s in all over its %s in the %s window, the rest of its time was spent publishing (the stub's %s per call), opening and closing pools, "+
			"and waiting for its turn.", strings.Join(parts, "; "), sum.Round(time.Millisecond), turnCount(r.With.HotTurns), r.With.Window.Round(time.Second), r.Delay)
		if r.With.HotFirst > 0 {
			w(" Its first event was acknowledged %s after the backlog's commit: the activity poll's next look (which sees the backlog's "+
				"transaction end, or the count the statistics publish), the turn's new connections and its first round.", r.With.HotFirst.Round(time.Millisecond))
		}
		w("\n\n")
	}

	i := r.Idle
	w("**Idle cost**: %d tenants, none writing, over %s, starting once every tenant had ended its first turn (each idle tenant is swept "+
		"every %s to %s, SweepInterval randomised down to half; %.1f turns per tenant in the window):\n\n",
		i.Tenants, i.Window.Round(time.Second), fleet.DefaultSweepInterval/2, fleet.DefaultSweepInterval, float64(i.Turns)/float64(max(1, i.Tenants)))
	w("| | whole fleet | per idle tenant |\n|---|---:|---:|\n")
	w("| relay sessions (`sluice-fleet-relay`), mean / max | %.2f / %d | %.3f |\n", i.RelayConnsMean, i.RelayConnsMax, i.RelayConnsMean/float64(max(1, i.Tenants)))
	w("| activity poll sessions (`sluice-fleet-activity`), mean / max | %.2f / %d | |\n", i.ActivityConnsMean, i.ActivityConnsMax)
	w("| transactions/s in the tenant databases (`xact_commit + xact_rollback`) | %.1f | %.3f (median database %.3f) |\n", i.Xacts, i.Xacts/float64(max(1, i.Tenants)), i.XactsMedian)
	w("| busiest tenant database (%s: the activity poll's connection is on it) | %.1f | |\n", i.XactsMaxDB, i.XactsMax)
	w("| turns (`RunPass` until nothing is pending, on a parked or a new pool) per minute | %.1f | %.2f |\n\n",
		float64(i.Turns)/i.Window.Minutes(), float64(i.Turns)/i.Window.Minutes()/float64(max(1, i.Tenants)))

	w("The budget: at most %d connections granted at once (of %d), at most %d `sluice-fleet-*` sessions seen in `pg_stat_activity` (sampled every 250 ms) over the whole run. "+
		"Start-up (every tenant's first turn) took %s. Duplicate publishes: %d; events whose tenant header did not name their writer: %d.",
		r.BudgetPeak, r.Budget, r.ConnsMax, r.Startup.Round(100*time.Millisecond), r.Duplicates, r.HeaderMismatches)
	if len(r.DuplicatesBy) > 0 {
		w(" Duplicate publishes by tenant: %s.", sortedCounts(r.DuplicatesBy))
	}
	if len(r.Problems) > 0 {
		w(" Warnings logged by the fleet and its relays: %s.", sortedCounts(r.Problems))
		if len(r.ProblemSamples) > 0 {
			w(" The first: %s.", strings.Join(r.ProblemSamples, "; "))
		}
	}
	w("\n\n")
}

// xactsPerEvent renders p's transactions per quiet event, or "—" when not measured.
func xactsPerEvent(p FleetPhase) string {
	if p.QuietXacts == 0 || p.QuietEvents == 0 {
		return "—"
	}
	return fmt.Sprintf("%.1f", float64(p.QuietXacts)/float64(p.QuietEvents))
}

func perTenantPerSecond(n, tenants int, d time.Duration) float64 {
	if tenants == 0 || d <= 0 {
		return 0
	}
	return float64(n) / float64(tenants) / d.Seconds()
}

// turnCount is "1 turn" or "n turns".
func turnCount(n int) string {
	if n == 1 {
		return "1 turn"
	}
	return fmt.Sprintf("%d turns", n)
}
