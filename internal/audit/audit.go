// Package audit checks, end to end, that what the relay published is what a consumer applied:
// `sluice audit --consumer billing --since 1h`.
//
// The outbox and the inbox may live in different databases, so the audit never moves every id
// across. Both sides summarise the same set of events — those created in the window, matched on
// the event's creation time, which the relay publishes as `createdAt` and the inbox stores in
// inbox_event.created_at, microsecond for microsecond — as a count and a hash (the XOR of each
// id's 64-bit MD5 prefix) per bucket of ids sharing a hexadecimal prefix. Buckets that agree are
// done; buckets that differ are split by one more hex digit, and only buckets of at most
// Options.LeafSize ids are read id by id and compared. A handful of missing events in a million
// costs a few grouped scans on each side and a few hundred ids over the wire.
//
// Invariant: every event the outbox published in the window that the consumer did not apply is
// reported in Report.Missing, and every applied event the outbox never published in the window is
// reported in Report.Unpublished (Run, in compareLeaf, is the one place that decides both),
// except the events that no filter policy of the consumer's subscriptions delivers
// (Options.Filters, read by `sluice audit --subscription`): those are counted in
// Report.Filtered, never as missing.
package audit

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/internal/wire"
)

// Querier is the smallest database handle the audit needs: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// DefaultLeafSize is Options.LeafSize's default: buckets up to this many ids are compared id by id.
const DefaultLeafSize = 512

// DefaultAlarmAfter is Options.AlarmAfter's default: a published event not applied this long
// after it was published counts as missing, not in flight.
const DefaultAlarmAfter = 15 * time.Minute

// Options says what to audit.
type Options struct {
	// Consumer is the inbox consumer name (inbox_event.consumer). Required.
	Consumer string
	// Since and Until bound the events' creation time (outbox_event.created_at): [Since, Until).
	// Since is required; Until defaults to the time Run starts.
	Since, Until time.Time
	// EventTypes are the event types the consumer subscribes to. Empty means the event types the
	// consumer recorded in the window (Report.EventTypes says which, and that they were inferred):
	// an event type none of whose events arrived is then not audited, so name them when you can.
	EventTypes []string
	// AlarmAfter separates missing events from events in flight: a published event that is
	// not applied AlarmAfter after its publication is missing. Defaults to DefaultAlarmAfter.
	AlarmAfter time.Duration
	// Filters are the filter policies of the consumer's SNS subscriptions: an event none of
	// them delivers is not expected in the inbox, and is counted in Report.Filtered instead of
	// Report.Missing. Defaults to none: every published event is expected (a subscription
	// without a filter policy delivers every event; leave Filters empty then).
	Filters []*FilterPolicy
	// LeafSize is the bucket size compared id by id. Defaults to DefaultLeafSize.
	LeafSize int
	// Now is the clock; defaults to time.Now.
	Now func() time.Time
}

// Gap is one event the outbox published that the consumer has not applied.
type Gap struct {
	EventID     string
	EventType   string
	PublishedAt time.Time
	// Age is how long ago it was published.
	Age time.Duration
	// InboxState is what the consumer's inbox holds: "absent" (never received), "pending" (received,
	// not yet applied: the asynchronous inbox) or "parked" (given up on, see `sluice dead`).
	InboxState string
	// Overdue is true when Age exceeds Options.AlarmAfter: the event is missing, not in flight.
	Overdue bool
}

// Lag summarises commit-to-apply latency (inbox processed_at − the event's created_at) over the
// events the consumer applied in the window.
type Lag struct {
	P50, P90, P99, Max time.Duration
}

// Cost is what the audit spent: the numbers BENCHMARKS.md reports.
type Cost struct {
	Queries      int           // statements sent, both databases
	BucketsRead  int           // bucket summaries read, both sides
	RowsGrouped  int64         // rows the summaries aggregated, both sides (each level re-reads the differing buckets' rows)
	IDsRead      int           // ids read one by one, both sides
	Levels       int           // prefix lengths visited
	Duration     time.Duration // wall time of Run
	OutboxEvents int64         // events the outbox published in the window
	InboxEvents  int64         // events the consumer applied in the window
}

