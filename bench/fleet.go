package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/pkg/fleet"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// The fleet suite (issue 24): one pkg/fleet deployment serving many tenant databases on one
// PostgreSQL server. One tenant ("hot") gets a large backlog in one commit while every other
// tenant ("quiet") commits one event a second; the suite measures the quiet tenants'
// commit-to-publish with and without the backlog (the fairness bound), the hot tenant's
// throughput and the fleet's aggregate against a single-database relay on the same server,
// and what the fleet costs while every tenant is idle (connections, transactions per second).
//
// Report.Markdown has no place for this suite yet (report.go is outside this item): the suite
// writes its section and raw results beside the report (fleetSidecar), and FleetResult
// carries markdown and targets ready for report.go to call.

// FleetResult is the fleet suite's outcome.
type FleetResult struct {
	// Databases is the number of tenant databases on the server: the hot tenant and the quiet
	// ones.
	Databases int
	// HotRows is the hot tenant's backlog, committed in one transaction; HotKeys its
	// partition keys.
	HotRows, HotKeys int
	// HotWeight is the hot tenant's Weight (0 in results from before it was recorded: 1).
	HotWeight int `json:",omitempty"`
	// Delay is the stub broker's latency per PublishBatch call.
	Delay time.Duration
	// Budget is the fleet's connection budget for the server (Config.DefaultConnections);
	// Settings describes the fleet's other settings (all defaults).
	Budget   int
	Settings string
	// CreateDatabases is how long creating the tenant databases from a migrated template took.
	CreateDatabases time.Duration
	// Single are the single-database relay runs on the hot tenant's database, before the fleet
	// starts: the relay at its defaults, and with the pipelines the fleet gives a tenant of
	// weight 1.
	Single []FleetSingle
	// Pairs are the aggregate's alternating windows, measured after the phases below with the
	// fleet stopped between its windows: the aggregate target is judged on their median ratio.
	Pairs []FleetPair `json:",omitempty"`
	// Startup is how long it took from Run until every tenant had ended its first turn.
	Startup time.Duration
	// Idle is the idle window: no tenant writes.
	Idle FleetIdle
	// Without and With are the quiet tenants' windows without and with the hot backlog, and
	// WithoutAfter without it again afterwards (what the time box left of it marked
	// published), to show drift between the windows.
	Without, With, WithoutAfter FleetPhase
	// BudgetPeak is the most connections the fleet's budget granted at once (BudgetUsage), and
	// ConnsMax the most sluice-fleet-* sessions pg_stat_activity showed at once over the run.
	BudgetPeak, ConnsMax int
	// HeaderMismatches counts published events whose outbox.TenantHeader did not name the
	// tenant that wrote them; Duplicates counts events published more than once, and
	// DuplicatesBy those by the tenant their header names.
	HeaderMismatches, Duplicates int
	DuplicatesBy                 map[string]int `json:",omitempty"`
	// HotStatements are the hot tenant's statements in the window with the backlog, by kind
	// (tracer.go's names), with the time they took.
	HotStatements []FleetStmtTime `json:",omitempty"`
	// Problems counts the fleet's and relays' log records at Warn and above, by message.
	Problems map[string]int `json:",omitempty"`
	// ProblemSamples are the first of those records, each with its error's text.
	ProblemSamples []string `json:",omitempty"`
}

// FleetStmtTime is how many statements of one kind a tenant's relay ran and how long they
// took in all.
type FleetStmtTime struct {
	Kind  string
	N     int
	Total time.Duration
}

// FleetSingle is one single-database relay run (outbox.Relay.Run on one pool).
type FleetSingle struct {
	Name      string
	Pipelines int
	// Writers committed one event a second each into the relay's database during the run, as
	// the quiet tenants do into theirs in the fleet's window (0: the backlog alone). Events
	// counts what the relay published in the run, theirs included.
	Writers int `json:",omitempty"`
	Events  int
	Elapsed time.Duration
	// FirstAck is how long after the backlog's commit its first event was acknowledged (the
	// fleet's windows of the aggregate's pairs: how soon the hot tenant's turn began).
	FirstAck time.Duration `json:",omitempty"`
}

// Rate is the run's events per second.
func (s FleetSingle) Rate() float64 { return rate(s.Events, s.Elapsed) }

// FleetPair is one pair of the aggregate's windows, measured one right after the other on the
// same server so that the machine's drift falls on both alike: the single-database relay at its
// defaults draining the backlog in the hot tenant's database beside as many writers of one
// event a second as the fleet has quiet tenants (the fleet's workload on one database), and the
// fleet, started afresh, draining the same backlog there while its quiet tenants write as many
// events into their own databases. Both are timed from the backlog's commit until the same
// check found none of its rows pending, and count every event published meanwhile.
type FleetPair struct {
	// FleetFirst: the fleet's window came first (the pairs alternate the order).
	FleetFirst bool `json:",omitempty"`
	// Reference is the single-database relay's window; Fleet the fleet's (its Pipelines: the
	// most relay sessions the hot tenant had at once, sampled every 250 ms).
	Reference, Fleet FleetSingle
}

// Ratio is the fleet's events per second over the reference's.
func (p FleetPair) Ratio() float64 {
	if p.Reference.Rate() == 0 {
		return 0
	}
	return p.Fleet.Rate() / p.Reference.Rate()
}

