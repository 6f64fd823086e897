package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/internal/wire"
	"github.com/sluicehq/sluice/pkg/metrics"
)

// RelayConfig configures a Relay. Zero fields take the defaults stated on each; the defaults
// and bounds of its numbers are declared in RelaySettings.
type RelayConfig struct {
	// Publisher sends events to the brokers. Required: a built-in publisher (NewSNSPublisher,
	// NewEventBridgePublisher, NewKinesisPublisher, NewKafkaPublisher), or Publishers to route
	// each destination to its kind's.
	Publisher Publisher
	// Topics maps logical topic names (outbox_event.topic) to destinations: SNS topic, EventBridge
	// bus or Kinesis stream ARNs, or Kafka topics as kafka://TOPIC (see ParseDestination).
	Topics map[string]string
	// DefaultTopic receives rows whose topic is not in Topics. Defaults to none: such rows are
	// quarantined with an "unknown topic" error.
	DefaultTopic string
	// BatchSize is the most rows one round takes, and the most partition keys it holds.
	// Defaults to 500.
	BatchSize int
	// MaxPerKey is the most rows of one partition key one round takes; a key's rows are
	// published one after another, so a smaller value spreads a round over more keys.
	// Defaults to 10.
	MaxPerKey int
	// PublishConcurrency is the number of PublishBatch calls in flight. Defaults to 64.
	PublishConcurrency int
	// Pipelines is the number of claim-publish-record rounds this relay runs at once, so that
	// one round's database work overlaps another's publishing. Each round holds keys the others
	// do not. Defaults to 2.
	Pipelines int
	// MaxRoundBytes bounds the payload bytes one round holds in memory; a round takes rows in
	// the order it would publish them until the next would exceed it (a single row larger than
	// the budget still goes out alone). The relay Lambda derives it from its memory size.
	// Defaults to 16 MiB.
	MaxRoundBytes int
	// RoundMemory, when set, bounds the payload bytes the rounds of every relay given the same
	// RoundMemory hold at once (a process running many relays, as a fleet does): a round takes
	// its share before it reads and waits while the budget is spent (a single message larger
	// than the whole budget still goes out alone, with the budget to itself). Defaults to nil:
	// each round is bounded by MaxRoundBytes alone.
	RoundMemory *RoundMemory
	// MessageLimits are the largest messages the destinations accept, each measured as its
	// service counts it (MessageSize: SNS the body and attributes, EventBridge the entry with
	// its envelope, Kinesis the record's data and partition key, Kafka the record batch). A
	// message above its destination's limit has its payload stored in S3 with ClaimCheck, and
	// is quarantined without one. Zero fields default to AWS's current limits (cited in
	// RelaySettings); set them to what your topics, queues, streams and brokers are configured
	// to take.
	MessageLimits MessageLimits
	// MaxMessageBytes caps the largest message, as the destination counts it, below
	// MessageLimits; a larger row is quarantined without being read into memory, or with
	// ClaimCheck its payload is stored in S3. Defaults to 0: each destination's limit.
	MaxMessageBytes int
	// ClaimCheck, when set, stores payloads of messages above its threshold in S3 and publishes
	// a pointer in the AWS extended clients' format instead. Defaults to nil: such rows are
	// quarantined as too large.
	ClaimCheck *ClaimCheck
	// PublishTimeout bounds one PublishBatch call. Defaults to 10s.
	PublishTimeout time.Duration
	// SlowCall is how long a call may be in flight before its destination counts as slow (or
	// PublishTimeout, when shorter): ordinary rounds then send that destination nothing more
	// (its keys wait, held) until the call ends, the call stops counting against
	// PublishConcurrency, and the round that made it gives its pipeline back (while the pool
	// has a connection for another round; otherwise the slow call is cut short and the
	// destination is backed off and probed as a failing one). So a slow or hanging destination
	// delays only its own rows (docs/outbox.md, "Liveness"). A relay with one destination has
	// nothing to isolate it from and does none of this. Defaults to 250ms.
	SlowCall time.Duration
	// WAL, when set, has Run follow the database's logical replication stream for new rows
	// instead of polling every PollInterval (on PostgreSQL 14+ it then sends no statement at
	// all while the outbox is idle), falling back to polling whenever the stream cannot be
	// followed (WALWake; docs/outbox.md, "WAL wake-up"). RunOnce and RunPass poll.
	WAL *WALWake
	// Lease bounds how long one round holds its partition keys: publishing stops at three
	// quarters of it, every statement of the round is cancelled after half of it, and
	// PostgreSQL ends the round's session if it sits idle longer (a hung or frozen relay;
	// idle_session_timeout, PostgreSQL 14 and later), which releases its keys. A relay that
	// dies releases them when PostgreSQL sees its connection close, within a second even
	// mid-statement. Defaults to 30s.
	Lease time.Duration
	// MaxAttempts is the number of failed publish attempts after which a row is quarantined.
	// Only failures of the row count: while its whole destination fails (nothing sent there
	// succeeds), the destination backs off instead. Defaults to 10.
	MaxAttempts int
	// BackoffBase is the first backoff (exponential, with jitter, up to BackoffMax) between
	// attempts of a row, and between probes of a failing destination. Defaults to 1s.
	BackoffBase time.Duration
	// BackoffMax is the longest backoff. Defaults to 5m.
	BackoffMax time.Duration
	// OutageLimit is how long a row may keep failing because its whole destination fails
	// before it is quarantined all the same, so that a destination that never recovers shows
	// up in `sluice dead list`. Defaults to 24h.
	OutageLimit time.Duration
	// PollInterval is how often Run looks for newly committed rows: one primary-key lookup,
	// whatever the backlog. Defaults to 50ms.
	PollInterval time.Duration
	// RescanInterval is how often Run walks every pending partition key (one index descent
	// each), to pick up what polling cannot see: keys released by a relay that died, rows
	// whose backoff ended, rows made pending again by hand. A walk that takes long is spaced
	// out further; while Run follows the WAL (WAL) and the outbox is idle, the stream stands in
	// for the walks until its next change. Defaults to 1s.
	RescanInterval time.Duration
	// IdleStop makes Run return once no round is in flight and none has claimed a row for this
	// long (since Run started or since the last round that claimed rows ended): for a relay a
	// schedule starts again, so that a quiet outbox costs one short run per schedule period,
	// while under traffic it keeps publishing as before. The first event after a quiet spell
	// then waits for the next start (up to one schedule period). Defaults to 0: Run polls until
	// ctx ends.
	IdleStop time.Duration
	// MetricsInterval is how often Run emits the heartbeat and lag metrics. Defaults to 30s.
	MetricsInterval time.Duration
	// Metrics receives Embedded Metric Format lines (a Lambda passes os.Stdout): a shorthand
	// for MetricsRecorder: metrics.NewEMF(Metrics). Defaults to none.
	Metrics io.Writer
	// MetricsRecorder receives the relay's metrics (pkg/metrics names, dimensions
	// {Service: relay}), e.g. otelmetrics.New(meterProvider). When Metrics is set too, both
	// receive everything. Defaults to none.
	MetricsRecorder metrics.Recorder
	// TracerProvider records a span per PublishBatch call, linked to the span that wrote each
	// event (see docs/tracing.md). Defaults to none: no spans, no cost; pass
	// otel.GetTracerProvider() for the global one.
	TracerProvider trace.TracerProvider
	// Propagator reads the writer's span context from each event's headers, for the span's
	// links. Defaults to W3C trace context (propagation.TraceContext), what Write injects.
	Propagator propagation.TextMapPropagator
	// Logger receives operational logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Tenant, when set, is carried on every message this relay publishes as the header
	// TenantHeader, so that consumers can apply it in the tenant's own database (pkg/fleet sets
	// it for each tenant database it serves). It counts against a destination's attribute limit
	// like any header, and is the last header a publisher drops when they do not all fit
	// (docs/fleet.md, "Limits"). Defaults to none.
	Tenant string

	// bookCapacity overrides the key book's capacity (tests: a small book; 0 means bookCapacity).
	bookCapacity int
	// stopGrace overrides how long calls in flight may take to return when the relay stops
	// (tests: stops that cancel calls; 0 means stopGrace).
	stopGrace time.Duration
}

