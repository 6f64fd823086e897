package fleet

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"time"
)

// A write transaction the activity poll saw in flight is asked about again before the next
// poll: a bulk write (a backlog committed in one transaction) wakes its tenant a moment after
// its commit, instead of up to a DetectInterval later. The question is pg_xact_status of the
// transaction's id, a lookup in the commit log that any role may make.

// writeCheckFirst is how soon after a poll the writes it saw in flight are first asked about,
// and writeCheckShare how much later each next question comes, as a share of the youngest
// write's age: a write that has run for a second is asked about every 30 ms, one stuck for a
// minute every DetectInterval at most (the next poll's). A write is thus seen ended within
// about 2% of its length after its commit, plus writeCheckFirst. The short writes a poll
// catches have ended by the first question (one lookup after the poll); a write of a second
// costs about 40; a transaction left open, one per DetectInterval beside the poll while it
// stays open.
const (
	writeCheckFirst = 10 * time.Millisecond
	writeCheckShare = 50
)

// writeInFlight is a write transaction seen in flight by the activity poll, named by
// activitySQL's writers ("pid xid"). detect owns the set (awaitPoll, which it calls, drops the
// ones that ended): a write it held and the next poll no longer sees has ended.
type writeInFlight struct {
	db    string
	xid   string    // its 64-bit transaction id (xid8), as text; "" when it could not be placed
	since time.Time // when a poll first saw it
}

// fullXid returns the 64-bit transaction id of xid, a 32-bit id of a transaction in flight,
// from ref, a 64-bit id read by the same statement (the snapshot's xmax, which a transaction
// in flight may be past): the id nearest ref, as PostgreSQL keeps every live id within 2^31 of
// the others. ok is false when that would be before the first normal id (3).
func fullXid(ref uint64, xid uint32) (full uint64, ok bool) {
	f := int64(ref) + int64(int32(xid-uint32(ref)))
	if f < 3 {
		return 0, false
	}
	return uint64(f), true
}

// writesInFlight returns the writes of seen in flight (activitySQL's writers, "pid xid"), each
// with the time the earlier polls first saw it (known) or now, and its id placed again (one
// that a failed question left unasked is asked again). A write whose id cannot be placed is
// kept, for the next poll to see it end, but not asked about.
func writesInFlight(seen map[string]dbActivity, known map[string]writeInFlight, now time.Time) map[string]writeInFlight {
	out := map[string]writeInFlight{}
	for db, a := range seen {
		for _, w := range a.writers {
			in := writeInFlight{db: db, since: now}
			if k, ok := known[w]; ok {
				in.since = k.since
			}
			_, x, _ := strings.Cut(w, " ")
			if xid, err := strconv.ParseUint(x, 10, 32); err == nil {
				if full, ok := fullXid(a.xmax, uint32(xid)); ok {
					in.xid = strconv.FormatUint(full, 10)
				}
			}
			out[w] = in
		}
	}
	return out
}

// errNoActivityConn: the activity poll's connection is closed.
var errNoActivityConn = errors.New("fleet: no activity connection")

// endedWritesSQL returns which of the transactions $2 (xid8 as text; $1 names each) are no
// longer in progress: committed, rolled back, or too old for the commit log to say.
const endedWritesSQL = `SELECT w FROM unnest($1::text[], $2::text[]) AS u(w, x) WHERE pg_xact_status(x::xid8) IS DISTINCT FROM 'in progress'`

// awaitPoll waits for the next poll's tick (true) or the end of ctx (false). Meanwhile it asks
// whether the writes the last poll saw in flight have ended, writeCheckFirst after the poll and
// then at intervals growing with the youngest write's age (writeCheckShare), and wakes the
// tenants of the database of each that has; it is removed from writes (the next poll would
// wake them again). A question that fails leaves the rest to the next poll.
func (s *server) awaitPoll(ctx context.Context, tick <-chan time.Time, writes map[string]writeInFlight) bool {
	for {
		var check <-chan time.Time
		youngest, asked := time.Duration(1<<62), false
		for _, w := range writes {
			if w.xid != "" {
				youngest, asked = min(youngest, time.Since(w.since)), true
			}
		}
		if asked {
			check = time.After(min(writeCheckFirst+youngest/writeCheckShare, s.f.cfg.DetectInterval))
		}
		select {
		case <-ctx.Done():
			return false
		case <-tick:
			return true
		case <-check:
		}
		ended, err := s.endedWrites(ctx, writes)
		if err != nil {
			s.f.log.Debug("fleet: ask whether writes ended", "error", err)
			for w, x := range writes {
				x.xid = "" // the next poll sees them end
				writes[w] = x
			}
			continue
		}
		_, byDB := s.members()
		for _, w := range ended {
			db := writes[w].db
			for _, t := range byDB[db] {
				t.writeEnded.Store(true)
				t.poke()
			}
			delete(writes, w)
		}
	}
}

// endedWrites returns which of writes have ended (endedWritesSQL), on the activity poll's
// connection.
func (s *server) endedWrites(ctx context.Context, writes map[string]writeInFlight) ([]string, error) {
	names, xids := make([]string, 0, len(writes)), make([]string, 0, len(writes))
	for w, x := range writes {
		if x.xid != "" {
			names, xids = append(names, w), append(xids, x.xid)
		}
	}
	s.connMu.Lock()
	defer s.connMu.Unlock()
	if s.conn == nil {
		return nil, errNoActivityConn
	}
	rows, err := s.conn.Query(ctx, endedWritesSQL, names, xids)
	if err != nil {
		s.closeConnLocked(ctx)
		return nil, err
	}
	var ended []string
	for rows.Next() {
		var w string
		if err := rows.Scan(&w); err != nil {
			rows.Close()
			return nil, err
		}
		ended = append(ended, w)
	}
	rows.Close()
	return ended, rows.Err()
}