// FleetIdle is the cost of the fleet while no tenant writes.
type FleetIdle struct {
	Window  time.Duration
	Tenants int
	// RelayConns and ActivityConns are the sessions the fleet held (pg_stat_activity,
	// application_name sluice-fleet-relay and sluice-fleet-activity), sampled every 250 ms:
	// mean and max.
	RelayConnsMean, ActivityConnsMean float64
	RelayConnsMax, ActivityConnsMax   int
	// Xacts is the transactions per second committed or rolled back in the tenant databases
	// (pg_stat_database xact_commit + xact_rollback; a statement outside a transaction block is
	// one), in all of them together; XactsMedian in the median tenant database, and XactsMax in
	// the busiest one (the activity poll's, which runs on one tenant's database).
	Xacts, XactsMedian, XactsMax float64
	XactsMaxDB                   string
	// Turns is the tenants' turns in the window (sweeps and wake-ups).
	Turns int
}

// FleetPhase is a window of the quiet tenants committing one event a second each.
type FleetPhase struct {
	Name   string
	Window time.Duration
	// QuietTenants wrote QuietEvents in the window, each its own transaction; Quiet is their
	// commit-to-acknowledgement times (Commit returned to the stub's acknowledgement, which
	// includes the stub's delay), Missing the events not acknowledged within a minute of the
	// window's end.
	QuietTenants, QuietEvents, Missing int
	Quiet                              Latencies
	// HotEvents were published for the hot tenant in the window (With only), and Published
	// all events the fleet published in it. TimeBoxed: the window ended at the time box, the
	// backlog not yet drained.
	HotEvents, Published int
	TimeBoxed            bool
	// Turns is the quiet tenants' turns in the window, HotTurns the hot tenant's.
	Turns, HotTurns int
	// QuietXacts is the transactions committed or rolled back in the quiet tenants' databases
	// over the window (pg_stat_database: their producers' and the fleet's, a statement outside
	// a transaction block counting as one): divided by QuietEvents, what one quiet event costs
	// the server in transactions.
	QuietXacts int64 `json:",omitempty"`
	// HotFirst is how long after the backlog's commit the hot tenant's first event was
	// acknowledged (the fleet noticing the backlog, its turn starting and its first round).
	HotFirst time.Duration
	// HotSessionsMax is the most relay sessions the hot tenant had on the server at once
	// (sampled every 250 ms): the pipelines it grew to.
	HotSessionsMax int
	// The fleet's sessions (pg_stat_activity) over the window, sampled every 250 ms.
	ConnsMean float64
	ConnsMax  int
}

// Aggregate is the events per second the fleet published over the window.
func (p FleetPhase) Aggregate() float64 { return rate(p.Published, p.Window) }

// HotRate is the hot tenant's events per second over the window.
func (p FleetPhase) HotRate() float64 { return rate(p.HotEvents, p.Window) }