// TenantHeader is the header that names a message's tenant database when a fleet relay
// published it (RelayConfig.Tenant); Write refuses it as a header of its own.
const TenantHeader = wire.Tenant

// WithDefaults returns c with every zero field set to its default (RelaySettings; a
// ClaimCheck's fields are left to it).
func (c RelayConfig) WithDefaults() RelayConfig {
	for _, s := range relaySettings {
		if s.Default != 0 && !strings.HasPrefix(s.Field, "ClaimCheck.") && s.Get(c) == 0 {
			s.Set(&c, s.Default)
		}
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// validate reports every problem at once, in field order.
func (c RelayConfig) validate() error {
	var errs []error
	if c.Publisher == nil {
		errs = append(errs, errors.New("Publisher is required"))
	}
	if len(c.Topics) == 0 && c.DefaultTopic == "" {
		errs = append(errs, errors.New("Topics or DefaultTopic is required: nothing could be published"))
	}
	for _, k := range sortedKeys(c.Topics) {
		if k == "" || c.Topics[k] == "" {
			errs = append(errs, fmt.Errorf("Topics has an empty name or destination (%q: %q)", k, c.Topics[k]))
		}
	}
	if checker, ok := c.Publisher.(DestinationChecker); ok {
		for _, dest := range c.Destinations() {
			if err := checker.CheckDestination(dest); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if c.ClaimCheck != nil {
		if err := c.ClaimCheck.validate(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := c.CheckSettings(); err != nil {
		errs = append(errs, err.(interface{ Unwrap() []error }).Unwrap()...)
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("outbox: invalid RelayConfig: %w", err)
	}
	return nil
}

// Destinations returns every destination of c (Topics' and DefaultTopic), sorted, without
// duplicates: what a publisher for c must serve.
func (c RelayConfig) Destinations() []string {
	seen := map[string]bool{}
	var out []string
	for _, k := range sortedKeys(c.Topics) {
		if d := c.Topics[k]; d != "" && !seen[d] {
			seen[d] = true
			out = append(out, d)
		}
	}
	if d := c.DefaultTopic; d != "" && !seen[d] {
		out = append(out, d)
	}
	return out
}

// CheckSettings reports every out-of-range setting of c (RelaySettings, after WithDefaults, so
// zero fields are fine), one error per problem in field order, each starting with the field's
// name. Publisher, Topics and ClaimCheck are not checked. It returns nil when all are in range.
func (c RelayConfig) CheckSettings() error {
	c = c.WithDefaults()
	var errs []error
	for _, s := range relaySettings {
		if strings.HasPrefix(s.Field, "ClaimCheck.") {
			continue
		}
		if err := s.Check(s.Get(c)); err != nil {
			errs = append(errs, err)
		}
	}
	if c.PublishTimeout >= c.Lease {
		errs = append(errs, fmt.Errorf("Lease (%s) must be longer than PublishTimeout (%s): a round's publishing stops at three quarters of the lease", c.Lease, c.PublishTimeout))
	}
	if c.BackoffMax < c.BackoffBase {
		errs = append(errs, fmt.Errorf("BackoffMax (%s) must not be below BackoffBase (%s)", c.BackoffMax, c.BackoffBase))
	}
	return errors.Join(errs...)
}

// Relay publishes committed outbox rows. Any number of relays, in one process or many, may
// run against the same database. One Relay runs one RunOnce or Run at a time.
type Relay struct {
	pool    *pgxpool.Pool
	cfg     RelayConfig
	log     *slog.Logger
	metrics metrics.Recorder
	// inFlight bounds PublishBatch calls across pipelines.
	inFlight chan struct{}
	book     *keyBook
	dests    *destinations
	watch    *watcher
	// wal follows the WAL for new rows (RelayConfig.WAL); nil when polling is the only way.
	wal *walFollower
	// limits holds each destination's limits (capped by MaxMessageBytes); readBytes is the
	// largest message the relay reads into memory to publish (or to store, with a claim check).
	limits    map[string]Limits
	readBytes int
	// rounds counts the rounds in flight, changed under the pipelines' lock: RunOnce waits for
	// it to reach 0, and IdleStop reads it (lock-free) to tell an idle relay.
	rounds atomic.Int64
	// detached counts the rounds running detached from their pipelines (runRound).
	detached atomic.Int64
	// lastRead is the payload bytes the relay's last round read, with a RoundMemory: the next
	// round asks the budget for twice that (takeRoundShare).
	lastRead atomic.Int64
}

// bookCapacity bounds the keys a relay schedules at once; the rest wait for a later sweep.
const bookCapacity = 200_000

// NewRelay returns a Relay over pool with cfg. The relay uses up to Pipelines connections for its
// rounds, one more per failing destination's probe, and two for polling and sweeping. A round
// sets session settings and session-level advisory locks on the connection it holds and puts
// them back (RESET, pg_advisory_unlock_all) before returning it, so pool may be shared; a pool
// of the relay's own is simpler to size.
func NewRelay(pool *pgxpool.Pool, cfg RelayConfig) (*Relay, error) {
	if pool == nil {
		return nil, errors.New("outbox: NewRelay needs a pool")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	cfg.Publisher = tracePublisher(cfg.Publisher, cfg.TracerProvider, cfg.Propagator)
	r := &Relay{
		pool:     pool,
		cfg:      cfg,
		log:      cfg.Logger.With("component", "relay"),
		inFlight: make(chan struct{}, cfg.PublishConcurrency),
		book:     newKeyBook(cmp.Or(cfg.bookCapacity, bookCapacity)),
		dests:    newDestinations(cfg.BackoffBase, cfg.BackoffMax, cfg.slowAfter(), jitter),
	}
	r.watch = newWatcher(r)
	if cfg.WAL != nil {
		r.wal = newWALFollower(r, *cfg.WAL)
	}
	r.limits = map[string]Limits{}
	for _, dest := range cfg.Destinations() {
		lim := r.limitOf(dest)
		r.limits[dest] = lim
		r.readBytes = max(r.readBytes, lim.MaxMessageBytes)
	}
	if cc := cfg.ClaimCheck; cc != nil {
		r.readBytes = max(r.readBytes, cc.maxPayload())
	}
	r.metrics = recorder(cfg.Metrics, cfg.MetricsRecorder)
	return r, nil
}

// limitOf returns dest's limits: the publisher's entries and bytes per call, and the message
// limit of MessageLimits for dest's kind (capped by MaxMessageBytes). A call always has room
// for one message of the largest size.
func (r *Relay) limitOf(dest string) Limits {
	lim := limitsOf(r.cfg.Publisher, dest)
	kind := SNS
	if d, err := ParseDestination(dest); err == nil {
		kind = d.Kind
	}
	lim.MaxMessageBytes = r.cfg.MessageLimits.Of(kind)
	if r.cfg.MaxMessageBytes > 0 {
		lim.MaxMessageBytes = min(lim.MaxMessageBytes, r.cfg.MaxMessageBytes)
	}
	lim.MaxCallBytes = max(lim.MaxCallBytes, lim.MaxMessageBytes)
	return lim
}

// jitter returns a random duration in [0, d].
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return rand.N(d + 1)
}

// Stats counts what a relay did.
type Stats struct {
	// Claimed is the number of rows rounds took to publish.
	Claimed int
	// Published is the number of rows the broker acknowledged and that were marked published.
	Published int
	// Retrying is the number of rows whose attempt failed and that will be retried after a backoff.
	Retrying int
	// Outage is the number of rows whose attempt failed because their whole destination failed:
	// not counted as attempts; the destination backs off.
	Outage int
	// Quarantined is the number of rows quarantined (too many attempts, a permanent error, a row
	// that cannot be read or published, or an outage longer than OutageLimit).
	Quarantined int
	// Rounds is the number of rounds that held keys.
	Rounds int
	// Offloaded is the number of published rows whose payload the claim check stored in S3,
	// and OffloadedBytes the size of those payloads.
	Offloaded, OffloadedBytes int
	// OrderViolations is the number of published rows that their destination acknowledged in a
	// call after failing an earlier row of their key in that call, which a destination that
	// keeps a key's order in a call (Limits.KeyOrderInCall) promises never to do. Each is also
	// logged as an error: the broker has the row ahead of its key's earlier one, and no retry
	// can take that back.
	OrderViolations int
}

func (s *Stats) add(o Stats) {
	s.Claimed += o.Claimed
	s.Published += o.Published
	s.Retrying += o.Retrying
	s.Outage += o.Outage
	s.Quarantined += o.Quarantined
	s.Rounds += o.Rounds
	s.Offloaded += o.Offloaded
	s.OffloadedBytes += o.OffloadedBytes
	s.OrderViolations += o.OrderViolations
}

// RunOnce drains the outbox: it walks every pending partition key, then claims and publishes
// until no claimable row is left (rows in backoff, quarantined, behind such a row, held by
// another relay's round, or of a destination that backs off are not claimable), then returns.
// It ends only after a walk of every pending key, against the database, found nothing it
// could claim: what it leaves pending is not claimable.
func (r *Relay) RunOnce(ctx context.Context) (Stats, error) {
	var total Stats
	for {
		st, err := r.RunPass(ctx)
		total.add(st)
		if err != nil || st.Claimed == 0 || ctx.Err() != nil {
			return total, err
		}
	}
}

// RunPass is one pass of RunOnce: it polls for new rows and walks every pending partition key
// (one read-only transaction when the walk fits in one step), then claims and publishes until
// nothing it found is claimable. Rows that commit during the pass may be left: RunOnce passes
// again until a pass claims nothing. A caller that knows cheaper whether rows are left (one
// lookup in the index of pending rows, as pkg/fleet does) calls it instead of RunOnce.
func (r *Relay) RunPass(ctx context.Context) (Stats, error) {
	if err := r.watch.start(ctx); err != nil {
		return Stats{}, err
	}
	if err := r.watch.pollAndSweep(ctx); err != nil {
		return Stats{}, err
	}
	return r.pipelines(ctx, true)
}

// Frontier is the newest outbox id the relay's polls have read (0 before its first): a row
// with a higher id is one it has not seen. A caller that runs passes (RunPass) can watch for
// rows past it instead of asking the outbox where it ends.
func (r *Relay) Frontier() int64 {
	r.watch.mu.Lock()
	defer r.watch.mu.Unlock()
	return r.watch.frontier
}

// Run relays until ctx ends: it walks every pending key, then publishes what is due while
// polling for new rows every PollInterval and walking all pending keys every RescanInterval.
// Database errors are logged and retried; Run returns nil when ctx ends, or when it was idle
// for IdleStop (when set).
func (r *Relay) Run(ctx context.Context) error {
	ctx, claimed := r.stopWhenIdle(ctx)
	for ctx.Err() == nil {
		err := r.watch.start(ctx)
		if err == nil {
			break
		}
		r.log.Error("relay cannot start; retrying", "error", err)
		sleep(ctx, r.cfg.PollInterval*10)
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.watch.run(ctx)
	}()
	if r.wal != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.wal.run(ctx)
		}()
	}
	var (
		mu     sync.Mutex
		window Stats
	)
	if r.metrics != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(r.cfg.MetricsInterval)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					mu.Lock()
					s := window
					window = Stats{}
					mu.Unlock()
					r.emitMetrics(ctx, s)
				}
			}
		}()
	}
	_, _ = r.pipelinesReporting(ctx, false, func(s Stats) {
		claimed(s)
		mu.Lock()
		window.add(s)
		mu.Unlock()
	})
	wg.Wait()
	if r.metrics != nil {
		r.emitMetrics(context.WithoutCancel(ctx), window)
	}
	return nil
}

