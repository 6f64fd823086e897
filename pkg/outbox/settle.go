package outbox

import (
	"fmt"
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

// recordOutcomes queues into b the statements that record outcomes, and counts them:
// acknowledged rows become published; a failed row backs off (its key waits behind it) or is
// quarantined (its key stays blocked behind it); rows whose call or destination failed as a
// whole keep their attempt count; rows never attempted are left as they were.
func (r *Relay) recordOutcomes(b *pgx.Batch, outcomes []*outcome) Stats {
	var (
		st        Stats
		published []int64
		fail      struct {
			ids        []int64
			errs       []string
			quarantine []bool
			delayMS    []*int64
			attempt    []int32
		}
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
			fail.ids = append(fail.ids, e.ID)
			fail.errs = append(fail.errs, truncateText(o.err.Error(), maxErrorText))
			fail.quarantine = append(fail.quarantine, o.quarantined)
			fail.delayMS = append(fail.delayMS, delay)
			fail.attempt = append(fail.attempt, attempt)
		}
	}
	st.Published = len(published)
	if len(published) > 0 {
		b.Queue(settlePublishedSQL, published)
	}
	if len(fail.ids) > 0 {
		b.Queue(settleFailedSQL, fail.ids, fail.errs, fail.quarantine, fail.delayMS, fail.attempt)
	}
	return st
}

// settlePublishedSQL and settleFailedSQL record a round's outcomes. Both find their rows by
// primary key, one lookup per id. The recheck is written "(published_at IS NULL) IS TRUE" so
// that it does not match the pending index's predicate: with statistics taken on an empty
// backlog the planner would otherwise scan every pending row through that index and filter on
// id (524 ms to mark 500 rows with 13,000 pending; 10 s for the failures' join).
const (
	settlePublishedSQL = `UPDATE outbox_event o SET published_at = now(), available_at = NULL, last_error = NULL, failing_since = NULL
		FROM unnest($1::bigint[]) AS p(id)
		WHERE o.id = p.id AND (o.published_at IS NULL) IS TRUE`
	settleFailedSQL = `UPDATE outbox_event o SET attempts = o.attempts + f.attempt, last_error = f.err,
			failing_since = coalesce(o.failing_since, now()),
			quarantined_at = CASE WHEN f.quarantine THEN now() END,
			available_at = CASE WHEN f.quarantine THEN NULL
			                    WHEN f.delay_ms IS NULL THEN o.available_at
			                    ELSE now() + f.delay_ms * interval '1 millisecond' END
		FROM unnest($1::bigint[], $2::text[], $3::bool[], $4::bigint[], $5::int[]) AS f(id, err, quarantine, delay_ms, attempt)
		WHERE o.id = f.id AND (o.published_at IS NULL) IS TRUE`
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
