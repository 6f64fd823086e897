package inbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/internal/wire"
)

// Fleet mode: one Consumer, many tenant databases (docs/inbox.md, "Fleet: one consumer, many
// tenant databases"). A fleet relay (pkg/fleet) publishes every tenant database's outbox through
// one deployment and names each message's tenant in the header TenantHeader. A Consumer whose
// ConsumerConfig.Tenants is set applies each message in its tenant's own database:
//
//   - run splits a batch by tenant, in the order each tenant first appears, and applies each
//     tenant's records as a batch of their own on that tenant's pool (runTenant), in the
//     configured mode: the inbox row and the handler's effects commit in the tenant's database
//     in one transaction, exactly as with one database, so a message is applied once per
//     tenant. Dead letters are recorded in the tenant's database too.
//   - An ordering group (FIFO message group, shard, partition) is ordered per tenant: a failure
//     blocks the later records of its group and tenant. A tenant's keys are its own; another
//     tenant's records of a group with the same name are not held back by it.
//   - A message without the header, or naming a tenant the resolver does not know, fails with
//     ErrUnknownTenant and is recorded nowhere (there is no database that owns it): its
//     source's retries, then its DLQ, are its path. So does a record that could not be parsed
//     (its tenant cannot be read), with its ErrBadMessage.
//   - TenantPools opens a tenant's pool on first use, bounded (MaxConnsPerTenant), within a
//     total (MaxConns) that is reserved before a pool opens: when it is spent, the least
//     recently used idle pool is closed first, and when every pool is in use the caller waits.
//     A pool idle for IdleClose is closed.

// TenantHeader is the header that names a message's tenant database: what a fleet relay
// (pkg/fleet, outbox.RelayConfig.Tenant) carries on every message, on every destination (an
// SNS or SQS attribute, the envelope's headers on EventBridge and Kinesis, a Kafka header).
// The same name as outbox.TenantHeader.
const TenantHeader = wire.Tenant

// Tenant returns the message's tenant (the TenantHeader header), or "" when it has none.
func (m Message) Tenant() string { return m.Headers[wire.Tenant] }

// Defaults of TenantPoolsConfig.
const (
	// DefaultMaxConnsPerTenant is TenantPoolsConfig.MaxConnsPerTenant's default.
	DefaultMaxConnsPerTenant = 2
	// DefaultTenantMaxConns is TenantPoolsConfig.MaxConns's default.
	DefaultTenantMaxConns = 10
	// DefaultTenantIdleClose is TenantPoolsConfig.IdleClose's default.
	DefaultTenantIdleClose = time.Minute
)

