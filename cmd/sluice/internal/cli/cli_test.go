package cli_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/cmd/sluice/internal/cli"
	"github.com/sluicehq/sluice/internal/doclint"
	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/migrations"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

func TestParseDurationAndTime(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]time.Duration{"7d": 7 * 24 * time.Hour, "1d12h": 36 * time.Hour, "90s": 90 * time.Second, "15m": 15 * time.Minute, "0d": 0} {
		got, err := cli.ParseDuration(in)
		require.NoError(t, err, in)
		require.Equal(t, want, got, in)
	}
	for _, bad := range []string{"", "7", "d", "7days", "-1h", "3x", "1.5d"} {
		_, err := cli.ParseDuration(bad)
		require.Error(t, err, bad)
	}
	now := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	for in, want := range map[string]time.Time{
		"-2h": now.Add(-2 * time.Hour), "-7d": now.Add(-7 * 24 * time.Hour), "+1h": now.Add(time.Hour), "now": now,
		"2026-11-28T09:00:00Z": time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC), "2026-11-28": time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC),
	} {
		got, err := cli.ParseTime(in, now)
		require.NoError(t, err, in)
		require.True(t, want.Equal(got), "%s: got %s", in, got)
	}
	for _, bad := range []string{"", "yesterday", "2h", "-2x", "2026-13-01"} {
		_, err := cli.ParseTime(bad, now)
		require.Error(t, err, bad)
	}
	require.Equal(t, "2d4h", cli.FormatDuration(52*time.Hour))
	require.Equal(t, "5m3s", cli.FormatDuration(5*time.Minute+3*time.Second))
}

func TestEveryCommandHasHelpWithExamples(t *testing.T) {
	t.Parallel()
	b := &testBundle{env: map[string]string{}}
	for _, cmd := range []string{"", "migrate", "migrate up", "migrate down", "migrate status", "relay", "status", "dead", "dead list",
		"dead retry", "redrive", "replay", "purge", "audit", "fleet", "fleet init", "fleet add", "fleet remove", "fleet list"} {
		args := append(strings.Fields(cmd), "--help")
		r := b.run(t, args...)
		require.Equal(t, 0, r.code, cmd)
		require.Contains(t, r.out, "Examples:", "sluice %s --help", cmd)
		require.Contains(t, r.out, "--database-url", "global flags are listed for %q", cmd)
	}
}

// TestHelpNamesEveryDestinationOrNone walks every command's help (found through "Available
// Commands", so a new command is covered without editing this test) and holds it to the rule of
// internal/doclint: general text names all of the outbox's destinations or none of them.
func TestHelpNamesEveryDestinationOrNone(t *testing.T) {
	t.Parallel()
	b := &testBundle{env: map[string]string{}}
	seen := 0
	var walk func(path []string)
	walk = func(path []string) {
		r := b.run(t, append(append([]string{}, path...), "--help")...)
		require.Equal(t, 0, r.code, "sluice %s --help", strings.Join(path, " "))
		seen++
		for _, para := range strings.Split(r.out, "\n\n") {
			if named, missing := doclint.Prose(para); len(named) > 0 && len(missing) > 0 {
				t.Errorf("sluice %s --help names %v but not %v in:\n%s", strings.Join(path, " "), named, missing, para)
			}
		}
		_, sub, ok := strings.Cut(r.out, "Available Commands:\n")
		if !ok {
			return
		}
		for _, line := range strings.Split(sub, "\n") {
			fields := strings.Fields(line)
			if len(fields) == 0 || !strings.HasPrefix(line, "  ") {
				break
			}
			if fields[0] != "help" {
				walk(append(append([]string{}, path...), fields[0]))
			}
		}
	}
	walk(nil)
	require.Greater(t, seen, 15, "the walk found the command tree")
}

