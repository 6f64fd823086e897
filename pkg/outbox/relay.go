package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/internal/emf"
)

// NotifyChannel is the PostgreSQL channel on which inserts into outbox_event wake relays.
const NotifyChannel = "sluice_outbox"

// RelayConfig configures a Relay. Zero fields take the defaults stated on each.
type RelayConfig struct {
	// Publisher sends events to the broker. Required; NewSNSPublisher is the production one.
	Publisher Publisher
	// Topics maps logical topic names (outbox_event.topic) to destinations (SNS topic ARNs).
	Topics map[string]string
	// DefaultTopic receives rows whose topic is not in Topics. Defaults to none: such rows are
	// quarantined with an "unknown topic" error.
	DefaultTopic string
	// BatchSize is the most rows one claim takes. Defaults to 500.
	BatchSize int
	// MaxPerKey is the most rows of one partition key one claim takes; a key's rows are
	// published one after another, so a smaller value spreads a claim over more keys.
	// Defaults to 10.
	MaxPerKey int
	// PublishConcurrency is the number of PublishBatch calls in flight. Defaults to 64.
	PublishConcurrency int
	// Pipelines is the number of claim-publish-record rounds this relay runs at once, so that
	// claiming overlaps publishing. Each round takes keys the others do not hold.
	// Defaults to 2.
	Pipelines int
	// PublishTimeout bounds one PublishBatch call. Defaults to 10 seconds.
	PublishTimeout time.Duration
	// Lease bounds how long one round holds its partition keys: publishing stops at three
	// quarters of it, and PostgreSQL ends the relay's session if it sits idle in the round's
	// transaction longer (a hung or frozen relay), which releases its keys. A relay that dies
	// releases them at once with its connection. Defaults to 30 seconds.
	Lease time.Duration
	// MaxAttempts is the number of failed publish attempts after which a row is quarantined.
	// Defaults to 10.
	MaxAttempts int
	// BackoffBase and BackoffMax bound the exponential backoff (with jitter) between attempts.
	// Default to 1 second and 5 minutes.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// PollInterval is how often Run looks for rows when no notification woke it. Defaults to 1 second.
	PollInterval time.Duration
	// MetricsInterval is how often Run emits the heartbeat and lag metrics. Defaults to 30 seconds.
	MetricsInterval time.Duration
	// Metrics receives Embedded Metric Format lines (a Lambda passes os.Stdout). Defaults to none.
	Metrics io.Writer
	// Logger receives operational logs. Defaults to slog.Default().
	Logger *slog.Logger
}

// WithDefaults returns c with every zero field set to its default.
func (c RelayConfig) WithDefaults() RelayConfig {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	defInt := func(i *int, v int) {
		if *i == 0 {
			*i = v
		}
	}
	defInt(&c.BatchSize, 500)
	defInt(&c.MaxPerKey, 10)
	defInt(&c.PublishConcurrency, 64)
	defInt(&c.Pipelines, 2)
	defInt(&c.MaxAttempts, 10)
	def(&c.PublishTimeout, 10*time.Second)
	def(&c.Lease, 30*time.Second)
	def(&c.BackoffBase, time.Second)
	def(&c.BackoffMax, 5*time.Minute)
	def(&c.PollInterval, time.Second)
	def(&c.MetricsInterval, 30*time.Second)
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c RelayConfig) validate() error {
	var errs []error
	if c.Publisher == nil {
		errs = append(errs, errors.New("Publisher is required"))
	}
	if len(c.Topics) == 0 && c.DefaultTopic == "" {
		errs = append(errs, errors.New("Topics or DefaultTopic is required: nothing could be published"))
	}
	for k, v := range c.Topics {
		if k == "" || v == "" {
			errs = append(errs, fmt.Errorf("Topics has an empty name or destination (%q: %q)", k, v))
		}
	}
	positive := map[string]int{"BatchSize": c.BatchSize, "MaxPerKey": c.MaxPerKey, "PublishConcurrency": c.PublishConcurrency, "Pipelines": c.Pipelines, "MaxAttempts": c.MaxAttempts}
	for name, v := range positive {
		if v < 1 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %d", name, v))
		}
	}
	durations := map[string]time.Duration{"PublishTimeout": c.PublishTimeout, "Lease": c.Lease, "BackoffBase": c.BackoffBase, "BackoffMax": c.BackoffMax, "PollInterval": c.PollInterval, "MetricsInterval": c.MetricsInterval}
	for name, v := range durations {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %s", name, v))
		}
	}
	if c.Lease > 0 && c.PublishTimeout >= c.Lease {
		errs = append(errs, fmt.Errorf("Lease (%s) must be longer than PublishTimeout (%s): a round's publishing stops at three quarters of the lease", c.Lease, c.PublishTimeout))
	}
	if c.BackoffMax < c.BackoffBase {
		errs = append(errs, fmt.Errorf("BackoffMax (%s) must not be below BackoffBase (%s)", c.BackoffMax, c.BackoffBase))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("outbox: invalid RelayConfig: %w", err)
	}
	return nil
}

