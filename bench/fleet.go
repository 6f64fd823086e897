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
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/internal/pgcluster"
	"github.com/sluicehq/sluice/pkg/fleet"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// The fleet suite (issues 24 and 42): one pkg/fleet deployment at its shipped defaults (the
// server's connection budget fleet.DefaultServerConnections, every other setting its default)
// serving 200 and then 1,000 tenant databases on one PostgreSQL server that, like a managed
// one, takes only TLS connections authenticated with scram-sha-256 (the fleet logs in as a
// password role of its own). Each run of a size measures:
//
//   - the cold start: the fleet started on a server whose hot tenant already holds a backlog
//     (written in many transactions), until every tenant ended its first turn and until the
//     backlog was drained, against one relay started on the same backlog;
//   - the idle cost: no tenant writes; the fleet's statements, transactions, sessions opened
//     and connections held, per tenant;
//   - the quiet tenants alone: every tenant but the hot one writes, 200 events/s in all, and
//     their commit-to-publish is measured over a window;
//   - the same with the hot tenant's backlog written in many transactions at the window's
//     start: what the backlog adds to the quiet tenants' commit-to-publish, and the backlog's
//     drain rate, against one relay given as many connections as the fleet gives one tenant,
//     draining the same backlog written the same way beside the same quiet writers (measured
//     right after, the fleet stopped).
//
// Every window reports the sessions the fleet opened per second (pg_stat_database.sessions of
// the tenant databases) and how long its connects took (a pgx connect tracer).

// FleetResult is the fleet suite's outcome.
type FleetResult struct {
	// Budget is the server's connection budget the fleet ran with (its default,
	// fleet.DefaultServerConnections, unless -fleet-budget said otherwise); Settings describes
	// the fleet's other settings.
	Budget   int
	Settings string
	// Auth is how the fleet logged in to the server.
	Auth string
	// Delay is the stub broker's latency per PublishBatch call.
	Delay time.Duration
	// QuietRate is the events per second the quiet tenants wrote in all, spread evenly over
	// them (each its own transaction).
	QuietRate float64
	// Backlog is how the hot tenant's backlog was written, at cold start and in the window
	// with it.
	Backlog FleetBacklog
	// Runs are the suite's runs: per size, in order.
	Runs []FleetRun
}

// FleetBacklog is a backlog written in Transactions transactions of Rows/Transactions rows
// each, over Keys partition keys, by Writers connections at once, as fast as they can.
type FleetBacklog struct {
	Rows, Transactions, Keys, Writers int
}

// FleetRun is one run of the suite at one number of tenants.
type FleetRun struct {
	// Tenants is the number of tenant databases (one hot, the rest quiet); Run numbers the
	// runs of that size from 1.
	Tenants, Run int
	// CreateDatabases is how long creating the run's new tenant databases took (CREATE
	// DATABASE from a migrated template); 0 when the run reused its size's databases.
	CreateDatabases time.Duration `json:",omitempty"`
	// Startup is how long it took from the fleet's Run until every tenant had ended its first
	// turn; Cold is the fleet draining the backlog present at that start (timed from Run), and
	// ColdReference one relay started on the same backlog.
	Startup             time.Duration
	Cold, ColdReference FleetDrain
	// Idle is the idle window.
	Idle FleetIdle
	// Without and With are the quiet tenants' windows without and with the hot tenant's
	// backlog; With.Drain is the backlog's drain, Reference the same backlog drained by one
	// relay beside the same writers.
	Without, With FleetPhase
	Reference     FleetDrain
	// BudgetPeak is the most connections the fleet's budget granted at once
	// (Fleet.BudgetUsage), ConnsMax the most sluice-fleet-* sessions pg_stat_activity showed at
	// once over the run.
	BudgetPeak, ConnsMax int
	// Connects is the fleet's connects over the run (its start to its stop), ConnectTime the
	// time they took in all.
	Connects    int
	ConnectTime time.Duration
	// Unpublished counts the quiet tenants' events still not published a minute after the
	// window with the backlog (and its own minute) ended, when the fleet was stopped.
	Unpublished int `json:",omitempty"`
	// Duplicates counts events published more than once; HeaderMismatches published events
	// whose outbox.TenantHeader did not name their writer.
	Duplicates, HeaderMismatches int
	// HotStatements are the hot tenant's statements in the window with the backlog, by kind.
	HotStatements []FleetStmtTime `json:",omitempty"`
	// Problems counts the fleet's and relays' log records at Warn and above, by message;
	// ProblemSamples are the first of them.
	Problems       map[string]int `json:",omitempty"`
	ProblemSamples []string       `json:",omitempty"`
}

// FleetStmtTime is how many statements of one kind a tenant's relay ran and how long they
// took in all.
type FleetStmtTime struct {
	Kind  string
	N     int
	Total time.Duration
}

// FleetDrain is one drain of a backlog.
type FleetDrain struct {
	// Rows is the backlog; Pipelines the relay's pipelines (its pool has as many connections),
	// or for the fleet the most relay sessions the hot tenant held at once (sampled every
	// 250 ms).
	Rows, Pipelines int
	// Write is how long the writers took to commit the backlog (0: it was there before).
	Write time.Duration `json:",omitempty"`
	// Elapsed runs from the backlog's first commit (or the relay's or fleet's start, for a
	// backlog present before) until a check (every 20 ms) first found none of its rows pending;
	// TimedOut: it had not by the suite's time box (Rows then counts what was published of it
	// by then).
	Elapsed  time.Duration
	TimedOut bool `json:",omitempty"`
	// FirstAck is how long after the same start the backlog's first event was acknowledged.
	FirstAck time.Duration `json:",omitempty"`
}