// TestBadInputChangesNothing runs each kind of bad input against a populated database and
// queues: one-line error naming the problem, non-zero exit, no row and no message changed.
func TestBadInputChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	c := b.withAWS(t)
	b.insertOutbox(t, outboxRow{age: 48 * time.Hour, publishedAgo: ago(40 * time.Hour)})
	qid, _ := b.insertOutbox(t, outboxRow{quarantined: true})
	b.insertInbox(t, "billing", "m-1", "processed", 30*24*time.Hour)
	b.insertInbox(t, "billing", "m-2", "parked", time.Hour)
	queueURL, dlqURL := queuePair(t, c, false)
	loner, err := c.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String("cli-loner-" + strconv.FormatInt(time.Now().UnixNano(), 36))})
	require.NoError(t, err)
	lonerURL := aws.ToString(loner.QueueUrl)
	_, err = c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(lonerURL), MessageBody: aws.String(`{"x":1}`)})
	require.NoError(t, err)
	missingQueue := queueURL + "-does-not-exist"
	before := b.fingerprint(t)

	cases := []struct {
		name string
		args []string
		code int
		want string
	}{
		{"unknown flag", []string{"status", "--bogus"}, 2, "unknown flag: --bogus"},
		{"unknown command", []string{"statsu"}, 2, `unknown command "statsu"`},
		{"malformed duration", []string{"purge", "--older-than", "3x"}, 2, `invalid duration "3x"`},
		{"missing duration", []string{"purge"}, 2, "--older-than is required"},
		{"malformed timestamp", []string{"replay", "--since", "yesterday", "--yes"}, 2, `invalid timestamp "yesterday"`},
		{"empty replay range", []string{"replay", "--since", "-1h", "--until", "-2h", "--yes"}, 2, "must be after --since"},
		{"replay without --yes and no terminal", []string{"replay", "--since", "-7d"}, 1, "refusing to replay 1 events (not confirmed): stdin is not a terminal; pass --yes"},
		{"unreachable database", []string{"status", "--database-url", "postgres://sluice:secret@127.0.0.1:1/app"}, 1, "cannot reach the database postgres://sluice:xxxxx@127.0.0.1:1/app"},
		{"non-existent queue (status)", []string{"status", "--queue", missingQueue}, 1, "queue " + missingQueue + ": queue does not exist"},
		{"non-existent queue (purge)", []string{"purge", "--older-than", "1d", "--queue", missingQueue}, 1, "queue does not exist"},
		{"non-existent DLQ", []string{"redrive", "--dlq", missingQueue}, 1, "--dlq: queue " + missingQueue + ": queue does not exist"},
		{"not a queue URL", []string{"redrive", "--dlq", "billing-dlq"}, 2, "is not a queue URL"},
		{"nobody's DLQ", []string{"redrive", "--dlq", lonerURL}, 1, "is not the dead-letter queue of any queue"},
		{"purge shorter than DLQ retention", []string{"purge", "--older-than", "7d", "--queue", queueURL}, 1, "refusing to purge: --older-than 7d is not longer than the message retention of " + dlqURL},
		{"retry of a row that is not quarantined", []string{"dead", "retry", strconv.FormatInt(qid, 10), "999"}, 1, "outbox rows 999 are not quarantined"},
		{"retry id that is not a number", []string{"dead", "retry", "abc"}, 2, `"abc" is not an outbox row id`},
		{"migrate down without --yes", []string{"migrate", "down"}, 1, "refusing to roll back (not confirmed): stdin is not a terminal; pass --yes"},
		{"migrate down to an unknown version", []string{"migrate", "down", "--to", "99", "--yes"}, 2, "--to 99 is not a version"},
		{"an argument a command does not take", []string{"status", "extra"}, 2, `unknown command "extra" for "sluice status"`},
		{"unknown subcommand", []string{"dead", "bury"}, 2, `unknown command "bury" for "sluice dead"`},
		{"retry both --all and ids", []string{"dead", "retry", "--all", "1"}, 2, "give either --all or the ids"},
		{"redrive without --dlq", []string{"redrive"}, 2, "--dlq is required"},
		{"flag without its value", []string{"dead", "list", "--limit"}, 2, "flag needs an argument: --limit"},
		{"no database configured", []string{"status", "--database-url", ""}, 0, ""}, // placeholder, replaced below
	}
	cases = cases[:len(cases)-1]
	for _, tc := range cases {
		r := b.run(t, tc.args...)
		requireOneLineError(t, r, tc.code, tc.want)
		require.Equal(t, before, b.fingerprint(t), "%s changed the database", tc.name)
	}
	// No database configured at all.
	nodb := &testBundle{env: map[string]string{}}
	requireOneLineError(t, nodb.run(t, "status"), 1, "no database configured: set DATABASE_URL")
	// The nobody's-DLQ refusal left the message where it was.
	require.Equal(t, 1, queueDepth(t, c, lonerURL))
	// An unmigrated database gets a hint.
	empty := &testBundle{env: map[string]string{"DATABASE_URL": testdb.EmptyURL(t)}}
	requireOneLineError(t, empty.run(t, "status"), 1, "run `sluice migrate up`")
}