// stopWhenIdle returns ctx, or with IdleStop a context that ends once no round is in flight and
// none claimed a row for IdleStop, and the function Run reports each round's stats to.
func (r *Relay) stopWhenIdle(ctx context.Context) (context.Context, func(Stats)) {
	if r.cfg.IdleStop <= 0 {
		return ctx, func(Stats) {}
	}
	ctx, cancel := context.WithCancel(ctx)
	var last atomic.Int64 // unix nanoseconds of Run's start or of the last round that claimed rows
	last.Store(time.Now().UnixNano())
	go func() {
		defer cancel()
		t := time.NewTicker(min(r.cfg.PollInterval, r.cfg.IdleStop))
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				if r.rounds.Load() == 0 && now.Sub(time.Unix(0, last.Load())) >= r.cfg.IdleStop {
					r.log.Info("relay idle; stopping until its next start", "idle_stop", r.cfg.IdleStop.String())
					return
				}
			}
		}
	}()
	return ctx, func(s Stats) {
		if s.Claimed > 0 {
			last.Store(time.Now().UnixNano())
		}
	}
}

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// pipelines runs Pipelines round loops over the keys the book makes due. With untilIdle, it
// returns once no key is due and no round is in flight (and a pipeline stops at its first
// error); otherwise it runs until ctx ends, waiting for the book between rounds.
func (r *Relay) pipelines(ctx context.Context, untilIdle bool) (Stats, error) {
	return r.pipelinesReporting(ctx, untilIdle, nil)
}

