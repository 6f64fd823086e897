package outbox

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// roundPlan is what a round publishes, key by key, and why each key's lane ends where it does.
type roundPlan struct {
	outcomes []*outcome
	keys     []*keyPlan
}

// laneStop says why a key's lane ends before the rows the round read.
type laneStop int

const (
	// stopNone: the lane holds every row read.
	stopNone laneStop = iota
	// stopQuarantined: a quarantined row follows (it becomes the key's head).
	stopQuarantined
	// stopWaiting: a row backing off follows, until waitUntil.
	stopWaiting
	// stopBudget: the next row did not fit the round's byte budget.
	stopBudget
)

type keyPlan struct {
	key       string
	lane      []*outcome
	read      int
	stop      laneStop
	waitUntil time.Time
}

// planRound turns the rows read for the locked keys into each key's lane: its rows in id order
// up to a row that may not go out now (quarantined, backing off, beyond the byte budget).
// Rows that can never be published (unknown topic, too large, a payload that cannot be
// rendered safely) stay in the lane and fail it, so they are quarantined by themselves.
func (r *Relay) planRound(keys []string, rows []*claimedRow, perKey int) *roundPlan {
	p := &roundPlan{}
	byKey := map[string]*keyPlan{}
	for _, k := range keys {
		kp := &keyPlan{key: k}
		byKey[k] = kp
		p.keys = append(p.keys, kp)
	}
	now := time.Now()
	for _, c := range rows {
		kp := byKey[c.PartitionKey]
		if kp == nil {
			continue
		}
		kp.read++
		if kp.stop != stopNone {
			continue
		}
		switch {
		case c.quarantined && mutant == mutantQuarantineSkipped:
			continue
		case c.quarantined:
			kp.stop = stopQuarantined
			continue
		case c.waitingUntil != nil:
			kp.stop, kp.waitUntil = stopWaiting, now.Add(time.Until(*c.waitingUntil))
			continue
		}
		if c.payloadLen == -3 {
			kp.stop = stopBudget
			continue
		}
		o := &outcome{event: &c.Event, row: c}
		switch {
		case c.payloadLen == -1:
			o.unpublishable = Permanent(fmt.Errorf("payload is stored in more than %d bytes: too large to publish", r.readBytes))
		default:
			dest, err := r.destination(&c.Event)
			lim := r.limit(dest)
			// The size as dest counts it (MessageSize): the one measure Write, this plan and
			// the claim check's threshold share.
			size := measure(r.cfg.Publisher, dest, &c.Event, c.payloadLen)
			cc := r.cfg.ClaimCheck
			offload := err == nil && cc != nil && size > cc.threshold(lim)
			if offload {
				o, n := cc.offloadedShape(&c.Event, c.payloadLen)
				size = measure(r.cfg.Publisher, dest, o, n)
			}
			switch {
			case err != nil:
				o.unpublishable = err
			case offload && c.payloadLen > cc.maxPayload():
				o.unpublishable = Permanent(fmt.Errorf("payload is %d bytes, above the claim check's %d", c.payloadLen, cc.maxPayload()))
			case size > lim.MaxMessageBytes:
				o.unpublishable = Permanent(fmt.Errorf("message is %d bytes as its destination counts it, above the destination's %d", size, lim.MaxMessageBytes))
			case !c.loaded:
				kp.stop = stopBudget
				continue
			default:
				o.dest, o.size, o.offload = dest, size, offload
			}
			published := &c.Event
			if o.offload {
				// The offloaded message carries ExtendedPayloadSize: one header fewer may fit.
				published = &Event{EventID: c.EventID, EventType: c.EventType, AggregateType: c.AggregateType, AggregateID: c.AggregateID,
					CreatedAt: c.CreatedAt, Headers: c.Headers, ExtendedPayloadSize: c.payloadLen}
			}
			if dropped := droppedHeaders(published); len(dropped) > 0 {
				r.log.Warn("outbox row has more headers than the message attributes limit allows; these are not published",
					"id", c.ID, "event_id", c.EventID, "headers", dropped)
			}
		}
		kp.lane = append(kp.lane, o)
		p.outcomes = append(p.outcomes, o)
	}
	for _, kp := range p.keys {
		if kp.stop == stopNone && kp.read >= perKey {
			kp.stop = stopBudget // more rows may wait: come back at once
		}
	}
	return p
}