// TenantPoolsConfig configures TenantPools.
type TenantPoolsConfig struct {
	// Resolve returns the pool configuration of tenant's database, e.g. parsed from a registry's
	// URL; TenantPools sets its MaxConns, MinConns and MaxConnIdleTime. It returns an error
	// wrapping ErrUnknownTenant when no such tenant exists. It is called when a tenant's pool
	// opens, and again after the pool closed (idle, evicted, or a failed Begin). Required.
	Resolve func(ctx context.Context, tenant string) (*pgxpool.Config, error)
	// MaxConnsPerTenant is the most connections a tenant's pool holds. Defaults to
	// DefaultMaxConnsPerTenant (a Consumer uses one at a time per batch; the second serves a
	// concurrent batch or a Processor).
	MaxConnsPerTenant int
	// MaxConns bounds the connections of every tenant pool together: a pool opens only when
	// its MaxConnsPerTenant fits in what the open pools reserved, after closing the least
	// recently used idle pools; when every open pool is in use, the caller waits for one.
	// Defaults to DefaultTenantMaxConns; at least MaxConnsPerTenant.
	MaxConns int
	// IdleClose is how long a tenant's pool stays open unused (and how long an idle
	// connection of it stays open). Defaults to DefaultTenantIdleClose.
	IdleClose time.Duration
	// Logger receives the pools' logs. Defaults to slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns a copy of c with every zero field set to its documented default.
func (c TenantPoolsConfig) WithDefaults() TenantPoolsConfig {
	if c.MaxConnsPerTenant == 0 {
		c.MaxConnsPerTenant = DefaultMaxConnsPerTenant
	}
	if c.MaxConns == 0 {
		c.MaxConns = max(DefaultTenantMaxConns, c.MaxConnsPerTenant)
	}
	if c.IdleClose == 0 {
		c.IdleClose = DefaultTenantIdleClose
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c TenantPoolsConfig) validate() error {
	var errs []error
	if c.Resolve == nil {
		errs = append(errs, fmt.Errorf("%w: TenantPoolsConfig.Resolve is required", ErrInvalidConfig))
	}
	if c.MaxConnsPerTenant < 1 || c.MaxConnsPerTenant > c.MaxConns {
		errs = append(errs, fmt.Errorf("%w: MaxConnsPerTenant must be between 1 and MaxConns (%d), got %d", ErrInvalidConfig, c.MaxConns, c.MaxConnsPerTenant))
	}
	if c.IdleClose < 0 {
		errs = append(errs, fmt.Errorf("%w: IdleClose must not be negative, got %s", ErrInvalidConfig, c.IdleClose))
	}
	return errors.Join(errs...)
}

// ErrPoolsClosed is returned for a tenant's database after TenantPools.Close.
var ErrPoolsClosed = errors.New("inbox: tenant pools closed")

// TenantPools opens and holds a pool per tenant database, for a Consumer in fleet mode
// (ConsumerConfig.Tenants) and for code that works on one tenant at a time (WithTenant, e.g. a
// Processor per tenant). It is safe for concurrent use; build it once per process.
type TenantPools struct {
	cfg TenantPoolsConfig
	log *slog.Logger
	now func() time.Time

	mu       sync.Mutex
	pools    map[string]*tenantPool
	reserved int           // MaxConnsPerTenant for every pool open, opening or closing
	changed  chan struct{} // closed (and replaced) when a lease ends or a reservation is returned
	closed   bool
}

// tenantPool is one tenant's pool, or its opening (ready not closed yet).
type tenantPool struct {
	name  string
	ready chan struct{} // closed once pool or err is set
	pool  *pgxpool.Pool
	err   error
	// leases, lastUsed and closing are guarded by TenantPools.mu.
	leases   int
	lastUsed time.Time
	closing  bool
	// stale: a Begin on the pool failed; it is closed when its last lease ends, so the next
	// use resolves the tenant again (a moved database, rotated credentials).
	stale atomic.Bool
	// layout is how the tenant's inbox_event is stored, as a Consumer learned it (see
	// partition_insert.go): a property of the database, kept with its pool.
	layout atomic.Int32
}

// NewTenantPools returns an empty TenantPools; pools open on first use.
func NewTenantPools(cfg TenantPoolsConfig) (*TenantPools, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &TenantPools{cfg: cfg, log: cfg.Logger, now: time.Now, pools: map[string]*tenantPool{}, changed: make(chan struct{})}, nil
}

// WithTenant runs f with tenant's pool, opening it when needed; the pool is not closed (idle,
// evicted) while f runs. It returns f's error, or one wrapping ErrUnknownTenant when Resolve
// does not know the tenant.
func (p *TenantPools) WithTenant(ctx context.Context, tenant string, f func(db *pgxpool.Pool) error) error {
	tp, err := p.acquire(ctx, tenant)
	if err != nil {
		return err
	}
	defer p.release(tp)
	return f(tp.pool)
}

// Close closes every pool, waiting for the ones in use to be released by their holders; later
// uses fail with ErrPoolsClosed.
func (p *TenantPools) Close() {
	p.mu.Lock()
	p.closed = true
	pools := make([]*tenantPool, 0, len(p.pools))
	for _, tp := range p.pools {
		pools = append(pools, tp)
	}
	clear(p.pools)
	p.broadcast()
	p.mu.Unlock()
	for _, tp := range pools {
		<-tp.ready
		if tp.pool != nil {
			tp.pool.Close()
		}
	}
}

// broadcast wakes every caller waiting for a reservation; p.mu is held.
func (p *TenantPools) broadcast() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// acquire returns tenant's pool, opened, with a lease the caller ends with release.
func (p *TenantPools) acquire(ctx context.Context, tenant string) (*tenantPool, error) {
	if tenant == "" {
		return nil, fmt.Errorf("%w: no tenant named (header %s)", ErrUnknownTenant, TenantHeader)
	}
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, fmt.Errorf("tenant %s: %w", tenant, ErrPoolsClosed)
		}
		p.closeIdle(p.now().Add(-p.cfg.IdleClose))
		if tp := p.pools[tenant]; tp != nil && tp.stale.Load() {
			// A Begin on it failed: this caller opens a new pool; the stale one closes with
			// its last lease (release).
			delete(p.pools, tenant)
			if tp.leases == 0 {
				p.closeLocked(tp)
			}
		}
		if tp := p.pools[tenant]; tp != nil {
			tp.leases++
			tp.lastUsed = p.now()
			p.mu.Unlock()
			select {
			case <-tp.ready:
			case <-ctx.Done():
				p.release(tp)
				return nil, fmt.Errorf("tenant %s: wait for its pool to open: %w", tenant, ctx.Err())
			}
			if tp.err != nil {
				p.release(tp)
				return nil, tp.err
			}
			return tp, nil
		}
		if p.reserved+p.cfg.MaxConnsPerTenant > p.cfg.MaxConns {
			// Close the least recently used idle pool (its reservation returns once its
			// connections are closed) or, when every pool is in use, wait for a lease to end.
			evicted := p.evictOne()
			wait := p.changed
			p.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				if evicted {
					return nil, fmt.Errorf("tenant %s: wait for an idle tenant pool to close: %w", tenant, ctx.Err())
				}
				return nil, fmt.Errorf("tenant %s: wait for a connection (every tenant pool in use, %d connections reserved): %w",
					tenant, p.cfg.MaxConns, ctx.Err())
			}
		}
		tp := &tenantPool{name: tenant, ready: make(chan struct{}), leases: 1, lastUsed: p.now()}
		p.pools[tenant] = tp
		p.reserved += p.cfg.MaxConnsPerTenant
		p.mu.Unlock()
		p.open(ctx, tp)
		if tp.err != nil {
			p.release(tp)
			return nil, tp.err
		}
		return tp, nil
	}
}