func (r *Relay) pipelinesReporting(ctx context.Context, untilIdle bool, report func(Stats)) (Stats, error) {
	var (
		mu    sync.Mutex
		idle  = sync.NewCond(&mu)
		total Stats
		errs  []error
		wg    sync.WaitGroup
	)
	// ran accounts for a round: its stats, and its error (which stops RunOnce).
	ran := func(st Stats, err error) bool {
		if report != nil {
			report(st)
		}
		mu.Lock()
		defer mu.Unlock()
		r.rounds.Add(-1)
		total.add(st)
		idle.Broadcast()
		if err != nil && ctx.Err() == nil {
			if untilIdle {
				errs = append(errs, err)
				return false
			}
			r.log.Error("relay round failed; retrying", "error", err)
		}
		return true
	}
	failed := func(err error) {
		mu.Lock()
		defer mu.Unlock()
		errs = append(errs, err)
		idle.Broadcast()
	}
	// startLooking starts a pass's polls and sweeps beside its pipelines (see below).
	startLooking, stopLooking := func() {}, func() {}
	// probe starts, beside the pipelines, a probe round for each failing destination whose
	// probe is due: a destination that hangs holds only its own probe, never a pipeline.
	probe := func() {
		for _, dest := range r.book.heldDestinations() {
			if r.dests.healthy(dest) {
				// It answered while a round still held some of its keys, which that round then
				// handed back as held (or its slow call ended): release them (the call that
				// answered released the rest).
				r.book.release(dest, time.Now())
				continue
			}
			if !r.dests.startProbe(dest, time.Now()) {
				continue
			}
			keys := r.book.takeHeld(dest)
			if len(keys.keys) == 0 {
				r.dests.abandoned(dest)
				continue
			}
			startLooking()
			mu.Lock()
			r.rounds.Add(1)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				st, err := r.round(ctx, keys, nil)
				r.dests.abandoned(dest) // no-op when the probe's call answered or failed
				ran(st, err)
			}()
		}
	}
	if untilIdle {
		// A pass polls every poll interval and sweeps on the sweep's deadline (watcher.sweepDue)
		// whatever its rounds do, as Run's watcher does: beside the pipelines, so that a poll or
		// a sweep never holds one between its rounds (made by the pipelines, they took 3-4% of
		// a pass's pipeline time draining a backlog at 0 ms). Pipelines that wait for rounds are
		// woken after each look, which also has them look at probes every poll interval. The
		// looks begin with the pass's first round, probes' too (a pass with nothing to claim needs none,
		// and its first look at the outbox is pollAndSweep's), and the pass ends once its
		// pipelines did and the look in progress, if any, ended.
		stop := make(chan struct{})
		var lookers sync.WaitGroup
		stopLooking = func() {
			close(stop)
			lookers.Wait()
		}
		wake := func() {
			mu.Lock()
			idle.Broadcast()
			mu.Unlock()
		}
		look := func(every func() time.Duration, do func(context.Context) error) {
			lookers.Add(1)
			go func() {
				defer lookers.Done()
				for {
					t := time.NewTimer(every())
					select {
					case <-stop:
						t.Stop()
						return
					case <-t.C:
					}
					if err := do(ctx); err != nil && ctx.Err() == nil {
						failed(err)
						return
					}
					wake()
				}
			}()
		}
		startLooking = sync.OnceFunc(func() {
			look(func() time.Duration { return r.cfg.PollInterval }, r.watch.pollIfDue)
			look(func() time.Duration { return max(r.watch.untilSweep(), time.Millisecond) }, func(ctx context.Context) error {
				if !r.watch.sweepDue() {
					return nil
				}
				return r.watch.sweepIfFree(ctx)
			})
		})
	}
	for range r.cfg.Pipelines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				probe()
				keys := r.book.take(r.cfg.BatchSize, time.Now())
				if len(keys.keys) == 0 {
					if !untilIdle {
						r.waitForWork(ctx)
						continue
					}
					if r.watch.sweepWanted() {
						// An operator action moved the epoch meanwhile: walk the keys again.
						if err := r.watch.sweep(ctx); err != nil && ctx.Err() == nil {
							failed(err)
							return
						}
						continue
					}
					mu.Lock()
					if r.rounds.Load() == 0 || len(errs) > 0 {
						idle.Broadcast()
						mu.Unlock()
						return
					}
					idle.Wait() // a round in flight may hand keys back; a sweep may be due
					mu.Unlock()
					continue
				}
				startLooking()
				mu.Lock()
				r.rounds.Add(1)
				mu.Unlock()
				st, err, ended := r.runRound(ctx, keys, &wg, func(st Stats, err error) { ran(st, err) })
				if !ended {
					continue // the round goes on detached; this pipeline takes other keys
				}
				if !ran(st, err) {
					return
				}
				if err != nil && ctx.Err() == nil {
					sleep(ctx, r.cfg.PollInterval)
				}
			}
		}()
	}
	wg.Wait()
	stopLooking()
	return total, errors.Join(errs...)
}

