package outbox

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/internal/wire"
)

// How the relay reads the outbox. Every statement here is bounded by construction: index scans
// with LIMITs, one index descent per partition key visited, never a plan whose cost depends on
// the planner's row estimates (the transactions also disable sequential scans, bitmap scans
// and hash and merge joins, so stale statistics cannot choose them). See docs/outbox.md, "How
// a round works".

// planGuards make the planner use the indexes whatever the statistics say: every statement
// here has an index plan, so disabling the alternatives costs nothing when statistics are
// fresh and prevents nested loops over sequential scans when they are not. A disabled plan
// node still counts its huge penalty in the estimated cost, which would otherwise trigger JIT
// compilation (seconds, for a statement that runs in a millisecond) and parallel workers:
// both are turned off too.
var planGuards = []string{"enable_seqscan = off", "enable_bitmapscan = off", "enable_hashjoin = off",
	"enable_mergejoin = off", "jit = off", "max_parallel_workers_per_gather = 0"}

// roundPlanCache has a round's prepared statements planned once per connection, not per
// execution. Under the plan guards each has one plan shape whatever its parameters, but
// PostgreSQL's plan cache kept choosing custom plans for readSQL (its generic estimate for an
// array of keys is above the custom one for a few keys), so every round planned it anew: 1.4 ms
// of the server's CPU per round, more than the rest of a one-event round together (measured with
// pg_stat_statements on the fleet suite's quiet tenants). The settle keeps its custom plans
// (settlePlanSQL, in its own transaction).
const roundPlanCache = "plan_cache_mode = force_generic_plan"

// roundGuards are the plan settings of a round: the plan guards and roundPlanCache.
var roundGuards = append(slices.Clone(planGuards), roundPlanCache)

// roundSettings are the session settings a round holds its connection with (session-level: a
// round is not one transaction, see Relay.round): every statement bounded to half the lease,
// the plan guards, generic plans (roundPlanCache), and, on PostgreSQL 14 and later, a session
// idle longer than the lease ended by the server (a hung or frozen relay releases its keys) and
// a dead client noticed within a second even mid-statement. roundEndSQL puts them back before
// the connection returns to the pool, which may be the application's.
func roundSettings(lease time.Duration, pg14 bool) []string {
	out := []string{"SET statement_timeout = " + strconv.FormatInt((lease/2).Milliseconds(), 10)}
	for _, g := range roundGuards {
		out = append(out, "SET "+g)
	}
	if pg14 {
		out = append(out, "SET idle_session_timeout = "+strconv.FormatInt(lease.Milliseconds(), 10),
			"SET client_connection_check_interval = 1000")
	}
	return out
}

// unlockAllSQL releases every key the session still holds: a round's end on a dedicated
// connection (DedicatePool), whose settings stay.
const unlockAllSQL = "SELECT pg_advisory_unlock_all()"

// roundEndSQL releases every key the session still holds and undoes roundSettings.
func roundEndSQL(pg14 bool) string {
	q := unlockAllSQL + "; RESET statement_timeout"
	for _, g := range roundGuards {
		q += "; RESET " + strings.Fields(g)[0]
	}
	if pg14 {
		q += "; RESET idle_session_timeout; RESET client_connection_check_interval"
	}
	return q
}

// readSettings open the watcher's read-only transactions with the same plan guards as rounds.
// They hold no keys, so their statements may run as long as a lease. A dedicated connection
// (DedicatePool) has the guards already; its transactions put back the server's plan cache
// mode, which the guards' roundPlanCache changed, so that they plan as on any other.
func readSettings(lease time.Duration, dedicated bool) []string {
	out := []string{"BEGIN READ ONLY", "SET LOCAL statement_timeout = " + strconv.FormatInt(lease.Milliseconds(), 10)}
	if dedicated {
		return append(out, "SET LOCAL "+strings.Fields(roundPlanCache)[0]+" TO DEFAULT")
	}
	for _, g := range planGuards {
		out = append(out, "SET LOCAL "+g)
	}
	return out
}

// pollSQL returns rows committed since the relay last looked: those after its frontier in id
// order, and those whose ids it saw missing (transactions that had not committed yet), each
// with its topic (a held key whose new row goes elsewhere may move) and whether it is
// published already (by another relay: then it moves the frontier only).
const pollSQL = `
(SELECT id, partition_key, topic, published_at IS NOT NULL FROM outbox_event WHERE id > $1 ORDER BY id LIMIT $2)
UNION ALL
(SELECT id, partition_key, topic, published_at IS NOT NULL FROM outbox_event WHERE id = ANY($3::bigint[]) AND id <= $1)`

