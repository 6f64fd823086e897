package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/pkg/outbox"
)

// Fleet runs a relay for each tenant database of its registry that has work. Make one with
// New; Run serves the fleet until its context ends.
type Fleet struct {
	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	tenants map[string]*tenant // the registered tenants of this shard, by name
	servers map[string]*server // by Tenant.Server
	wg      sync.WaitGroup     // the tenants' and servers' goroutines
}

// New checks cfg (every problem at once) and returns a Fleet.
func New(cfg Config) (*Fleet, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Fleet{cfg: cfg, log: cfg.Logger, tenants: map[string]*tenant{}, servers: map[string]*server{}}, nil
}

// TenantState is what a tenant's relay is doing.
type TenantState string

// The states of a tenant.
const (
	// StateIdle: no turn runs; the tenant waits for writes, its sweep or the registry, on its
	// parked connections for IdleClose after a turn that published, and on none after that.
	StateIdle TenantState = "idle"
	// StateWaiting: the tenant has work and waits for its server's connections.
	StateWaiting TenantState = "waiting"
	// StateActive: the tenant's relay runs on an open pool.
	StateActive TenantState = "active"
	// StateFailing: the tenant's last turn failed (its LastError); it is retried with a backoff.
	StateFailing TenantState = "failing"
)

// TenantStatus is one tenant's figures, as Status reports them.
type TenantStatus struct {
	Tenant Tenant
	State  TenantState
	// Published and Claimed count this Fleet's work for the tenant since Run started.
	Published, Claimed int
	// Turns counts the tenant's turns (the relay run on connections opened for it or still
	// parked from the last turn), and GaveWay those that ended with work left because other tenants waited while
	// the busy ones held more than Config.BusyShare of the budget.
	Turns, GaveWay int
	// Lag is the tenant's backlog as last read (at the end of a turn, at most once per
	// Relay.MetricsInterval), and LagAt when.
	Lag   outbox.Lag
	LagAt time.Time
	// LastError is the last turn's failure, empty after a turn that succeeded; Failures
	// counts the failed turns in a row.
	LastError string
	Failures  int
	// LastTurn is when the last turn ended.
	LastTurn time.Time
	// Detection is how the tenant's writes are found between its sweeps, as its server's last
	// activity poll saw its database; "" until a turn has read the database's name and a poll
	// has run since.
	Detection Detection
}

// Detection is how a tenant's new writes are found between its sweeps.
type Detection string

// The detections of a tenant.
const (
	// DetectPoll: its server's activity poll sees its database's counters and every session's
	// state: a write wakes it within about a DetectInterval (plus the statistics' delay).
	DetectPoll Detection = "poll"
	// DetectCounters: the poll sees its database's counters and write transactions, but not
	// every session's state (another role's sessions without pg_read_all_stats, or
	// track_activities off): a write wakes it when the statistics count it (about 1 s, up to
	// 10 s), and its parked connections look every DetectInterval.
	DetectCounters Detection = "counters"
	// DetectSweepOnly: the poll does not see its database at all (the poll's connection, made
	// through another tenant of the same Server, reaches another server: tenants of different
	// servers, or behind a proxy, under one Server name): its writes wait for its sweep,
	// SweepInterval/2 to SweepInterval.
	DetectSweepOnly Detection = "sweep-only"
)

// Status returns every registered tenant's status, the failing first, then by oldest pending
// row, then by name.
func (f *Fleet) Status() []TenantStatus {
	f.mu.Lock()
	out := make([]TenantStatus, 0, len(f.tenants))
	for _, t := range f.tenants {
		out = append(out, t.snapshot())
	}
	f.mu.Unlock()
	SortWorstFirst(out)
	return out
}

// SortWorstFirst orders statuses the failing first, then by oldest pending row, then by
// pending rows, then by name.
func SortWorstFirst(s []TenantStatus) {
	slices.SortFunc(s, func(a, b TenantStatus) int {
		if fa, fb := a.State == StateFailing, b.State == StateFailing; fa != fb {
			if fa {
				return -1
			}
			return 1
		}
		if a.Lag.OldestPendingAge != b.Lag.OldestPendingAge {
			return cmpDesc(a.Lag.OldestPendingAge, b.Lag.OldestPendingAge)
		}
		if a.Lag.Pending != b.Lag.Pending {
			return cmpDesc(a.Lag.Pending, b.Lag.Pending)
		}
		if a.Tenant.Name < b.Tenant.Name {
			return -1
		}
		return 1
	})
}

func cmpDesc[T int64 | time.Duration](a, b T) int {
	if a > b {
		return -1
	}
	return 1
}

// BudgetUsage returns, per server, the connections the fleet holds now and the most it held
// at once (never above the server's budget).
func (f *Fleet) BudgetUsage() map[string][2]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string][2]int{}
	for name, s := range f.servers {
		u, p := s.budget.usage()
		out[name] = [2]int{u + 1, p + 1} // and the activity poll's reserved connection
	}
	return out
}

