package main

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// The suite at a tiny size, on its own cluster: every phase's statements, rows, WAL and index
// entries are counted, and the counts that follow from the schema come out exactly.
func TestWritesSuiteCounts(t *testing.T) {
	ctx, log := clusterTest(t, 3*time.Minute)
	env, err := startWritesEnv(ctx, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(env.Close)
	const events, keys = 300, 30
	res, err := measureWrites(ctx, log, env, events, keys)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Runs) != 6 || !strings.Contains(res.Server, "full_page_writes=on") {
		t.Fatalf("%d runs on %q", len(res.Runs), res.Server)
	}
	for _, run := range res.Runs {
		name := run.Scenario + ", " + run.Name()
		p, d := run.Producer, run.Drain
		// The producer: one INSERT per event in a transaction of its own, a heap tuple and three
		// index entries (primary key, event_id, the pending-key index) each, nothing dead.
		if p.Statements != events || p.Commits < events || p.RowsWritten != events || p.TupIns != events || p.Dead != 0 {
			t.Errorf("%s: producer statements %d, commits %d, rows %d, inserted %d, dead %d; want %d, ≥ %d, %d, %d, 0",
				name, p.Statements, p.Commits, p.RowsWritten, p.TupIns, p.Dead, events, events, events, events)
		}
		if p.IndexEntries < 3*events || p.WALBytes <= 0 || p.WALRecords < 4*events {
			t.Errorf("%s: producer index entries %d, WAL %d B in %d records", name, p.IndexEntries, p.WALBytes, p.WALRecords)
		}
		// The drain: every row updated once (not HOT: published_at is in the pending index's
		// predicate), so one dead tuple and two index entries (primary key, event_id) per event.
		if d.Statements <= 0 || d.RowsWritten != events || d.TupUpd != events || d.TupHotUpd != 0 || d.Dead != events {
			t.Errorf("%s: drain statements %d, rows %d, updated %d (HOT %d), dead %d; want > 0, %d, %d (0), %d",
				name, d.Statements, d.RowsWritten, d.TupUpd, d.TupHotUpd, d.Dead, events, events, events)
		}
		if d.IndexEntries < 2*events || d.WALBytes <= 0 || d.StatementWALBytes <= 0 || len(d.TopStatements) == 0 || len(d.TopRecords) == 0 {
			t.Errorf("%s: drain index entries %d, WAL %d B (statements %d B), %d top statements, %d record types",
				name, d.IndexEntries, d.WALBytes, d.StatementWALBytes, len(d.TopStatements), len(d.TopRecords))
		}
		// The harness's own statements (the pending poll, the measurement) are not counted.
		for _, s := range d.TopStatements {
			if strings.Contains(s.Query, "pg_stat") || strings.Contains(s.Query, "count(*) FROM outbox_event") {
				t.Errorf("%s: the harness's statement counted: %s", name, s.Query)
			}
		}
	}
	// A checkpoint before the drain makes the drain write full-page images.
	for _, run := range res.Runs {
		if run.Scenario == writesCheckpoint && run.Drain.WALFPI == 0 {
			t.Errorf("%s after a checkpoint: no full-page image", run.Name())
		}
	}
}

func TestStatementClass(t *testing.T) {
	t.Parallel()
	for q, want := range map[string]string{
		"begin": "tx", "COMMIT": "tx", "rollback": "tx",
		"INSERT INTO outbox_event (event_id) VALUES ($1)":                             "write",
		"UPDATE outbox_event o SET published_at = now() FROM unnest($1::bigint[])":    "write",
		"WITH x AS (SELECT 1) DELETE FROM outbox_event WHERE id IN (SELECT * FROM x)": "write",
		"WITH chain AS (SELECT r.* FROM t) SELECT b.id FROM budget b":                 "read",
		"SELECT id FROM outbox_event FOR UPDATE SKIP LOCKED":                          "read",
	} {
		if got := statementClass(q); got != want {
			t.Errorf("statementClass(%q) = %s, want %s", q, got, want)
		}
	}
}

// The section renders every run, and the target's verdict follows the ratio of WAL bytes.
func TestRenderWrites(t *testing.T) {
	t.Parallel()
	cost := func(wal int64) WriteCost {
		return WriteCost{Events: 100, Statements: 10, Commits: 5, RowsWritten: 100, TupUpd: 100, Dead: 100, WALBytes: wal, WALRecords: 400, IndexEntries: 200,
			StatementWALBytes: wal, TopStatements: []StatementWAL{{Query: "UPDATE outbox_event SET published_at = now()", Calls: 5, Rows: 100, WALBytes: wal}},
			TopRecords: []RecordWAL{{Type: "Heap/UPDATE", Count: 100, Bytes: wal / 2}}}
	}
	prod := WriteCost{Events: 100, Statements: 100, TxControl: 200, Commits: 100, RowsWritten: 100, TupIns: 100, WALBytes: 58_000, WALRecords: 545, IndexEntries: 300}
	rep := &Report{Writes: &WritesResult{Events: 100, Keys: 10, Server: "PostgreSQL 15", Runs: []WritesRun{
		{Scenario: writesCloseBehind, Drainer: drainerRelay, Delay: 10 * time.Millisecond, Producer: prod, Drain: cost(40_000)},
		{Scenario: writesCloseBehind, Drainer: drainerCeiling, Producer: prod, Drain: cost(50_000)},
		{Scenario: writesCheckpoint, Drainer: drainerRelay, Delay: 10 * time.Millisecond, Producer: prod, Drain: cost(80_000)},
		{Scenario: writesCheckpoint, Drainer: drainerCeiling, Producer: prod, Drain: cost(50_000)},
	}}}
	var b strings.Builder
	rep.writesMarkdown(func(f string, a ...any) { fmt.Fprintf(&b, f, a...) })
	for _, want := range []string{"## 13. Database writes per event (issue 25)",
		"| drain right after the producer | sluice relay, publisher 10ms | 0.100 | 0.000 | 0.050 | 1.000 | 0.00 / 1.00 (0.00) / 0.00 | 400.0 | 4.00 | 0.000 | 2.00 | 1.00 | 0.80× |",
		"| drain right after the producer | producer: `outbox.Write`, 1 event per transaction | 1.000 | 2.000 | 1.000 | 1.000 | 1.00 / 0.00 (0.00) / 0.00 | 580.0 |",
		"`UPDATE outbox_event SET published_at = now()` | 0.050 | 400.0 | 100% |"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("missing %q in:\n%s", want, b.String())
		}
	}
	got := map[string]target{}
	for _, tg := range rep.targets() {
		got[tg.Name] = tg
	}
	if tg := got["WAL bytes per published event, "+writesCloseBehind]; tg.Status != "met" || !strings.Contains(tg.Measured, "0.80×") {
		t.Errorf("close behind: %+v", tg)
	}
	if tg := got["WAL bytes per published event, "+writesCheckpoint]; tg.Status != "**not met**" || !strings.Contains(tg.Measured, "1.60×") {
		t.Errorf("after a checkpoint: %+v", tg)
	}
}