// epochSQL reads the counter that operator actions bump.
const epochSQL = `SELECT admin_epoch FROM outbox_control WHERE singleton`

// maxIDSQL starts a relay's frontier at the newest row: older rows are found by its sweep.
const maxIDSQL = `SELECT coalesce(max(id), 0) FROM outbox_event`

// sweepSQL walks the pending keys after $1 (inclusive when $2) in key order, one index descent
// per key on outbox_event_pending_key_idx, up to $3 keys, and reports each key's head row: its
// first pending row, its topic, whether quarantined, and until when it backs off. A key's other rows are
// never read, however many wait behind its head.
const sweepSQL = `
WITH RECURSIVE walk(partition_key, id, topic, quarantined, available_at, n) AS (
    (SELECT o.partition_key, o.id, o.topic, o.quarantined_at IS NOT NULL, o.available_at, 1
     FROM outbox_event o
     WHERE o.published_at IS NULL AND (o.partition_key > $1 OR ($2 AND o.partition_key = $1))
     ORDER BY o.partition_key, o.id LIMIT 1)
    UNION ALL
    SELECT nx.partition_key, nx.id, nx.topic, nx.quarantined, nx.available_at, w.n + 1
    FROM walk w CROSS JOIN LATERAL (
        SELECT o.partition_key, o.id, o.topic, o.quarantined_at IS NOT NULL AS quarantined, o.available_at
        FROM outbox_event o
        WHERE o.published_at IS NULL AND o.partition_key > w.partition_key
        ORDER BY o.partition_key, o.id LIMIT 1) nx
    WHERE w.n < $3
)
SELECT partition_key, id, topic, quarantined, available_at, now() FROM walk`

// lockKeysSQL takes a session-level advisory lock per partition key (a 64-bit hash of the key),
// skipping keys another round holds. The lock is what makes a key belong to one round at a
// time, whichever of its rows is the head, even when a row with a lower id commits late. It
// lives in PostgreSQL's shared lock table and ends with unlockKeysSQL once the key's outcomes
// are committed, with roundEndSQL, or with the session.
const lockKeysSQL = `SELECT k FROM unnest($1::text[]) AS k WHERE pg_try_advisory_lock(hashtextextended(k, 5433))`

// unlockKeysSQL releases keys whose outcomes are committed.
const unlockKeysSQL = `SELECT count(*) FILTER (WHERE pg_advisory_unlock(hashtextextended(k, 5433))) FROM unnest($1::text[]) AS k`