// Rate is the drain's events per second.
func (d FleetDrain) Rate() float64 { return rate(d.Rows, d.Elapsed) }

// FleetIdle is the cost of the fleet while no tenant writes.
type FleetIdle struct {
	Window  time.Duration
	Tenants int
	// RelayConns and ActivityConns are the sessions the fleet held (pg_stat_activity,
	// application_name sluice-fleet-relay and sluice-fleet-activity), sampled every 250 ms.
	RelayConnsMean, ActivityConnsMean float64
	RelayConnsMax, ActivityConnsMax   int
	// Statements is the fleet's statements per second in the tenant databases
	// (pg_stat_statements calls of the fleet's role; -1: not measured).
	Statements float64
	// Xacts is the transactions per second in the tenant databases (xact_commit +
	// xact_rollback), XactsMax in the busiest one (XactsMaxDB).
	Xacts, XactsMax float64
	XactsMaxDB      string
	// Sessions is the sessions opened per second in the tenant databases.
	Sessions float64
	// Turns is the tenants' turns in the window.
	Turns int
}

// FleetPhase is a window of the quiet tenants writing.
type FleetPhase struct {
	Name   string
	Window time.Duration
	// QuietTenants wrote QuietEvents in the window; Quiet is their commit-to-acknowledgement
	// times (Commit returned to the stub's acknowledgement, its delay included), Missing the
	// events not acknowledged within a minute of the window's end. QuietDuringDrain are those
	// of the events committed while the backlog was being drained (With only).
	QuietTenants, QuietEvents, Missing int
	Quiet                              Latencies
	QuietDuringDrain                   Latencies `json:",omitempty"`
	// Drain is the hot tenant's backlog (With only).
	Drain FleetDrain `json:",omitempty"`
	// Sessions is the sessions opened per second in the tenant databases (the fleet's: the
	// producers stay connected); Connects and ConnectTime the fleet's connects in the window
	// and the time they took in all (TLS and scram-sha-256 included).
	Sessions    float64
	Connects    int
	ConnectTime time.Duration
	// Statements is the fleet's statements per second in the tenant databases (-1: not
	// measured); Xacts the transactions per second in them, the producers' included.
	Statements, Xacts float64
	// The fleet's sessions (pg_stat_activity) over the window, sampled every 250 ms.
	ConnsMean float64
	ConnsMax  int
	// Turns is the quiet tenants' turns in the window, HotTurns the hot tenant's.
	Turns, HotTurns int
}

func rate(n int, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(n) / d.Seconds()
}

// fleetSize is the suite's workload.
type fleetSize struct {
	// Tenants are the sizes run, in order (one hot tenant, the rest quiet); Runs the runs of
	// each.
	Tenants []int
	Runs    int
	// QuietRate is the events per second of the quiet tenants in all.
	QuietRate float64
	// Backlog is the hot tenant's backlog, at cold start and in the window with it.
	Backlog FleetBacklog
	// IdleWindow and QuietWindow are the idle and the quiet tenants' windows (the window with
	// the backlog lasts at least QuietWindow, and until the backlog is drained).
	IdleWindow, QuietWindow time.Duration
	// Budget is the fleet's connection budget (0: fleet.DefaultServerConnections).
	Budget int
	// HotWeight is the hot tenant's Weight; 0 is 1.
	HotWeight int
	// Timeout bounds the start-up; DrainBox a drain: a backlog not drained by then is measured
	// by what was published of it (FleetDrain.TimedOut).
	Timeout, DrainBox time.Duration
}

// fleetDelay is the stub broker's latency per call, the relay suite's 10 ms.
const fleetDelay = 10 * time.Millisecond

// fleetTargetRatio is issue 42's bound on the backlog's drain rate in the fleet against one
// relay given the same connections; fleetTargetDelay its bound on what the backlog adds to
// the quiet tenants' commit-to-publish at p99.
const (
	fleetTargetRatio = 0.8
	fleetTargetDelay = time.Second
)

// fleetRole is the password role the fleet logs in as on the suite's own server.
const fleetRole = "sluice_fleet"

// fleetHarnessConns is what the suite's harness connects beside the fleet and the producers:
// its probe, the hot tenant's pool, the backlog's writers and the reference relay.
const fleetHarnessConns = 20