// Report is the audit's answer for one consumer.
type Report struct {
	Consumer           string
	Since, Until       time.Time
	EventTypes         []string
	EventTypesInferred bool
	// Missing lists published events the consumer has not applied, oldest first.
	Missing []Gap
	// Unpublished lists event ids the consumer applied that the outbox did not publish in the
	// window (created in the window by their createdAt): there should be none.
	Unpublished []string
	// Filtered counts the published events not applied that no subscription's filter policy
	// (Options.Filters) delivers: they are not missing.
	Filtered int
	Lag      Lag
	Cost     Cost
}

// Overdue counts the missing events older than the alarm threshold.
func (r Report) Overdue() int {
	n := 0
	for _, g := range r.Missing {
		if g.Overdue {
			n++
		}
	}
	return n
}

// ErrInvalidOptions is returned, wrapped, for options Run cannot use.
var ErrInvalidOptions = errors.New("audit: invalid options")

func (o Options) withDefaults() (Options, error) {
	var problems []string
	if strings.TrimSpace(o.Consumer) == "" {
		problems = append(problems, "a consumer is required")
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Until.IsZero() {
		o.Until = o.Now()
	}
	if o.Since.IsZero() {
		problems = append(problems, "since is required")
	} else if !o.Until.After(o.Since) {
		problems = append(problems, fmt.Sprintf("the window is empty: until (%s) is not after since (%s)",
			o.Until.UTC().Format(time.RFC3339), o.Since.UTC().Format(time.RFC3339)))
	}
	if o.AlarmAfter == 0 {
		o.AlarmAfter = DefaultAlarmAfter
	}
	if o.AlarmAfter < 0 {
		problems = append(problems, "alarm-after must not be negative")
	}
	if o.LeafSize == 0 {
		o.LeafSize = DefaultLeafSize
	}
	if o.LeafSize < 1 || o.LeafSize > 100_000 {
		problems = append(problems, "leaf size must be between 1 and 100000")
	}
	if len(problems) > 0 {
		return o, fmt.Errorf("%w: %s", ErrInvalidOptions, strings.Join(problems, "; "))
	}
	return o, nil
}

// side is one database's view of the audited set: the SQL that yields the set's ids (as text,
// lower-case canonical UUIDs) from the arguments args gives it.
type side struct {
	db   Querier
	name string
	ids  string // SELECT id FROM ... WHERE ... (the audited set), with $1..$n
	args []any  // $1..$n
}

// Both sides hash the same text: a UUID's canonical lower-case form, as the relay sends it.
const outboxSet = `SELECT event_id::text AS id FROM outbox_event
	WHERE published_at IS NOT NULL AND created_at >= $1 AND created_at < $2 AND event_type = ANY($3)`

const inboxSet = `SELECT lower(message_id) AS id FROM inbox_event
	WHERE processed_at IS NOT NULL AND created_at >= $1 AND created_at < $2 AND event_type = ANY($3)
	AND consumer = $4`

// under wraps a side's set in a query over the ids whose first prefixLen characters are one of
// prefixes; the prefixes and their length follow the side's own arguments.
func (s side) under(selectList, tail string, prefixes []string, prefixLen int) (string, []any) {
	n := len(s.args)
	if strings.Contains(selectList, "%d") {
		selectList = fmt.Sprintf(selectList, n+3) // the caller's own argument, after these
	}
	sql := fmt.Sprintf(`SELECT %s FROM (%s) ids WHERE left(id, $%d::int) = ANY($%d::text[]) %s`,
		selectList, s.ids, n+2, n+1, tail)
	return sql, append(slices.Clone(s.args), prefixes, prefixLen)
}

// bucket is one prefix's summary on one side.
type bucket struct {
	count int64
	hash  int64
}

// Run audits one consumer: it compares what the outbox (in outboxDB) published with what the
// consumer applied (in inboxDB, which may be the same database).
func Run(ctx context.Context, outboxDB, inboxDB Querier, opts Options) (Report, error) {
	opts, err := opts.withDefaults()
	if err != nil {
		return Report{}, err
	}
	start := time.Now()
	r := Report{Consumer: opts.Consumer, Since: opts.Since, Until: opts.Until}
	a := auditor{opts: opts, cost: &r.Cost}

	r.EventTypes = slices.Clone(opts.EventTypes)
	if len(r.EventTypes) == 0 {
		r.EventTypesInferred = true
		if r.EventTypes, err = a.recordedTypes(ctx, inboxDB); err != nil {
			return r, err
		}
	}
	sort.Strings(r.EventTypes)
	out := side{db: outboxDB, name: "outbox", ids: outboxSet, args: []any{opts.Since, opts.Until, r.EventTypes}}
	in := side{db: inboxDB, name: "inbox", ids: inboxSet, args: []any{opts.Since, opts.Until, r.EventTypes, opts.Consumer}}

	// Walk the prefix tree. The first level splits the set by two hex digits (256 buckets); each
	// later level splits the differing buckets by as many more digits as bring them to about
	// LeafSize ids, and buckets of at most LeafSize ids are compared id by id.
	differing, prefixLen, depth := []string{""}, 0, 2
	for len(differing) > 0 {
		r.Cost.Levels++
		ob, err := a.buckets(ctx, out, differing, prefixLen, depth)
		if err != nil {
			return r, err
		}
		ib, err := a.buckets(ctx, in, differing, prefixLen, depth)
		if err != nil {
			return r, err
		}
		if prefixLen == 0 {
			for _, b := range ob {
				r.Cost.OutboxEvents += b.count
			}
			for _, b := range ib {
				r.Cost.InboxEvents += b.count
			}
		}
		var next, leaves []string
		var largest int64
		for _, p := range unionKeys(ob, ib) {
			o, i := ob[p], ib[p]
			switch {
			case o == i:
			case max(o.count, i.count) <= int64(opts.LeafSize) || depth >= maxPrefixLen:
				leaves = append(leaves, p)
			default:
				next = append(next, p)
				largest = max(largest, o.count, i.count)
			}
		}
		if len(leaves) > 0 {
			if err := a.compareLeaves(ctx, out, in, leaves, depth, &r); err != nil {
				return r, err
			}
		}
		differing, prefixLen = next, depth
		depth = min(maxPrefixLen, depth+digitsToSplit(largest, int64(opts.LeafSize)))
	}
	if err := a.describeGaps(ctx, outboxDB, inboxDB, &r); err != nil {
		return r, err
	}
	if r.Lag, err = a.lag(ctx, inboxDB, r.EventTypes); err != nil {
		return r, err
	}
	r.Cost.Duration = time.Since(start)
	return r, nil
}

type auditor struct {
	opts Options
	cost *Cost
}

func (a auditor) recordedTypes(ctx context.Context, inboxDB Querier) ([]string, error) {
	a.cost.Queries++
	rows, err := inboxDB.Query(ctx, `SELECT DISTINCT event_type FROM inbox_event
		WHERE consumer = $1 AND created_at >= $2 AND created_at < $3`, a.opts.Consumer, a.opts.Since, a.opts.Until)
	if err != nil {
		return nil, fmt.Errorf("audit: read the consumer's event types: %w", err)
	}
	types, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("audit: read the consumer's event types: %w", err)
	}
	return types, nil
}