// result says what the book should do with the key once its lane's outcomes are committed.
func (kp *keyPlan) result() keyResult {
	res := keyResult{key: kp.key, verdict: verdictDrained}
	for _, o := range kp.lane {
		switch {
		case o.done:
			continue
		case o.err != nil && o.quarantined:
			res.verdict = verdictParked
		case o.err != nil && o.kind == failOutage, o.err == nil && !o.deferredUntil.IsZero():
			res.verdict, res.dest = verdictHeld, o.dest
		case o.err != nil:
			res.verdict, res.until = verdictWait, o.retryAt
		default: // not attempted: the round stopped
			res.verdict = verdictMore
		}
		return res
	}
	switch kp.stop {
	case stopQuarantined:
		res.verdict = verdictParked
	case stopWaiting:
		res.verdict, res.until = verdictWait, kp.waitUntil
	case stopBudget:
		res.verdict = verdictMore
	}
	return res
}

// recordOutcomes queues into b the statements that record outcomes, and counts them (b has
// begun a transaction):
// acknowledged rows become published; a failed row backs off (its key waits behind it) or is
// quarantined (its key stays blocked behind it); rows whose call or destination failed as a
// whole keep their attempt count; rows never attempted are left as they were.
func (r *Relay) recordOutcomes(b *pgx.Batch, outcomes []*outcome) Stats {
	var (
		st        Stats
		published []int64
		failed    []failedRow
	)
	now := time.Now()
	for _, o := range outcomes {
		st.Claimed++
		switch {
		case o.done:
			published = append(published, o.event.ID)
			if o.overtook != nil {
				st.OrderViolations++
			}
			if o.offload {
				st.Offloaded++
				st.OffloadedBytes += o.row.payloadLen
			}
		case o.err != nil:
			e, row := o.event, o.row
			attempt := int32(1)
			var delay *int64
			outlived := row.failingSince != nil && now.Sub(*row.failingSince) >= r.cfg.OutageLimit
			switch o.kind {
			case failOutage:
				// The destination's probe decides when the row moves; available_at stays.
				attempt, o.quarantined, o.retryAt = 0, outlived, o.deferredUntil
			case failCall:
				attempt, o.quarantined = 0, outlived
			default:
				o.quarantined = IsPermanent(o.err) || e.Attempts+1 >= r.cfg.MaxAttempts
			}
			if !o.quarantined && o.kind != failOutage {
				d := r.backoff(e.Attempts + int(attempt))
				ms := d.Milliseconds()
				delay, o.retryAt = &ms, now.Add(d)
			}
			switch {
			case o.quarantined:
				st.Quarantined++
				r.log.Warn("outbox row quarantined", "id", e.ID, "event_id", e.EventID, "topic", e.Topic,
					"partition_key", e.PartitionKey, "attempts", e.Attempts+int(attempt), "outage", o.kind != failRow, "error", o.err)
			case o.kind != failRow:
				st.Outage++
			default:
				st.Retrying++
				r.log.Info("outbox row publish failed; will retry", "id", e.ID, "attempts", e.Attempts+1,
					"retry_in_ms", *delay, "error", o.err)
			}
			failed = append(failed, failedRow{id: e.ID, err: truncateText(o.err.Error(), maxErrorText),
				quarantine: o.quarantined, delayMS: delay, attempt: attempt})
		}
	}
	st.Published = len(published)
	if len(published) > 0 || len(failed) > 0 {
		b.Queue(settlePlanSQL)
	}
	if len(published) > 0 {
		b.Queue(settlePublishedSQL, published)
	}
	if len(failed) > 0 {
		b.Queue(settleFailedSQL, failedArgs(failed)...)
	}
	return st
}