func rate(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// fleetSize is the suite's workload at one size.
type fleetSize struct {
	// Databases is the number of tenant databases (one hot, the rest quiet).
	Databases int
	// HotRows is the hot tenant's backlog (over HotKeys partition keys).
	HotRows, HotKeys int
	// IdleWindow is the idle measurement (at least the fleet's sweep interval to be
	// representative) and QuietWindow the phase without the backlog.
	IdleWindow, QuietWindow time.Duration
	// Budget is the fleet's connection budget for the server.
	Budget int
	// HotWeight is the hot tenant's Weight (its pipelines and its share of time); 0 is 1.
	HotWeight int
	// Timeout bounds each wait: start-up, a drain.
	Timeout time.Duration
	// Pairs is how many alternating pairs of windows measure the aggregate (FleetPair); 0: none.
	Pairs int
	// HotBox, when set, time-boxes the fleet's window with the backlog: the hot tenant's
	// throughput and the aggregate are then measured over it, and the rest of the backlog is
	// left pending. Zero: the window lasts until the backlog is drained (at most Timeout).
	HotBox time.Duration
}

// fleetDelay is the stub broker's latency per call, the relay suite's 10 ms.
const fleetDelay = 10 * time.Millisecond

// fleetTargetRatio is issue 24's bound on the fleet's aggregate throughput against a
// single-database relay; fleetTargetDelay its bound on what a backlog adds to another
// tenant's commit-to-publish.
const (
	fleetTargetRatio = 0.8
	fleetTargetDelay = time.Second
)

// defaultFleetBudget is the fleet suite's connection budget: enough for each of its 200 tenants
// to keep a connection parked between turns, as a fleet's servers should be sized (a budget
// smaller than the tenants that write makes them take turns for connections, each on a new
// session: -fleet-budget 40). The harness's server has room for it beside the quiet tenants'
// producers (benchMaxConnections); measureFleet checks a server it did not start.
const defaultFleetBudget = 240

// fleetHarnessConns is what the suite's harness connects beside the fleet and the producers:
// its probe, the hot tenant's pool and the single-database relays.
const fleetHarnessConns = 10

// fleetSizeFor derives the suite's size from the run's: issue 24's 200 databases and
// 100,000-row backlog at full size, a tenth of them with -quick; the hot tenant's weight is
// the run's (-fleet-hot-weight), and so is the server's connection budget (-fleet-budget, defaultFleetBudget).
// The aggregate is judged on the median of 8 pairs at full size: on this shared machine one
// run's pairs ranged from 69% to 86%, and another's from 63% to 98%.
func fleetSizeFor(sz Sizes) fleetSize {
	budget := sz.FleetBudget
	if budget == 0 {
		budget = defaultFleetBudget
	}
	if sz.Name == "full" {
		return fleetSize{Databases: 200, HotRows: 100_000, HotKeys: 1_000, IdleWindow: 40 * time.Second, QuietWindow: 30 * time.Second,
			Budget: budget, Timeout: 4 * time.Minute, HotBox: time.Minute, HotWeight: sz.FleetHotWeight, Pairs: 8}
	}
	return fleetSize{Databases: 20, HotRows: 10_000, HotKeys: 1_000, IdleWindow: 10 * time.Second, QuietWindow: 10 * time.Second,
		Budget: budget, Timeout: 2 * time.Minute, HotBox: time.Minute, HotWeight: sz.FleetHotWeight, Pairs: 2}
}

func runFleetSuite(ctx context.Context, log *slog.Logger, env *Env, sz Sizes, rep *Report) error {
	res, err := measureFleet(ctx, log, env, fleetSizeFor(sz))
	if err != nil {
		return err
	}
	rep.Fleet = res
	return nil
}

// fleetTenant is one tenant database of the suite.
type fleetTenant struct {
	name, db, url string
}

// hotTenant is the hot tenant's name; quiet tenants are q001, q002, ...
const hotTenant = "hot"

// measureFleet runs the suite at size fs on env's server.
func measureFleet(ctx context.Context, log *slog.Logger, env *Env, fs fleetSize) (*FleetResult, error) {
	fs.HotWeight = max(1, fs.HotWeight)
	res := &FleetResult{Databases: fs.Databases, HotRows: fs.HotRows, HotKeys: fs.HotKeys, HotWeight: fs.HotWeight, Delay: fleetDelay, Budget: fs.Budget}
	probe, err := newFleetProbe(ctx, env.AdminURL)
	if err != nil {
		return nil, err
	}
	defer probe.close()
	var maxConns int
	if err := probe.pool.QueryRow(ctx, `SELECT current_setting('max_connections')::int`).Scan(&maxConns); err != nil {
		return nil, fmt.Errorf("read max_connections: %w", err)
	}
	if need := fs.Budget + fs.Databases - 1 + fleetHarnessConns; need > maxConns {
		return nil, fmt.Errorf("the server's max_connections is %d: the fleet suite needs %d (the budget %d, %d producers, %d for the harness); lower -fleet-budget",
			maxConns, need, fs.Budget, fs.Databases-1, fleetHarnessConns)
	}

	t0 := time.Now()
	tenants, err := createTenantDatabases(ctx, env, fs.Databases)
	if err != nil {
		return nil, err
	}
	res.CreateDatabases = time.Since(t0)
	log.Info("fleet: tenant databases created", "databases", len(tenants), "took", res.CreateDatabases.Round(time.Millisecond))
	hot, quiet := tenants[0], tenants[1:]
	probe.hotDB = hot.db

	hotPool, err := openPool(ctx, hot.url, 4)
	if err != nil {
		return nil, err
	}
	defer hotPool.Close()
	if res.Single, err = singleRelayRuns(ctx, log, hotPool, fs); err != nil {
		return nil, err
	}
	beside, err := singleRelayBesideWriters(ctx, log, hotPool, hot, len(quiet), 0, fs)
	if err != nil {
		return nil, err
	}
	res.Single = append(res.Single, beside)

	// The fleet: every setting at its default but the server's connection budget.
	book := newWaitBook()
	pub := newFleetPublisher(book)
	problems := newProblemLog()
	reg := make(fleet.Static, 0, len(tenants))
	for _, t := range tenants {
		weight := 1
		if t.name == hotTenant {
			weight = fs.HotWeight
		}
		reg = append(reg, fleet.Tenant{Name: t.name, DatabaseURL: t.url, Weight: weight})
	}
	// The hot tenant's statements are timed by kind (tracer.go), to show where its turns go.
	hotTracer := newRelayTracer()
	connect := func(_ context.Context, t fleet.Tenant) (*pgxpool.Config, error) {
		pc, err := pgxpool.ParseConfig(t.DatabaseURL)
		if err == nil && t.Name == hotTenant {
			pc.ConnConfig.Tracer = hotTracer
		}
		return pc, err
	}
	cfg := fleet.Config{Registry: reg, DefaultConnections: fs.Budget, Connect: connect,
		Relay:  outbox.RelayConfig{Publisher: pub, Topics: map[string]string{"orders": ordersARN}, Logger: slog.New(problems)},
		Logger: slog.New(problems)}
	f, err := fleet.New(cfg)
	if err != nil {
		return nil, err
	}
	fleets := []*fleet.Fleet{f}
	res.Settings = fmt.Sprintf("DefaultConnections %d; the hot tenant's Weight %d (the others 1); the rest at their defaults: Relay.Pipelines 1 per unit of weight, "+
		"DetectInterval %s, SweepInterval %s, IdleClose %s, Turn %s, RegistryRefresh %s", fs.Budget, fs.HotWeight, fleet.DefaultDetectInterval,
		fleet.DefaultSweepInterval, fleet.DefaultIdleClose, fleet.DefaultTurn, fleet.DefaultRegistryRefresh)
	started := time.Now()
	stopFleet := inBackground(ctx, f.Run)
	defer stopFleet()
	connsAll := probe.sample(ctx) // over the whole run, for the budget check
	defer connsAll.stop()

	// Start-up: every tenant gets a turn at once; wait until each has ended its first.
	if err := firstTurnsEnded(ctx, f, len(tenants), fs.Timeout); err != nil {
		return nil, err
	}
	res.Startup = time.Since(started)
	log.Info("fleet: every tenant had its first turn", "took", res.Startup.Round(time.Millisecond))

	// Idle: no tenant writes.
	if res.Idle, err = measureIdle(ctx, probe, f, tenants, fs.IdleWindow); err != nil {
		return nil, err
	}
	log.Info("fleet idle", "window", res.Idle.Window, "relay_conns_mean", fmt.Sprintf("%.2f", res.Idle.RelayConnsMean),
		"relay_conns_max", res.Idle.RelayConnsMax, "xacts/s", fmt.Sprintf("%.1f", res.Idle.Xacts),
		"per_tenant_xacts/s", fmt.Sprintf("%.3f", res.Idle.Xacts/float64(res.Idle.Tenants)), "turns", res.Idle.Turns)

	// The quiet tenants write one event a second each from here to the end.
	prod, err := startQuietProducers(ctx, quiet, book)
	if err != nil {
		return nil, err
	}
	defer prod.stop()
	if err := sleepCtx(ctx, 10*time.Second); err != nil { // past the producers' first events and their tenants' first wake-ups
		return nil, err
	}
	res.Without, err = measurePhase(ctx, probe, f, prod, pub, "without the backlog", fs.QuietWindow, 0, nil)
	if err != nil {
		return nil, err
	}
	log.Info("fleet phase", "phase", res.Without.Name, "events", res.Without.QuietEvents, "p50", res.Without.Quiet.P50, "p99", res.Without.Quiet.P99,
		"max", res.Without.Quiet.Max, "missing", res.Without.Missing, "turns", res.Without.Turns)
	if err := sleepCtx(ctx, 3*time.Second); err != nil { // the window's last events published before the backlog lands
		return nil, err
	}
	box := fs.Timeout
	if fs.HotBox > 0 {
		box = fs.HotBox
	}
	hotTracer.reset()
	res.With, err = measurePhase(ctx, probe, f, prod, pub, "with the backlog", box, fs.HotRows, func() (time.Time, error) {
		if err := insertOutboxRows(ctx, hotPool, 0, fs.HotRows, fs.HotKeys, false); err != nil {
			return time.Time{}, err
		}
		return time.Now(), nil
	})
	if err != nil {
		return nil, err
	}
	for _, kind := range []string{stmtPoll, stmtSweep, stmtLock, stmtSettle} { // lock: the claim, its keys' locks and rows in one round trip
		st := FleetStmtTime{Kind: kind}
		for _, s := range hotTracer.take(kind) {
			st.N++
			st.Total += s.Took
		}
		res.HotStatements = append(res.HotStatements, st)
	}
	log.Info("fleet phase", "phase", res.With.Name, "hot_events", res.With.HotEvents, "window", res.With.Window.Round(time.Millisecond),
		"hot_events/s", int(res.With.HotRate()), "aggregate_events/s", int(res.With.Aggregate()),
		"events", res.With.QuietEvents, "p50", res.With.Quiet.P50, "p99", res.With.Quiet.P99, "max", res.With.Quiet.Max,
		"missing", res.With.Missing, "hot_turns", res.With.HotTurns)

	// The quiet tenants again without the backlog, so that drift on the machine shows: what
	// the time box left of the backlog is marked published as another relay would (the hot
	// tenant's relay skips rows published under it).
	if err := markBacklogPublished(ctx, hotPool, fs.Timeout); err != nil {
		return nil, fmt.Errorf("mark the rest of the backlog published: %w", err)
	}
	if err := sleepCtx(ctx, 5*time.Second); err != nil {
		return nil, err
	}
	res.WithoutAfter, err = measurePhase(ctx, probe, f, prod, pub, "without the backlog, after it", fs.QuietWindow, 0, nil)
	if err != nil {
		return nil, err
	}
	log.Info("fleet phase", "phase", res.WithoutAfter.Name, "events", res.WithoutAfter.QuietEvents, "p50", res.WithoutAfter.Quiet.P50,
		"p99", res.WithoutAfter.Quiet.P99, "max", res.WithoutAfter.Quiet.Max, "missing", res.WithoutAfter.Missing, "turns", res.WithoutAfter.Turns)

	// Every event of the run is published: stop the producers and wait for the rest.
	all := prod.stop()
	if err := prod.failed(); err != nil {
		return nil, fmt.Errorf("a quiet tenant's producer: %w", err)
	}
	if err := waitUntil(ctx, time.Minute, func() bool { return book.pending(all) == 0 }); err != nil {
		return nil, fmt.Errorf("%d of the quiet tenants' %d events not published a minute after the last commit: %w", book.pending(all), len(all), err)
	}
	if n, err := pendingCount(ctx, hotPool); err != nil || n != 0 {
		return nil, fmt.Errorf("the hot tenant has %d rows pending after its drain (%v)", n, err)
	}
	if err := stopFleet(); err != nil {
		return nil, fmt.Errorf("fleet run: %w", err)
	}

	// The aggregate's pairs of windows.
	pr := &pairRunner{log: log, probe: probe, hotPool: hotPool, hot: hot, quiet: quiet, fs: fs, pub: pub, book: book,
		newFleet: func() (*fleet.Fleet, error) { return fleet.New(cfg) }, prods: []*quietProducers{prod}}
	for i := range fs.Pairs {
		pair, err := pr.pair(ctx, i%2 == 1)
		if err != nil {
			return nil, fmt.Errorf("the aggregate's pair %d: %w", i+1, err)
		}
		res.Pairs = append(res.Pairs, pair)
		log.Info("fleet: aggregate pair", "pair", i+1, "fleet_first", pair.FleetFirst, "reference_events/s", int(pair.Reference.Rate()),
			"fleet_events/s", int(pair.Fleet.Rate()), "ratio", fmt.Sprintf("%.2f", pair.Ratio()))
	}
	fleets = append(fleets, pr.fleets...)

	res.ConnsMax = connsAll.stop().totalMax
	for _, f := range fleets {
		for _, u := range f.BudgetUsage() {
			res.BudgetPeak = max(res.BudgetPeak, u[1])
		}
	}
	res.Duplicates, res.DuplicatesBy = pub.duplicates()
	res.HeaderMismatches = pub.mismatches(pr.tenantOf)
	if c := problems.counts(); len(c) > 0 {
		res.Problems, res.ProblemSamples = c, problems.samples()
		for _, p := range res.ProblemSamples {
			log.Warn("fleet suite: logged by the fleet", "record", p)
		}
	}
	return res, nil
}

// createTenantDatabases creates n databases sluice_bench_fleet_<pid>_<tenant> from one migrated
// template (CREATE DATABASE ... TEMPLATE copies it without running the migrations n times);
// the first is the hot tenant's. Env.Close drops them.
func createTenantDatabases(ctx context.Context, env *Env, n int) ([]fleetTenant, error) {
	tpl, tplURL, err := env.NewDatabase(ctx, "fleet_template", 1, nil)
	if err != nil {
		return nil, err
	}
	tpl.Close()
	tplDB := dbNameOf(tplURL)
	admin, err := pgx.Connect(ctx, env.AdminURL)
	if err != nil {
		return nil, err
	}
	defer admin.Close(context.WithoutCancel(ctx))
	u, err := url.Parse(env.AdminURL)
	if err != nil {
		return nil, err
	}
	out := make([]fleetTenant, n)
	for i := range n {
		name := hotTenant
		if i > 0 {
			name = fmt.Sprintf("q%03d", i)
		}
		db := fmt.Sprintf("sluice_bench_fleet_%d_%s", os.Getpid(), name)
		ident := pgx.Identifier{db}.Sanitize()
		if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
			return nil, fmt.Errorf("drop old %s: %w", db, err)
		}
		// The template must have no session: autovacuum may hold one for a moment.
		for attempt := 0; ; attempt++ {
			_, err = admin.Exec(ctx, "CREATE DATABASE "+ident+" TEMPLATE "+pgx.Identifier{tplDB}.Sanitize())
			var pgErr *pgconn.PgError
			if err == nil || attempt == 50 || !errors.As(err, &pgErr) || pgErr.Code != "55006" { // object_in_use
				break
			}
			if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
				return nil, err
			}
		}
		if err != nil {
			return nil, fmt.Errorf("create database %s: %w", db, err)
		}
		env.dbs = append(env.dbs, db)
		tu := *u
		tu.Path = "/" + db
		out[i] = fleetTenant{name: name, db: db, url: tu.String()}
	}
	return out, nil
}