// waitForWork blocks until the book may have a due key: a change, the next due time, or at
// most a poll interval.
func (r *Relay) waitForWork(ctx context.Context) {
	wait := r.cfg.PollInterval // also how often a failing destination's probe is looked at
	if at, ok := r.book.nextDue(); ok {
		wait = min(wait, max(time.Until(at), time.Millisecond))
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-r.book.changed:
	case <-t.C:
	}
}

func (r *Relay) emitMetrics(ctx context.Context, s Stats) {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ms := []metrics.Measurement{
		metrics.RelayHeartbeat.Measure(1),
		metrics.Published.Measure(float64(s.Published)),
		metrics.PublishFailures.Measure(float64(s.Retrying + s.Quarantined + s.Outage)),
		metrics.DestinationsDown.Measure(float64(len(r.dests.down()))),
		metrics.OrderViolations.Measure(float64(s.OrderViolations)),
	}
	if r.wal != nil {
		ms = append(ms, metrics.WALWakeActive.Measure(map[bool]float64{false: 0, true: 1}[r.wal.following()]))
	}
	if r.cfg.ClaimCheck != nil { // payloads stored in S3 (claimcheck.go)
		ms = append(ms, metrics.Offloaded.Measure(float64(s.Offloaded)), metrics.OffloadedBytes.Measure(float64(s.OffloadedBytes)))
	}
	if lag, err := LagOf(lctx, r.pool); err == nil {
		ms = append(ms,
			metrics.OutboxPending.Measure(float64(lag.Pending)),
			metrics.OutboxOldestPendingAge.Measure(lag.OldestPendingAge.Seconds()),
			metrics.OutboxQuarantined.Measure(float64(lag.Quarantined)),
		)
	} else {
		r.log.Warn("read outbox lag", "error", err)
	}
	if h, err := HorizonOf(lctx, r.pool); err == nil {
		ms = append(ms, metrics.OldestTransactionAge.Measure(h.OldestTransactionAge.Seconds()))
		if h.OldestTransactionAge > 5*time.Minute {
			r.log.Warn("an old transaction holds back VACUUM: published rows' index entries pile up", "held_by", h.HeldBy,
				"age", h.OldestTransactionAge.Round(time.Second))
		}
	} else {
		r.log.Warn("read the oldest transaction", "error", err)
	}
	r.metrics.Record(ctx, relayDimensions, ms...)
}

