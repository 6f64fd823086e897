package inbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"

	"github.com/aws/aws-lambda-go/events"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// The batched mode (Mode Batched) applies a batch in one transaction and costs a few round trips
// per batch plus the handlers' own statements, where the per-record mode pays BEGIN, INSERT,
// the handler and COMMIT for every record. It keeps the per-record mode's outcomes (a test
// compares both modes record by record):
//
//  1. The first record that passes its precheck (FIFO group, parse error, deadline) opens the
//     transaction, and one statement (insertBatch) inserts the inbox rows of every record from
//     there on that can still run, ordered by (consumer, message_id) with ON CONFLICT DO NOTHING.
//     The sort makes concurrent batches take the inbox keys' locks in the same order, so they
//     cannot deadlock on them (they could when rows were inserted in delivery order). A message
//     id the statement does not return was already there: that record is a Duplicate.
//  2. The records then run in delivery order, with the same prechecks as the per-record mode.
//     A record whose message id this transaction inserted "takes" the row and runs its handler;
//     a later record with the same id is a Duplicate of it. A record that fails without having
//     run a handler (unknown event type, blocked group, deadline) hands the row back, so a later
//     delivery of the same id in the batch can take it, as it would in the per-record mode.
//  3. Before COMMIT, one DELETE removes the rows no record kept, so a failed record leaves no
//     inbox row and comes back. Rows inserted and deleted by the same transaction leave nothing
//     behind; a concurrent consumer waiting on such a key finds it free after the commit.
//
// The first attempt (optimistic) runs handlers without savepoints. When a handler fails (error,
// panic, or it returned nil but left the transaction aborted), its effects cannot be undone
// alone, so the consumer rolls the whole transaction back and applies the batch again from the
// start with a SAVEPOINT around each handler (ROLLBACK TO SAVEPOINT undoes a failed handler and
// the record hands its row back). Handlers of the records before the failure, and the failing
// one, therefore run twice in that Process call; their database effects are committed once.
// If the batch insert itself fails (e.g. a payload PostgreSQL cannot store), the consumer falls
// back to inserting each record's row inside its own savepoint (runEach), which attributes
// the failure to its record.

// bulkResult says how one attempt of runBulk ended.
type bulkResult int

const (
	bulkDone          bulkResult = iota // results are final
	bulkHandlerFailed                   // optimistic attempt: a handler failed; rolled back
	bulkInsertFailed                    // the batch insert failed; rolled back
)

// runBatched applies the batch in one transaction; see the comment at the top of this file.
func (b *batch) runBatched(ctx context.Context, recs []events.SQSMessage, msgs []Message, perr []error) {
	results, blocked := append([]Result(nil), b.results...), maps.Clone(b.blocked)
	restore := func() {
		copy(b.results, results)
		b.blocked = maps.Clone(blocked)
	}
	res := b.runBulk(ctx, recs, msgs, perr, false)
	if res == bulkHandlerFailed {
		restore()
		res = b.runBulk(ctx, recs, msgs, perr, true)
	}
	if res == bulkInsertFailed {
		restore()
		b.runEach(ctx, recs, msgs, perr)
	}
}

// rowState is what one transaction knows of an inbox key it inserted.
type rowState int

const (
	rowFree  rowState = iota + 1 // inserted by this transaction, no record holds it (yet)
	rowTaken                     // held by a record that succeeded (pending the commit)
)