// maxPrefixLen stops the walk at a UUID's first dash: 8 hex digits split any set this audit
// can meet into buckets far below a leaf.
const maxPrefixLen = 8

// digitsToSplit is how many more hex digits split a bucket of n ids into buckets of about leaf.
func digitsToSplit(n, leaf int64) int {
	d := 1
	for n > leaf*16 {
		n /= 16
		d++
	}
	return d
}

// buckets summarises, on one side, the ids under the prefixes (each prefixLen long) by their
// first depth characters: a count and a hash per bucket.
func (a auditor) buckets(ctx context.Context, s side, prefixes []string, prefixLen, depth int) (map[string]bucket, error) {
	sql, args := s.under(`left(id, $%d::int), count(*), coalesce(bit_xor(('x' || left(md5(id), 16))::bit(64)::bigint), 0)`,
		`GROUP BY 1`, prefixes, prefixLen)
	a.cost.Queries++
	rows, err := s.db.Query(ctx, sql, append(args, depth)...)
	if err != nil {
		return nil, fmt.Errorf("audit: summarise the %s's ids: %w", s.name, err)
	}
	out := map[string]bucket{}
	for rows.Next() {
		var p string
		var b bucket
		if err := rows.Scan(&p, &b.count, &b.hash); err != nil {
			rows.Close()
			return nil, fmt.Errorf("audit: summarise the %s's ids: %w", s.name, err)
		}
		out[p] = b
		a.cost.BucketsRead++
		a.cost.RowsGrouped += b.count
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("audit: summarise the %s's ids: %w", s.name, err)
	}
	return out, nil
}