// FollowingWAL reports whether Run follows the WAL for new rows now (RelayConfig.WAL): false
// without it, before the stream started, and while the relay polls because it cannot.
func (r *Relay) FollowingWAL() bool { return r.wal.following() }

// DestinationsDown returns the destinations this relay currently backs off as a whole.
func (r *Relay) DestinationsDown() []DestinationOutage { return r.dests.down() }

func (r *Relay) destination(e *Event) (string, error) {
	if d := r.destinationOf(e.Topic); d != "" {
		return d, nil
	}
	return "", Permanent(fmt.Errorf("unknown topic %q: no destination is configured for it", e.Topic))
}

// destinationOf returns the destination of rows of topic, "" when none is configured.
func (r *Relay) destinationOf(topic string) string {
	if d, ok := r.cfg.Topics[topic]; ok {
		return d
	}
	return r.cfg.DefaultTopic
}

// backoff returns the delay before attempt number attempts+1: exponential, capped, with jitter
// (half fixed, half random) so that failing relays do not retry in lockstep.
func (r *Relay) backoff(attempts int) time.Duration {
	d := r.cfg.BackoffBase
	for i := 1; i < attempts && d < r.cfg.BackoffMax; i++ {
		d *= 2
	}
	d = min(d, r.cfg.BackoffMax)
	return d/2 + jitter(d/2)
}
