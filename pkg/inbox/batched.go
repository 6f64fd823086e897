package inbox

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

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
//
// A batch's records are [record]s; its transaction, with the savepoint helper and the records
// waiting for the commit, is a [batchTx]; the inbox rows its insert created are [batchRows].

// bulkResult says how one attempt of runBulk ended.
type bulkResult int

const (
	bulkDone          bulkResult = iota // results are final
	bulkHandlerFailed                   // optimistic attempt: a handler failed; rolled back
	bulkInsertFailed                    // the batch insert failed; rolled back
)

// runBatched applies the batch in one transaction; see the comment at the top of this file.
func (b *batch) runBatched(ctx context.Context) {
	results, blocked := append([]Result(nil), b.results...), maps.Clone(b.blocked)
	restore := func() {
		copy(b.results, results)
		b.blocked = maps.Clone(blocked)
	}
	res := b.runBulk(ctx, false)
	if res == bulkHandlerFailed {
		restore()
		b.spanEvent("batch rolled back: a handler failed; applying again with a savepoint per record")
		res = b.runBulk(ctx, true)
	}
	if res == bulkInsertFailed {
		restore()
		b.spanEvent("batch insert failed; applying record by record")
		b.runEach(ctx)
	}
}

// batchTx is the one transaction of a batched attempt. The first record that may run begins
// it; once it breaks (BEGIN or a savepoint command failed) every later record fails with that
// error; the records whose work succeeded wait in pending for the commit.
type batchTx struct {
	db      Beginner
	tx      pgx.Tx
	broken  error     // set when the transaction can no longer be used
	pending []*record // records whose work succeeded, waiting for the commit
}

// begin opens the transaction unless it is open already; began reports whether this call
// opened it. A failure breaks the batch transaction.
func (t *batchTx) begin(ctx context.Context) (began bool, err error) {
	if t.tx != nil {
		return false, nil
	}
	tx, err := t.db.Begin(ctx)
	if err != nil {
		t.broken = fmt.Errorf("begin batch: %w", err)
		return false, t.broken
	}
	t.tx = tx
	return true, nil
}

// savepoint runs f, the work of the message with id, inside a savepoint: it releases the
// savepoint when f succeeds and rolls back to it when f fails or the release fails, so f's work
// is undone alone. It returns the record's failure; when a savepoint command itself fails the
// transaction is broken (and that error is the record's failure when it failed first).
//
// The savepoint is driven by hand rather than with tx.Begin: pgx closes its nested transaction
// when RELEASE fails, after which it can no longer roll back to it, and the whole batch would be
// lost for one record.
func (t *batchTx) savepoint(ctx context.Context, id string, f func() error) error {
	if _, err := t.tx.Exec(ctx, "SAVEPOINT inbox_record"); err != nil {
		t.broken = fmt.Errorf("savepoint: %w", err)
		return t.broken
	}
	err := f()
	if err == nil {
		if _, rerr := t.tx.Exec(ctx, "RELEASE SAVEPOINT inbox_record"); rerr != nil {
			err = fmt.Errorf("message %s: release savepoint: %w", id, rerr)
		}
	}
	if err != nil {
		if _, rerr := t.tx.Exec(context.WithoutCancel(ctx), "ROLLBACK TO SAVEPOINT inbox_record; RELEASE SAVEPOINT inbox_record"); rerr != nil {
			t.broken = fmt.Errorf("batch transaction unusable after message %s failed: %w", id, rerr)
		}
	}
	return err
}

// commit runs before (when given) and commits, unless the transaction broke earlier. It returns
// why it did not commit; nil means every pending record's work is committed.
func (t *batchTx) commit(ctx context.Context, before func() error) error {
	if t.broken != nil {
		return t.broken
	}
	if before != nil {
		if err := before(); err != nil {
			return fmt.Errorf("batch: %w: %w", ErrCommit, err)
		}
	}
	if err := t.tx.Commit(ctx); err != nil {
		return fmt.Errorf("batch: %w: %w", ErrCommit, err)
	}
	return nil
}

// close rolls back what was not committed and releases the connection.
func (t *batchTx) close(ctx context.Context) {
	if t.tx != nil {
		_ = t.tx.Rollback(context.WithoutCancel(ctx))
	}
}

// rowState is what one transaction knows of an inbox key it inserted.
type rowState int