// Run serves the fleet until ctx ends: it reads the registry every RegistryRefresh, and
// returns once every tenant's last round finished and its pool closed. A registry that
// cannot be read is logged and read again; the tenants already known keep being served.
// Run may be called again after it returned (a relay Lambda calls it once per invocation):
// what the Fleet learnt (when each tenant was last looked at, its servers' activity counters)
// carries over, so a tenant swept by the last run is not swept again at once. Run must not be
// called while another Run of the same Fleet runs.
func (f *Fleet) Run(ctx context.Context) error {
	defer f.closeObservers() // after every goroutine ended: none can open one again
	defer f.wg.Wait()
	f.mu.Lock()
	for _, s := range f.servers {
		f.startServer(ctx, s)
	}
	for _, t := range f.tenants {
		f.startTenant(ctx, t)
	}
	f.mu.Unlock()
	var mwg sync.WaitGroup
	mwg.Add(1)
	go func() {
		defer mwg.Done()
		f.emitMetricsEvery(ctx)
	}()
	defer mwg.Wait()
	for {
		if err := f.refresh(ctx); err != nil && ctx.Err() == nil {
			f.log.Error("fleet: read the registry; keeping the tenants known", "error", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(f.cfg.RegistryRefresh):
		}
	}
}

// refresh reads the registry and makes the running tenants match it: new ones start, removed
// (or changed) ones stop and close their pools.
func (f *Fleet) refresh(ctx context.Context) error {
	listed, readErr := f.cfg.Registry.Tenants(ctx)
	if readErr != nil && len(listed) == 0 {
		return readErr
	}
	listed, err := checkTenants(listed) // bad entries are reported and left out; good ones are served
	if err != nil {
		f.log.Error("fleet: registry entries left out", "error", err)
	}
	want := map[string]Tenant{}
	for _, t := range listed {
		if ShardOf(t.Name, f.cfg.Shards) == f.cfg.Shard {
			want[t.Name] = t
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for name, t := range f.tenants {
		if readErr != nil {
			break // part of the registry is unread: add what was read, remove nothing
		}
		if w, ok := want[name]; !ok || w != t.t {
			t.stop()
			delete(f.tenants, name)
			f.servers[t.t.Server].remove(t)
		}
	}
	var added []*server
	for name, w := range want {
		if _, ok := f.tenants[name]; ok {
			continue
		}
		s := f.servers[w.Server]
		if s == nil {
			s = newServer(f, w.Server)
			f.servers[w.Server] = s
			added = append(added, s)
		}
		t := newTenant(f, w, s)
		s.add(t)
		f.tenants[name] = t
		f.startTenant(ctx, t)
	}
	for _, s := range added { // with its tenants: its first poll, at once, has them
		f.startServer(ctx, s)
	}
	return readErr
}

// closeObservers closes the servers' activity poll connections (Run's end).
func (f *Fleet) closeObservers() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, s := range f.servers {
		s.closeConn(context.Background())
	}
}

func (f *Fleet) startServer(ctx context.Context, s *server) {
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		s.detect(ctx)
	}()
}

func (f *Fleet) startTenant(ctx context.Context, t *tenant) {
	f.wg.Add(1)
	go func() {
		defer f.wg.Done()
		t.run(ctx)
	}()
}

// tenant is one tenant's worker: the only goroutine that opens its pool and runs its relay.
type tenant struct {
	f      *Fleet
	t      Tenant
	server *server
	wake   chan struct{} // a hint that the tenant may have work (its server saw writes)
	// stirred: its database's sessions did something since its server's last poll (detect); a
	// parked tenant looks at its outbox (run). watchedUntil (unix ns): until then, every commit
	// in its database stirs it, so a parked tenant needs no periodic look.
	stirred      chan struct{}
	watchedUntil atomic.Int64
	// turnStarted is when its last turn began (unix ns; 0: none yet in this process).
	turnStarted atomic.Int64
	ctx         context.Context
	cancel      context.CancelFunc

	mu     sync.Mutex // guards status and database
	status TenantStatus
	// database is the tenant's database name as its server knows it (current_database(), read
	// on the tenant's first turn: a URL without a database name, or a proxy that aliases
	// names, would not match), how its server's activity poll recognizes it; "" until read.
	database string
	// warned: the tenant's detection was logged as short of DetectPoll (once per tenant).
	warned bool
	// named is its Database, or the database its DatabaseURL names ("" when neither names
	// one): what its server's activity poll reads for it until database is known, so that
	// the run's first poll, before the tenant's first turn, sees its writes in flight.
	named string

	// pool and relay are the tenant goroutine's (run, turn): made on the first turn, kept
	// between turns and runs without a connection, dropped after a failed turn and when the
	// tenant leaves the registry.
	pool  *pgxpool.Pool
	relay *outbox.Relay
	// head is the newest outbox row id newRows or pendingLeft saw, and headRead whether the
	// turn that just ended read it (the tenant goroutine's).
	head     int64
	headRead bool
	// lastClaim is when the tenant's last pass that claimed rows ended (the tenant
	// goroutine's): a pass that starts within a DetectInterval of it is a busy tenant's, which
	// checks for pending rows before its turn ends (turn).
	lastClaim time.Time
	// inserted counts the rows its server's activity poll saw inserted into its database
	// since its last turn began (detect adds, turn takes), and looked the rows its parked
	// looks saw added to its outbox meanwhile (newRows adds, turn takes; the tenant
	// goroutine's): hints of a backlog (backlogAtStart).
	inserted atomic.Int64
	looked   int64
	// writeEnded: a write transaction its server's activity poll saw in flight in its database
	// has ended since its last turn began (detect and awaitPoll set it, turn takes it): a
	// bulk write's rows are in the outbox before its statistics count them (backlogAtStart).
	writeEnded atomic.Bool
	// turnRecord is what recordTurn last wrote to TurnStateTable (the tenant goroutine's).
	turnRecord turnRecord
}

func newTenant(f *Fleet, t Tenant, s *server) *tenant {
	ctx, cancel := context.WithCancel(context.Background())
	named := t.Database
	if named == "" && t.DatabaseURL != "" {
		if cc, err := pgconn.ParseConfig(t.DatabaseURL); err == nil {
			named = cc.Database
		}
	}
	return &tenant{f: f, t: t, server: s, wake: make(chan struct{}, 1), stirred: make(chan struct{}, 1), ctx: ctx, cancel: cancel,
		status: TenantStatus{Tenant: t, State: StateIdle}, named: named}
}

func (t *tenant) stop() { t.cancel() }

// poke wakes the tenant if it sleeps.
func (t *tenant) poke() {
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// stir tells a parked tenant to look at its outbox.
func (t *tenant) stir() {
	select {
	case t.stirred <- struct{}{}:
	default:
	}
}

// watch records a poll of its server's activity at at: complete when every session of its
// database showed its state, so the next poll will see every commit made after this one. The
// watch lasts three DetectIntervals (the next poll, late on a busy machine): a poll that sees
// hidden sessions ends it, and polls that fail let it lapse; the parked tenant then looks
// every DetectInterval again.
func (t *tenant) watch(at time.Time, complete bool) {
	if !complete {
		t.watchedUntil.Store(0)
		return
	}
	t.watchedUntil.Store(at.Add(3 * t.f.cfg.DetectInterval).UnixNano())
}

// watched reports whether its server's polls see every commit in its database now (watch).
func (t *tenant) watched() bool {
	return time.Now().UnixNano() < t.watchedUntil.Load()
}

func (t *tenant) snapshot() TenantStatus {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.status
}

func (t *tenant) update(fn func(s *TenantStatus)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	fn(&t.status)
}

// run is the tenant's loop: a turn at start, on every wake, at least every SweepInterval,
// and again after a failure once its backoff ends. After a turn that published, it keeps the
// turn's connections open (parked in its server's budget) for IdleClose, unless the budget
// asks for them back: the tenant's next turn then needs no new sessions.
func (t *tenant) run(parent context.Context) {
	ctx, cancel := context.WithCancel(parent)
	defer cancel()
	go func() {
		select {
		case <-t.ctx.Done(): // removed from the registry
			cancel()
		case <-ctx.Done():
		}
	}()
	defer func() {
		if t.ctx.Err() != nil {
			t.drop()
		}
	}()
	var (
		hold        *parked   // the connections kept open since the last turn, or nil
		parkedUntil time.Time // when hold is closed unless a turn resumed it
	)
	defer func() { t.unpark(ctx, &hold) }() // before drop (defers run last first)
	cfg := t.f.cfg
	due := time.Now() // a new tenant's first turn comes at once; a known one's when its sweep is due
	if last := t.snapshot().LastTurn; !last.IsZero() {
		due = last.Add(cfg.SweepInterval)
	} else {
		t.server.awaitFirstPoll(ctx)
	}
	fruitless := 0  // turns in a row that claimed nothing
	failed := false // the last turn failed: its backoff runs until due, whatever wakes it
	for {
		timer := time.NewTimer(time.Until(due))
		var (
			evict  <-chan struct{}
			expire <-chan time.Time
			look   <-chan time.Time
			stir   <-chan struct{}
			wake   = t.wake
		)
		if failed {
			// Writes to a failing tenant's database (its activity poll's wake-ups) do not cut its
			// backoff short: its next turn comes when the backoff ends.
			wake = nil
		}
		if hold != nil {
			evict, expire = hold.evict, time.After(time.Until(parkedUntil))
			look, stir = time.After(cfg.DetectInterval), t.stirred
		}
		select {
		case <-ctx.Done():
			timer.Stop()
			return
		case <-wake:
		case <-timer.C:
		case <-stir: // parked, and its database's sessions did something: a commit, perhaps
			timer.Stop()
			if !t.newRows(ctx) {
				continue
			}
		case <-look: // parked: unless watched, its own connection sees new rows before the server's statistics do
			timer.Stop()
			if t.watched() || !t.newRows(ctx) { // watched: a commit would have stirred it
				continue
			}
		case <-evict: // another tenant waits for the connections
			timer.Stop()
			t.unpark(ctx, &hold)
			continue
		case <-expire: // idle for IdleClose: an idle tenant holds no connection
			timer.Stop()
			t.unpark(ctx, &hold)
			continue
		}
		timer.Stop()
		conns := cfg.pipelinesOf(t.t, t.server.size) // a connection per pipeline: the relay's other statements come between its rounds
		resumed := hold != nil && t.server.budget.resume(hold)
		if hold != nil && !resumed {
			t.unpark(ctx, &hold) // asked back meanwhile: give them back, then wait like any other
		}
		if !resumed {
			t.update(func(s *TenantStatus) {
				if s.State != StateFailing {
					s.State = StateWaiting
				}
			})
			if t.server.budget.acquire(ctx, conns) != nil {
				return // ctx ended
			}
		}
		hold = nil // the turn holds the connections now
		claimed := t.snapshot().Claimed
		t.turnStarted.Store(time.Now().UnixNano())
		held, more, retrying, err := t.turn(ctx, conns)
		worked := t.snapshot().Claimed > claimed
		if worked {
			fruitless = 0
		} else {
			fruitless++
		}
		if worked {
			parkedUntil = time.Now().Add(cfg.IdleClose)
		} else if !resumed {
			parkedUntil = time.Time{} // a turn on new connections that found nothing closes them
		}
		// Parked connections are kept only while nobody waits for them: with the budget short,
		// closing them at once is what another tenant needs.
		// A turn that grew closes its connections: its pool and relay go back to its base size.
		if err == nil && ctx.Err() == nil && t.pool != nil && held == conns && time.Now().Before(parkedUntil) && !t.server.budget.waiting() {
			if !t.headRead {
				t.readHead(ctx) // where the outbox ends now: the parked tenant looks for rows after it
			}
			hold = t.server.budget.park(conns)
		} else {
			t.closeConns(ctx)
			if err != nil || held != conns {
				t.drop() // a failed turn starts the next one from new settings (a rotated secret, a fixed schema)
			}
			t.server.budget.release(held)
		}
		wait := time.Duration(0)
		failed = err != nil
		switch {
		case ctx.Err() != nil:
			return
		case err != nil:
			var n int
			t.update(func(s *TenantStatus) {
				s.State, s.LastError, s.LastTurn = StateFailing, err.Error(), time.Now()
				s.Failures++
				n = s.Failures
			})
			t.f.log.Warn("fleet: tenant turn failed", "tenant", t.t.Name, "failures", n, "error", err)
			wait = backoff(n, cfg.SweepInterval)
		case more:
			t.poke() // straight back into its server's queue, behind those who waited
		case retrying: // rows in backoff: look again soon (no write will wake it), less often while nothing comes of it
			wait = min(cfg.SweepInterval, retryLook<<min(fruitless, 10))
		default:
			wait = cfg.SweepInterval/2 + rand.N(cfg.SweepInterval/2+1) // sweeps spread over the interval
		}
		due = time.Now().Add(wait)
		t.recordTurn(ctx, err, due) // the operators' view (Config.TurnState): at most one statement a turn
	}
}

// readDatabase reads, once, the tenant's database name as its server knows it: the name its
// server's activity poll recognizes it by (the connection settings may have none, or a
// proxy's alias).
func (t *tenant) readDatabase(ctx context.Context) error {
	t.mu.Lock()
	known := t.database != ""
	t.mu.Unlock()
	if known {
		return nil
	}
	var db string
	if err := t.pool.QueryRow(ctx, `SELECT current_database()`).Scan(&db); err != nil {
		return fmt.Errorf("tenant %s: read its database's name (SELECT current_database()): %w", t.t.Name, err)
	}
	t.mu.Lock()
	t.database = db
	t.mu.Unlock()
	return nil
}

// detected records how the server's activity poll sees the tenant's database, and logs once
// a tenant whose writes it cannot see in full.
func (t *tenant) detected(d Detection) {
	t.mu.Lock()
	t.status.Detection = d
	warn := d != DetectPoll && !t.warned
	t.warned = t.warned || warn
	db := t.database
	t.mu.Unlock()
	if !warn {
		return
	}
	switch d {
	case DetectSweepOnly:
		t.f.log.Warn("fleet: the activity poll does not see this tenant's database; its writes wait for its sweep",
			"tenant", t.t.Name, "database", db, "server", t.t.Server, "sweep_interval", t.f.cfg.SweepInterval,
			"fix", "give the tenant its own Server when its database is on another server or behind a proxy")
	case DetectCounters:
		t.f.log.Warn("fleet: the activity poll cannot see every session of this tenant's database; its writes are found by the statistics (about 1 s later) and its parked connections look every DetectInterval",
			"tenant", t.t.Name, "database", db, "server", t.t.Server,
			"fix", "grant pg_read_all_stats (RDS: pg_monitor) to the role the poll connects as")
	}
}

// newRows reports whether the tenant's outbox has rows after the newest it had when last asked
// (one primary-key lookup on its pool). It only makes a turn sooner: a row committed with an id
// below the newest (its transaction took the id before another committed a later one) is found
// by the activity poll or the sweep, and so are rows made pending again or due after a backoff.
func (t *tenant) newRows(ctx context.Context) bool {
	added, err := t.readHead(ctx)
	if err != nil {
		return true // let a turn find out what is wrong
	}
	t.looked += added
	return added > 0
}

// readHead reads where the tenant's outbox ends into t.head and returns how many ids past the
// previous head that is.
func (t *tenant) readHead(ctx context.Context) (added int64, err error) {
	var head int64
	if err := t.pool.QueryRow(ctx, maxIDSQL).Scan(&head); err != nil {
		return 0, err
	}
	added, t.head = max(head-t.head, 0), head
	return added, nil
}

// unpark closes the parked connections *hold, if any, and gives them back to the budget.
func (t *tenant) unpark(ctx context.Context, hold **parked) {
	if *hold == nil {
		return
	}
	t.closeConns(ctx)
	t.server.budget.releaseParked(*hold)
	*hold = nil
}

// retryLook is how soon a tenant whose last turn left unpublished rows it could not claim (in
// backoff after a failed publish) is looked at again: their backoff ends without a write that
// would wake it.
const retryLook = time.Second

// backoff is the wait after n failed turns in a row: 1 s doubling, at most max.
func backoff(n int, most time.Duration) time.Duration {
	d := time.Second << min(n-1, 10)
	return min(d, most)
}

// growAfter is how long a turn publishes before it is first weighed for growing to its
// BurstPipelines: a turn for a few new rows ends within milliseconds; one still publishing
// grows when it has claimed a full batch per pipeline by then (a backlog, not a slow machine).
// One that has not is weighed again at twice the time, then four times, and so on: a backlog
// whose first half second was slow (a busy server, a lock) still grows once it has claimed a
// full batch, and a slow turn for a few rows is cut for weighing only a few times.
const growAfter = 500 * time.Millisecond

// turn runs the tenant's relay on its pool, on the conns connections run took from the
// server's budget, until it finds nothing more to publish, or it used its Weight × Turn and
// must give way. While it has a backlog and the budget has free connections nobody waits for,
// it grows to its BurstPipelines, and shrinks back as soon as a tenant waits (budget.grow,
// budget.shrink; a pool and relay of the new size replace the old ones, whose sessions are
// gone first). It reports the connections it holds at its end, whether work was left, and
// whether the last round left rows to retry after a backoff.
func (t *tenant) turn(ctx context.Context, conns int) (held int, more, retrying bool, err error) {
	cfg := t.f.cfg
	held = conns
	t.headRead = false
	inserted, looked, wrote := t.inserted.Swap(0), t.looked, t.writeEnded.Swap(false)
	t.looked = 0
	relay, err := t.open(ctx, held)
	if err != nil {
		return held, false, false, err
	}
	if err := t.openSession(ctx); err != nil {
		return held, false, false, err
	}
	if err := t.readDatabase(ctx); err != nil {
		return held, false, false, err
	}
	t.update(func(s *TenantStatus) { s.Turns++ })

	// The turn's share of time starts once it can publish: a session slower to open than a Turn
	// (TLS and scram-sha-256 on a busy server) would otherwise end every turn before its first
	// claim, and the tenant would never publish while others wait.
	start := time.Now()
	var lastWork time.Time // the last pass of this turn that claimed rows
	share := time.Duration(t.t.Weight) * cfg.Turn
	most := cfg.burstOf(t.t, t.server.size)
	shrunk := false      // a turn that gave lent connections back does not take them again
	grown := false       // it grew (once a turn)
	weighAt := growAfter // when, into the turn, growing is weighed next
	claimed := 0         // the rows this turn's passes claimed
	busy := &busyTurn{n: conns, start: start}
	defer t.server.budget.turnEnded(busy) // before run releases or parks the connections
	// A turn woken by a backlog grows before its first pass, not growAfter into it.
	if most > held && t.server.budget.room(most-held) && t.backlogAtStart(ctx, inserted, looked, wrote, held) && t.server.budget.grow(busy, most-held) {
		grown, held = true, most
		if relay, err = t.reopen(ctx, held); err != nil {
			return held, false, false, err
		}
	}
	for {
		// The turn's share ends the pass early (its rounds finish) once another tenant has waited;
		// so does a change of its size (resize: the pipelines it runs next).
		rctx, stop := context.WithCancel(ctx)
		yielded := make(chan struct{})
		resize, size, weigh := 0, held, false
		go func() {
			defer close(yielded)
			tick := time.NewTicker(max(cfg.Relay.PollInterval, 10*time.Millisecond))
			defer tick.Stop()
			for {
				select {
				case <-rctx.Done():
					return
				case <-tick.C:
					if size > conns && t.server.budget.waiting() {
						resize = conns // lent connections go back at once
						stop()
						return
					}
					// A turn still publishing at weighAt may have a backlog, or a busy
					// machine: its pass ends (its rounds finish) so that what it claimed decides.
					if size < most && !shrunk && !grown && time.Since(start) >= weighAt && t.server.budget.room(most-size) {
						weigh = true
						stop()
						return
					}
					// A turn past its share gives way to a tenant that has waited a Turn (one
					// that the other tenants' short turns did not let in meanwhile) when the
					// turns past their share hold more than BusyShare of the budget, the
					// longest-running first. One busy tenant among many quiet ones keeps its
					// few connections: giving them back would cost it most of its throughput
					// and let the waiting tenants in only marginally sooner.
					if time.Since(start) < share {
						continue
					}
					t.server.budget.pastShare(busy)
					if t.server.budget.giveWay(busy, cfg.Turn, cfg.BusyShare) {
						stop()
						return
					}
				}
			}
		}()
		passStart := time.Now()
		st, err := relay.RunPass(rctx)
		cut := rctx.Err() != nil && ctx.Err() == nil // by its share, to resize, or to weigh growing
		stop()
		<-yielded
		t.update(func(s *TenantStatus) {
			s.Published += st.Published
			s.Claimed += st.Claimed
			if err == nil || cut {
				s.State, s.LastError, s.Failures = StateActive, "", 0
			}
		})
		if ctx.Err() != nil {
			return held, false, false, nil
		}
		if err != nil && !cut {
			// The relay's error names its statement (a round's claim or settle, a poll, a
			// sweep); what its rounds' destinations acknowledged is recorded, even by a round
			// that lost its connection (outbox's recordAcknowledged).
			return held, false, false, fmt.Errorf("tenant %s: relay pass on %d pipelines: %w", t.t.Name, held, err)
		}
		if st.Claimed > 0 {
			lastWork = time.Now()
		}
		claimed += st.Claimed
		if weigh {
			// A backlog is at least a full batch per pipeline claimed by now; a turn that has
			// not claimed as much goes on at its size and is weighed again at twice the time
			// into it (growAfter).
			if claimed < cfg.Relay.BatchSize*held || !t.server.budget.grow(busy, most-held) {
				weighAt = 2 * time.Since(start)
				continue
			}
			grown, resize = true, most
		}
		if resize != 0 {
			if resize < held {
				t.closeConns(ctx) // their sessions gone before the budget counts them free
				t.server.budget.shrink(busy, held-resize)
				shrunk = true
			}
			held = resize
			if relay, err = t.reopen(ctx, held); err != nil {
				return held, false, false, err
			}
			continue
		}
		t.readLag(ctx, t.pool)
		if cut {
			t.update(func(s *TenantStatus) { s.GaveWay++ })
			t.idle()
			return held, true, false, nil
		}
		// The pass ended: nothing it found is claimable. A turn that published goes on with
		// another pass while rows are pending (new ones, or late commits; its share of time
		// ends it); otherwise it ends, and run keeps its connections parked: the activity
		// poll's stir, the look and the counters wake the tenant for its next rows. A pass
		// that claimed nothing ends the turn: what is pending is not claimable now.
		if st.Claimed > 0 {
			busy := passStart.Sub(t.lastClaim) < cfg.DetectInterval
			t.lastClaim = time.Now()
			if (busy || st.Claimed >= cfg.Relay.BatchSize || st.Retrying > 0 || st.Outage > 0) && t.pendingLeft(ctx) {
				continue
			}
			// A few rows of a tenant that writes now and then: the rows committed since the
			// pass's poll are past its frontier, and their commits stir the tenant (detect)
			// as any other's do; the pending check would cost this turn another round trip
			// for what is almost never there.
			t.head, t.headRead = relay.Frontier(), true
			t.idle()
			return held, false, false, nil
		}
		t.idle()
		left := t.pendingLeft(ctx)
		if left && !lastWork.IsZero() {
			return held, true, false, nil // it published this turn: straight back into the queue
		}
		// Rows left pending now are not claimable (in backoff, behind a quarantined row,
		// of a destination backing off): no write will wake the tenant when they are due.
		return held, false, left, nil
	}
}

// backlogAtStart reports whether a turn on held pipelines starts on a backlog of at least a
// full batch per pipeline of new outbox rows: its parked looks saw as many added (looked), or
// its server's activity poll counted as many rows inserted into its database (inserted) or saw
// a write transaction in it end (wrote: a bulk write, before its statistics count it), and
// the outbox's newest id is as far past the newest the tenant knew, with what the looks saw
// before it (one lookup at the primary key's end: rows of other tables count in the poll's
// figure, not in the outbox). Only a hint for growing sooner: a turn that starts small is
// weighed from growAfter into it on what it claimed.
func (t *tenant) backlogAtStart(ctx context.Context, inserted, looked int64, wrote bool, held int) bool {
	need := int64(t.f.cfg.Relay.BatchSize * held)
	if looked >= need {
		return true
	}
	if inserted < need && !wrote {
		return false
	}
	added, err := t.readHead(ctx) // past the head of the tenant's last look: the looks' rows count too
	return err == nil && looked+added >= need
}

// maxIDSQL reads where the tenant's outbox ends (pkg/outbox's relay starts its frontier with
// the same statement; it is not part of that package's API).
const maxIDSQL = `SELECT coalesce(max(id), 0) FROM outbox_event`

// pendingLeftSQL is pendingLeft's lookup: whether unpublished, unquarantined rows are left, and
// maxIDSQL beside it.
const pendingLeftSQL = `SELECT EXISTS (SELECT 1 FROM outbox_event WHERE published_at IS NULL AND quarantined_at IS NULL), (` + maxIDSQL + `)`

// pendingLeft reports whether the tenant's outbox has unpublished, unquarantined rows (one
// lookup in the index of unpublished rows), and, in the same statement, where the outbox ends
// (the head a parked tenant's look starts from: a turn that ends here needs no newRows).
func (t *tenant) pendingLeft(ctx context.Context) bool {
	var (
		left bool
		head int64
	)
	err := t.pool.QueryRow(ctx, pendingLeftSQL).Scan(&left, &head)
	if err != nil {
		if ctx.Err() == nil {
			// The turn ends as if nothing were left: the tenant's next wake-up or sweep finds it.
			t.f.log.Warn("fleet: look for a tenant's pending rows (pendingLeftSQL)", "tenant", t.t.Name, "error", err)
		}
		return false
	}
	t.head, t.headRead = head, true
	return left
}

// open returns the tenant's relay, making it and its pool (no connection yet) on the first
// turn. Both are the tenant goroutine's own and outlive a turn: what the relay learnt of the
// outbox (its pending keys) saves the next turn a walk of every key; it is only ever a cache,
// what a round claims is read from the database.
func (t *tenant) open(ctx context.Context, pipelines int) (*outbox.Relay, error) {
	if t.relay != nil {
		return t.relay, nil
	}
	cfg := t.f.cfg
	pcfg, err := cfg.Connect(ctx, t.t)
	if err != nil {
		return nil, fmt.Errorf("tenant %s: connection settings: %w", t.t.Name, err)
	}
	pcfg.MaxConns, pcfg.MinConns = int32(pipelines), 0
	if pcfg.ConnConfig.RuntimeParams == nil {
		pcfg.ConnConfig.RuntimeParams = map[string]string{}
	}
	pcfg.ConnConfig.RuntimeParams["application_name"] = "sluice-fleet-relay"
	// A turn's sessions are mostly new ones (under a full budget every turn opens its own), on
	// which a prepared statement would be used once: preparing each statement first (pgx's
	// default) costs a round trip per statement per session for nothing. Executed directly
	// (parameter types from their Go values), each statement takes one. A mode Connect chose
	// (the simple protocol behind a proxy, say) is kept.
	if pcfg.ConnConfig.DefaultQueryExecMode == pgx.QueryExecModeCacheStatement {
		pcfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	rcfg := cfg.Relay
	rcfg.Tenant, rcfg.Pipelines = t.t.Name, pipelines
	rcfg.Logger = cfg.Logger.With("tenant", t.t.Name)
	// The pool is the relay's alone (the fleet's own lookups on it are bounded reads): its
	// sessions keep the rounds' settings, which spares a quiet tenant's round most of its
	// statements.
	outbox.DedicatePool(pcfg, rcfg)
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, fmt.Errorf("tenant %s: open pool: %w", t.t.Name, err)
	}
	relay, err := outbox.NewRelay(pool, rcfg)
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("tenant %s: relay: %w", t.t.Name, err)
	}
	t.pool, t.relay = pool, relay
	return relay, nil
}

// closeConns closes the turn's connections (the pool stays, empty) and returns once their
// sessions have ended on the server: the turn gives its connections back to the budget only
// when the server no longer counts them. A session still being opened (a pass cut while one
// of its pipelines connected: the pool finishes opening it in the background) joins the
// pool's idle ones when it is open, and is closed with them; a connection the budget counted
// free while its session lived on would let the fleet's sessions exceed the budget. Each
// session is ended synchronously (endSession); one whose end was not seen so is looked for in
// pg_stat_activity until it is gone (awaitGone). After closeWait, what is left is closed when
// it is released (the pool's Reset).
func (t *tenant) closeConns(ctx context.Context) {
	if t.pool == nil {
		return
	}
	qctx := context.WithoutCancel(ctx) // the turn's sessions are ended even as the run ends
	deadline := time.Now().Add(closeWait)
	var (
		mu          sync.Mutex
		unconfirmed []uint32
	)
	for {
		var wg sync.WaitGroup
		for _, c := range t.pool.AcquireAllIdle(qctx) {
			conn := c.Hijack() // out of the pool: its slot is free there, its session ended here
			wg.Add(1)
			go func() {
				defer wg.Done()
				if pid, gone := endSession(qctx, conn, deadline); !gone {
					mu.Lock()
					unconfirmed = append(unconfirmed, pid)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if t.pool.Stat().TotalConns() == 0 || time.Now().After(deadline) {
			break
		}
		sleepCtx(qctx, 2*time.Millisecond) // a session still opening (or, for a moment, in use)
	}
	t.pool.Reset()
	t.server.awaitGone(ctx, unconfirmed)
}

// closeWait bounds how long closeConns waits for the sessions of a turn to end.
const closeWait = 5 * time.Second

// terminateMsg is the protocol's Terminate message ('X', then the length 4).
var terminateMsg = []byte{'X', 0, 0, 0, 4}

// endSession ends conn's session synchronously, as PostgreSQL lets a client do: it sends
// Terminate and reads until the server closes the connection. A backend closes it only on
// its way out, after it has left pg_stat_activity and freed its connection slot (pqcomm.c:
// socket_close, an on_proc_exit callback, runs after the shared-memory exit callbacks; over
// TLS its close_notify is sent there too), so the end of the stream is the session's end on
// the server, seen without a query. It returns the session's backend pid and whether its end
// was seen by deadline.
func endSession(ctx context.Context, conn *pgx.Conn, deadline time.Time) (pid uint32, gone bool) {
	pc := conn.PgConn()
	pid = pc.PID()
	defer func() { _ = pc.Close(ctx) }()
	if pc.SyncConn(ctx) != nil {
		return pid, false
	}
	nc := pc.Conn()
	if nc.SetDeadline(deadline) != nil {
		return pid, false
	}
	if _, err := nc.Write(terminateMsg); err != nil {
		return pid, false
	}
	_, err := io.Copy(io.Discard, nc) // nil at the end of the stream
	return pid, !errors.Is(err, os.ErrDeadlineExceeded)
}

// reopen replaces the tenant's pool and relay with ones of the given pipelines (a turn that
// grows or shrinks): the old sessions end first, so that the connections open never exceed
// what the budget granted. The old relay's state is only a cache (per-key order is its
// claim's), so the new one starts from the database.
func (t *tenant) reopen(ctx context.Context, pipelines int) (*outbox.Relay, error) {
	t.closeConns(ctx)
	t.drop()
	relay, err := t.open(ctx, pipelines)
	if err != nil {
		return nil, fmt.Errorf("resize to %d pipelines: %w", pipelines, err)
	}
	if err := t.openSession(ctx); err != nil {
		return nil, fmt.Errorf("resize to %d pipelines: %w", pipelines, err)
	}
	return relay, nil
}

// openSession opens one session of the tenant's pool, unless one is open, on the turn's own
// context: a pass that must end (its share of time, a resize) is never cut while its first
// session is being opened, so every turn can claim. The relay's other pipelines open theirs
// as they need them; closeConns waits for any still opening.
func (t *tenant) openSession(ctx context.Context) error {
	c, err := t.pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("tenant %s: connect: %w", t.t.Name, err)
	}
	c.Release()
	return nil
}

// drop forgets the tenant's relay and pool.
func (t *tenant) drop() {
	if t.pool != nil {
		t.pool.Close()
	}
	t.pool, t.relay = nil, nil
}

func (t *tenant) idle() {
	t.update(func(s *TenantStatus) {
		s.State, s.LastTurn = StateIdle, time.Now()
	})
}

// readLag reads the tenant's backlog on the turn's pool, at most once per MetricsInterval.
func (t *tenant) readLag(ctx context.Context, pool *pgxpool.Pool) {
	t.mu.Lock()
	due := time.Since(t.status.LagAt) >= t.f.cfg.Relay.MetricsInterval
	t.mu.Unlock()
	if !due {
		return
	}
	lag, err := outbox.LagOf(ctx, pool)
	if err != nil {
		if ctx.Err() == nil { // a run that stops cancels the read: not a problem to report
			t.f.log.Warn("fleet: read a tenant's lag (outbox.LagOf)", "tenant", t.t.Name, "error", err)
		}
		return
	}
	t.update(func(s *TenantStatus) { s.Lag, s.LagAt = lag, time.Now() })
}

// server is one PostgreSQL server of the fleet: its connection budget, and its activity
// poll, which wakes the tenants whose databases saw writes.
type server struct {
	f      *Fleet
	name   string
	size   int     // the server's connection budget
	budget *budget // the tenants' share of it: size less the activity poll's connection

	mu      sync.Mutex
	tenants map[*tenant]bool

	connMu sync.Mutex // guards the activity poll's connection
	conn   *pgx.Conn
	via    *tenant // whose settings conn was opened with
	// counters are the databases' write counters as the last poll read them (owned by detect;
	// kept between runs).
	counters map[string]int64
	// polled is closed when the first activity poll with tenants ended (awaitFirstPoll).
	polled     chan struct{}
	polledOnce sync.Once
}

func newServer(f *Fleet, name string) *server {
	size := f.cfg.budgetOf(name)
	// One connection of the budget is the activity poll's, reserved: the tenants share the rest.
	return &server{f: f, name: name, size: size, budget: newBudget(size - 1), tenants: map[*tenant]bool{}, polled: make(chan struct{})}
}

// firstPolled closes polled once, when the server's first activity poll with tenants ended.
func (s *server) firstPolled() {
	s.polledOnce.Do(func() { close(s.polled) })
}

// awaitFirstPoll waits, for at most four DetectIntervals, until the server's activity poll has
// read the counters once: a turn that begins after that poll reads every row the counters
// include, so the next poll compares with a count the turn has seen. Without it, a row
// committed between a tenant's first turn and the poll that takes the first count would wait
// for the sweep.
func (s *server) awaitFirstPoll(ctx context.Context) {
	t := time.NewTimer(4 * s.f.cfg.DetectInterval)
	defer t.Stop()
	select {
	case <-s.polled:
	case <-t.C:
	case <-ctx.Done():
	}
}

func (s *server) add(t *tenant) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tenants[t] = true
}

func (s *server) remove(t *tenant) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.tenants, t)
}