// readSQL is where per-key order is enforced. For each locked key ($1) it reads, in a snapshot
// taken after the key's lock was granted, the key's first $2 pending rows in id order, starting
// at its FIRST pending row: no cache (floor, frontier) says where to start, so a row that
// committed late below rows already published is read first, and a row goes out only after
// every pending row of its key with a lower id visible to this statement (see planRound, which
// ends a key's lane at the first row that may not go out now, and laneSet, which sends a lane's
// rows one after another).
//
// It also reads the payloads that fit the round's byte budget ($3 bytes, counted in the order
// rows would be published: every key's first row, then second rows, ...); the rest stay in the
// database for the next round. A payload's size is its text's length: the column keeps the
// bytes the producer wrote, so the relay's work on a row is bounded by its stored size by
// construction (at most what PostgreSQL's compression can expand it to). Rows whose stored
// payloads before them already exceed the budget are not measured (len -3); a stored payload
// larger than the largest message the relay reads ($4) is not read at all (len -1).
//
// The key is matched as the range [key, key] and its rows ordered by (partition_key, id),
// outbox_event_pending_key_idx's own order, so that only that index returns them without a
// sort whatever the statistics say. With "partition_key = key ORDER BY id", statistics taken
// while one key held every pending row made the planner walk the primary key in id order past
// that key's rows, for each other key (12 ms a key behind 50,000 rows: isolation scenario (d),
// TestReadUsesThePendingKeyIndexWhateverTheStatistics).
const readSQL = `
WITH chain AS (
    SELECT r.*, k.ord
    FROM unnest($1::text[]) WITH ORDINALITY AS k(key, ord)
    CROSS JOIN LATERAL (
        SELECT e.id, e.event_id, e.topic, e.aggregate_type, e.aggregate_id, e.event_type, e.partition_key,
               e.headers, e.created_at, e.attempts, e.failing_since, e.quarantined_at IS NOT NULL AS quarantined,
               CASE WHEN e.available_at > now() THEN e.available_at END AS waiting_until,
               e.payload, pg_column_size(e.payload) AS stored
        FROM outbox_event e
        WHERE e.partition_key >= k.key AND e.partition_key <= k.key AND e.published_at IS NULL
        ORDER BY e.partition_key, e.id LIMIT $2) r
), ranked AS (
    SELECT c.*, row_number() OVER (PARTITION BY c.ord ORDER BY c.id) AS rn FROM chain c
), reach AS (
    SELECT r.*, sum(r.stored) OVER (ORDER BY r.rn, r.ord ROWS UNBOUNDED PRECEDING) - r.stored AS stored_before
    FROM ranked r
), sized AS (
    SELECT x.*, CASE WHEN x.stored_before >= $3 THEN -3
                     WHEN x.stored > $4 + 8 THEN -1
                     ELSE octet_length(x.payload::text) END AS len
    FROM reach x
), budget AS (
    SELECT z.*, sum(CASE WHEN z.len BETWEEN 0 AND $4 THEN z.len ELSE 0 END)
                OVER (ORDER BY z.rn, z.ord ROWS UNBOUNDED PRECEDING) AS spent
    FROM sized z
)
SELECT b.id, b.event_id, b.topic, b.aggregate_type, b.aggregate_id, b.event_type, b.partition_key, b.headers,
       b.created_at, b.attempts, b.failing_since, b.quarantined, b.waiting_until, b.len,
       CASE WHEN b.len BETWEEN 0 AND $4 AND b.spent - b.len < $3 THEN b.payload::text END
FROM budget b ORDER BY b.ord, b.id`

// claimedRow is a row a round read, with what the read learned about it.
type claimedRow struct {
	Event
	quarantined  bool
	waitingUntil *time.Time
	failingSince *time.Time
	// payloadLen is the payload's length in bytes; -1: stored payload too large to read,
	// -3: not measured (beyond the budget).
	payloadLen int
	// loaded: the payload was read (it fit the round's budget).
	loaded bool
}

// scanClaimed reads readSQL's rows: each key's in id order, keys in the order given.
func (r *Relay) scanClaimed(rows pgx.Rows) ([]*claimedRow, error) {
	var out []*claimedRow
	for rows.Next() {
		var (
			c       claimedRow
			headers []byte
			payload *string
			evID    uuid.UUID
		)
		if err := rows.Scan(&c.ID, &evID, &c.Topic, &c.AggregateType, &c.AggregateID, &c.EventType, &c.PartitionKey,
			&headers, &c.CreatedAt, &c.Attempts, &c.failingSince, &c.quarantined, &c.waitingUntil, &c.payloadLen, &payload); err != nil {
			return nil, fmt.Errorf("read claimed outbox row: %w", err)
		}
		c.EventID = evID
		if payload != nil {
			c.Payload, c.loaded = []byte(*payload), true
		}
		if err := json.Unmarshal(headers, &c.Headers); err != nil {
			// Headers written by plain SQL may hold non-string values: keep what is usable.
			c.Headers = looseHeaders(headers)
		}
		if r.cfg.Tenant != "" { // the one place a published message gains its tenant
			if c.Headers == nil {
				c.Headers = map[string]string{}
			}
			c.Headers[wire.Tenant] = r.cfg.Tenant
		}
		out = append(out, &c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read claimed outbox rows: %w", err)
	}
	if brokenClaimSkipsHead.Load() {
		out = skipHeads(out)
	}
	return out, nil
}

// brokenClaimSkipsHead deliberately breaks the claim for the fault simulator's self-test: when
// set, a round drops each key's first row whenever it read a second one, so that the later row
// goes out while the earlier one is pending. Production code never sets it.
var brokenClaimSkipsHead atomic.Bool

// skipHeads is the broken claim: each key's first row is dropped when the key has another.
func skipHeads(rows []*claimedRow) []*claimedRow {
	var out []*claimedRow
	for i, c := range rows {
		first := i == 0 || rows[i-1].PartitionKey != c.PartitionKey
		hasNext := i+1 < len(rows) && rows[i+1].PartitionKey == c.PartitionKey
		if first && hasNext {
			continue
		}
		out = append(out, c)
	}
	return out
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