func dbNameOf(dbURL string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		return ""
	}
	return strings.TrimPrefix(u.Path, "/")
}

// singleRelayRuns drains HotRows rows with one relay (outbox.Relay.Run) on the hot tenant's
// database before the fleet starts: at the relay's defaults, and with the one pipeline the
// fleet gives a tenant of weight 1. Each run starts as the fleet's drain does: the rows
// committed in one INSERT, no VACUUM or ANALYZE after it. The table is empty afterwards.
func singleRelayRuns(ctx context.Context, log *slog.Logger, pool *pgxpool.Pool, fs fleetSize) ([]FleetSingle, error) {
	var out []FleetSingle
	for _, run := range []struct {
		name      string
		pipelines int
	}{{"single-database relay, defaults", 0}, {"single-database relay, Pipelines 1 (a fleet tenant of weight 1)", 1}} {
		if _, err := pool.Exec(ctx, "TRUNCATE outbox_event RESTART IDENTITY"); err != nil {
			return nil, err
		}
		if err := insertOutboxRows(ctx, pool, 0, fs.HotRows, fs.HotKeys, false); err != nil {
			return nil, err
		}
		pub := &stubPublisher{Delay: fleetDelay}
		r, err := outbox.NewRelay(pool, outbox.RelayConfig{Publisher: pub, Topics: map[string]string{"orders": ordersARN}, Pipelines: run.pipelines})
		if err != nil {
			return nil, err
		}
		elapsed, err := drainWith(ctx, pool, []*outbox.Relay{r}, fs.HotRows, pub.events.Load, fs.Timeout)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", run.name, err)
		}
		pipelines := run.pipelines
		if pipelines == 0 {
			pipelines = outbox.RelayConfig{}.WithDefaults().Pipelines
		}
		s := FleetSingle{Name: run.name, Pipelines: pipelines, Events: fs.HotRows, Elapsed: elapsed}
		log.Info("fleet: single-database relay", "name", s.Name, "pipelines", s.Pipelines, "elapsed", elapsed.Round(time.Millisecond), "events/s", int(s.Rate()))
		out = append(out, s)
	}
	if _, err := pool.Exec(ctx, "TRUNCATE outbox_event RESTART IDENTITY"); err != nil {
		return nil, err
	}
	return out, nil
}

