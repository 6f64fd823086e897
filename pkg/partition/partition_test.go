package partition_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/pkg/outbox"
	"github.com/sluicehq/sluice/pkg/partition"
)

func TestMain(m *testing.M) { testdb.Main(m) }

func exec(t *testing.T, db *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	_, err := db.Exec(context.Background(), sql, args...)
	require.NoError(t, err, sql)
}

func count(t *testing.T, db *pgxpool.Pool, sql string) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(context.Background(), sql).Scan(&n), sql)
	return n
}

// writeOutbox inserts n outbox rows with plain SQL (as another language would), in keys round
// robin, with created_at and published_at from the given expressions.
func writeOutbox(t *testing.T, db *pgxpool.Pool, n int, createdAt, publishedAt string) {
	t.Helper()
	exec(t, db, fmt.Sprintf(`
		INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload, created_at, published_at)
		SELECT gen_random_uuid(), 'orders', 'order', 'o' || i, 'OrderCreated', 'k' || (i %% 5), jsonb_build_object('n', i), %s, %s
		FROM generate_series(1, %d) i`, createdAt, publishedAt, n))
}

// writeInbox inserts one processed inbox row per id, received now.
func writeInbox(t *testing.T, db *pgxpool.Pool, ids ...string) {
	t.Helper()
	for _, id := range ids {
		exec(t, db, `INSERT INTO inbox_event (consumer, message_id, event_type, processed_at) VALUES ('billing', $1, 'Scripted', now())`, id)
	}
}

func names(ps []partition.Partition) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name)
	}
	return out
}

// A table PostgreSQL cannot carry over to a partitioned table as it is (a trigger, a view
// reading it) is refused with every problem named, and nothing is changed.
func TestConvertRefusesWhatItCannotCarryOver(t *testing.T) {
	t.Parallel()
	for _, tb := range partition.Tables() {
		t.Run(tb.Name(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testdb.Pool(t)
			exec(t, pool, `CREATE FUNCTION audit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NEW; END $$`)
			exec(t, pool, `CREATE TRIGGER sluice_audit AFTER INSERT ON `+tb.Name()+` FOR EACH ROW EXECUTE FUNCTION audit()`)
			exec(t, pool, `CREATE VIEW recent_rows AS SELECT * FROM `+tb.Name())

			_, err := partition.PlanConversion(ctx, pool, tb, nil)
			require.ErrorContains(t, err, "sluice_audit")
			require.ErrorContains(t, err, "recent_rows")
			_, err = partition.Convert(ctx, pool, tb, nil, nil)
			require.ErrorContains(t, err, "nothing was changed")
			l, err := partition.Read(ctx, pool, tb)
			require.NoError(t, err)
			require.Equal(t, tb.Name(), l.Table)
			require.False(t, l.Partitioned)
			require.Zero(t, l.ConversionBound, "no bound was added")
		})
	}
}

// A conversion interrupted after it added its bound is reported by maintenance and finished by
// running it again, with the same bound, every row kept; a converted table is not converted
// twice.
func TestAnInterruptedConversionIsFinishedByRunningItAgain(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		table *partition.Table
		fill  func(t *testing.T, db *pgxpool.Pool)
		check string // the CHECK the first step adds
		bound int64
		opts  *partition.Options
	}{
		{
			table: partition.Outbox,
			fill:  func(t *testing.T, db *pgxpool.Pool) { writeOutbox(t, db, 50, "now()", "NULL") },
			check: "id < 5000",
			bound: 5000,
			opts:  &partition.Options{Size: 1000},
		},
		{
			table: partition.Inbox,
			fill:  func(t *testing.T, db *pgxpool.Pool) { writeInbox(t, db, "m1", "m2", "m3") },
			check: "received_at < '2100-01-01T00:00:00Z'",
			bound: time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro(),
			opts:  &partition.Options{Interval: 24 * time.Hour},
		},
	} {
		t.Run(tc.table.Name(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testdb.Pool(t)
			tc.fill(t, pool)
			rows := count(t, pool, "SELECT count(*) FROM "+tc.table.Name())
			// What the first step leaves behind when the process dies right after it.
			exec(t, pool, "ALTER TABLE "+tc.table.Name()+" ADD CONSTRAINT "+tc.table.Name()+"_partition_bound CHECK ("+tc.check+") NOT VALID")

			rep, err := partition.Maintain(ctx, pool, tc.table, nil)
			require.NoError(t, err)
			require.False(t, rep.Partitioned)
			require.Len(t, rep.Warnings, 1)
			require.Contains(t, rep.Warnings[0], "did not finish")
			l, err := partition.Read(ctx, pool, tc.table)
			require.NoError(t, err)
			require.Equal(t, tc.bound, l.ConversionBound)

			plan, err := partition.PlanConversion(ctx, pool, tc.table, tc.opts)
			require.NoError(t, err)
			require.True(t, plan.Resume)
			require.Equal(t, tc.bound, plan.Bound)
			require.NotContains(t, strings.Join(plan.Steps, "\n"), "NOT VALID to "+tc.table.Name(), "the bound is not added twice")
			_, err = partition.Convert(ctx, pool, tc.table, tc.opts, nil)
			require.NoError(t, err)

			l, err = partition.Read(ctx, pool, tc.table)
			require.NoError(t, err)
			require.True(t, l.Partitioned)
			require.Equal(t, tc.table.Name()+"_p0", l.Partitions[0].Name)
			require.Equal(t, tc.bound, l.Partitions[0].To)
			require.Equal(t, tc.bound, l.Partitions[1].From)
			require.Equal(t, rows, count(t, pool, "SELECT count(*) FROM "+tc.table.Name()), "every row is kept")
			require.Zero(t, count(t, pool, "SELECT count(*) FROM pg_constraint WHERE conname = '"+tc.table.Name()+"_partition_bound'"),
				"the bound is gone once the partition's range holds it")

			_, err = partition.PlanConversion(ctx, pool, tc.table, tc.opts)
			require.ErrorIs(t, err, partition.ErrPartitioned)
		})
	}
}