// open resolves tp's tenant and creates its pool (connections open on first use); on failure
// tp.err is set and tp leaves the map, returning its reservation.
func (p *TenantPools) open(ctx context.Context, tp *tenantPool) {
	var pool *pgxpool.Pool
	cfg, err := p.cfg.Resolve(ctx, tp.name)
	if err == nil {
		cfg.MaxConns, cfg.MinConns = int32(p.cfg.MaxConnsPerTenant), 0
		if cfg.MaxConnIdleTime == 0 || cfg.MaxConnIdleTime > p.cfg.IdleClose {
			cfg.MaxConnIdleTime = p.cfg.IdleClose
		}
		pool, err = pgxpool.NewWithConfig(ctx, cfg)
	}
	if err != nil && !errors.Is(err, ErrUnknownTenant) {
		err = fmt.Errorf("open the database of tenant %s: %w", tp.name, err)
	}
	p.mu.Lock()
	tp.pool, tp.err = pool, err
	if err != nil {
		p.drop(tp)
	}
	close(tp.ready)
	p.mu.Unlock()
}

// release ends a lease of tp; a stale pool closes with its last lease.
func (p *TenantPools) release(tp *tenantPool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	tp.leases--
	tp.lastUsed = p.now()
	if tp.leases == 0 && tp.stale.Load() && tp.pool != nil {
		p.log.Warn("inbox: closing a tenant pool after a failed Begin; the tenant is resolved again on its next use", "tenant", tp.name)
		p.closeLocked(tp)
	}
	p.broadcast()
}

// evictOne closes the least recently used pool without leases; it reports whether it found
// one. p.mu is held.
func (p *TenantPools) evictOne() bool {
	var lru *tenantPool
	for _, tp := range p.pools {
		if tp.leases == 0 && tp.pool != nil && (lru == nil || tp.lastUsed.Before(lru.lastUsed)) {
			lru = tp
		}
	}
	if lru == nil {
		return false
	}
	p.closeLocked(lru)
	return true
}

// closeIdle closes the pools unused since before. p.mu is held.
func (p *TenantPools) closeIdle(before time.Time) {
	for _, tp := range p.pools {
		if tp.leases == 0 && tp.pool != nil && tp.lastUsed.Before(before) {
			p.closeLocked(tp)
		}
	}
}

