package outbox

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
)

// DestinationLag is the backlog of one topic (a destination), what an operator's overview shows
// per destination. DestinationsOf reads it.
type DestinationLag struct {
	Topic string
	// Pending counts unpublished rows that are not quarantined.
	Pending int64
	// OldestPendingAge is the age of its oldest pending row (0 when none).
	OldestPendingAge time.Duration
	// Quarantined counts quarantined rows, QuarantinedKeys the partition keys they block.
	Quarantined, QuarantinedKeys int64
	// Failing counts pending rows whose last publish attempt failed (they back off, or wait for
	// the destination's probe); FailingSince is when the oldest such run of failures began.
	Failing      int64
	FailingSince *time.Time
	// Outage reports that some failing row failed only through the destination or the call
	// failing as a whole (its attempt count stayed 0): the relay is probing the destination.
	Outage bool
	// LastError is the error of the most recently failing row ("" when none fails).
	LastError string
	// PublishedLastMinute counts its rows published in the last minute, among the newest
	// 100,000 rows (as Lag.PublishedLastMinute).
	PublishedLastMinute int64
}

// DestinationsOf reads the backlog of every topic with unpublished rows or rows published in
// the last minute, by topic name. Like LagOf, it reads only the unpublished rows and the newest
// 100,000 rows, so its cost follows the backlog, not the table.
func DestinationsOf(ctx context.Context, db Querier) ([]DestinationLag, error) {
	rows, err := db.Query(ctx, `
		WITH pending AS (
		    SELECT topic,
		           count(*) FILTER (WHERE quarantined_at IS NULL) AS pending,
		           coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE quarantined_at IS NULL)), 0)::float8 AS age,
		           count(*) FILTER (WHERE quarantined_at IS NOT NULL) AS quarantined,
		           count(DISTINCT partition_key) FILTER (WHERE quarantined_at IS NOT NULL) AS quarantined_keys,
		           count(*) FILTER (WHERE quarantined_at IS NULL AND failing_since IS NOT NULL) AS failing,
		           min(failing_since) FILTER (WHERE quarantined_at IS NULL) AS failing_since,
		           coalesce(bool_or(quarantined_at IS NULL AND failing_since IS NOT NULL AND attempts = 0), false) AS outage,
		           coalesce((array_agg(last_error ORDER BY failing_since DESC)
		                     FILTER (WHERE quarantined_at IS NULL AND failing_since IS NOT NULL AND last_error IS NOT NULL))[1], '') AS last_error
		    FROM outbox_event WHERE published_at IS NULL
		    GROUP BY topic
		), recent AS (
		    SELECT topic, count(*) AS published
		    FROM (SELECT topic, published_at FROM outbox_event ORDER BY id DESC LIMIT 100000) r
		    WHERE published_at > now() - interval '1 minute'
		    GROUP BY topic
		)
		SELECT topic, coalesce(p.pending, 0), coalesce(p.age, 0), coalesce(p.quarantined, 0), coalesce(p.quarantined_keys, 0),
		       coalesce(p.failing, 0), p.failing_since, coalesce(p.outage, false), coalesce(p.last_error, ''), coalesce(r.published, 0)
		FROM pending p FULL JOIN recent r USING (topic)
		ORDER BY topic`)
	if err != nil {
		return nil, fmt.Errorf("read outbox destinations: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (DestinationLag, error) {
		var d DestinationLag
		var age float64
		err := r.Scan(&d.Topic, &d.Pending, &age, &d.Quarantined, &d.QuarantinedKeys, &d.Failing, &d.FailingSince, &d.Outage,
			&d.LastError, &d.PublishedLastMinute)
		d.OldestPendingAge = time.Duration(age * float64(time.Second))
		return d, err
	})
	if err != nil {
		return nil, fmt.Errorf("read outbox destinations: %w", err)
	}
	return out, nil
}

// WaitReason says why a pending row of a key's chain is not being published.
type WaitReason string

// The reasons a pending row waits, from the row's own state and its key's.
const (
	// WaitQuarantined: the row was quarantined (LastError says why); its key waits behind it
	// until an operator retries it.
	WaitQuarantined WaitReason = "quarantined"
	// WaitBackoff: a publish attempt failed; the row is not claimed before AvailableAt.
	WaitBackoff WaitReason = "backoff"
	// WaitOutage: the destination failed as a whole; the relay's probe decides when it moves.
	WaitOutage WaitReason = "destination failing"
	// WaitHeld: a relay holds the key right now (ChainRow.HeldBy): the row is being published.
	WaitHeld WaitReason = "held by a relay"
	// WaitBehind: a lower row of the same key is pending; rows of a key go out in id order.
	WaitBehind WaitReason = "behind an earlier row"
	// WaitReady: nothing holds the row back; the next relay round publishes it.
	WaitReady WaitReason = "ready"
)

// KeyHolder is the database session that holds a partition key's advisory lock: a relay
// publishing its rows (pkg/outbox's relays lock a key while they publish it).
type KeyHolder struct {
	PID             int32
	ApplicationName string
	// Since is when the session's current transaction or, outside one, its current state began.
	Since *time.Time
}