// compareLeaves reads both sides' ids under the leaf prefixes (each prefixLen long) and
// records the differences.
func (a auditor) compareLeaves(ctx context.Context, out, in side, leaves []string, prefixLen int, r *Report) error {
	ids := func(s side) (map[string]bool, error) {
		sql, args := s.under(`id`, ``, leaves, prefixLen)
		a.cost.Queries++
		rows, err := s.db.Query(ctx, sql, args...)
		if err != nil {
			return nil, fmt.Errorf("audit: read the %s's ids: %w", s.name, err)
		}
		list, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			return nil, fmt.Errorf("audit: read the %s's ids: %w", s.name, err)
		}
		a.cost.IDsRead += len(list)
		set := make(map[string]bool, len(list))
		for _, id := range list {
			set[id] = true
		}
		return set, nil
	}
	published, err := ids(out)
	if err != nil {
		return err
	}
	applied, err := ids(in)
	if err != nil {
		return err
	}
	compareLeaf(published, applied, r)
	return nil
}

// compareLeaf is where the audit decides: published and not applied is a gap, applied and not
// published is unpublished. Every leaf bucket of both sides passes through here.
func compareLeaf(published, applied map[string]bool, r *Report) {
	for id := range published {
		if !applied[id] {
			r.Missing = append(r.Missing, Gap{EventID: id})
		}
	}
	for id := range applied {
		if !published[id] {
			r.Unpublished = append(r.Unpublished, id)
		}
	}
}