// closeLocked removes tp (open, without leases) from the map and closes its pool in the
// background, once; its reservation returns once the pool's connections are closed, so the
// connections of all pools never exceed MaxConns. p.mu is held.
func (p *TenantPools) closeLocked(tp *tenantPool) {
	if tp.closing {
		return
	}
	tp.closing = true
	if p.pools[tp.name] == tp {
		delete(p.pools, tp.name)
	}
	go func() {
		tp.pool.Close()
		p.mu.Lock()
		p.reserved -= p.cfg.MaxConnsPerTenant
		p.broadcast()
		p.mu.Unlock()
	}()
}

// drop removes tp, which failed to open, and returns its reservation. p.mu is held.
func (p *TenantPools) drop(tp *tenantPool) {
	if p.pools[tp.name] == tp {
		delete(p.pools, tp.name)
	}
	p.reserved -= p.cfg.MaxConnsPerTenant
	p.broadcast()
}

// tenantDB is a tenant's pool as a Consumer's database: a failed Begin marks the pool stale.
type tenantDB struct {
	*pgxpool.Pool
	tp *tenantPool
}

// Begin begins a transaction on the tenant's pool.
func (d tenantDB) Begin(ctx context.Context) (pgx.Tx, error) {
	tx, err := d.Pool.Begin(ctx)
	if err != nil && ctx.Err() == nil {
		d.tp.stale.Store(true)
	}
	return tx, err
}

// forTenant returns a view of c that applies in tp's database: its pool, its layout, its name
// in the logs.
func (c *Consumer) forTenant(tp *tenantPool) *Consumer {
	v := *c
	v.db = tenantDB{Pool: tp.pool, tp: tp}
	v.layout = &tp.layout
	v.tenants = nil
	v.log = c.log.With("tenant", tp.name)
	return &v
}

// onTenant runs f with the view of c on tenant's database.
func (c *Consumer) onTenant(ctx context.Context, tenant string, f func(tc *Consumer)) error {
	tp, err := c.tenants.acquire(ctx, tenant)
	if err != nil {
		return err
	}
	defer c.tenants.release(tp)
	f(c.forTenant(tp))
	return nil
}

// runTenants applies a batch in fleet mode: each tenant's records as a batch of their own in
// the tenant's database (see the comment at the top of this file).
func (b *batch) runTenants(ctx context.Context) {
	var order []string
	byTenant := map[string][]int{}
	for i := range b.recs {
		r := &b.recs[i]
		if r.err != nil && r.msg.ID == "" {
			b.fail(r, r.err) // not parsed: no tenant to apply it in, or to record it in
			continue
		}
		name := r.msg.Tenant()
		if name == "" {
			b.fail(r, fmt.Errorf("record %s, message %s: %w: no %s header (not published by a fleet relay?)", r.id, r.msg.ID, ErrUnknownTenant, TenantHeader))
			continue
		}
		if _, ok := byTenant[name]; !ok {
			order = append(order, name)
		}
		byTenant[name] = append(byTenant[name], i)
	}
	for _, name := range order {
		b.runTenant(ctx, name, byTenant[name])
	}
	b.endSpans(ctx) // the records no tenant took
}

// runTenant applies the records idx of the batch, tenant's, in the tenant's database.
func (b *batch) runTenant(ctx context.Context, tenant string, idx []int) {
	err := b.c.onTenant(ctx, tenant, func(tc *Consumer) {
		sub := &batch{c: tc, recs: make([]record, len(idx)), results: make([]Result, len(idx)), blocked: map[string]bool{}}
		for j, i := range idx {
			sub.recs[j], sub.results[j] = b.recs[i], b.results[i]
			sub.recs[j].i = j
		}
		sub.apply(ctx)
		for j, i := range idx {
			b.recs[i], b.results[i] = sub.recs[j], sub.results[j]
			b.recs[i].i = i
		}
	})
	if err != nil {
		for _, i := range idx {
			b.fail(&b.recs[i], fmt.Errorf("record %s: %w", b.recs[i].id, err))
		}
	}
}

// markDeadInTenant is markDead in fleet mode: in the database of d's tenant.
func (c *Consumer) markDeadInTenant(ctx context.Context, d *delivery) bool {
	var changed bool
	if err := c.onTenant(context.WithoutCancel(ctx), d.msg.Tenant(), func(tc *Consumer) { changed = tc.markDead(ctx, d) }); err != nil {
		c.log.WarnContext(ctx, "inbox: could not mark a dead letter dead", "item_id", d.id, "error", err.Error())
	}
	return changed
}