// runBulk makes one attempt at the batch: one transaction, one insert of the inbox rows, the
// handlers (inside a savepoint each when savepoints is true), one delete of the rows no record
// kept, one commit. Without savepoints it returns bulkHandlerFailed, after rolling back, as
// soon as a handler fails.
func (b *batch) runBulk(ctx context.Context, recs []events.SQSMessage, msgs []Message, perr []error, savepoints bool) bulkResult {
	var (
		tx      pgx.Tx
		rows    map[string]rowState // message ids this transaction inserted
		pending []int               // records whose work succeeded, waiting for the batch commit
		broken  error               // set when the batch transaction can no longer be used
	)
	defer func() {
		if tx != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	for i, rec := range recs {
		ok, began := b.ready(ctx, i, rec, perr[i], &tx, &broken)
		if !ok {
			continue
		}
		if began {
			var err error
			if rows, err = b.c.insertBatch(ctx, tx, b.runnable(i, recs, msgs, perr)); err != nil {
				b.c.log.WarnContext(ctx, "inbox: batch insert failed, inserting record by record", "error", err.Error())
				return bulkInsertFailed
			}
		}
		msg := msgs[i]
		if rows[msg.ID] != rowFree {
			b.results[i].Outcome = Duplicate // in the table before, or taken by an earlier record
			pending = append(pending, i)
			continue
		}
		h, skip, err := b.c.cfg.Router.lookup(msg.EventType)
		if err != nil {
			b.fail(i, rec, fmt.Errorf("message %s: %w", msg.ID, err))
			continue
		}
		if !skip {
			if !savepoints {
				err = call(ctx, h, tx, msg)
				if err == nil && tx.Conn().PgConn().TxStatus() == 'E' {
					// The handler swallowed a failed statement; blame it, as the savepoint attempt will.
					err = errors.New("transaction aborted by a failed statement")
				}
				if err != nil {
					return bulkHandlerFailed
				}
			} else if err, broken = callInSavepoint(ctx, tx, h, msg); err != nil {
				b.fail(i, rec, err) // its row stays free: a later delivery of the id may take it
				continue
			}
		}
		rows[msg.ID] = rowTaken
		b.results[i].Outcome = Applied
		if skip {
			b.results[i].Outcome = Skipped
		}
		pending = append(pending, i)
	}
	if tx != nil {
		b.commit(ctx, tx, pending, broken, func() error { return b.c.deleteFree(ctx, tx, rows) })
	}
	return bulkDone
}

// callInSavepoint runs h inside a savepoint of tx and rolls the savepoint back when h fails.
// err is the record's failure (the handler's error, as in the per-record mode); broken is set
// when a savepoint command failed and the batch transaction can no longer be used.
//
// The savepoint is driven by hand rather than with tx.Begin: pgx closes its nested transaction
// when RELEASE fails (a handler that returned nil after a failed statement), after which it can
// no longer roll back to it, and the whole batch would be lost for one record.
func callInSavepoint(ctx context.Context, tx pgx.Tx, h Handler, msg Message) (err, broken error) {
	if _, err := tx.Exec(ctx, "SAVEPOINT inbox_record"); err != nil {
		broken = fmt.Errorf("savepoint: %w", err)
		return broken, broken
	}
	if err = call(ctx, h, tx, msg); err != nil {
		err = fmt.Errorf("message %s (%s): handler: %w", msg.ID, msg.EventType, err)
	} else if _, rerr := tx.Exec(ctx, "RELEASE SAVEPOINT inbox_record"); rerr != nil {
		err = fmt.Errorf("message %s: release savepoint: %w", msg.ID, rerr)
	}
	if err != nil {
		if _, rerr := tx.Exec(context.WithoutCancel(ctx), "ROLLBACK TO SAVEPOINT inbox_record; RELEASE SAVEPOINT inbox_record"); rerr != nil {
			broken = fmt.Errorf("batch transaction unusable after message %s failed: %w", msg.ID, rerr)
		}
	}
	return err, broken
}

// runnable returns the records from first on that may run in this batch: parsed, in a group not
// blocked by an earlier failure known now, the first record of each message id. Later failures
// can still stop some of them; their rows are deleted before the commit.
func (b *batch) runnable(first int, recs []events.SQSMessage, msgs []Message, perr []error) []Message {
	blocked := maps.Clone(b.blocked)
	seen := map[string]bool{}
	var out []Message
	for j := first; j < len(recs); j++ {
		g := recs[j].Attributes["MessageGroupId"]
		if g != "" && blocked[g] {
			continue
		}
		if perr[j] != nil {
			if g != "" {
				blocked[g] = true
			}
			continue
		}
		if !seen[msgs[j].ID] {
			seen[msgs[j].ID] = true
			out = append(out, msgs[j])
		}
	}
	return out
}

const insertBatch = `
INSERT INTO inbox_event (consumer, message_id, event_type, aggregate_type, aggregate_id, group_id,
                         created_at, headers, payload, processed_at)
SELECT $1::text, m.message_id, m.event_type, m.aggregate_type, m.aggregate_id, NULLIF(m.group_id, ''),
       m.created_at, m.headers::jsonb, m.payload::jsonb, clock_timestamp()
FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::timestamptz[], $8::text[], $9::text[])
     AS m (message_id, event_type, aggregate_type, aggregate_id, group_id, created_at, headers, payload)
ORDER BY 1, 2 -- consumer, message_id: the primary key's order
ON CONFLICT (consumer, message_id) DO NOTHING
RETURNING message_id`

// insertBatch inserts the inbox rows of msgs (distinct ids) in one statement, in key order,
// and returns the ids it inserted, each rowFree.
func (c *Consumer) insertBatch(ctx context.Context, tx pgx.Tx, msgs []Message) (map[string]rowState, error) {
	n := len(msgs)
	var (
		ids, types, aggTypes, aggIDs, groups = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		created                              = make([]pgtype.Timestamptz, n)
		headers                              = make([]string, n)
		payloads                             = make([]*string, n)
	)
	for i, m := range msgs {
		ids[i], types[i], aggTypes[i], aggIDs[i], groups[i] = m.ID, m.EventType, m.AggregateType, m.AggregateID, m.GroupID
		created[i] = pgtype.Timestamptz{Time: m.CreatedAt, Valid: !m.CreatedAt.IsZero()}
		headers[i] = "{}"
		if c.cfg.StorePayload {
			h, err := json.Marshal(m.Headers)
			if err != nil {
				return nil, fmt.Errorf("message %s: encode headers: %w", m.ID, err)
			}
			headers[i] = string(h)
			if m.Payload != nil {
				p := string(m.Payload)
				payloads[i] = &p
			}
		}
	}
	out := make(map[string]rowState, n)
	if n == 0 {
		return out, nil
	}
	rows, err := tx.Query(ctx, insertBatch, c.cfg.Consumer, ids, types, aggTypes, aggIDs, groups, created, headers, payloads)
	if err != nil {
		return nil, fmt.Errorf("insert inbox rows: %w", err)
	}
	inserted, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("insert inbox rows: %w", err)
	}
	for _, id := range inserted {
		out[id] = rowFree
	}
	return out, nil
}