func TestMigrateUpStatusDown(t *testing.T) {
	t.Parallel()
	b := &testBundle{env: map[string]string{"DATABASE_URL": testdb.EmptyURL(t)}}
	latest := migrations.Latest()
	require.Contains(t, b.ok(t, "migrate", "status"), fmt.Sprintf("version 0 of %d", latest))
	require.Contains(t, b.ok(t, "migrate"), fmt.Sprintf("migrated from version 0 to %d", latest))
	require.Contains(t, b.ok(t, "migrate", "up"), fmt.Sprintf("already at version %d", latest))
	out := b.ok(t, "migrate", "status")
	require.Contains(t, out, fmt.Sprintf("version %d of %d", latest, latest))
	require.Regexp(t, `0001\s+outbox\s+applied`, out)
	require.Contains(t, b.ok(t, "migrate", "down", "--to", "1", "--yes"), fmt.Sprintf("rolled back from version %d to 1", latest))
	require.Regexp(t, `0002\s+inbox\s+pending`, b.ok(t, "migrate", "status"))
	requireOneLineError(t, b.run(t, "migrate", "down", "--to", "70", "--yes"), 2, "--to 70 is not a version")
	require.Contains(t, b.ok(t, "migrate", "down", "--yes"), "rolled back from version 1 to 0")
	require.Contains(t, b.ok(t, "migrate", "down", "--yes"), "nothing to roll back")
}

func TestStatusJSONGoldenAndTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	c := b.withAWS(t)
	b.insertOutbox(t, outboxRow{age: 10 * time.Minute})                          // pending, the oldest
	b.insertOutbox(t, outboxRow{age: time.Minute})                               // pending
	b.insertOutbox(t, outboxRow{age: time.Hour, quarantined: true})              // quarantined
	b.insertOutbox(t, outboxRow{age: time.Hour, publishedAgo: ago(time.Second)}) // published in the last minute
	b.insertOutbox(t, outboxRow{age: time.Hour, publishedAgo: ago(time.Hour)})
	b.insertInbox(t, "billing", "m-1", "unprocessed", 5*time.Minute)
	b.insertInbox(t, "billing", "m-2", "parked", time.Hour)
	b.insertInbox(t, "shipping", "m-1", "processed", time.Hour) // nothing pending: not listed
	queueURL, dlqURL := queuePair(t, c, false)
	for i := range 3 {
		_, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(queueURL), MessageBody: aws.String(strconv.Itoa(i))})
		require.NoError(t, err)
	}
	_, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(dlqURL), MessageBody: aws.String("dead")})
	require.NoError(t, err)

	out := b.ok(t, "status", "--json", "--queue", queueURL)
	var doc map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &doc))
	// Volatile values: check them, then normalize.
	ob := doc["outbox"].(map[string]any)
	require.InDelta(t, 600, ob["oldest_pending_age_seconds"], 30)
	ob["oldest_pending_age_seconds"] = "<about 600>"
	inb := doc["inbox"].([]any)[0].(map[string]any)
	require.InDelta(t, 300, inb["oldest_unprocessed_age_seconds"], 30)
	inb["oldest_unprocessed_age_seconds"] = "<about 300>"
	ts, err := time.Parse(time.RFC3339, doc["time"].(string))
	require.NoError(t, err)
	require.WithinDuration(t, time.Now(), ts, time.Minute)
	doc["time"] = "<now>"
	db := doc["database"].(map[string]any)
	require.GreaterOrEqual(t, db["oldest_transaction_age_seconds"], 0.0)
	require.GreaterOrEqual(t, db["horizon_xid_age"], 0.0)
	db["oldest_transaction_age_seconds"], db["oldest_transaction"], db["horizon_xid_age"] = "<age>", "<session>", "<xids>"
	q := doc["queues"].([]any)[0].(map[string]any)
	require.Equal(t, queueURL, q["url"])
	q["url"] = "<queue-url>"
	dlq := q["dlq"].(map[string]any)
	require.Equal(t, dlqURL, dlq["url"])
	dlq["url"] = "<dlq-url>"
	var normalized strings.Builder
	enc := json.NewEncoder(&normalized)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	require.NoError(t, enc.Encode(doc))
	golden(t, "status.golden.json", normalized.String())

	table := b.ok(t, "status", "--queue", queueURL)
	require.Regexp(t, `OUTBOX\s+PENDING\s+OLDEST\s+QUARANTINED\s+PUBLISHED/1m\n\s+2\s+10m\d+s\s+1\s+1`, table)
	require.Regexp(t, `billing\s+1\s+5m\d+s\s+1`, table)
	require.NotContains(t, table, "shipping")
	require.Regexp(t, regexpQuote(queueURL)+`\s+3\s+0\s+\?\s+1`, table)
}