// fleetSizeFor derives the suite's size from the run's: 200 and 1,000 tenants, two runs each,
// windows of 30 s at full size; -quick a fraction of it. -fleet-tenants and -fleet-runs
// override the sizes and the runs.
func fleetSizeFor(sz Sizes) fleetSize {
	fs := fleetSize{Tenants: []int{200, 1000}, Runs: 2, QuietRate: 200,
		Backlog:    FleetBacklog{Rows: 200_000, Transactions: 2_000, Keys: 1_000, Writers: 4},
		IdleWindow: 30 * time.Second, QuietWindow: 30 * time.Second, Timeout: 3 * time.Minute, DrainBox: 2 * time.Minute}
	if sz.Name != "full" {
		fs = fleetSize{Tenants: []int{10, 30}, Runs: 1, QuietRate: 20,
			Backlog:    FleetBacklog{Rows: 10_000, Transactions: 100, Keys: 200, Writers: 2},
			IdleWindow: 5 * time.Second, QuietWindow: 5 * time.Second, Timeout: 2 * time.Minute, DrainBox: time.Minute}
	}
	if len(sz.FleetTenants) > 0 {
		fs.Tenants = sz.FleetTenants
	}
	if sz.FleetRuns > 0 {
		fs.Runs = sz.FleetRuns
	}
	fs.Budget, fs.HotWeight = sz.FleetBudget, sz.FleetHotWeight
	return fs
}

func runFleetSuite(ctx context.Context, log *slog.Logger, env *Env, sz Sizes, rep *Report) error {
	res, err := measureFleet(ctx, log, env, fleetSizeFor(sz))
	if err != nil {
		return err
	}
	rep.Fleet = res
	return nil
}

// fleetTenant is one tenant database of the suite: url is the fleet's (its role's), adminURL
// the harness's (the producers', the writers').
type fleetTenant struct {
	name, db, url, adminURL string
}

// hotTenant is the hot tenant's name; quiet tenants are q0001, q0002, ...
const hotTenant = "hot"

// fleetServer is the server the suite runs on: its own throwaway cluster (TLS, scram-sha-256,
// pg_stat_statements) when the harness started the run's, else the run's server as it is.
type fleetServer struct {
	adminURL string
	// fleetUser and fleetPassword are the fleet's login; empty: the admin URL's.
	fleetUser, fleetPassword string
	auth                     string
	cluster                  *pgcluster.Cluster
	dbs                      []string
	template                 string
}

// openFleetServer starts the suite's server for up to tenants databases (max_connections:
// a producer per quiet tenant beside the budget and the harness).
func openFleetServer(ctx context.Context, log *slog.Logger, env *Env, tenants, budget int) (*fleetServer, error) {
	if env.cluster == nil {
		return &fleetServer{adminURL: env.AdminURL, auth: "as the server named by DATABASE_URL takes the harness's login (not the suite's own TLS and scram-sha-256 server)"}, nil
	}
	password := fmt.Sprintf("bench-%d-%d", os.Getpid(), time.Now().UnixNano())
	log.Info("fleet: starting a throwaway PostgreSQL cluster with TLS and scram-sha-256", "max_connections", tenants+budget+fleetHarnessConns+20)
	c, err := pgcluster.Start(ctx, pgcluster.Options{Password: password, MaxConnections: tenants + budget + fleetHarnessConns + 20,
		Settings: map[string]string{"shared_preload_libraries": "pg_stat_statements", "pg_stat_statements.max": "50000"}})
	if err != nil {
		return nil, fmt.Errorf("start the fleet's PostgreSQL cluster: %w", err)
	}
	s := &fleetServer{adminURL: c.URL, cluster: c, fleetUser: fleetRole, fleetPassword: password + "-fleet",
		auth: fmt.Sprintf("scram-sha-256 over TLS (ssl=on, a self-signed certificate; pg_hba.conf takes only hostssl with scram-sha-256), "+
			"as the role %s (LOGIN PASSWORD, pg_read_all_stats, privileges on the outbox's tables)", fleetRole)}
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		s.close()
		return nil, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	for _, q := range []string{
		"CREATE EXTENSION IF NOT EXISTS pg_stat_statements",
		fmt.Sprintf("CREATE ROLE %s LOGIN PASSWORD '%s'", fleetRole, s.fleetPassword),
		"GRANT pg_read_all_stats TO " + fleetRole,
	} {
		if _, err := conn.Exec(ctx, q); err != nil {
			s.close()
			return nil, fmt.Errorf("%s: %w", strings.SplitN(q, " PASSWORD", 2)[0], err)
		}
	}
	return s, nil
}

func (s *fleetServer) close() {
	if s.cluster != nil {
		s.cluster.Stop()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.adminURL)
	if err != nil {
		return
	}
	defer conn.Close(ctx)
	for _, db := range append(s.dbs, s.template) {
		if db != "" {
			_, _ = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)")
		}
	}
}

