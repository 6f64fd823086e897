package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/pkg/outbox"
)

// The fleet suite's workload (fleet.go): the broker stub that tells tenants apart, the quiet
// tenants' producers, and the probe that reads the server's view of the fleet.

// fleetPublisher is the fleet's broker: the latency suites' ackPublisher (Delay per call,
// acknowledgements recorded in a waitBook), counting what it acknowledged per tenant, as
// each event's outbox.TenantHeader names it. A call only appends what it acknowledged to a
// log; the readers file the log into the per-tenant figures first (file), so that the stub's
// bookkeeping costs the relays' rounds no more than the reference's counting stub does
// (stubPublisher): the aggregate's pairs compare the two.
type fleetPublisher struct {
	ack *ackPublisher

	mu       sync.Mutex
	unfiled  []ackedCall // the calls not filed yet, in the order they were recorded
	byTenant map[string]int
	last     map[string]time.Time // each tenant's latest acknowledgement
	first    map[string]time.Time // each tenant's first acknowledgement
	calls    []ackedCall          // every filed call (their events dropped)
	header   map[uuid.UUID]string // the tenant header of each event's first publish
	again    int                  // publishes of an event already acknowledged
	againBy  map[string]int       // again, by the tenant the event's header names
}

// ackedCall is one PublishBatch call's acknowledgements: when, how many, and until filed
// each acknowledged event's id and tenant header.
type ackedCall struct {
	at      time.Time
	n       int
	ids     []uuid.UUID
	tenants []string
}

var _ outbox.Publisher = (*fleetPublisher)(nil)

func newFleetPublisher(book *waitBook) *fleetPublisher {
	return &fleetPublisher{ack: &ackPublisher{Delay: fleetDelay, book: book},
		byTenant: map[string]int{}, last: map[string]time.Time{}, first: map[string]time.Time{}, header: map[uuid.UUID]string{}, againBy: map[string]int{}}
}

// PublishBatch implements outbox.Publisher.
func (p *fleetPublisher) PublishBatch(ctx context.Context, dest string, events []*outbox.Event) []error {
	errs := p.ack.PublishBatch(ctx, dest, events)
	c := ackedCall{at: time.Now(), ids: make([]uuid.UUID, 0, len(events)), tenants: make([]string, 0, len(events))}
	for i, e := range events {
		if errs[i] == nil {
			c.ids, c.tenants = append(c.ids, e.EventID), append(c.tenants, e.Headers[outbox.TenantHeader])
		}
	}
	c.n = len(c.ids)
	p.mu.Lock()
	p.unfiled = append(p.unfiled, c)
	p.mu.Unlock()
	return errs
}

// file moves the unfiled calls into the per-tenant figures. p.mu is held.
func (p *fleetPublisher) file() {
	for _, c := range p.unfiled {
		for i, id := range c.ids {
			tenant := c.tenants[i]
			if _, ok := p.header[id]; ok {
				p.again++
				p.againBy[tenant]++
				continue
			}
			p.header[id] = tenant
			p.byTenant[tenant]++
			p.last[tenant] = c.at
			if _, ok := p.first[tenant]; !ok {
				p.first[tenant] = c.at
			}
		}
		p.calls = append(p.calls, ackedCall{at: c.at, n: c.n})
	}
	p.unfiled = p.unfiled[:0]
}

// count returns how many distinct events of tenant were acknowledged.
func (p *fleetPublisher) count(tenant string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.file()
	return p.byTenant[tenant]
}

// lastAck returns when tenant's latest event was acknowledged.
func (p *fleetPublisher) lastAck(tenant string) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.file()
	return p.last[tenant]
}

// firstAck returns when tenant's first event was acknowledged (zero: none yet).
func (p *fleetPublisher) firstAck(tenant string) time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.file()
	return p.first[tenant]
}

// forgetFirst makes firstAck of tenant report its next acknowledgement.
func (p *fleetPublisher) forgetFirst(tenant string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.file()
	delete(p.first, tenant)
}