// retentionCase fills a partitioned table so that Maintain with its retention must drop some
// partitions, keep others for named reasons, and purge expired rows from the default partition.
type retentionCase struct {
	table *partition.Table
	// fill converts the empty table, writes its rows and returns the Maintain options and what
	// it must do.
	fill func(t *testing.T, db *pgxpool.Pool) (opts *partition.Options, want retentionWant)
}

type retentionWant struct {
	dropped []string
	kept    map[string]string // partition → a piece of the reason
	purged  int64
	left    int
}

// Retention drops a partition only when every row in it finished before the cutoff: never one
// with an unfinished row (unpublished or quarantined; unprocessed or parked), one with a row
// that finished after the cutoff, one whose newest row is younger (outbox), or the default
// partition, whose expired rows are deleted instead.
func TestMaintainDropsOnlyPartitionsWhoseRowsAllFinishedBeforeTheRetention(t *testing.T) {
	t.Parallel()
	const (
		old        = "now() - interval '41 days'"
		oldPublish = "now() - interval '40 days'"
	)
	for _, tc := range []retentionCase{
		{table: partition.Outbox, fill: func(t *testing.T, db *pgxpool.Pool) (*partition.Options, retentionWant) {
			ctx := context.Background()
			plan, err := partition.Convert(ctx, db, partition.Outbox, &partition.Options{Size: 100, Ahead: 6}, nil)
			require.NoError(t, err)
			require.Equal(t, int64(100), plan.Bound, "an empty table: [MINVALUE, 100), then 100 ids each")
			writeOutbox(t, db, 99, old, oldPublish)  // ids 1-99: the former table, expired
			writeOutbox(t, db, 100, old, oldPublish) // 100-199: expired
			writeOutbox(t, db, 100, old, oldPublish) // 200-299: expired but for one quarantined row
			exec(t, db, "UPDATE outbox_event SET published_at = NULL, quarantined_at = now() WHERE id = 250")
			writeOutbox(t, db, 100, old, "CASE WHEN i = 50 THEN now() - interval '1 hour' ELSE "+oldPublish+" END") // 300-399: one row republished lately
			writeOutbox(t, db, 100, "CASE WHEN i = 100 THEN now() ELSE "+old+" END", oldPublish)                    // 400-499: its newest row is young
			writeOutbox(t, db, 50, "now()", "now()")                                                                // 500-549: where new ids go
			// A partition ahead went missing: ids beyond the others reach the default partition.
			exec(t, db, "DROP TABLE outbox_event_p0000000000000000600")
			exec(t, db, `INSERT INTO outbox_event (id, event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload, created_at, published_at)
				OVERRIDING SYSTEM VALUE
				SELECT 650 + i, gen_random_uuid(), 'orders', 'order', 'o', 'OrderCreated', 'k', '{}', `+old+`, `+oldPublish+` FROM generate_series(0, 9) i`)
			return &partition.Options{Size: 100, Ahead: 2, Retention: 30 * 24 * time.Hour}, retentionWant{
				dropped: []string{"outbox_event_p0", "outbox_event_p0000000000000000100"},
				kept: map[string]string{
					"outbox_event_p0000000000000000200": "not published",
					"outbox_event_p0000000000000000300": "published after the cutoff",
					"outbox_event_p0000000000000000400": "newest row was written at",
				},
				purged: 10,
				left:   549 - 199,
			}
		}},
		{table: partition.Inbox, fill: func(t *testing.T, db *pgxpool.Pool) (*partition.Options, retentionWant) {
			ctx := context.Background()
			insert := func(id, receivedAt, processedAt, parkedAt string) {
				t.Helper()
				exec(t, db, `INSERT INTO inbox_event (consumer, message_id, event_type, received_at, processed_at, parked_at)
					VALUES ('billing', $1, 'Scripted', `+receivedAt+`, `+processedAt+`, `+parkedAt+`)`, id)
			}
			const hourAgo = "now() - interval '1 hour'"
			insert("p0-a", "now() - interval '2 hours'", hourAgo, "NULL") // the former table
			_, err := partition.Convert(ctx, db, partition.Inbox, &partition.Options{Interval: time.Second, Ahead: 4}, nil)
			require.NoError(t, err)
			layout, err := partition.Read(ctx, db, partition.Inbox)
			require.NoError(t, err)
			parts := layout.Partitions
			require.Len(t, parts, 6, "the former table, 4 partitions ahead, the default one")
			at := func(i int) string {
				from, ok := partition.Inbox.Time(parts[i].From)
				require.True(t, ok)
				return fmt.Sprintf("'%s'::timestamptz", from.Format(time.RFC3339Nano))
			}
			insert("a-done", at(1), hourAgo, "NULL")
			insert("a-waiting", at(1), "NULL", "NULL") // unprocessed
			insert("b-done", at(2), hourAgo, "NULL")
			insert("b-parked", at(2), "NULL", "now()") // parked
			insert("c-done", at(3), hourAgo, "NULL")
			insert("c-late", at(3), "NULL", "NULL") // processed below, after the cutoff
			insert("d-done", at(4), hourAgo, "NULL")
			insert("x-done", "'2100-01-01'", hourAgo, "NULL") // beyond every partition: the default one
			var in string
			require.NoError(t, db.QueryRow(ctx, `SELECT tableoid::regclass::text FROM inbox_event WHERE message_id = 'x-done'`).Scan(&in))
			require.Equal(t, "inbox_event_default", strings.TrimPrefix(in, "public."))

			// Wait until the four partitions ended a retention ago, then process c-late: after the
			// cutoff of the runs that follow (the retention leaves them seconds to start).
			const retention = 5 * time.Second
			end, _ := partition.Inbox.Time(parts[4].To)
			time.Sleep(time.Until(end) + retention + 500*time.Millisecond)
			exec(t, db, `UPDATE inbox_event SET processed_at = now() WHERE message_id = 'c-late'`)
			return &partition.Options{Interval: time.Second, Ahead: 2, Retention: retention}, retentionWant{
				dropped: []string{"inbox_event_p0", parts[4].Name},
				kept: map[string]string{
					parts[1].Name: "not processed",
					parts[2].Name: "not processed",
					parts[3].Name: "processed after the cutoff",
				},
				purged: 1,
				left:   6,
			}
		}},
	} {
		t.Run(tc.table.Name(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := testdb.Pool(t)
			opts, want := tc.fill(t, pool)

			dry := *opts
			dry.DryRun = true
			plan, err := partition.Maintain(ctx, pool, tc.table, &dry)
			require.NoError(t, err)
			require.ElementsMatch(t, want.dropped, names(plan.Dropped), "the dry run reports what the run drops")
			require.Empty(t, plan.Created, "a dry run creates nothing")
			require.Zero(t, plan.Purged, "a dry run deletes nothing")

			rep, err := partition.Maintain(ctx, pool, tc.table, opts)
			require.NoError(t, err)
			require.Equal(t, tc.table.Name(), rep.Table)
			require.True(t, rep.Partitioned)
			require.ElementsMatch(t, want.dropped, names(rep.Dropped))
			kept := map[string]string{}
			for _, k := range rep.Kept {
				kept[k.Name] = k.Reason
			}
			for name, why := range want.kept {
				require.Contains(t, kept[name], why, "%s kept: %v", name, kept)
			}
			require.Equal(t, want.purged, rep.Purged, "the default partition's expired rows are deleted")
			require.NotEmpty(t, rep.Created, "partitions are kept ready ahead")
			require.Equal(t, want.left, count(t, pool, "SELECT count(*) FROM "+tc.table.Name()))

			l, err := partition.Read(ctx, pool, tc.table)
			require.NoError(t, err)
			for _, p := range l.Partitions {
				require.NotContains(t, want.dropped, p.Name)
			}
			require.True(t, l.Partitions[len(l.Partitions)-1].Default, "the default partition is never dropped")

			rep, err = partition.Maintain(ctx, pool, tc.table, opts)
			require.NoError(t, err)
			require.Empty(t, rep.Dropped, "nothing more expires on a second run")
		})
	}
}