// ChainRow is one pending row of a key's chain.
type ChainRow struct {
	ID          int64
	EventID     uuid.UUID
	Topic       string
	EventType   string
	CreatedAt   time.Time
	Attempts    int
	LastError   string
	AvailableAt *time.Time
	// FailingSince is when its current run of failed attempts began (nil when none failed).
	FailingSince  *time.Time
	QuarantinedAt *time.Time
	// Wait is why it is not published now; BehindID the row it waits behind (WaitBehind).
	Wait     WaitReason
	BehindID int64
}

// KeyChain is a partition key's pending rows in publishing order and why each waits.
type KeyChain struct {
	Key string
	// Rows are its first pending rows (quarantined ones included), in id order.
	Rows []ChainRow
	// Pending counts every pending row of the key (Rows holds at most the limit asked for).
	Pending int64
	// HeldBy is the session holding the key's advisory lock, nil when none does.
	HeldBy *KeyHolder
	// Now is the database's clock when the chain was read.
	Now time.Time
}

// chainSQL reads a key's first $2 pending rows in id order on outbox_event_pending_key_idx
// (matched as the range [key, key], as readSQL does, so the plan does not depend on statistics),
// with the key's pending count.
const chainSQL = `
SELECT e.id, e.event_id, e.topic, e.event_type, e.created_at, e.attempts, coalesce(e.last_error, ''),
       e.available_at, e.failing_since, e.quarantined_at, now(),
       (SELECT count(*) FROM outbox_event c WHERE c.partition_key >= $1 AND c.partition_key <= $1 AND c.published_at IS NULL)
FROM outbox_event e
WHERE e.partition_key >= $1 AND e.partition_key <= $1 AND e.published_at IS NULL
ORDER BY e.partition_key, e.id
LIMIT $2`

// keyHolderSQL finds the session holding a key's advisory lock in this database: the lock
// relays take (lockKeysSQL) shows in pg_locks as the 64-bit key split into classid (high 32
// bits) and objid (low 32 bits), objsubid 1. pg_locks and these columns of pg_stat_activity
// are readable by every role.
var keyHolderSQL = `
WITH h AS (SELECT ` + keyLockExpr("$1::text") + ` AS k)
SELECT l.pid, coalesce(a.application_name, ''), coalesce(a.xact_start, a.state_change)
FROM h, pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid = ((h.k >> 32) & 4294967295)::oid AND l.objid = (h.k & 4294967295)::oid
LIMIT 1`

// ChainOf reads partition key's first limit pending rows (100 when limit is 0 or less) in
// publishing order and says why each waits: quarantined (with its last error), backing off
// until AvailableAt, its destination failing, its key held by a relay right now (the session
// holding the key's advisory lock), behind an earlier row of the key, or ready.
func ChainOf(ctx context.Context, db Querier, key string, limit int) (KeyChain, error) {
	if limit <= 0 {
		limit = 100
	}
	c := KeyChain{Key: key}
	rows, err := db.Query(ctx, chainSQL, key, limit)
	if err != nil {
		return KeyChain{}, fmt.Errorf("read the chain of key %q: %w", key, err)
	}
	c.Rows, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (ChainRow, error) {
		var row ChainRow
		err := r.Scan(&row.ID, &row.EventID, &row.Topic, &row.EventType, &row.CreatedAt, &row.Attempts, &row.LastError,
			&row.AvailableAt, &row.FailingSince, &row.QuarantinedAt, &c.Now, &c.Pending)
		return row, err
	})
	if err != nil {
		return KeyChain{}, fmt.Errorf("read the chain of key %q: %w", key, err)
	}
	var h KeyHolder
	switch err := db.QueryRow(ctx, keyHolderSQL, key).Scan(&h.PID, &h.ApplicationName, &h.Since); err {
	case nil:
		c.HeldBy = &h
	case pgx.ErrNoRows:
	default:
		return KeyChain{}, fmt.Errorf("read who holds key %q: %w", key, err)
	}
	for i := range c.Rows {
		c.Rows[i].Wait = c.waitOf(i)
		if c.Rows[i].Wait == WaitBehind {
			c.Rows[i].BehindID = c.Rows[i-1].ID
		}
	}
	return c, nil
}

// waitOf says why row i waits: a row's own state first (quarantined, backing off, its
// destination failing), then its place in the key (a row behind the head waits for it), then
// the key's lock.
func (c KeyChain) waitOf(i int) WaitReason {
	r := c.Rows[i]
	switch {
	case r.QuarantinedAt != nil:
		return WaitQuarantined
	case i > 0:
		return WaitBehind
	case r.FailingSince != nil && r.Attempts == 0 && r.LastError != "":
		return WaitOutage
	case r.AvailableAt != nil && r.AvailableAt.After(c.Now):
		return WaitBackoff
	case c.HeldBy != nil:
		return WaitHeld
	}
	return WaitReady
}