// measureFleet runs the suite at size fs on its server.
func measureFleet(ctx context.Context, log *slog.Logger, env *Env, fs fleetSize) (*FleetResult, error) {
	fs.HotWeight = max(1, fs.HotWeight)
	budget := fs.Budget
	if budget == 0 {
		budget = fleet.DefaultServerConnections
	}
	most := 0
	for _, n := range fs.Tenants {
		most = max(most, n)
	}
	srv, err := openFleetServer(ctx, log, env, most, budget)
	if err != nil {
		return nil, err
	}
	defer srv.close()
	res := &FleetResult{Budget: budget, Auth: srv.auth, Delay: fleetDelay, QuietRate: fs.QuietRate, Backlog: fs.Backlog,
		Settings: fmt.Sprintf("DefaultConnections %d; the hot tenant's Weight %d (the others 1); the rest at their defaults: Relay.Pipelines 1 per unit of weight, "+
			"BurstPipelines %d, DetectInterval %s, SweepInterval %s, IdleClose %s, Turn %s, BusyShare %.1f, RegistryRefresh %s", budget, fs.HotWeight,
			outbox.RelayConfig{}.WithDefaults().Pipelines, fleet.DefaultDetectInterval, fleet.DefaultSweepInterval, fleet.DefaultIdleClose, fleet.DefaultTurn,
			fleet.DefaultBusyShare, fleet.DefaultRegistryRefresh)}
	probe, err := newFleetProbe(ctx, srv.adminURL, srv.fleetUser)
	if err != nil {
		return nil, err
	}
	defer probe.close()
	var maxConns int
	if err := probe.pool.QueryRow(ctx, `SELECT current_setting('max_connections')::int`).Scan(&maxConns); err != nil {
		return nil, fmt.Errorf("read max_connections: %w", err)
	}
	if need := budget + most - 1 + fleetHarnessConns; need > maxConns {
		return nil, fmt.Errorf("the server's max_connections is %d: the fleet suite needs %d (the budget %d, %d producers, %d for the harness)",
			maxConns, need, budget, most-1, fleetHarnessConns)
	}
	var tenants []fleetTenant
	for _, n := range fs.Tenants {
		created := time.Duration(0)
		if len(tenants) < n {
			t0 := time.Now()
			more, err := srv.createTenantDatabases(ctx, len(tenants), n-len(tenants))
			if err != nil {
				return nil, err
			}
			tenants = append(tenants, more...)
			created = time.Since(t0)
			log.Info("fleet: tenant databases created", "databases", len(more), "took", created.Round(time.Millisecond))
		}
		for run := 1; run <= fs.Runs; run++ {
			r, err := fleetRun(ctx, log, probe, tenants[:n], fs, budget)
			if err != nil {
				return nil, fmt.Errorf("%d tenants, run %d: %w", n, run, err)
			}
			r.Run = run
			if run == 1 {
				r.CreateDatabases = created
			}
			res.Runs = append(res.Runs, *r)
		}
	}
	return res, nil
}