// members returns the server's tenants, and for each database name the tenants on it.
func (s *server) members() ([]*tenant, map[string][]*tenant) {
	all, byDB, _ := s.membersPolled()
	return all, byDB
}

// membersPolled returns what members does and the databases the activity poll reads: those
// of byDB, and for each tenant whose database's name is not known yet (before its first turn)
// the one its DatabaseURL names.
func (s *server) membersPolled() ([]*tenant, map[string][]*tenant, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	all := make([]*tenant, 0, len(s.tenants))
	byDB := map[string][]*tenant{}
	var named []string
	for t := range s.tenants {
		all = append(all, t)
		t.mu.Lock()
		switch {
		case t.database != "":
			byDB[t.database] = append(byDB[t.database], t)
		case t.named != "":
			named = append(named, t.named)
		}
		t.mu.Unlock()
	}
	dbs := slices.Collect(maps.Keys(byDB))
	for _, n := range named {
		if _, ok := byDB[n]; !ok && !slices.Contains(dbs, n) {
			dbs = append(dbs, n)
		}
	}
	return all, byDB, dbs
}

// activitySQL reads, for each database of the fleet's tenants on the server ($1, the names
// their turns read with current_database(), or before a tenant's first turn the one its URL
// names: membersPolled) in one query for all of them, its count of
// inserted rows and what its sessions are doing now. Only those databases are read: the
// statistics functions are called for each of them, never for the server's other databases
// (another shard's tenants, other applications'), so a poll's cost grows with its own
// tenants, not with the server (a shard of 1,000 tenants on a server of 10,000 databases reads
// 1,000). The sessions are filtered to the same databases before they are grouped.
//
// The count: PostgreSQL's cumulative statistics, published by each backend within about a
// second of its commit (up to PGSTAT_IDLE_INTERVAL, 10 s, when it flushed less than a second
// before). Inserts only: a relay marking its rows published updates them, and would wake its own
// tenant for an empty turn; rows made pending again by an update (sluice replay, dead retry) are
// found by the tenant's sweep.
//
// The sessions (pg_stat_activity, the server's live table of backends, which has no delay): a
// signature of each session's pid and state_change (when its state last changed; every
// statement's start and every return to idle change it): the sessions that can commit rows,
// clients and logical replication's workers, the fleet's own left out (autovacuum's are not
// writes, and would stir tenants for nothing).
// A backend reports itself idle only after its commit is visible, and one that ends leaves the
// table, so every commit in a database changes its signature at the next poll, unless a
// session hides its state: another role's session without pg_read_all_stats (its query reads
// '<insufficient privilege>', its state and state_change NULL), or one with track_activities
// off (state 'disabled'). hidden counts those; a database with hidden sessions is not watched,
// and its parked tenants keep their periodic looks (tenant.watch). A session still starting
// (logged in, not yet ready for its first query) also shows no state for a moment, but its
// query is readable: it has committed nothing, and its first return to idle changes the
// signature, so it is not hidden (counting it made every connection churn look like a missing
// grant).
//
// writers names the transactions that have written (backend_xid, which every role may read)
// and not ended: a transaction seen writing by one poll and gone at the next has committed (or
// rolled back). A bulk write is thus seen when it ends, whatever the statistics' delay; the
// short ones that no poll catches are the count's and the signature's.
//
// Beside them, the statement's snapshot xmax, a 64-bit transaction id: the writers' 32-bit ids
// are placed by it (fullXid) for awaitPoll, which asks whether each has ended before the next
// poll.
//
// All of it only hints: the tenants' sweeps do not depend on it.
const activitySQL = `WITH mine AS (SELECT oid, datname FROM pg_database WHERE datname = ANY($1::text[]))
SELECT m.datname::text, pg_stat_get_db_tuples_inserted(m.oid), coalesce(a.sessions, ''), coalesce(a.hidden, 0), coalesce(a.writers, '{}'),
	pg_snapshot_xmax(pg_current_snapshot())::text
FROM mine m
LEFT JOIN (
	SELECT datid,
		sum(hashtextextended(pid::text || ' ' || coalesce(state_change::text, ''), 0))::text AS sessions,
		count(*) FILTER (WHERE query = '<insufficient privilege>' OR state = 'disabled') AS hidden,
		array_agg(pid::text || ' ' || backend_xid::text) FILTER (WHERE backend_xid IS NOT NULL) AS writers
	FROM pg_stat_activity
	WHERE datid IN (SELECT oid FROM mine) AND application_name NOT LIKE 'sluice-fleet-%'
		AND (backend_type = 'client backend' OR backend_type LIKE 'logical replication%')
	GROUP BY datid
) a ON a.datid = m.oid`