// publishedBetween counts the acknowledgements in [from, to].
func (p *fleetPublisher) publishedBetween(from, to time.Time) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.file()
	n := 0
	for _, c := range p.calls {
		if !c.at.Before(from) && !c.at.After(to) {
			n += c.n
		}
	}
	return n
}

// duplicates returns how many publishes repeated an acknowledged event, in all and by the
// tenant the event's header names.
func (p *fleetPublisher) duplicates() (int, map[string]int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.file()
	return p.again, maps.Clone(p.againBy)
}

// mismatches counts the events whose tenant header is not their writer's: tenantOf names the
// writer of the quiet tenants' events; every other event is the hot tenant's.
func (p *fleetPublisher) mismatches(tenantOf func(uuid.UUID) (string, bool)) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.file()
	n := 0
	for id, h := range p.header {
		want, ok := tenantOf(id)
		if !ok {
			want = hotTenant
		}
		if h != want {
			n++
		}
	}
	return n
}

// quietProducers are the quiet tenants' writers: each commits one event every period, each in
// its own transaction with outbox.Write, on a connection of its own, on an open-loop schedule
// (event k of tenant i is due at start + (i/n + k) × period), the tenants spread evenly over
// the period.
type quietProducers struct {
	tenants []fleetTenant
	book    *waitBook
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	// mark: on stop, each producer marks its database's pending rows published before closing
	// (markPublishedOnStop).
	mark atomic.Bool

	mu     sync.Mutex
	events []quietEvent
	writer map[uuid.UUID]string
	err    error
	all    []uuid.UUID // set by stop
}

// quietEvent is one committed event: its id, its tenant's name and when Commit returned.
type quietEvent struct {
	id     uuid.UUID
	tenant string
	at     time.Time
}

// startQuietProducers connects to every tenant's database (8 at a time) and starts its writer.
func startQuietProducers(ctx context.Context, tenants []fleetTenant, book *waitBook, period time.Duration) (*quietProducers, error) {
	p := &quietProducers{tenants: tenants, book: book, writer: map[uuid.UUID]string{}}
	conns := make([]*pgx.Conn, len(tenants))
	errs := make([]error, len(tenants))
	var next atomic.Int64
	var cwg sync.WaitGroup
	for range 8 {
		cwg.Add(1)
		go func() {
			defer cwg.Done()
			for i := int(next.Add(1) - 1); i < len(tenants); i = int(next.Add(1) - 1) {
				cfg, err := pgx.ParseConfig(tenants[i].adminURL)
				if err == nil {
					cfg.RuntimeParams["application_name"] = "sluice-bench-producer"
					conns[i], err = pgx.ConnectConfig(ctx, cfg)
				}
				if err != nil {
					errs[i] = fmt.Errorf("connect the producer of %s: %w", tenants[i].name, err)
				}
			}
		}()
	}
	cwg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, c := range conns {
			if c != nil {
				c.Close(context.WithoutCancel(ctx))
			}
		}
		return nil, err
	}
	pctx, cancel := context.WithCancel(ctx)
	p.cancel = cancel
	start := time.Now()
	for i, t := range tenants {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			defer conns[i].Close(context.WithoutCancel(ctx))
			offset := time.Duration(i) * period / time.Duration(len(tenants))
			for k := 0; ; k++ {
				if sleepCtx(pctx, time.Until(start.Add(offset+time.Duration(k)*period))) != nil {
					if p.mark.Load() {
						_, _ = conns[i].Exec(context.WithoutCancel(ctx), "UPDATE outbox_event SET published_at = now() WHERE published_at IS NULL")
					}
					return
				}
				// The transaction does not see stop: an event is never committed without being
				// recorded (the tenant header check counts an unrecorded one as misattributed).
				id, at, err := writeQuietEvent(context.WithoutCancel(pctx), conns[i], t.name, k)
				p.mu.Lock()
				if err != nil {
					if p.err == nil {
						p.err = fmt.Errorf("tenant %s: %w", t.name, err)
					}
					p.mu.Unlock()
					return
				}
				p.events = append(p.events, quietEvent{id, t.name, at})
				p.writer[id] = t.name
				p.mu.Unlock()
				book.commit(at, id)
			}
		}()
	}
	return p, nil
}