// createTenantDatabases creates n databases from one migrated template (CREATE DATABASE ...
// TEMPLATE copies it without running the migrations n times), numbered from first; tenant 0 is
// the hot one. The template grants the fleet's role what its relay needs.
func (s *fleetServer) createTenantDatabases(ctx context.Context, first, n int) ([]fleetTenant, error) {
	u, err := url.Parse(s.adminURL)
	if err != nil {
		return nil, err
	}
	if s.template == "" {
		env := &Env{AdminURL: s.adminURL}
		tpl, tplURL, err := env.NewDatabase(ctx, "fleet_template", 1, nil)
		if err != nil {
			return nil, err
		}
		if s.fleetUser != "" {
			for _, q := range []string{"GRANT ALL ON ALL TABLES IN SCHEMA public TO %s", "GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO %s",
				"GRANT ALL ON ALL FUNCTIONS IN SCHEMA public TO %s", "GRANT USAGE, CREATE ON SCHEMA public TO %s"} {
				if _, err := tpl.Exec(ctx, fmt.Sprintf(q, s.fleetUser)); err != nil {
					tpl.Close()
					return nil, fmt.Errorf("grant the fleet's role: %w", err)
				}
			}
		}
		tpl.Close()
		s.template = dbNameOf(tplURL)
	}
	out := make([]fleetTenant, n)
	errs := make([]error, fleetCreators)
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := range fleetCreators {
		wg.Add(1)
		go func() {
			defer wg.Done()
			conn, err := pgx.Connect(ctx, s.adminURL)
			if err != nil {
				errs[w] = err
				return
			}
			defer conn.Close(context.WithoutCancel(ctx))
			for j := int(next.Add(1) - 1); j < n; j = int(next.Add(1) - 1) {
				if out[j], errs[w] = s.createTenantDatabase(ctx, conn, u, first+j); errs[w] != nil {
					next.Store(int64(n)) // the others stop too
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for _, t := range out {
		s.dbs = append(s.dbs, t.db)
	}
	return out, nil
}

// fleetCreators is how many CREATE DATABASE statements run at once: each copies the template
// between two checkpoints (STRATEGY FILE_COPY), and concurrent ones share their checkpoints
// (on this machine about 90 ms a database at 4 at once against 700 ms one at a time).
const fleetCreators = 8

// createTenantDatabase creates tenant i's database from the template on admin.
func (s *fleetServer) createTenantDatabase(ctx context.Context, admin *pgx.Conn, u *url.URL, i int) (fleetTenant, error) {
	name := hotTenant
	if i > 0 {
		name = fmt.Sprintf("q%04d", i)
	}
	db := fmt.Sprintf("sluice_bench_fleet_%d_%s", os.Getpid(), name)
	ident := pgx.Identifier{db}.Sanitize()
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
		return fleetTenant{}, fmt.Errorf("drop old %s: %w", db, err)
	}
	// The template must have no session: autovacuum may hold one for a moment.
	var err error
	for attempt := 0; ; attempt++ {
		_, err = admin.Exec(ctx, "CREATE DATABASE "+ident+" TEMPLATE "+pgx.Identifier{s.template}.Sanitize()+" STRATEGY FILE_COPY")
		var pgErr *pgconn.PgError
		if err == nil || attempt == 50 || !errors.As(err, &pgErr) || pgErr.Code != "55006" { // object_in_use
			break
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil {
			return fleetTenant{}, err
		}
	}
	if err != nil {
		return fleetTenant{}, fmt.Errorf("create database %s: %w", db, err)
	}
	tu := *u
	tu.Path = "/" + db
	t := fleetTenant{name: name, db: db, adminURL: tu.String()}
	if s.fleetUser != "" {
		tu.User = url.UserPassword(s.fleetUser, s.fleetPassword)
	}
	t.url = tu.String()
	return t, nil
}

func dbNameOf(dbURL string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		return ""
	}
	return strings.TrimPrefix(u.Path, "/")
}

// fleetRun is one run of the suite on tenants (the first the hot one): a fleet started cold on
// a backlog, the idle window, the quiet tenants' windows without and with a backlog, and the
// reference relay.
func fleetRun(ctx context.Context, log *slog.Logger, probe *fleetProbe, tenants []fleetTenant, fs fleetSize, budget int) (*FleetRun, error) {
	res := &FleetRun{Tenants: len(tenants)}
	hot, quiet := tenants[0], tenants[1:]
	probe.hotDB = hot.db
	hotPool, err := openPool(ctx, hot.adminURL, int32(fs.Backlog.Writers+2))
	if err != nil {
		return nil, err
	}
	defer hotPool.Close()
	refPipelines := outbox.RelayConfig{}.WithDefaults().Pipelines * fs.HotWeight // the most a tenant alone grows to (BurstPipelines)

	// The reference's cold start: one relay started on the backlog.
	if _, err := hotPool.Exec(ctx, "TRUNCATE outbox_event RESTART IDENTITY"); err != nil {
		return nil, err
	}
	var idBase int64
	nextBase := func() int64 { idBase += int64(fs.Backlog.Rows); return idBase }
	if _, err := writeBacklog(ctx, hotPool, nextBase(), fs.Backlog); err != nil {
		return nil, err
	}
	if res.ColdReference, err = referenceDrain(ctx, hotPool, hot, refPipelines, fs, 0); err != nil {
		return nil, fmt.Errorf("the reference's cold start: %w", err)
	}
	log.Info("fleet: reference cold drain", "tenants", len(tenants), "events/s", int(res.ColdReference.Rate()), "elapsed", res.ColdReference.Elapsed.Round(time.Millisecond))

	// The fleet: every setting at its default.
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
	hotTracer := newRelayTracer()
	connects := &connectTracer{}
	hotConnects := &connectTracer{QueryTracer: hotTracer, also: connects}
	connect := func(_ context.Context, t fleet.Tenant) (*pgxpool.Config, error) {
		pc, err := pgxpool.ParseConfig(t.DatabaseURL)
		if err != nil {
			return nil, err
		}
		pc.ConnConfig.Tracer = connects
		if t.Name == hotTenant {
			pc.ConnConfig.Tracer = hotConnects
		}
		return pc, nil
	}
	cfg := fleet.Config{Registry: reg, DefaultConnections: fs.Budget, Connect: connect,
		Relay:  outbox.RelayConfig{Publisher: pub, Topics: map[string]string{"orders": ordersARN}, Logger: slog.New(problems)},
		Logger: slog.New(problems)}
	f, err := fleet.New(cfg)
	if err != nil {
		return nil, err
	}

	// Cold start: the backlog is there before the fleet starts.
	if _, err := writeBacklog(ctx, hotPool, nextBase(), fs.Backlog); err != nil {
		return nil, err
	}
	var last int64
	if err := hotPool.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM outbox_event`).Scan(&last); err != nil {
		return nil, err
	}
	hotSessions := probe.sample(ctx)
	started := time.Now()
	stopFleet := inBackground(ctx, f.Run)
	defer stopFleet()
	connsAll := probe.sample(ctx) // over the whole run, for the budget check
	defer connsAll.stop()
	if err := firstTurnsEnded(ctx, f, len(tenants), fs.Timeout); err != nil {
		return nil, err
	}
	res.Startup = time.Since(started)
	res.Cold = FleetDrain{Rows: fs.Backlog.Rows}
	to, left, err := drainedUpTo(ctx, hotPool, last, started, fs.DrainBox)
	if err != nil {
		return nil, err
	}
	res.Cold.Elapsed, res.Cold.Pipelines = to.Sub(started), hotSessions.stop().hotMax
	res.Cold.timedOut(left)
	if first := pub.firstAck(hotTenant); !first.IsZero() {
		res.Cold.FirstAck = first.Sub(started)
	}
	log.Info("fleet: cold start", "tenants", len(tenants), "startup", res.Startup.Round(time.Millisecond), "drain", res.Cold.Elapsed.Round(time.Millisecond),
		"events/s", int(res.Cold.Rate()), "hot_sessions_max", res.Cold.Pipelines)
	if err := sleepCtx(ctx, 5*time.Second); err != nil { // the turns of the drain over
		return nil, err
	}

	// Idle: no tenant writes.
	if res.Idle, err = measureIdle(ctx, probe, f, tenants, fs.IdleWindow); err != nil {
		return nil, err
	}
	log.Info("fleet idle", "tenants", len(tenants), "statements/s", fmt.Sprintf("%.1f", res.Idle.Statements), "xacts/s", fmt.Sprintf("%.1f", res.Idle.Xacts),
		"sessions/s", fmt.Sprintf("%.2f", res.Idle.Sessions), "relay_conns_mean", fmt.Sprintf("%.2f", res.Idle.RelayConnsMean), "turns", res.Idle.Turns)

	// The quiet tenants write from here to the end.
	prod, err := startQuietProducers(ctx, quiet, book, time.Duration(float64(len(quiet))/fs.QuietRate*float64(time.Second)))
	if err != nil {
		return nil, err
	}
	defer prod.stop()
	if err := sleepCtx(ctx, 10*time.Second); err != nil { // past the producers' first events and their tenants' first wake-ups
		return nil, err
	}
	res.Without, err = measurePhase(ctx, probe, f, prod, pub, connects, "without the backlog", fs.QuietWindow, nil)
	if err != nil {
		return nil, err
	}
	logPhase(log, len(tenants), res.Without)
	hotTracer.reset()
	res.With, err = measurePhase(ctx, probe, f, prod, pub, connects, "with the backlog", fs.QuietWindow, func(sessions *connSampler) (FleetDrain, time.Time, error) {
		return drainWritten(ctx, hotPool, nextBase(), fs, sessions, pub)
	})
	if err != nil {
		return nil, err
	}
	for _, kind := range []string{stmtPoll, stmtSweep, stmtLock, stmtSettle} {
		st := FleetStmtTime{Kind: kind}
		for _, s := range hotTracer.take(kind) {
			st.N++
			st.Total += s.Took
		}
		res.HotStatements = append(res.HotStatements, st)
	}
	logPhase(log, len(tenants), res.With)

	// Every quiet event of the fleet's windows is published (or counted as not), then the
	// fleet stops.
	ids := prod.committedBetween(time.Time{}, time.Now())
	_ = waitUntil(ctx, time.Minute, func() bool { return book.pending(ids) == 0 })
	res.Unpublished = book.pending(ids)
	if err := stopFleet(); err != nil {
		return nil, fmt.Errorf("fleet run: %w", err)
	}
	res.ConnsMax = connsAll.stop().totalMax
	n, took := connects.read()
	res.Connects, res.ConnectTime = int(n), took
	for _, u := range f.BudgetUsage() {
		res.BudgetPeak = max(res.BudgetPeak, u[1])
	}
	res.Duplicates, _ = pub.duplicates()
	res.HeaderMismatches = pub.mismatches(prod.tenantOf)
	if c := problems.counts(); len(c) > 0 {
		res.Problems, res.ProblemSamples = c, problems.samples()
		for _, p := range res.ProblemSamples {
			log.Warn("fleet suite: logged by the fleet", "record", p)
		}
	}

	// The reference: one relay given the connections the fleet gives one tenant at most, the
	// same backlog written the same way, the quiet tenants still writing (their events wait
	// for the next run's cold start, marked published when their producers stop).
	res.Reference, err = referenceDrain(ctx, hotPool, hot, refPipelines, fs, nextBase())
	if err != nil {
		return nil, fmt.Errorf("the reference: %w", err)
	}
	log.Info("fleet: reference drain", "tenants", len(tenants), "events/s", int(res.Reference.Rate()), "elapsed", res.Reference.Elapsed.Round(time.Millisecond),
		"fleet_events/s", int(res.With.Drain.Rate()))
	prod.markPublishedOnStop()
	prod.stop()
	if err := prod.failed(); err != nil {
		return nil, fmt.Errorf("a quiet tenant's producer: %w", err)
	}
	return res, nil
}

func logPhase(log *slog.Logger, tenants int, p FleetPhase) {
	log.Info("fleet phase", "tenants", tenants, "phase", p.Name, "window", p.Window.Round(time.Millisecond), "events", p.QuietEvents,
		"p50", p.Quiet.P50, "p99", p.Quiet.P99, "max", p.Quiet.Max, "missing", p.Missing, "sessions/s", fmt.Sprintf("%.1f", p.Sessions),
		"drain_events/s", int(p.Drain.Rate()), "drain", p.Drain.Elapsed.Round(time.Millisecond))
}

// writeBacklog commits b.Rows rows into pool's outbox in b.Transactions transactions, b.Writers
// at once, their event ids numbered from idBase on; it returns how long that took and the
// highest id written.
func writeBacklog(ctx context.Context, pool *pgxpool.Pool, idBase int64, b FleetBacklog) (time.Duration, error) {
	per := b.Rows / b.Transactions
	var next atomic.Int64
	t0 := time.Now()
	errs := make([]error, b.Writers)
	var wg sync.WaitGroup
	for w := range b.Writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(b.Transactions) {
					return
				}
				// One statement outside a transaction block: one transaction.
				if errs[w] = insertOutboxRows(ctx, pool, idBase+i*int64(per), per, b.Keys, false); errs[w] != nil {
					next.Store(int64(b.Transactions)) // the others stop too
					return
				}
			}
		}()
	}
	wg.Wait()
	return time.Since(t0), errors.Join(errs...)
}

// drainedUpTo waits until none of pool's rows up to id last is pending (checked every 20 ms,
// one lookup in the index of unpublished rows), at most timeout after from, and returns when
// the check first found none, or when it gave up: then left is how many were still pending.
func drainedUpTo(ctx context.Context, pool *pgxpool.Pool, last int64, from time.Time, timeout time.Duration) (to time.Time, left int, err error) {
	var any bool
	err = waitUntil(ctx, timeout-time.Since(from), func() bool {
		err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM outbox_event WHERE published_at IS NULL AND id <= $1)`, last).Scan(&any)
		return err == nil && !any
	})
	to = time.Now()
	if ctx.Err() != nil {
		return to, 0, ctx.Err()
	}
	if err != nil {
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM outbox_event WHERE published_at IS NULL AND id <= $1`, last).Scan(&left); err != nil {
			return to, 0, err
		}
	}
	return to, left, nil
}

// timedOut records on d that its drain gave up with left rows pending: Rows becomes what was
// published of it.
func (d *FleetDrain) timedOut(left int) {
	if left > 0 {
		d.TimedOut, d.Rows = true, d.Rows-left
	}
}

// drainWritten writes a backlog into the hot tenant's database (writeBacklog) while it is
// served, and times its drain from the first commit: it returns the drain and when it began.
// ack, when set, tells the backlog's first acknowledgement.
func drainWritten(ctx context.Context, pool *pgxpool.Pool, idBase int64, fs fleetSize, sessions *connSampler, pub *fleetPublisher) (FleetDrain, time.Time, error) {
	d := FleetDrain{Rows: fs.Backlog.Rows}
	if pub != nil {
		pub.forgetFirst(hotTenant)
	}
	from := time.Now()
	var err error
	if d.Write, err = writeBacklog(ctx, pool, idBase, fs.Backlog); err != nil {
		return d, from, err
	}
	var last int64
	if err := pool.QueryRow(ctx, `SELECT max(id) FROM outbox_event`).Scan(&last); err != nil {
		return d, from, err
	}
	to, left, err := drainedUpTo(ctx, pool, last, from, fs.DrainBox)
	if err != nil {
		return d, from, err
	}
	d.Elapsed = to.Sub(from)
	d.timedOut(left)
	if sessions != nil {
		d.Pipelines = sessions.stop().hotMax
	}
	if pub != nil {
		if first := pub.firstAck(hotTenant); !first.IsZero() {
			d.FirstAck = first.Sub(from)
		}
	}
	return d, from, nil
}

// referenceDrain is one relay (outbox.Relay.Run) on the hot tenant's database with pipelines
// pipelines on a pool of as many connections, logging in as the fleet does: with idBase 0 it
// is started on the backlog already there and timed from its start; otherwise it runs first
// and the backlog is written as in the fleet's window (drainWritten). The table is emptied
// afterwards.
func referenceDrain(ctx context.Context, hotPool *pgxpool.Pool, hot fleetTenant, pipelines int, fs fleetSize, idBase int64) (FleetDrain, error) {
	d := FleetDrain{Rows: fs.Backlog.Rows, Pipelines: pipelines}
	pool, err := openPool(ctx, hot.url, int32(pipelines))
	if err != nil {
		return d, err
	}
	defer pool.Close()
	pub := &stubPublisher{Delay: fleetDelay}
	r, err := outbox.NewRelay(pool, outbox.RelayConfig{Publisher: pub, Topics: map[string]string{"orders": ordersARN}, Pipelines: pipelines})
	if err != nil {
		return d, err
	}
	if idBase == 0 {
		var last int64
		if err := hotPool.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM outbox_event`).Scan(&last); err != nil {
			return d, err
		}
		from := time.Now()
		stop := inBackground(ctx, r.Run)
		to, left, err := drainedUpTo(ctx, hotPool, last, from, fs.DrainBox)
		_ = stop()
		if err != nil {
			return d, err
		}
		d.Elapsed = to.Sub(from)
		d.timedOut(left)
	} else {
		stop := inBackground(ctx, r.Run)
		if err := sleepCtx(ctx, 2*time.Second); err != nil { // running, its pool connected, as the fleet's hot tenant is parked
			return d, err
		}
		w, _, err := drainWritten(ctx, hotPool, idBase, fs, nil, nil)
		_ = stop()
		if err != nil {
			return d, err
		}
		d.Write, d.Elapsed, d.TimedOut, d.Rows = w.Write, w.Elapsed, w.TimedOut, w.Rows
	}
	_, err = hotPool.Exec(ctx, "TRUNCATE outbox_event RESTART IDENTITY")
	return d, err
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