func regexpQuote(s string) string {
	r := strings.NewReplacer(".", `\.`, "?", `\?`, "/", "/")
	return r.Replace(s)
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		require.NoError(t, os.WriteFile(path, []byte(got), 0o644))
	}
	want, err := os.ReadFile(path)
	require.NoError(t, err, "run go test -run %s -update to create %s", t.Name(), path)
	require.Equal(t, string(want), got)
}

func TestDeadListAndRetry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	q1, e1 := b.insertOutbox(t, outboxRow{aggID: "o-1", quarantined: true})
	q2, _ := b.insertOutbox(t, outboxRow{aggID: "o-2", quarantined: true})
	b.insertOutbox(t, outboxRow{aggID: "o-1"}) // blocked behind q1
	b.insertInbox(t, "billing", "m-1", "parked", time.Hour)
	b.insertInbox(t, "billing", "m-2", "parked", time.Hour)
	b.insertInbox(t, "shipping", "m-1", "parked", time.Hour)

	out := b.ok(t, "dead", "list")
	require.Contains(t, out, "Quarantined outbox rows: 2")
	require.Regexp(t, strconv.FormatInt(q1, 10)+`\s+`+e1.String()+`\s+orders\s+OrderCreated\s+o-1\s+10\s+1\s+`, out, "blocking count shown")
	require.Contains(t, out, "SNS: topic not found")
	require.Contains(t, out, "Parked inbox rows: 3")
	require.Regexp(t, `billing\s+m-1\s+OrderCreated\s+5\s+.*handler: boom`, out)

	var doc struct {
		Outbox []struct{ ID int64 }        `json:"outbox_quarantined"`
		Inbox  []struct{ Consumer string } `json:"inbox_parked"`
	}
	require.NoError(t, json.Unmarshal([]byte(b.ok(t, "dead", "list", "--json", "--consumer", "billing")), &doc))
	require.Empty(t, doc.Outbox, "--consumer shows only that consumer's inbox rows")
	require.Len(t, doc.Inbox, 2)

	before := b.fingerprint(t)
	out = b.ok(t, "dead", "retry", "--all", "--dry-run")
	require.Contains(t, out, "would retry outbox row "+strconv.FormatInt(q2, 10))
	require.Contains(t, out, "would retry inbox row shipping/m-1")
	require.Equal(t, before, b.fingerprint(t), "--dry-run changes nothing")

	require.Contains(t, b.ok(t, "dead", "retry", strconv.FormatInt(q1, 10), "--yes"), "released 1 outbox rows")
	require.Equal(t, 1, b.count(t, "SELECT count(*) FROM outbox_event WHERE quarantined_at IS NOT NULL"))
	require.Equal(t, 0, b.count(t, "SELECT attempts FROM outbox_event WHERE id = "+strconv.FormatInt(q1, 10)))

	require.Contains(t, b.ok(t, "dead", "retry", "--consumer", "billing", "m-2", "--yes"), "released 1 parked inbox rows")
	require.Equal(t, 2, b.count(t, "SELECT count(*) FROM inbox_event WHERE parked_at IS NOT NULL"))
	requireOneLineError(t, b.run(t, "dead", "retry", "--consumer", "billing", "m-2"), 1, `inbox rows m-2 of consumer "billing" are not parked or dead letters`)

	out = b.ok(t, "dead", "retry", "--all", "--yes")
	require.Contains(t, out, "released 1 outbox rows")
	require.Contains(t, out, "released 2 parked inbox rows")
	require.Equal(t, 0, b.count(t, "SELECT count(*) FROM outbox_event WHERE quarantined_at IS NOT NULL"))
	require.Equal(t, 0, b.count(t, "SELECT count(*) FROM inbox_event WHERE parked_at IS NOT NULL"))
}