// failedRow is what settleFailedSQL records of one row that failed.
type failedRow struct {
	id         int64
	err        string
	quarantine bool
	delayMS    *int64
	attempt    int32
}

// failedArgs returns settleFailedSQL's arguments: one array per column, in the order of the
// rows' ids (the statement finds a row's values by binary search in the ids).
func failedArgs(rows []failedRow) []any {
	slices.SortFunc(rows, func(a, b failedRow) int { return cmp.Compare(a.id, b.id) })
	ids, errs, quarantine, delayMS, attempt := make([]int64, len(rows)), make([]string, len(rows)),
		make([]bool, len(rows)), make([]*int64, len(rows)), make([]int32, len(rows))
	for i, f := range rows {
		ids[i], errs[i], quarantine[i], delayMS[i], attempt[i] = f.id, f.err, f.quarantine, f.delayMS, f.attempt
	}
	return []any{ids, errs, quarantine, delayMS, attempt}
}

// settlePublishedSQL and settleFailedSQL record a round's outcomes. Each updates the one table
// and nothing else, finding its rows by "id = ANY(ids)": under the plan guards (roundSettings)
// the only plan is one primary-key descent per id, whatever the statistics say and whatever
// plan a connection has cached. A join of the ids against the table has a second plan, the
// table outside and the ids inside, which the planner takes when it believes the table holds
// a few rows (statistics or a cached generic plan from before a burst): one pass over the table
// per id (15 s to record 500 rows behind 100,000 pending, the fleet benchmark's backlogged
// tenant; TestSettleIsBoundedAfterABurstOnACachedPlan). settleFailedSQL's per-row values come
// in arrays ordered by id (failedArgs), and width_bucket, a binary search of a sorted array,
// finds a row's place in them. The recheck is written "(published_at IS NULL) IS TRUE" so
// that it does not match the pending index's predicate: with statistics taken on an empty
// backlog the planner would otherwise scan every pending row through that index and filter on
// id (524 ms to mark 500 rows with 13,000 pending). settlePlanSQL has both planned for the
// ids they are given, never from a plan cached for other ids: on a partitioned outbox only
// then are the partitions that hold none of them left out (PostgreSQL prunes partitions by
// "= ANY" of an array known when planning, not of a parameter).
const (
	settlePlanSQL      = `SET LOCAL plan_cache_mode = force_custom_plan`
	settlePublishedSQL = `UPDATE outbox_event o SET published_at = now(), available_at = NULL, last_error = NULL, failing_since = NULL
		WHERE o.id = ANY($1::bigint[]) AND (o.published_at IS NULL) IS TRUE`
	settleFailedSQL = `UPDATE outbox_event o SET attempts = o.attempts + ($5::int[])[width_bucket(o.id, $1::bigint[])],
			last_error = ($2::text[])[width_bucket(o.id, $1::bigint[])],
			failing_since = coalesce(o.failing_since, now()),
			quarantined_at = CASE WHEN ($3::bool[])[width_bucket(o.id, $1::bigint[])] THEN now() END,
			available_at = CASE WHEN ($3::bool[])[width_bucket(o.id, $1::bigint[])] THEN NULL
			                    WHEN ($4::bigint[])[width_bucket(o.id, $1::bigint[])] IS NULL THEN o.available_at
			                    ELSE now() + ($4::bigint[])[width_bucket(o.id, $1::bigint[])] * interval '1 millisecond' END
		WHERE o.id = ANY($1::bigint[]) AND (o.published_at IS NULL) IS TRUE`
)

// maxErrorText bounds last_error.
const maxErrorText = 2000

// truncateText returns s as text PostgreSQL accepts (valid UTF-8, no NUL bytes), cut to at
// most n bytes on a character boundary.
func truncateText(s string, n int) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "")
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// sortedKeys returns m's keys in order, so that reports are stable.
func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