// measureIdle measures the fleet over window while no tenant writes.
func measureIdle(ctx context.Context, probe *fleetProbe, f *fleet.Fleet, tenants []fleetTenant, window time.Duration) (FleetIdle, error) {
	res := FleetIdle{Window: window, Tenants: len(tenants)}
	c0, err := probe.counters(ctx, tenants)
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
	c1, err := probe.counters(ctx, tenants)
	if err != nil {
		return res, err
	}
	res.RelayConnsMean, res.RelayConnsMax = c.relayMean, c.relayMax
	res.ActivityConnsMean, res.ActivityConnsMax = c.activityMean, c.activityMax
	d := c1.minus(c0)
	res.Xacts, res.Sessions, res.Statements = rate64(d.xacts, window), rate64(d.sessions, window), rate64(d.statements, window)
	if d.statements < 0 {
		res.Statements = -1
	}
	for _, t := range tenants {
		if v := rate64(c1.xactsBy[t.db]-c0.xactsBy[t.db], window); v > res.XactsMax {
			res.XactsMax, res.XactsMaxDB = v, t.name
		}
	}
	for name, n := range turns1 {
		res.Turns += n - turns0[name]
	}
	return res, nil
}

func rate64(n int64, d time.Duration) float64 { return rate(int(n), d) }