// singleRelayBesideWriters is the fleet's workload on one database: one relay at its defaults
// (warm, running before anything is written, as the fleet is) drains HotRows rows committed in
// one INSERT while writers (as many as the fleet's quiet tenants) each commit one event a
// second into the same database, as the quiet tenants do into theirs. It is timed from the
// backlog's commit until no row up to it is pending, and counts every event published in that
// time, the writers' included (the fleet's aggregate counts the quiet tenants' the same way).
func singleRelayBesideWriters(ctx context.Context, log *slog.Logger, pool *pgxpool.Pool, db fleetTenant, writers int, idBase int64, fs fleetSize) (FleetSingle, error) {
	s := FleetSingle{Name: fmt.Sprintf("single-database relay, defaults, beside %d writers of 1 event/s into its database (the fleet's workload on one database)", writers),
		Writers: writers}
	if _, err := pool.Exec(ctx, "TRUNCATE outbox_event RESTART IDENTITY"); err != nil {
		return s, err
	}
	pub := &stubPublisher{Delay: fleetDelay}
	r, err := outbox.NewRelay(pool, outbox.RelayConfig{Publisher: pub, Topics: map[string]string{"orders": ordersARN}})
	if err != nil {
		return s, err
	}
	s.Pipelines = outbox.RelayConfig{}.WithDefaults().Pipelines
	stopRelay := inBackground(ctx, r.Run)
	defer stopRelay()
	as := make([]fleetTenant, writers)
	for i := range as {
		as[i] = fleetTenant{name: fmt.Sprintf("w%03d", i+1), db: db.db, url: db.url}
	}
	prod, err := startQuietProducers(ctx, as, newWaitBook())
	if err != nil {
		return s, err
	}
	defer prod.stop()
	if err := sleepCtx(ctx, 5*time.Second); err != nil { // every writer past its first events
		return s, err
	}
	published0 := pub.events.Load()
	from, to, err := drainBacklog(ctx, pool, idBase, fs)
	if err != nil {
		return s, fmt.Errorf("%s: %w", s.Name, err)
	}
	s.Elapsed, s.Events = to.Sub(from), int(pub.events.Load()-published0)
	prod.stop()
	if err := prod.failed(); err != nil {
		return s, fmt.Errorf("%s: a writer: %w", s.Name, err)
	}
	log.Info("fleet: single-database relay", "name", s.Name, "pipelines", s.Pipelines, "elapsed", s.Elapsed.Round(time.Millisecond), "events/s", int(s.Rate()))
	_ = stopRelay()
	if _, err := pool.Exec(ctx, "TRUNCATE outbox_event RESTART IDENTITY"); err != nil {
		return s, err
	}
	return s, nil
}