// A Replay that makes the rows of an expired partition unpublished, in a transaction still open
// while maintenance runs, keeps that partition: maintenance waits for the Replay's lock, then
// sees its rows unpublished. With a short LockTimeout it gives up instead, dropping nothing.
func TestMaintainNeverDropsAPartitionAConcurrentReplayMadeUnpublished(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	_, err := partition.Convert(ctx, pool, partition.Outbox, &partition.Options{Size: 100, Ahead: 3}, nil)
	require.NoError(t, err)
	writeOutbox(t, pool, 99, "now() - interval '41 days'", "now() - interval '40 days'")  // the former table
	writeOutbox(t, pool, 100, "now() - interval '41 days'", "now() - interval '40 days'") // 100-199
	writeOutbox(t, pool, 50, "now()", "now()")                                            // 200-249: where new ids go
	retention := &partition.Options{Size: 100, Ahead: 1, Retention: 30 * 24 * time.Hour, LockTimeout: 100 * time.Millisecond}

	replay, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = replay.Rollback(ctx) }()
	n, err := outbox.Replay(ctx, replay, outbox.ReplayFilter{Since: time.Now().Add(-42 * 24 * time.Hour), Until: time.Now().Add(-40 * 24 * time.Hour)})
	require.NoError(t, err)
	require.Equal(t, int64(199), n)

	keptFor := func(rep partition.Report, why string) []string {
		var out []string
		for _, k := range rep.Kept {
			if strings.Contains(k.Reason, why) {
				out = append(out, k.Name)
			}
		}
		return out
	}
	// The Replay holds its lock: maintenance gives up on both partitions and drops nothing.
	rep, err := partition.Maintain(ctx, pool, partition.Outbox, retention)
	require.NoError(t, err)
	require.Empty(t, rep.Dropped)
	expired := []string{"outbox_event_p0", "outbox_event_p0000000000000000100"}
	require.ElementsMatch(t, expired, keptFor(rep, "busy"))

	// With time to wait, maintenance queues behind the Replay and checks again once it commits.
	patient := *retention
	patient.LockTimeout = time.Minute
	done := make(chan error, 1)
	var rep2 partition.Report
	go func() {
		var err error
		rep2, err = partition.Maintain(ctx, pool, partition.Outbox, &patient)
		done <- err
	}()
	testwait.Until(t, "maintenance waits for the Replay's lock", func() bool {
		var waiting bool
		require.NoError(t, pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted AND relation = 'outbox_event'::regclass)`).Scan(&waiting))
		return waiting
	})
	require.NoError(t, replay.Commit(ctx))
	require.NoError(t, <-done)
	require.Empty(t, rep2.Dropped, "a partition with replayed (unpublished) rows is never dropped")
	require.ElementsMatch(t, expired, keptFor(rep2, "not published"))
	require.Equal(t, 199, count(t, pool, "SELECT count(*) FROM outbox_event WHERE published_at IS NULL"), "every replayed row is there to be published again")
}

// Options report every problem at once, naming each field.
func TestOptionsCheckReportsEveryProblem(t *testing.T) {
	t.Parallel()
	err := (&partition.Options{Interval: time.Millisecond, Ahead: 500, MinSize: -1, Size: -1, Retention: -time.Hour}).Check()
	for _, field := range []string{"Interval", "Ahead", "MinSize", "Size", "Retention"} {
		require.ErrorContains(t, err, field)
	}
	require.NoError(t, (*partition.Options)(nil).Check(), "nil takes the defaults")
}

// A partition renders with its range: ids for the outbox, times for the inbox.
func TestPartitionsRenderTheirRange(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := testdb.Pool(t)
	want := map[*partition.Table]string{
		partition.Outbox: "outbox_event_p0 [MINVALUE, ",
		partition.Inbox:  "inbox_event_p0 [MINVALUE, 20",
	}
	for _, tb := range partition.Tables() {
		_, err := partition.Convert(ctx, pool, tb, nil, nil)
		require.NoError(t, err)
		l, err := partition.Read(ctx, pool, tb)
		require.NoError(t, err)
		require.Contains(t, l.Partitions[0].String(), want[tb])
		last := l.Partitions[len(l.Partitions)-1]
		require.Equal(t, tb.Name()+"_default (default)", last.String())
		_, isTime := tb.Time(l.Partitions[1].From)
		require.Equal(t, tb == partition.Inbox, isTime)
	}
}