func turnsOf(f *fleet.Fleet) map[string]int {
	out := map[string]int{}
	for _, s := range f.Status() {
		out[s.Tenant.Name] = s.Turns
	}
	return out
}

// measurePhase measures the quiet tenants over a window. Without drain, the window is the next
// d; with drain (a backlog written and drained in the hot tenant's database), it runs from the
// backlog's first commit for at least d and until it is drained.
func measurePhase(ctx context.Context, probe *fleetProbe, f *fleet.Fleet, prod *quietProducers, pub *fleetPublisher, connects *connectTracer, name string,
	d time.Duration, drain func(*connSampler) (FleetDrain, time.Time, error)) (FleetPhase, error) {
	res := FleetPhase{Name: name, QuietTenants: len(prod.tenants)}
	turns0 := turnsOf(f)
	c0, err := probe.counters(ctx, prod.tenants)
	if err != nil {
		return res, err
	}
	n0, t0 := connects.read()
	s := probe.sample(ctx)
	defer s.stop()
	from := time.Now()
	var drainedAt time.Time
	if drain != nil {
		var err error
		res.Drain, from, err = drain(probe.sample(ctx))
		if err != nil {
			return res, err
		}
		drainedAt = from.Add(res.Drain.Elapsed)
	}
	if err := sleepCtx(ctx, time.Until(from.Add(d))); err != nil {
		return res, err
	}
	to := time.Now()
	c := s.stop()
	c1, err := probe.counters(ctx, prod.tenants)
	if err != nil {
		return res, err
	}
	n1, t1 := connects.read()
	res.Window = to.Sub(from)
	dc := c1.minus(c0)
	res.Sessions, res.Xacts, res.Statements = rate64(dc.sessions, res.Window), rate64(dc.xacts, res.Window), rate64(dc.statements, res.Window)
	if dc.statements < 0 {
		res.Statements = -1
	}
	res.Connects, res.ConnectTime = int(n1-n0), t1-t0
	res.ConnsMean, res.ConnsMax = c.relayMean+c.activityMean, c.totalMax
	for n, v := range turnsOf(f) {
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
	if drain != nil {
		w, _ := prod.book.waits(prod.committedBetween(from, drainedAt))
		res.QuietDuringDrain = summarize(w)
	}
	return res, nil
}

// connectTracer counts the connects of the pools it is set on and the time they took (the TCP
// connection, TLS and authentication), and passes queries and batches to QueryTracer when set;
// also, when set, counts them too.
type connectTracer struct {
	pgx.QueryTracer
	also *connectTracer
	n    atomic.Int64
	took atomic.Int64 // nanoseconds
}

type connectStartKey struct{}

var (
	_ pgx.ConnectTracer = (*connectTracer)(nil)
	_ pgx.BatchTracer   = (*connectTracer)(nil)
)

// TraceConnectStart implements pgx.ConnectTracer.
func (c *connectTracer) TraceConnectStart(ctx context.Context, _ pgx.TraceConnectStartData) context.Context {
	return context.WithValue(ctx, connectStartKey{}, time.Now())
}

// TraceConnectEnd implements pgx.ConnectTracer.
func (c *connectTracer) TraceConnectEnd(ctx context.Context, _ pgx.TraceConnectEndData) {
	if t, ok := ctx.Value(connectStartKey{}).(time.Time); ok {
		for x := c; x != nil; x = x.also {
			x.n.Add(1)
			x.took.Add(int64(time.Since(t)))
		}
	}
}

// TraceQueryStart implements pgx.QueryTracer.
func (c *connectTracer) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if c.QueryTracer == nil {
		return ctx
	}
	return c.QueryTracer.TraceQueryStart(ctx, conn, data)
}

// TraceQueryEnd implements pgx.QueryTracer.
func (c *connectTracer) TraceQueryEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryEndData) {
	if c.QueryTracer != nil {
		c.QueryTracer.TraceQueryEnd(ctx, conn, data)
	}
}

// TraceBatchStart implements pgx.BatchTracer: the relay's rounds are batches.
func (c *connectTracer) TraceBatchStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	if b, ok := c.QueryTracer.(pgx.BatchTracer); ok {
		return b.TraceBatchStart(ctx, conn, data)
	}
	return ctx
}

// TraceBatchQuery implements pgx.BatchTracer.
func (c *connectTracer) TraceBatchQuery(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchQueryData) {
	if b, ok := c.QueryTracer.(pgx.BatchTracer); ok {
		b.TraceBatchQuery(ctx, conn, data)
	}
}

// TraceBatchEnd implements pgx.BatchTracer.
func (c *connectTracer) TraceBatchEnd(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchEndData) {
	if b, ok := c.QueryTracer.(pgx.BatchTracer); ok {
		b.TraceBatchEnd(ctx, conn, data)
	}
}

// read returns the connects so far and the time they took.
func (c *connectTracer) read() (int64, time.Duration) {
	return c.n.Load(), time.Duration(c.took.Load())
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