// drainBacklog commits fs.HotRows rows in one INSERT into pool's outbox (their event ids made
// from idBase on, insertOutboxRows: a backlog's events are new to the stub's count) and waits until none of
// them is pending (checked every 20 ms, one lookup in the index of unpublished rows): it
// returns when the commit returned and when the check first found nothing left. Both windows
// of a FleetPair end by it.
func drainBacklog(ctx context.Context, pool *pgxpool.Pool, idBase int64, fs fleetSize) (from, to time.Time, err error) {
	if err := insertOutboxRows(ctx, pool, idBase, fs.HotRows, fs.HotKeys, false); err != nil {
		return from, to, err
	}
	from = time.Now()
	var last int64
	if err := pool.QueryRow(ctx, `SELECT max(id) FROM outbox_event`).Scan(&last); err != nil {
		return from, to, err
	}
	var left bool
	err = waitUntil(ctx, fs.Timeout, func() bool {
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM outbox_event WHERE published_at IS NULL AND id <= $1)`, last).Scan(&left)
		return err == nil && !left
	})
	return from, time.Now(), err
}

// firstTurnsEnded waits until each of f's n tenants has ended its first turn.
func firstTurnsEnded(ctx context.Context, f *fleet.Fleet, n int, timeout time.Duration) error {
	err := waitUntil(ctx, timeout, func() bool {
		st := f.Status()
		for _, s := range st {
			if s.LastTurn.IsZero() {
				return false
			}
		}
		return len(st) == n
	})
	if err != nil {
		return fmt.Errorf("fleet start-up: not every tenant had its first turn: %w", err)
	}
	return nil
}

// pairRunner measures the aggregate's pairs of windows (FleetPair) after the suite's phases,
// on the same databases: the fleet is started afresh for each of its windows and stopped
// after it, so that nothing of it runs in the reference's.
type pairRunner struct {
	log      *slog.Logger
	probe    *fleetProbe
	hotPool  *pgxpool.Pool
	hot      fleetTenant
	quiet    []fleetTenant
	fs       fleetSize
	pub      *fleetPublisher
	book     *waitBook
	newFleet func() (*fleet.Fleet, error)
	// prods are every set of quiet producers of the run, fleets the fleets the pairs ran.
	prods  []*quietProducers
	fleets []*fleet.Fleet
	// backlogs is how many backlogs the pairs committed: each window's events get ids of their
	// own (the suite's phases used the first HotRows).
	backlogs int64
}

// nextBase is where the next window's backlog's event ids start.
func (r *pairRunner) nextBase() int64 {
	r.backlogs++
	return r.backlogs * int64(r.fs.HotRows)
}

// pair measures one pair of windows, the fleet's first when fleetFirst.
func (r *pairRunner) pair(ctx context.Context, fleetFirst bool) (FleetPair, error) {
	p := FleetPair{FleetFirst: fleetFirst}
	var err error
	for _, fleetNow := range []bool{fleetFirst, !fleetFirst} {
		if fleetNow {
			p.Fleet, err = r.fleetWindow(ctx)
		} else {
			p.Reference, err = singleRelayBesideWriters(ctx, r.log, r.hotPool, r.hot, len(r.quiet), r.nextBase(), r.fs)
		}
		if err != nil {
			return p, err
		}
	}
	return p, nil
}

// fleetWindow starts a new fleet on the suite's tenants, lets its quiet tenants write for as
// long as the reference's writers do before the backlog, drains the backlog in the hot
// tenant's database (emptied first), waits for the quiet tenants' events and stops the fleet.
func (r *pairRunner) fleetWindow(ctx context.Context) (FleetSingle, error) {
	s := FleetSingle{Name: fmt.Sprintf("fleet, the backlog in one tenant's database beside %d quiet tenants of 1 event/s", len(r.quiet)),
		Writers: len(r.quiet)}
	if _, err := r.hotPool.Exec(ctx, "TRUNCATE outbox_event RESTART IDENTITY"); err != nil {
		return s, err
	}
	f, err := r.newFleet()
	if err != nil {
		return s, err
	}
	r.fleets = append(r.fleets, f)
	stopFleet := inBackground(ctx, f.Run)
	defer stopFleet()
	if err := firstTurnsEnded(ctx, f, len(r.quiet)+1, r.fs.Timeout); err != nil {
		return s, err
	}
	prod, err := startQuietProducers(ctx, r.quiet, r.book)
	if err != nil {
		return s, err
	}
	r.prods = append(r.prods, prod)
	defer prod.stop()
	if err := sleepCtx(ctx, 5*time.Second); err != nil { // as singleRelayBesideWriters waits for its writers
		return s, err
	}
	sessions := r.probe.sample(ctx)
	published0 := r.pub.count(hotTenant)
	r.pub.forgetFirst(hotTenant)
	from, to, err := drainBacklog(ctx, r.hotPool, r.nextBase(), r.fs)
	s.Pipelines = sessions.stop().hotMax
	if err != nil {
		return s, fmt.Errorf("%s: %w", s.Name, err)
	}
	s.Elapsed, s.Events = to.Sub(from), r.pub.publishedBetween(from, to)
	s.FirstAck = r.pub.firstAck(hotTenant).Sub(from)
	if hot := r.pub.count(hotTenant) - published0; hot < r.fs.HotRows {
		return s, fmt.Errorf("%s: %d of the backlog's %d events acknowledged when none was pending", s.Name, hot, r.fs.HotRows)
	}
	ids := prod.stop()
	if err := prod.failed(); err != nil {
		return s, fmt.Errorf("%s: a quiet tenant's producer: %w", s.Name, err)
	}
	if err := waitUntil(ctx, time.Minute, func() bool { return r.book.pending(ids) == 0 }); err != nil {
		return s, fmt.Errorf("%s: %d of the quiet tenants' %d events not published a minute after the last commit: %w", s.Name, r.book.pending(ids), len(ids), err)
	}
	if err := stopFleet(); err != nil {
		return s, fmt.Errorf("%s: fleet run: %w", s.Name, err)
	}
	r.log.Info("fleet: aggregate window", "name", s.Name, "hot_sessions_max", s.Pipelines, "elapsed", s.Elapsed.Round(time.Millisecond), "events/s", int(s.Rate()),
		"first_ack", s.FirstAck.Round(time.Millisecond))
	return s, nil
}

// tenantOf names the quiet tenant that wrote id, whichever of the run's producers wrote it.
func (r *pairRunner) tenantOf(id uuid.UUID) (string, bool) {
	for _, p := range r.prods {
		if t, ok := p.tenantOf(id); ok {
			return t, true
		}
	}
	return "", false
}

// measureIdle measures the fleet over window while no tenant writes.
func measureIdle(ctx context.Context, probe *fleetProbe, f *fleet.Fleet, tenants []fleetTenant, window time.Duration) (FleetIdle, error) {
	res := FleetIdle{Window: window, Tenants: len(tenants)}
	x0, err := probe.xacts(ctx, tenants)
	if err != nil {
		return res, err
	}
	turns0 := turnsOf(f)
	s := probe.sample(ctx)
	defer s.stop()
	if err := sleepCtx(ctx, window); err != nil {
		return res, err
	}
	c := s.stop()
	turns1 := turnsOf(f)
	x1, err := probe.xacts(ctx, tenants)
	if err != nil {
		return res, err
	}
	res.RelayConnsMean, res.RelayConnsMax = c.relayMean, c.relayMax
	res.ActivityConnsMean, res.ActivityConnsMax = c.activityMean, c.activityMax
	per := make([]float64, 0, len(tenants))
	for _, t := range tenants {
		v := float64(x1[t.db]-x0[t.db]) / window.Seconds()
		per = append(per, v)
		res.Xacts += v
		if v > res.XactsMax {
			res.XactsMax, res.XactsMaxDB = v, t.name
		}
	}
	res.XactsMedian = median(per)
	for name, n := range turns1 {
		res.Turns += n - turns0[name]
	}
	return res, nil
}

func turnsOf(f *fleet.Fleet) map[string]int {
	out := map[string]int{}
	for _, s := range f.Status() {
		out[s.Tenant.Name] = s.Turns
	}
	return out
}

// measurePhase measures the quiet tenants over a window. Without begin, the window is the
// next d; with begin (the hot backlog's commit of hotRows rows, which returns when it
// committed), it runs from that commit until the hot tenant's last event is acknowledged (at
// most d).
func measurePhase(ctx context.Context, probe *fleetProbe, f *fleet.Fleet, prod *quietProducers, pub *fleetPublisher, name string,
	d time.Duration, hotRows int, begin func() (time.Time, error)) (FleetPhase, error) {
	res := FleetPhase{Name: name, QuietTenants: len(prod.tenants)}
	turns0 := turnsOf(f)
	x0, err := probe.xacts(ctx, prod.tenants)
	if err != nil {
		return res, err
	}
	s := probe.sample(ctx)
	defer s.stop()
	var from, to time.Time
	hot0 := pub.count(hotTenant)
	if begin == nil {
		from = time.Now()
		if err := sleepCtx(ctx, d); err != nil {
			return res, err
		}
		to = time.Now()
	} else {
		var err error
		if from, err = begin(); err != nil {
			return res, err
		}
		err = waitUntil(ctx, d, func() bool { return pub.count(hotTenant)-hot0 >= hotRows })
		switch {
		case ctx.Err() != nil:
			return res, ctx.Err()
		case err != nil: // the time box ended first
			to, res.TimeBoxed = time.Now(), true
		default:
			to = pub.lastAck(hotTenant)
		}
		res.HotEvents = pub.count(hotTenant) - hot0
		if first := pub.firstAck(hotTenant); hot0 == 0 && !first.IsZero() {
			res.HotFirst = first.Sub(from)
		}
	}
	c := s.stop()
	x1, err := probe.xacts(ctx, prod.tenants)
	if err != nil {
		return res, err
	}
	for db, n := range x1 {
		res.QuietXacts += n - x0[db]
	}
	res.ConnsMean, res.ConnsMax, res.HotSessionsMax = c.relayMean+c.activityMean, c.totalMax, c.hotMax
	res.Window = to.Sub(from)
	turns1 := turnsOf(f)
	for n, v := range turns1 {
		if n == hotTenant {
			res.HotTurns = v - turns0[n]
		} else {
			res.Turns += v - turns0[n]
		}
	}
	// Let the window's last events be published before judging them.
	ids := prod.committedBetween(from, to)
	_ = waitUntil(ctx, time.Minute, func() bool { return prod.book.pending(ids) == 0 })
	waits, missing := prod.book.waits(ids)
	res.QuietEvents, res.Quiet, res.Missing = len(ids), summarize(waits), missing
	res.Published = pub.publishedBetween(from, to)
	return res, nil
}

// inBackground runs run in a goroutine on a context of its own; stop cancels that context,
// waits for run to return and returns its error (every call, the same).
func inBackground(ctx context.Context, run func(context.Context) error) (stop func() error) {
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(rctx) }()
	return sync.OnceValue(func() error {
		cancel()
		return <-done
	})
}

// waitUntil polls cond every 20 ms until it holds, for at most d.
func waitUntil(ctx context.Context, d time.Duration, cond func() bool) error {
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %s", d)
		}
		if err := sleepCtx(ctx, 20*time.Millisecond); err != nil {
			return err
		}
	}
	return nil
}

// markBacklogPublished marks the pending rows of pool's outbox published while its relay may
// still be settling some of them: a thousand rows at a time, in id order, passing over rows
// another transaction holds (the relay's settle publishes those itself), so it never waits
// for the relay. One UPDATE of every row would: it and a settle batch lock rows in different
// orders, and when PostgreSQL breaks that deadlock by failing the settle, the relay publishes
// the rows again. The batch's ids are gathered once (ARRAY of the subquery) and looked up by
// primary key: as "id IN (subquery)" the planner, with statistics from the full backlog, ran
// the subquery once per row of the table and took minutes to find that nothing was left.
func markBacklogPublished(ctx context.Context, pool *pgxpool.Pool, timeout time.Duration) error {
	var last error
	err := waitUntil(ctx, timeout, func() bool {
		tag, err := pool.Exec(ctx, `UPDATE outbox_event SET published_at = now() WHERE id = ANY(ARRAY(
			SELECT id FROM outbox_event WHERE published_at IS NULL ORDER BY id LIMIT 1000 FOR UPDATE SKIP LOCKED))`)
		if last = err; err != nil || tag.RowsAffected() > 0 {
			return false
		}
		n, err := pendingCount(ctx, pool)
		last = err
		return err == nil && n == 0
	})
	if err != nil && last != nil {
		return fmt.Errorf("%w (last: %w)", err, last)
	}
	return err
}