// Relay publishes committed outbox rows. Any number of relays, in one process or many, may
// run against the same database.
type Relay struct {
	// inFlight bounds PublishBatch calls across pipelines.
	inFlight chan struct{}
	pool     *pgxpool.Pool
	cfg      RelayConfig
	log      *slog.Logger
	metrics  *emf.Logger
}

// NewRelay returns a Relay over pool with cfg.
func NewRelay(pool *pgxpool.Pool, cfg RelayConfig) (*Relay, error) {
	if pool == nil {
		return nil, errors.New("outbox: NewRelay needs a pool")
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	r := &Relay{pool: pool, cfg: cfg, log: cfg.Logger.With("component", "relay"), inFlight: make(chan struct{}, cfg.PublishConcurrency)}
	if cfg.Metrics != nil {
		r.metrics = emf.New(cfg.Metrics, map[string]string{emf.DimensionService: emf.ServiceRelay})
	}
	return r, nil
}

// Stats counts what a relay did.
type Stats struct {
	// Claimed is the number of rows claimed.
	Claimed int
	// Published is the number of rows the broker acknowledged and that were marked published.
	Published int
	// Retrying is the number of rows whose attempt failed and that will be retried after a backoff.
	Retrying int
	// Quarantined is the number of rows quarantined (too many attempts or a permanent error).
	Quarantined int
	// Rounds is the number of claims made.
	Rounds int
}

func (s *Stats) add(o Stats) {
	s.Claimed += o.Claimed
	s.Published += o.Published
	s.Retrying += o.Retrying
	s.Quarantined += o.Quarantined
	s.Rounds += o.Rounds
}

// RunOnce drains the outbox: it claims and publishes until no claimable row is left (rows in
// backoff, quarantined, or held by another relay's round are not claimable), then returns.
// Pipelines rounds run at once, so one round's claim overlaps another's publishing.
func (r *Relay) RunOnce(ctx context.Context) (Stats, error) {
	var (
		mu    sync.Mutex
		cond  = sync.NewCond(&mu)
		busy  int // pipelines in a round that claimed rows
		total Stats
		errs  []error
		wg    sync.WaitGroup
	)
	for range r.cfg.Pipelines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				mu.Lock()
				others := busy
				busy++
				mu.Unlock()
				s, err := r.round(ctx, others)
				mu.Lock()
				busy--
				total.add(s)
				cond.Broadcast()
				if err != nil {
					errs = append(errs, err)
					mu.Unlock()
					return
				}
				if s.Claimed == 0 {
					// Nothing free now; if another pipeline is mid-round, its keys come free
					// when it finishes: wait for that, else the outbox is drained.
					if busy == 0 || len(errs) > 0 {
						mu.Unlock()
						return
					}
					cond.Wait()
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return total, errors.Join(errs...)
}

// Run relays until ctx ends: it drains, then waits for a notification of new rows (LISTEN on
// NotifyChannel) or PollInterval, and drains again. Database errors are logged and retried;
// Run returns nil when ctx ends.
func (r *Relay) Run(ctx context.Context) error {
	wake := make(chan struct{}, 1)
	listenCtx, stopListening := context.WithCancel(ctx)
	defer stopListening()
	go r.listen(listenCtx, wake)

	var window Stats
	lastMetrics := time.Time{}
	for ctx.Err() == nil {
		s, err := r.RunOnce(ctx)
		window.add(s)
		if err != nil && ctx.Err() == nil {
			r.log.Error("relay round failed; retrying", "error", err)
		}
		if r.metrics != nil && time.Since(lastMetrics) >= r.cfg.MetricsInterval {
			r.emitMetrics(ctx, window)
			window, lastMetrics = Stats{}, time.Now()
		}
		timer := time.NewTimer(r.cfg.PollInterval)
		select {
		case <-ctx.Done():
		case <-wake:
		case <-timer.C:
		}
		timer.Stop()
	}
	if r.metrics != nil {
		r.emitMetrics(context.WithoutCancel(ctx), window)
	}
	return nil
}

// listen holds a connection on LISTEN NotifyChannel and signals wake on each notification,
// reconnecting after errors. Polling covers any gap.
func (r *Relay) listen(ctx context.Context, wake chan<- struct{}) {
	signal := func() {
		select {
		case wake <- struct{}{}:
		default:
		}
	}
	for ctx.Err() == nil {
		err := func() error {
			conn, err := r.pool.Acquire(ctx)
			if err != nil {
				return err
			}
			defer conn.Release()
			if _, err := conn.Exec(ctx, "LISTEN "+NotifyChannel); err != nil {
				return err
			}
			defer func() {
				// Return the connection clean, or drop it when that is impossible.
				uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
				defer cancel()
				if _, err := conn.Exec(uctx, "UNLISTEN *"); err != nil {
					_ = conn.Conn().Close(uctx)
				}
			}()
			for {
				if _, err := conn.Conn().WaitForNotification(ctx); err != nil {
					return err
				}
				signal()
			}
		}()
		if ctx.Err() != nil {
			return
		}
		r.log.Warn("relay listener lost its connection; polling until it reconnects", "error", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(r.cfg.PollInterval):
		}
	}
}

func (r *Relay) emitMetrics(ctx context.Context, s Stats) {
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ms := []emf.Metric{
		{Name: emf.RelayHeartbeat, Unit: emf.Count, Value: 1},
		{Name: emf.Published, Unit: emf.Count, Value: float64(s.Published)},
		{Name: emf.PublishFailures, Unit: emf.Count, Value: float64(s.Retrying + s.Quarantined)},
	}
	if lag, err := LagOf(lctx, r.pool); err == nil {
		ms = append(ms,
			emf.Metric{Name: emf.OutboxPending, Unit: emf.Count, Value: float64(lag.Pending)},
			emf.Metric{Name: emf.OutboxOldestPendingAge, Unit: emf.Seconds, Value: lag.OldestPendingAge.Seconds()},
			emf.Metric{Name: emf.OutboxQuarantined, Unit: emf.Count, Value: float64(lag.Quarantined)},
		)
	} else {
		r.log.Warn("read outbox lag", "error", err)
	}
	r.metrics.Emit(ms...)
}

// claimSQL returns up to $2 rows, at most $3 per partition key, taking only keys whose oldest
// unpublished row is claimable (not locked by another relay's round, not backing off, not
// quarantined). It locks only those oldest rows, the heads, FOR UPDATE SKIP LOCKED: the round's
// transaction holds them while it publishes, so a key belongs to one relay at a time and its rows
// go out in id order, concurrent claims never wait on each other, and a relay that dies releases
// its keys with its connection.
const claimSQL = `
WITH cand AS (
    SELECT e.id, e.partition_key
    FROM outbox_event e
    WHERE e.published_at IS NULL
      AND e.quarantined_at IS NULL
      AND (e.available_at IS NULL OR e.available_at <= now())
      AND NOT EXISTS (SELECT 1 FROM outbox_event q
                      WHERE q.quarantined_at IS NOT NULL AND q.published_at IS NULL
                        AND q.partition_key = e.partition_key)
    ORDER BY e.id
    LIMIT $1
), heads AS (
    SELECT DISTINCT ON (partition_key) partition_key, id FROM cand ORDER BY partition_key, id
), free AS (
    SELECT h.id FROM heads h
    WHERE NOT EXISTS (SELECT 1 FROM outbox_event o
                      WHERE o.partition_key = h.partition_key AND o.published_at IS NULL AND o.id < h.id)
), locked AS (
    -- The limit counts rows actually locked, so a claim racing another one takes the next free
    -- keys instead of the leftovers of the same first ones.
    SELECT e.id, e.partition_key FROM outbox_event e
    WHERE e.id IN (SELECT id FROM free)
      AND e.published_at IS NULL AND e.quarantined_at IS NULL
      AND (e.available_at IS NULL OR e.available_at <= now())
    ORDER BY e.id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), share AS (
    -- Every key gets the same share of the batch (a round lasts as long as its longest key's
    -- chain of calls, so none may get more); with as many keys as the batch holds, the heads
    -- alone fill it and no key's later rows are read.
    SELECT least($3, greatest(1, floor($2::float8 / greatest(count(*), 1))))::int - 1 AS extra FROM locked
), picked AS (
    SELECT l.id, 1::bigint AS rn, l.id AS head FROM locked l
    UNION ALL
    SELECT r.id, r.rn, l.id FROM locked l CROSS JOIN LATERAL (
        SELECT o.id, 1 + row_number() OVER (ORDER BY o.id) AS rn FROM outbox_event o
        WHERE o.partition_key = l.partition_key AND o.published_at IS NULL AND o.id > l.id
        ORDER BY o.id LIMIT (SELECT extra FROM share)) r
)
SELECT e.id, e.event_id, e.topic, e.aggregate_type, e.aggregate_id, e.event_type,
       e.partition_key, e.payload::text, e.headers, e.created_at, e.attempts
FROM outbox_event e
WHERE e.id = ANY (ARRAY (SELECT id FROM picked ORDER BY rn, head LIMIT $2))`

// claim runs claimSQL in tx. It scans twice the batch of oldest rows for free keys, and two
// batches more for each of this relay's other rounds in flight: their keys' rows fill the front
// of the backlog, and a round that found only those would wait for them instead of overlapping.
func (r *Relay) claim(ctx context.Context, tx pgx.Tx, others int) ([]*Event, error) {
	rows, err := tx.Query(ctx, claimSQL, (2+2*others)*r.cfg.BatchSize, r.cfg.BatchSize, r.cfg.MaxPerKey)
	if err != nil {
		return nil, fmt.Errorf("claim outbox rows: %w", err)
	}
	var events []*Event
	for rows.Next() {
		var (
			e       Event
			payload string
			headers []byte
			evID    uuid.UUID
		)
		if err := rows.Scan(&e.ID, &evID, &e.Topic, &e.AggregateType, &e.AggregateID, &e.EventType,
			&e.PartitionKey, &payload, &headers, &e.CreatedAt, &e.Attempts); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read claimed outbox row: %w", err)
		}
		e.EventID, e.Payload = evID, []byte(payload)
		if err := json.Unmarshal(headers, &e.Headers); err != nil {
			// Headers written by plain SQL may hold non-string values: keep what is usable.
			e.Headers = looseHeaders(headers)
		}
		events = append(events, &e)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim outbox rows: %w", err)
	}
	sort.Slice(events, func(i, j int) bool { return events[i].ID < events[j].ID })
	return events, nil
}

// looseHeaders keeps the string-valued entries of a headers object.
func looseHeaders(raw []byte) map[string]string {
	var any map[string]any
	if json.Unmarshal(raw, &any) != nil {
		return nil
	}
	out := map[string]string{}
	for k, v := range any {
		if s, ok := v.(string); ok {
			out[k] = s
		}
	}
	return out
}

// outcome is what happened to one claimed row in a round.
type outcome struct {
	event *Event
	// dest is the SNS topic ARN, or destErr why there is none; size is the message's SNS size.
	dest    string
	destErr error
	size    int
	// done: the broker acknowledged it. err: the attempt failed. Neither: not attempted.
	done bool
	err  error
	// afterFailure: not attempted because an earlier row of its key failed.
	afterFailure *outcome
}

// round claims, publishes and records one batch inside one transaction that holds the claimed
// keys' head rows locked: BEGIN, claim, publish (no statement runs meanwhile), record, COMMIT.
// PostgreSQL ends the session should it stay idle in that transaction longer than Lease (a hung
// or frozen relay), which releases the keys; publishing stops at three quarters of it.
func (r *Relay) round(ctx context.Context, others int) (Stats, error) {
	start := time.Now()
	// One round trip opens the transaction and bounds how long it may sit idle.
	tx, err := r.pool.BeginTx(ctx, pgx.TxOptions{BeginQuery: "BEGIN; SET LOCAL idle_in_transaction_session_timeout = " +
		strconv.FormatInt(r.cfg.Lease.Milliseconds(), 10)})
	if err != nil {
		if ctx.Err() != nil {
			return Stats{}, nil // stopping: not a failure
		}
		return Stats{}, fmt.Errorf("begin relay round: %w", err)
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	events, err := r.claim(ctx, tx, others)
	if err != nil && ctx.Err() != nil {
		return Stats{}, nil
	}
	if err != nil || len(events) == 0 {
		return Stats{}, err
	}
	claimed := time.Now()
	pctx, cancel := context.WithTimeout(ctx, r.cfg.Lease*3/4)
	outcomes := r.publish(pctx, events)
	cancel()
	published := time.Now()
	st, err := r.settle(context.WithoutCancel(ctx), tx, outcomes)
	st.Claimed, st.Rounds = len(events), 1
	if r.log.Enabled(ctx, slog.LevelDebug) {
		keys := map[string]bool{}
		for _, e := range events {
			keys[e.PartitionKey] = true
		}
		r.log.Debug("relay round", "others", others, "claimed", st.Claimed, "keys", len(keys), "published", st.Published,
			"retrying", st.Retrying, "quarantined", st.Quarantined, "claim_ms", claimed.Sub(start).Milliseconds(),
			"publish_ms", published.Sub(claimed).Milliseconds(), "settle_ms", time.Since(published).Milliseconds())
	}
	return st, err
}

// lane is the claimed rows of one partition key, published strictly one after another.
type lane struct {
	rows []*outcome
	next int
}

// publish sends the claimed events, each partition key's rows in id order and never two rows
// of one key in flight at once, with up to PublishConcurrency batches in flight.
func (r *Relay) publish(ctx context.Context, events []*Event) []*outcome {
	outcomes := make([]*outcome, len(events))
	lanes := map[string]*lane{}
	var ready []*lane
	for i, e := range events {
		o := &outcome{event: e, size: messageSize(e)}
		o.dest, o.destErr = r.destination(e)
		if o.destErr == nil && o.size > MaxMessageBytes {
			o.destErr = Permanent(fmt.Errorf("message is %d bytes, above SNS's %d", o.size, MaxMessageBytes))
		}
		outcomes[i] = o
		l := lanes[e.PartitionKey]
		if l == nil {
			l = &lane{}
			lanes[e.PartitionKey] = l
			ready = append(ready, l)
		}
		l.rows = append(l.rows, o)
	}

	var (
		mu       sync.Mutex
		cond     = sync.NewCond(&mu)
		inFlight int
		wg       sync.WaitGroup
	)
	// failLane records err for the lane's current row and parks the rest of the lane behind it.
	failLane := func(l *lane, err error) {
		cur := l.rows[l.next]
		cur.err = err
		for _, later := range l.rows[l.next+1:] {
			later.afterFailure = cur
		}
		l.next = len(l.rows)
	}
	// takeBatch removes up to 10 lanes whose next rows share one destination and fit one
	// request, scanning the ready lanes only until the batch is full.
	takeBatch := func() (string, []*lane) {
		var (
			dest  string
			batch []*lane
			size  int
			rest  []*lane
			i     int
		)
		for i = 0; i < len(ready) && len(batch) < 10; i++ {
			l := ready[i]
			o := l.rows[l.next]
			switch {
			case o.destErr != nil:
				failLane(l, o.destErr)
			case (dest == "" || o.dest == dest) && size+o.size <= MaxMessageBytes:
				dest = o.dest
				size += o.size
				batch = append(batch, l)
			default:
				rest = append(rest, l)
			}
		}
		ready = append(rest, ready[i:]...)
		return dest, batch
	}

	worker := func() {
		defer wg.Done()
		mu.Lock()
		defer mu.Unlock()
		for {
			for len(ready) == 0 && inFlight > 0 {
				cond.Wait()
			}
			if len(ready) == 0 || ctx.Err() != nil {
				cond.Broadcast()
				return
			}
			dest, batch := takeBatch()
			if len(batch) == 0 {
				continue
			}
			inFlight++
			mu.Unlock()
			batchEvents := make([]*Event, len(batch))
			for i, l := range batch {
				batchEvents[i] = l.rows[l.next].event
			}
			r.inFlight <- struct{}{}
			pctx, cancel := context.WithTimeout(ctx, r.cfg.PublishTimeout)
			errs := r.cfg.Publisher.PublishBatch(pctx, dest, batchEvents)
			cancel()
			<-r.inFlight
			if len(errs) != len(batch) {
				errs = fillErrors(len(batch), fmt.Errorf("publisher returned %d results for %d events", len(errs), len(batch)))
			}
			mu.Lock()
			inFlight--
			stopping := ctx.Err() != nil
			for i, l := range batch {
				if errs[i] != nil && stopping {
					// Cut short by our own shutdown: not an attempt. The row is released.
					l.next = len(l.rows)
					continue
				}
				if errs[i] != nil {
					failLane(l, errs[i])
					continue
				}
				l.rows[l.next].done = true
				l.next++
				if l.next < len(l.rows) {
					ready = append(ready, l)
				}
			}
			cond.Broadcast()
		}
	}
	for range r.cfg.PublishConcurrency {
		wg.Add(1)
		go worker()
	}
	wg.Wait()
	return outcomes
}

func (r *Relay) destination(e *Event) (string, error) {
	if d, ok := r.cfg.Topics[e.Topic]; ok {
		return d, nil
	}
	if r.cfg.DefaultTopic != "" {
		return r.cfg.DefaultTopic, nil
	}
	return "", Permanent(fmt.Errorf("unknown topic %q: no SNS topic is configured for it", e.Topic))
}

// backoff returns the delay before attempt number attempts+1: exponential, capped, with jitter
// (half fixed, half random) so that failing relays do not retry in lockstep.
func (r *Relay) backoff(attempts int) time.Duration {
	d := r.cfg.BackoffBase
	for i := 1; i < attempts && d < r.cfg.BackoffMax; i++ {
		d *= 2
	}
	d = min(d, r.cfg.BackoffMax)
	return d/2 + rand.N(d/2+1)
}

// settle records a round's outcomes in its transaction and commits: acknowledged rows become
// published; a failed row backs off (its key's later rows wait with it) or is quarantined (its
// key's later rows stay blocked behind it); rows never attempted are left as they were. The
// commit releases the keys.
func (r *Relay) settle(ctx context.Context, tx pgx.Tx, outcomes []*outcome) (Stats, error) {
	var (
		st                 Stats
		published          []int64
		failIDs, failDelay []int64
		failErr            []string
		failQuarantine     []bool
		holdIDs, holdDelay []int64
		delayOf            = map[*outcome]int64{}
	)
	for _, o := range outcomes {
		switch {
		case o.done:
			published = append(published, o.event.ID)
		case o.err != nil:
			quarantine := IsPermanent(o.err) || o.event.Attempts+1 >= r.cfg.MaxAttempts
			delay := int64(-1)
			if quarantine {
				st.Quarantined++
				r.log.Warn("outbox row quarantined", "id", o.event.ID, "event_id", o.event.EventID, "topic", o.event.Topic,
					"partition_key", o.event.PartitionKey, "attempts", o.event.Attempts+1, "error", o.err)
			} else {
				st.Retrying++
				delay = r.backoff(o.event.Attempts + 1).Milliseconds()
				r.log.Info("outbox row publish failed; will retry", "id", o.event.ID, "attempts", o.event.Attempts+1, "retry_in_ms", delay, "error", o.err)
			}
			delayOf[o] = delay
			failIDs = append(failIDs, o.event.ID)
			failErr = append(failErr, truncate(o.err.Error(), 2000))
			failQuarantine = append(failQuarantine, quarantine)
			failDelay = append(failDelay, max(delay, 0))
		}
	}
	for _, o := range outcomes {
		// Rows behind a row that backs off wait as long, so the claim's scan skips them.
		if !o.done && o.err == nil && o.afterFailure != nil && delayOf[o.afterFailure] >= 0 {
			holdIDs = append(holdIDs, o.event.ID)
			holdDelay = append(holdDelay, delayOf[o.afterFailure])
		}
	}
	st.Published = len(published)

	b := &pgx.Batch{}
	if len(published) > 0 {
		b.Queue(`UPDATE outbox_event SET published_at = now(), available_at = NULL, last_error = NULL
			WHERE id = ANY($1) AND published_at IS NULL`, published)
	}
	if len(failIDs) > 0 {
		b.Queue(`UPDATE outbox_event o SET attempts = o.attempts + 1, last_error = f.err,
				quarantined_at = CASE WHEN f.quarantine THEN now() END,
				available_at = CASE WHEN f.quarantine THEN NULL ELSE now() + f.delay_ms * interval '1 millisecond' END
			FROM unnest($1::bigint[], $2::text[], $3::bool[], $4::bigint[]) AS f(id, err, quarantine, delay_ms)
			WHERE o.id = f.id AND o.published_at IS NULL`, failIDs, failErr, failQuarantine, failDelay)
	}
	if len(holdIDs) > 0 {
		b.Queue(`UPDATE outbox_event o SET available_at = now() + h.delay_ms * interval '1 millisecond'
			FROM unnest($1::bigint[], $2::bigint[]) AS h(id, delay_ms)
			WHERE o.id = h.id AND o.published_at IS NULL`, holdIDs, holdDelay)
	}
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err := func() error {
		if b.Len() > 0 {
			if err := tx.SendBatch(sctx, b).Close(); err != nil {
				return err
			}
		}
		return tx.Commit(sctx)
	}()
	if err != nil {
		// The transaction is gone, and with it the locks: the rows are claimed again and
		// published a second time. Duplicates are possible, loss is not.
		return Stats{}, fmt.Errorf("record publish outcomes of %d rows: %w", len(outcomes), err)
	}
	return st, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n]
}