const (
	rowFree  rowState = iota + 1 // inserted by this transaction, no record holds it (yet)
	rowTaken                     // held by a record that succeeded (pending the commit)
)

// batchRows holds the inbox rows a batch transaction inserted, by message id. A row is free
// until a record takes it (its work succeeded); rows still free at the end are deleted before
// the commit, so a record that did not succeed leaves no inbox row.
type batchRows map[string]rowState

// free reports whether the transaction inserted id's row and no record took it yet. A record
// whose row is not free is a duplicate: of a row there before, or of an earlier record.
func (r batchRows) free(id string) bool { return r[id] == rowFree }

// take gives id's row to the record that just succeeded.
func (r batchRows) take(id string) { r[id] = rowTaken }

// freeIDs returns the ids of the rows no record took, sorted.
func (r batchRows) freeIDs() []string {
	var out []string
	for id, st := range r {
		if st == rowFree {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

// runBulk makes one attempt at the batch: one transaction, one insert of the inbox rows, the
// handlers (inside a savepoint each when savepoints is true), one delete of the rows no record
// kept, one commit. Without savepoints it returns bulkHandlerFailed, after rolling back, as
// soon as a handler fails.
func (b *batch) runBulk(ctx context.Context, savepoints bool) bulkResult {
	t := &batchTx{db: b.c.db}
	defer t.close(ctx)
	var rows batchRows
	for i := range b.recs {
		r := &b.recs[i]
		rctx := b.recordCtx(ctx, r)
		ok, began := b.ready(rctx, r, t)
		if !ok {
			continue
		}
		if began {
			var err error
			if rows, err = b.c.insertBatch(ctx, t.tx, b.runnable(i)); err != nil {
				b.c.log.WarnContext(ctx, "inbox: batch insert failed, inserting record by record", "error", err.Error())
				return bulkInsertFailed
			}
		}
		if !rows.free(r.msg.ID) {
			b.results[r.i].Outcome = Duplicate // in the table before, or taken by an earlier record
			t.pending = append(t.pending, r)
			continue
		}
		h, skip, err := b.c.cfg.Router.lookup(r.msg.EventType)
		if err != nil {
			b.fail(r, fmt.Errorf("message %s: %w", r.msg.ID, err))
			continue
		}
		if !skip {
			if !savepoints {
				// A failure (error, panic, or a swallowed failed statement) cannot be undone alone.
				if runHandler(rctx, h, t.tx, r.msg) != nil {
					return bulkHandlerFailed
				}
			} else if err := t.savepoint(rctx, r.msg.ID, func() error { return runHandler(rctx, h, t.tx, r.msg) }); err != nil {
				b.fail(r, err) // its row stays free: a later delivery of the id may take it
				continue
			}
		}
		rows.take(r.msg.ID)
		b.results[r.i].Outcome = Applied
		if skip {
			b.results[r.i].Outcome = Skipped
		}
		t.pending = append(t.pending, r)
	}
	b.commit(ctx, t, func() error { return b.c.deleteFree(ctx, t.tx, rows) })
	return bulkDone
}

// runnable returns the messages of the records from first on that may run in this batch:
// parsed, in a group not blocked by an earlier failure known now, the first record of each
// message id. Later failures can still stop some of them; their rows are deleted before the
// commit.
func (b *batch) runnable(first int) []Message {
	blocked := maps.Clone(b.blocked)
	seen := map[string]bool{}
	var out []Message
	for _, r := range b.recs[first:] {
		g := r.group()
		if g != "" && blocked[g] {
			continue
		}
		if r.err != nil {
			if g != "" {
				blocked[g] = true
			}
			continue
		}
		if !seen[r.msg.ID] {
			seen[r.msg.ID] = true
			out = append(out, r.msg)
		}
	}
	return out
}

// insertBatch inserts a batch's inbox rows in one statement: unnest of the parameter arrays, a
// sort of at most the batch, and one primary-key probe per row (ON CONFLICT).
const insertBatch = `
INSERT INTO inbox_event (consumer, message_id, event_type, aggregate_type, aggregate_id, group_id,
                         created_at, headers, payload, processed_at)
SELECT $1::text, m.message_id, m.event_type, m.aggregate_type, m.aggregate_id, NULLIF(m.group_id, ''),
       m.created_at, m.headers::jsonb, m.payload::json, clock_timestamp()
FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::timestamptz[], $8::text[], $9::text[])
     AS m (message_id, event_type, aggregate_type, aggregate_id, group_id, created_at, headers, payload)
ORDER BY 1, 2 -- consumer, message_id: the primary key's order
ON CONFLICT (consumer, message_id) DO NOTHING
RETURNING message_id`

// insertBatch inserts the inbox rows of msgs (distinct ids) in one statement, in key order,
// and returns the ids it inserted, each free.
func (c *Consumer) insertBatch(ctx context.Context, tx pgx.Tx, msgs []Message) (batchRows, error) {
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
	out := make(batchRows, n)
	if n == 0 {
		return out, nil
	}
	part, err := c.partitioned(ctx, tx)
	if err != nil {
		return nil, fmt.Errorf("insert inbox rows: %w", err)
	}
	args := []any{c.cfg.Consumer, ids, types, aggTypes, aggIDs, groups, created, headers, payloads}
	var inserted []string
	if part {
		inserted, err = c.insertBatchRows(ctx, tx, ids, args...)
	} else {
		var rows pgx.Rows
		if rows, err = tx.Query(ctx, insertBatch, args...); err == nil {
			inserted, err = pgx.CollectRows(rows, pgx.RowTo[string])
		}
	}
	if err != nil {
		c.relearnLayout(err)
		return nil, fmt.Errorf("insert inbox rows: %w", err)
	}
	for _, id := range inserted {
		out[id] = rowFree
	}
	return out, nil
}

// deleteFree removes the inbox rows this transaction inserted that no record kept.
func (c *Consumer) deleteFree(ctx context.Context, tx pgx.Tx, rows batchRows) error {
	free := rows.freeIDs()
	if len(free) == 0 {
		return nil
	}
	// One primary-key lookup per id.
	if _, err := tx.Exec(ctx, `DELETE FROM inbox_event WHERE consumer = $1 AND message_id = ANY($2)`, c.cfg.Consumer, free); err != nil {
		return fmt.Errorf("remove the inbox rows of failed records: %w", err)
	}
	return nil
}

// runEach is the fallback when the batch insert fails: one transaction for the batch, a
// SAVEPOINT per record around its inbox insert and handler (which attributes a row PostgreSQL
// refuses to its record). Rows are inserted in delivery order, so concurrent batches can
// deadlock here; the losing records fail and come back.
func (b *batch) runEach(ctx context.Context) {
	t := &batchTx{db: b.c.db}
	defer t.close(ctx)
	for i := range b.recs {
		r := &b.recs[i]
		rctx := b.recordCtx(ctx, r)
		if ok, _ := b.ready(rctx, r, t); !ok {
			continue
		}
		var out Outcome
		if err := t.savepoint(rctx, r.msg.ID, func() (err error) {
			out, err = b.c.apply(rctx, t.tx, r.msg)
			return err
		}); err != nil {
			b.fail(r, err)
			continue
		}
		b.results[r.i].Outcome = out
		t.pending = append(t.pending, r)
	}
	b.commit(ctx, t, nil)
}

// commit ends a batch's transaction, when one began: it runs before (when given) and commits,
// unless the transaction broke earlier. When it does not commit, every pending record (whose
// work succeeded and waited for the commit) fails with the reason; the caller's deferred close
// then rolls back and releases the connection.
func (b *batch) commit(ctx context.Context, t *batchTx, before func() error) {
	if t.tx == nil {
		return
	}
	if err := t.commit(ctx, before); err != nil {
		for _, r := range t.pending {
			b.results[r.i].Outcome, b.results[r.i].Err = Failed, err
		}
	}
}

// ready reports whether r may run in the batch's transaction t, failing it when t is broken or
// the record's prechecks (parse error, blocked FIFO group, deadline) say no, and begins t for
// the first record that may run (began).
func (b *batch) ready(ctx context.Context, r *record, t *batchTx) (ok, began bool) {
	if t.broken != nil {
		b.fail(r, t.broken)
		return false, false
	}
	if err := b.precheck(ctx, r); err != nil {
		b.fail(r, err)
		return false, false
	}
	began, err := t.begin(ctx)
	if err != nil {
		b.fail(r, err)
		return false, false
	}
	return true, began
}