// markPublishedOnStop makes stop mark every tenant's pending rows published (rows no relay
// served, e.g. written while the reference ran): the next run starts from none.
func (p *quietProducers) markPublishedOnStop() { p.mark.Store(true) }

func writeQuietEvent(ctx context.Context, conn *pgx.Conn, tenant string, k int) (uuid.UUID, time.Time, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return uuid.Nil, time.Time{}, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	key := fmt.Sprintf("%s-%d", tenant, k%10)
	written, err := outbox.Write(ctx, tx, outbox.Message{Topic: "orders", AggregateType: "order", AggregateID: key, EventType: "OrderCreated",
		Payload: json.RawMessage(fmt.Sprintf(`{"orderId":%d,"customerId":"c-42","totalCents":1299,"currency":"EUR","schemaVersion":1}`, k))})
	if err != nil {
		return uuid.Nil, time.Time{}, err
	}
	if err := tx.Commit(ctx); err != nil {
		return uuid.Nil, time.Time{}, err
	}
	return written[0].EventID, time.Now(), nil
}

// committedBetween returns the ids of the events committed in [from, to].
func (p *quietProducers) committedBetween(from, to time.Time) []uuid.UUID {
	p.mu.Lock()
	defer p.mu.Unlock()
	var ids []uuid.UUID
	for _, e := range p.events {
		if !e.at.Before(from) && !e.at.After(to) {
			ids = append(ids, e.id)
		}
	}
	return ids
}

// tenantOf names the tenant that wrote id.
func (p *quietProducers) tenantOf(id uuid.UUID) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	t, ok := p.writer[id]
	return t, ok
}

// stop stops the writers (once) and returns every event they committed; a writer's failure is
// returned by failed.
func (p *quietProducers) stop() []uuid.UUID {
	p.cancel()
	p.wg.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.all == nil {
		p.all = make([]uuid.UUID, len(p.events))
		for i, e := range p.events {
			p.all[i] = e.id
		}
	}
	return p.all
}

// failed returns the first writer's failure, if any.
func (p *quietProducers) failed() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// fleetProbe reads the server's view of the fleet from the maintenance database (so that its
// own transactions are in no tenant's counters).
type fleetProbe struct {
	pool *pgxpool.Pool
	// hotDB is the hot tenant's database, whose relay sessions the sampler also counts.
	hotDB string
	// role is the fleet's login, whose statements pg_stat_statements counts (empty: the
	// probe's own, the harness's); statements is false without pg_stat_statements.
	role       string
	statements bool
}

func newFleetProbe(ctx context.Context, adminURL, role string) (*fleetProbe, error) {
	cfg, err := pgxpool.ParseConfig(adminURL)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 6 // three samplers and the counters' reads at once
	cfg.ConnConfig.RuntimeParams["application_name"] = "sluice-bench-probe"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	p := &fleetProbe{pool: pool, role: role}
	if p.role == "" {
		if err := pool.QueryRow(ctx, "SELECT current_user").Scan(&p.role); err != nil {
			pool.Close()
			return nil, err
		}
	}
	var n int64
	p.statements = pool.QueryRow(ctx, "SELECT count(*) FROM pg_stat_statements").Scan(&n) == nil
	return p, nil
}

func (p *fleetProbe) close() { p.pool.Close() }

// serverCounters are cumulative counters of the tenant databases.
type serverCounters struct {
	// xacts (xact_commit + xact_rollback) and sessions (opened) in all, xactsBy per database;
	// statements are the fleet role's (pg_stat_statements calls; -1 without it).
	xacts, sessions, statements int64
	xactsBy                     map[string]int64
}

// minus is c − o.
func (c serverCounters) minus(o serverCounters) serverCounters {
	d := serverCounters{xacts: c.xacts - o.xacts, sessions: c.sessions - o.sessions, statements: c.statements - o.statements}
	if c.statements < 0 || o.statements < 0 {
		d.statements = -1
	}
	return d
}