// dbActivity is one database's line of activitySQL.
type dbActivity struct {
	inserted int64
	sessions string // the signature of its sessions' states; "" when it has none
	hidden   int64  // its sessions whose state this role cannot see
	writers  []string
	xmax     uint64 // the poll's snapshot xmax (xid8), which places the writers' ids
}

// detect polls the server's activity every DetectInterval on one connection (taken from the
// budget). It wakes each tenant whose database's insert counter moved (a turn), and stirs each
// whose database's sessions changed since the last poll (a parked tenant looks at its outbox:
// tenant.run); a tenant whose database showed every session's state is watched until the next
// poll, and its parked look skips its periodic round trip. Between two polls, it asks whether
// the write transactions the last one saw in flight have ended (awaitPoll). It connects
// through one of its tenants' settings and lets go of the connection when that tenant leaves.
func (s *server) detect(ctx context.Context) {
	last := s.counters // from the last Run: writes between two runs wake their tenants
	defer func() { s.counters = last }()
	sessions := map[string]string{}      // each database's signature at the last poll
	writes := map[string]writeInFlight{} // the writes the last poll saw in flight, until one ends
	defer s.closeConn(ctx)
	tick := time.NewTicker(s.f.cfg.DetectInterval)
	defer tick.Stop()
	for first := true; ; first = false {
		if !first { // the first poll comes at once: the tenants' first turns wait for it
			if !s.awaitPoll(ctx, tick.C, writes) {
				return
			}
		}
		all, byDB, dbs := s.membersPolled()
		s.connMu.Lock()
		via := s.via
		s.connMu.Unlock()
		if len(all) == 0 || (via != nil && !slices.Contains(all, via)) {
			s.closeConn(ctx) // no connection to a removed tenant's database
			if len(all) == 0 {
				continue
			}
		}
		polled := time.Now().UnixNano()
		seen, err := s.activity(ctx, all, dbs)
		s.firstPolled()
		if err != nil {
			s.f.log.Debug("fleet: activity poll failed", "error", err)
			continue // the tenants' sweeps carry on without the hint; watches lapse
		}
		at := time.Now()
		counters := make(map[string]int64, len(seen))
		nextSessions := make(map[string]string, len(seen))
		ended := map[string]bool{} // the databases where a write the last poll saw in flight has ended
		for w, x := range writes {
			if !slices.Contains(seen[x.db].writers, w) {
				ended[x.db] = true
			}
		}
		for db, a := range seen {
			counters[db], nextSessions[db] = a.inserted, a.sessions
			n, counted := last[db]
			old, known := sessions[db]
			// A write a poll saw in flight has ended (a burst, perhaps), or the count moved.
			ended := ended[db]
			wrote := ended || counted && a.inserted != n
			for _, t := range byDB[db] {
				if counted && a.inserted > n {
					t.inserted.Add(a.inserted - n)
				}
				if ended {
					t.writeEnded.Store(true)
				}
				switch started := t.turnStarted.Load(); {
				case wrote:
					t.poke()
				case !counted && started != 0 && started < polled:
					// No count to compare with yet (a database new to the poll): a row may
					// have committed between the tenant's last turn and this poll.
					t.poke()
				case !known || a.sessions != old:
					t.stir() // (a turn woken above reads the outbox anyway)
				}
				t.watch(at, a.hidden == 0)
			}
		}
		for _, t := range all {
			t.mu.Lock()
			db := t.database
			t.mu.Unlock()
			switch a, ok := seen[db]; {
			case db == "": // not known yet: its first turn reads it
			case !ok:
				t.detected(DetectSweepOnly)
			case a.hidden > 0:
				t.detected(DetectCounters)
			default:
				t.detected(DetectPoll)
			}
		}
		sessions = nextSessions
		writes = writesInFlight(seen, writes, at)
		last = counters
	}
}