func TestPurgeKeepsWhatRetentionNeeds(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.withAWS(t)
	queueURL, _ := queuePair(t, c, false)                                                          // retention 4d, DLQ 14d
	b.insertOutbox(t, outboxRow{age: 21 * 24 * time.Hour, publishedAgo: ago(20 * 24 * time.Hour)}) // purged
	b.insertOutbox(t, outboxRow{age: 21 * 24 * time.Hour, publishedAgo: ago(24 * time.Hour)})      // kept: recent
	b.insertOutbox(t, outboxRow{age: 21 * 24 * time.Hour, quarantined: true})                      // kept: never published
	b.insertInbox(t, "billing", "old", "processed", 20*24*time.Hour)                               // purged
	b.insertInbox(t, "billing", "new", "processed", 24*time.Hour)                                  // kept
	b.insertInbox(t, "billing", "parked", "parked", 20*24*time.Hour)                               // kept

	before := b.fingerprint(t)
	requireOneLineError(t, b.run(t, "purge", "--older-than", "14d", "--queue", queueURL), 1, "(DLQ of")
	require.Equal(t, before, b.fingerprint(t))
	// --outbox-only needs no queue check.
	out := b.ok(t, "purge", "--older-than", "14d", "--outbox-only", "--queue", queueURL, "--yes")
	require.Contains(t, out, "deleted 1 published outbox rows older than 14d")
	require.NotContains(t, out, "inbox")

	out = b.ok(t, "purge", "--older-than", "15d", "--queue", queueURL, "--batch-size", "1", "--yes")
	require.Contains(t, out, "deleted 0 published outbox rows")
	require.Contains(t, out, "deleted 1 processed inbox rows and dead letters older than 15d")
	require.Equal(t, 2, b.count(t, "SELECT count(*) FROM outbox_event"))
	require.Equal(t, 2, b.count(t, "SELECT count(*) FROM inbox_event"))
	require.Equal(t, 0, b.count(t, "SELECT count(*) FROM inbox_event WHERE message_id = 'old'"))

	// Without --queue the bound is SQS's 14-day maximum: a refusal, unless the risk is named.
	before = b.fingerprint(t)
	requireOneLineError(t, b.run(t, "purge", "--older-than", "7d", "--inbox-only", "--yes"), 1, "--allow-duplicate-applies")
	require.Equal(t, before, b.fingerprint(t))
	r := b.run(t, "purge", "--older-than", "7d", "--inbox-only", "--yes", "--allow-duplicate-applies")
	require.Equal(t, 0, r.code, r.err)
	require.Contains(t, r.err, "warning: --older-than 7d is not longer than the message retention of SQS's 14-day maximum")
}

func TestStatusNamesTheTransactionThatHoldsBackVacuum(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	conn, err := pgx.Connect(ctx, b.env["DATABASE_URL"])
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, "SET application_name = 'nightly-report'")
	require.NoError(t, err)
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = tx.Exec(ctx, "SELECT count(*) FROM outbox_event") // takes the snapshot
	require.NoError(t, err)
	time.Sleep(1100 * time.Millisecond)

	var st cli.Status
	require.NoError(t, json.Unmarshal([]byte(b.ok(t, "status", "--json")), &st))
	require.GreaterOrEqual(t, st.Database.OldestTransactionAgeSeconds, 1.0)
	require.Contains(t, st.Database.OldestTransaction, "nightly-report")
	require.Contains(t, st.Database.OldestTransaction, "idle in transaction")
	require.Regexp(t, `DATABASE\s+OLDEST TRANSACTION\s+AGE\s+HORIZON \(XIDS\)\n\s+session \d+ \(nightly-report, idle in transaction\)\s+\d+s\s+\d+`,
		b.ok(t, "status"))
}

// A READ COMMITTED transaction that wrote and sits idle holds no snapshot between statements,
// yet holds back VACUUM by its transaction id: status names it.
func TestStatusNamesAnIdleWriter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	require.Contains(t, b.ok(t, "status"), "(none)", "nothing holds the horizon")
	conn, err := pgx.Connect(ctx, b.env["DATABASE_URL"])
	require.NoError(t, err)
	defer conn.Close(ctx)
	// Exec without arguments: the simple protocol, which leaves no portal (and no snapshot) open.
	_, err = conn.Exec(ctx, "SET application_name = 'forgotten-psql'")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "BEGIN; CREATE TEMP TABLE scratch (n int); INSERT INTO scratch VALUES (1)")
	require.NoError(t, err)

	var st cli.Status
	require.NoError(t, json.Unmarshal([]byte(b.ok(t, "status", "--json")), &st))
	require.Contains(t, st.Database.OldestTransaction, "forgotten-psql, idle in transaction")
	require.Positive(t, st.Database.HorizonXIDAge)
	require.Contains(t, b.ok(t, "status"), "forgotten-psql, idle in transaction")
}