// counters reads the tenants' databases' counters.
func (p *fleetProbe) counters(ctx context.Context, tenants []fleetTenant) (serverCounters, error) {
	c := serverCounters{xactsBy: map[string]int64{}, statements: -1}
	dbs := make([]string, len(tenants))
	for i, t := range tenants {
		dbs[i] = t.db
	}
	// The statistics a backend reported last (pg_stat_database is a snapshot per transaction).
	rows, err := p.pool.Query(ctx, `SELECT datname, xact_commit + xact_rollback, sessions FROM pg_stat_database WHERE datname = ANY($1)`, dbs)
	if err != nil {
		return c, fmt.Errorf("read pg_stat_database: %w", err)
	}
	for rows.Next() {
		var (
			db      string
			x, sess int64
		)
		if err := rows.Scan(&db, &x, &sess); err != nil {
			rows.Close()
			return c, err
		}
		c.xactsBy[db] = x
		c.xacts += x
		c.sessions += sess
	}
	if err := rows.Err(); err != nil {
		return c, err
	}
	if p.statements {
		err := p.pool.QueryRow(ctx, `SELECT coalesce(sum(s.calls), 0)::bigint FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
			WHERE d.datname = ANY($1) AND s.userid = (SELECT oid FROM pg_roles WHERE rolname = $2)`, dbs, p.role).Scan(&c.statements)
		if err != nil {
			return c, fmt.Errorf("read pg_stat_statements: %w", err)
		}
	}
	return c, nil
}

// fleetSessionsSQL counts the fleet's sessions on the server: its relays' pools, its
// activity poll (pkg/fleet names them by application_name), and the relay sessions in
// database $1 (the hot tenant's).
const fleetSessionsSQL = `SELECT count(*) FILTER (WHERE application_name = 'sluice-fleet-relay'),
	count(*) FILTER (WHERE application_name = 'sluice-fleet-activity'), count(*),
	count(*) FILTER (WHERE application_name = 'sluice-fleet-relay' AND datname = $1)
	FROM pg_stat_activity WHERE application_name LIKE 'sluice-fleet-%'`

// connSampler samples the fleet's sessions every 250 ms until stopped.
type connSampler struct {
	stopc chan struct{}
	done  chan connStats
	once  sync.Once
	stats connStats
}

// connStats are a sampler's figures: the mean and the max of the relays' sessions, of the
// activity poll's, the max of their sum, and the max of the hot tenant's relay sessions.
type connStats struct {
	samples                                 int
	relayMean, activityMean                 float64
	relayMax, activityMax, totalMax, hotMax int
}

func (p *fleetProbe) sample(ctx context.Context) *connSampler {
	s := &connSampler{stopc: make(chan struct{}), done: make(chan connStats, 1)}
	go func() {
		var st connStats
		var sumR, sumA int
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		for {
			var r, a, all, hot int
			if err := p.pool.QueryRow(ctx, fleetSessionsSQL, p.hotDB).Scan(&r, &a, &all, &hot); err == nil {
				st.samples++
				sumR, sumA = sumR+r, sumA+a
				st.relayMax, st.activityMax, st.totalMax = max(st.relayMax, r), max(st.activityMax, a), max(st.totalMax, all)
				st.hotMax = max(st.hotMax, hot)
			}
			select {
			case <-s.stopc:
				if st.samples > 0 {
					st.relayMean, st.activityMean = float64(sumR)/float64(st.samples), float64(sumA)/float64(st.samples)
				}
				s.done <- st
				return
			case <-ctx.Done():
				s.done <- st
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

// stop ends the sampling and returns its figures; it may be called again.
func (s *connSampler) stop() connStats {
	s.once.Do(func() {
		close(s.stopc)
		s.stats = <-s.done
	})
	return s.stats
}

// sortedCounts renders counts by message, most frequent first.
func sortedCounts(m map[string]int) string {
	type kv struct {
		k string
		v int
	}
	var s []kv
	for k, v := range m {
		s = append(s, kv{k, v})
	}
	sort.Slice(s, func(i, j int) bool { return s[i].v > s[j].v || (s[i].v == s[j].v && s[i].k < s[j].k) })
	out := ""
	for i, x := range s {
		if i > 0 {
			out += "; "
		}
		out += fmt.Sprintf("%s (%d)", x.k, x.v)
	}
	return out
}