// describeGaps fills each gap's type, publication time and inbox state, oldest first.
func (a auditor) describeGaps(ctx context.Context, outboxDB, inboxDB Querier, r *Report) error {
	sort.Strings(r.Unpublished)
	if len(r.Missing) == 0 {
		return nil
	}
	ids := make([]string, len(r.Missing))
	for i, g := range r.Missing {
		ids[i] = g.EventID
	}
	a.cost.Queries += 2
	rows, err := outboxDB.Query(ctx, `SELECT event_id::text, event_type, published_at, aggregate_type, aggregate_id, created_at, headers, payload::text
		FROM outbox_event WHERE event_id = ANY($1::uuid[])`, ids)
	if err != nil {
		return fmt.Errorf("audit: describe the missing events: %w", err)
	}
	type info struct {
		eventType string
		published time.Time
		filtered  bool
	}
	infos := map[string]info{}
	for rows.Next() {
		var (
			id, aggType, aggID, payload string
			created                     time.Time
			headers                     map[string]string
			in                          info
		)
		if err := rows.Scan(&id, &in.eventType, &in.published, &aggType, &aggID, &created, &headers, &payload); err != nil {
			rows.Close()
			return fmt.Errorf("audit: describe the missing events: %w", err)
		}
		if len(a.opts.Filters) > 0 {
			attrs := map[string]string{}
			for k, v := range headers {
				attrs[k] = v
			}
			attrs[wire.MessageID], attrs[wire.EventType], attrs[wire.AggregateType], attrs[wire.AggregateID] = id, in.eventType, aggType, aggID
			attrs[wire.CreatedAt] = created.UTC().Format(time.RFC3339Nano)
			in.filtered = true
			for _, f := range a.opts.Filters {
				if ok, _ := f.Matches(attrs, []byte(payload)); ok {
					in.filtered = false
					break
				}
			}
		}
		infos[id] = in
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("audit: describe the missing events: %w", err)
	}
	kept := r.Missing[:0]
	for _, g := range r.Missing {
		if infos[g.EventID].filtered {
			r.Filtered++
			continue
		}
		kept = append(kept, g)
	}
	r.Missing = kept
	ids = ids[:0]
	for _, g := range r.Missing {
		ids = append(ids, g.EventID)
	}
	rows, err = inboxDB.Query(ctx, `SELECT lower(message_id), CASE WHEN parked_at IS NOT NULL THEN 'parked' ELSE 'pending' END
		FROM inbox_event WHERE consumer = $1 AND lower(message_id) = ANY($2::text[])`, a.opts.Consumer, ids)
	if err != nil {
		return fmt.Errorf("audit: read the missing events' inbox state: %w", err)
	}
	states := map[string]string{}
	for rows.Next() {
		var id, state string
		if err := rows.Scan(&id, &state); err != nil {
			rows.Close()
			return fmt.Errorf("audit: read the missing events' inbox state: %w", err)
		}
		states[id] = state
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("audit: read the missing events' inbox state: %w", err)
	}
	now := a.opts.Now()
	for i := range r.Missing {
		g := &r.Missing[i]
		in := infos[g.EventID]
		g.EventType, g.PublishedAt = in.eventType, in.published
		g.Age = now.Sub(in.published)
		g.Overdue = g.Age > a.opts.AlarmAfter
		g.InboxState = states[g.EventID]
		if g.InboxState == "" {
			g.InboxState = "absent"
		}
	}
	sort.Slice(r.Missing, func(i, j int) bool {
		if !r.Missing[i].PublishedAt.Equal(r.Missing[j].PublishedAt) {
			return r.Missing[i].PublishedAt.Before(r.Missing[j].PublishedAt)
		}
		return r.Missing[i].EventID < r.Missing[j].EventID
	})
	return nil
}

func (a auditor) lag(ctx context.Context, inboxDB Querier, types []string) (Lag, error) {
	a.cost.Queries++
	var l Lag
	var p50, p90, p99, mx *float64
	err := inboxDB.QueryRow(ctx, `SELECT
			percentile_cont(0.5) WITHIN GROUP (ORDER BY lag),
			percentile_cont(0.9) WITHIN GROUP (ORDER BY lag),
			percentile_cont(0.99) WITHIN GROUP (ORDER BY lag),
			max(lag)
		FROM (SELECT extract(epoch FROM processed_at - created_at)::float8 AS lag FROM inbox_event
			WHERE consumer = $1 AND processed_at IS NOT NULL AND created_at >= $2 AND created_at < $3
			AND event_type = ANY($4)) l`, a.opts.Consumer, a.opts.Since, a.opts.Until, types).Scan(&p50, &p90, &p99, &mx)
	if err != nil {
		return l, fmt.Errorf("audit: read the consumer's lag: %w", err)
	}
	sec := func(f *float64) time.Duration {
		if f == nil {
			return 0
		}
		return time.Duration(*f * float64(time.Second))
	}
	return Lag{P50: sec(p50), P90: sec(p90), P99: sec(p99), Max: sec(mx)}, nil
}

func unionKeys(a, b map[string]bucket) []string {
	keys := make([]string, 0, len(a)+len(b))
	for k := range a {
		keys = append(keys, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	return keys
}