// activity reads the activity of the databases dbs (activitySQL) on the activity poll's
// connection, connecting first when it has none.
func (s *server) activity(ctx context.Context, all []*tenant, dbs []string) (map[string]dbActivity, error) {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	if err := s.connectLocked(ctx, all); err != nil {
		return nil, err
	}
	rows, err := s.conn.Query(ctx, activitySQL, dbs)
	if err != nil {
		s.closeConnLocked(ctx)
		return nil, err
	}
	seen := map[string]dbActivity{}
	for rows.Next() {
		var (
			db, xmax string
			a        dbActivity
		)
		if rows.Scan(&db, &a.inserted, &a.sessions, &a.hidden, &a.writers, &xmax) == nil {
			a.xmax, _ = strconv.ParseUint(xmax, 10, 64)
			seen[db] = a
		}
	}
	rows.Close()
	return seen, rows.Err()
}

func (s *server) closeConn(ctx context.Context) {
	s.connMu.Lock()
	defer s.connMu.Unlock()
	s.closeConnLocked(ctx)
}

func (s *server) closeConnLocked(ctx context.Context) {
	if s.conn != nil {
		_ = s.conn.Close(context.WithoutCancel(ctx))
		s.conn, s.via = nil, nil
	}
}

// awaitGone waits until the server's sessions pids have ended (a closed connection's backend
// ends a moment after the client let go), so that the budget given back is free on the server
// too. It asks on the activity poll's connection, opening it if needed while ctx lasts; without
// one it waits a short grace.
func (s *server) awaitGone(ctx context.Context, pids []uint32) {
	if len(pids) == 0 {
		return
	}
	ids := make([]int32, len(pids))
	for i, p := range pids {
		ids[i] = int32(p)
	}
	qctx := context.WithoutCancel(ctx) // the turn's sessions are awaited even as the run ends
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		all, _ := s.members()
		s.connMu.Lock()
		var n int
		err := errors.New("no activity connection")
		if s.conn != nil || ctx.Err() == nil {
			err = s.connectLocked(qctx, all)
		}
		if err == nil {
			err = s.conn.QueryRow(qctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)`, ids).Scan(&n)
		}
		s.connMu.Unlock()
		if err != nil {
			sleepCtx(qctx, 20*time.Millisecond)
			return
		}
		if n == 0 {
			return
		}
		sleepCtx(qctx, 2*time.Millisecond)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// connectLocked opens the activity poll's connection, when it has none, through the first
// tenant (by name) whose last turn did not fail; connMu is held. The connection is the one of
// the server's budget reserved for it.
func (s *server) connectLocked(ctx context.Context, all []*tenant) error {
	if s.conn != nil {
		return nil
	}
	if len(all) == 0 {
		return errors.New("no tenant to connect through")
	}
	slices.SortFunc(all, func(a, b *tenant) int {
		fa, fb := a.snapshot().State == StateFailing, b.snapshot().State == StateFailing
		switch {
		case fa != fb && fa:
			return 1
		case fa != fb:
			return -1
		case a.t.Name < b.t.Name:
			return -1
		default:
			return 1
		}
	})
	var errs []error
	for _, t := range all[:min(3, len(all))] {
		pcfg, err := s.f.cfg.Connect(ctx, t.t)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		cc := pcfg.ConnConfig
		if cc.RuntimeParams == nil {
			cc.RuntimeParams = map[string]string{}
		}
		cc.RuntimeParams["application_name"] = "sluice-fleet-activity"
		conn, err := pgx.ConnectConfig(ctx, cc)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		s.conn, s.via = conn, t
		return nil
	}
	return errors.Join(errs...)
}