// deleteFree removes the inbox rows this transaction inserted that no record kept.
func (c *Consumer) deleteFree(ctx context.Context, tx pgx.Tx, rows map[string]rowState) error {
	var free []string
	for id, st := range rows {
		if st == rowFree {
			free = append(free, id)
		}
	}
	if len(free) == 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, `DELETE FROM inbox_event WHERE consumer = $1 AND message_id = ANY($2)`, c.cfg.Consumer, free); err != nil {
		return fmt.Errorf("remove the inbox rows of failed records: %w", err)
	}
	return nil
}

// runEach is the fallback when the batch insert fails: one transaction for the batch, a
// SAVEPOINT per record around its inbox insert and handler (which attributes a row PostgreSQL
// refuses to its record). Rows are inserted in delivery order, so concurrent batches can
// deadlock here; the losing records fail and come back.
func (b *batch) runEach(ctx context.Context, recs []events.SQSMessage, msgs []Message, perr []error) {
	var (
		tx      pgx.Tx
		pending []int
		broken  error
	)
	defer func() {
		if tx != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	for i, rec := range recs {
		if ok, _ := b.ready(ctx, i, rec, perr[i], &tx, &broken); !ok {
			continue
		}
		// The savepoint is driven by hand, as in callInSavepoint.
		if _, err := tx.Exec(ctx, "SAVEPOINT inbox_record"); err != nil {
			broken = fmt.Errorf("savepoint: %w", err)
			b.fail(i, rec, broken)
			continue
		}
		out, err := b.c.apply(ctx, tx, msgs[i])
		if err == nil {
			if _, rerr := tx.Exec(ctx, "RELEASE SAVEPOINT inbox_record"); rerr != nil {
				err = fmt.Errorf("message %s: release savepoint: %w", msgs[i].ID, rerr)
			}
		}
		if err != nil {
			if _, rerr := tx.Exec(context.WithoutCancel(ctx), "ROLLBACK TO SAVEPOINT inbox_record; RELEASE SAVEPOINT inbox_record"); rerr != nil {
				broken = fmt.Errorf("batch transaction unusable after message %s failed: %w", msgs[i].ID, rerr)
			}
			b.fail(i, rec, err)
			continue
		}
		b.results[i].Outcome = out
		pending = append(pending, i)
	}
	if tx != nil {
		b.commit(ctx, tx, pending, broken, nil)
	}
}

// commit ends a batch's transaction: it runs before (when given) and commits, unless the
// transaction broke earlier. When it does not commit, every pending record (whose work
// succeeded and waited for the commit) fails with the reason; the callers' deferred Rollback
// then ends the transaction and releases its connection.
func (b *batch) commit(ctx context.Context, tx pgx.Tx, pending []int, broken error, before func() error) {
	cerr := broken
	if cerr == nil && before != nil {
		if err := before(); err != nil {
			cerr = fmt.Errorf("batch: %w: %w", ErrCommit, err)
		}
	}
	if cerr == nil {
		if err := tx.Commit(ctx); err != nil {
			cerr = fmt.Errorf("batch: %w: %w", ErrCommit, err)
		}
	}
	if cerr != nil {
		for _, i := range pending {
			b.results[i].Outcome, b.results[i].Err = Failed, cerr
		}
	}
}

// ready reports whether record i may run in the batch's transaction, failing it when the
// transaction is broken or the record's prechecks (parse error, blocked FIFO group, deadline)
// say no, and begins the transaction for the first record that may run (began).
func (b *batch) ready(ctx context.Context, i int, rec events.SQSMessage, perr error, tx *pgx.Tx, broken *error) (ok, began bool) {
	if *broken != nil {
		b.fail(i, rec, *broken)
		return false, false
	}
	if err := b.precheck(ctx, rec, perr); err != nil {
		b.fail(i, rec, err)
		return false, false
	}
	if *tx != nil {
		return true, false
	}
	t, err := b.c.db.Begin(ctx)
	if err != nil {
		*broken = fmt.Errorf("begin batch: %w", err)
		b.fail(i, rec, *broken)
		return false, false
	}
	*tx = t
	return true, true
}
