package cli_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/cmd/sluice/internal/cli"
)

// runTTY runs the CLI as on a terminal, answering the confirmation with answer.
func (b *testBundle) runTTY(t *testing.T, answer string, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := cli.Run(context.Background(), args, cli.IO{
		In: strings.NewReader(answer), Out: &out, Err: &errb,
		Getenv:     func(k string) string { return b.env[k] },
		IsTerminal: func(any) bool { return true },
	})
	return result{code: code, out: out.String(), err: errb.String()}
}

// jsonLines parses every JSON line of out.
func jsonLines(t *testing.T, out string) []map[string]any {
	t.Helper()
	var lines []map[string]any
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var m map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &m), "not a JSON line: %q", sc.Text())
		lines = append(lines, m)
	}
	return lines
}

func lineOf(t *testing.T, lines []map[string]any, event string) map[string]any {
	t.Helper()
	for _, l := range lines {
		if l["event"] == event {
			return l
		}
	}
	t.Fatalf("no %q line in %v", event, lines)
	return nil
}

// Every destructive command refuses on a non-terminal without --yes, and changes nothing.
func TestDestructiveCommandsRefuseWithoutYesOnANonTerminal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	c := b.withAWS(t)
	queueURL, dlqURL := queuePair(t, c, false)
	_, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(dlqURL), MessageBody: aws.String(`{}`)})
	require.NoError(t, err)
	b.insertOutbox(t, outboxRow{age: 40 * 24 * time.Hour, publishedAgo: ago(40 * 24 * time.Hour)})
	b.insertInbox(t, "billing", "old", "processed", 40*24*time.Hour)
	b.ok(t, "partition", "convert", "inbox", "--yes")

	before := b.fingerprint(t)
	for _, args := range [][]string{
		{"purge", "--older-than", "30d"},
		{"purge", "--older-than", "30d", "--outbox-only"},
		{"partition", "maintain", "--older-than", "30d"},
		{"redrive", "--dlq", dlqURL},
	} {
		r := b.run(t, args...)
		requireOneLineError(t, r, 1, "stdin is not a terminal; pass --yes to confirm")
		require.Contains(t, r.err, "Nothing was changed", args)
	}
	require.Equal(t, before, b.fingerprint(t))
	require.Equal(t, 1, queueDepth(t, c, dlqURL))
	require.Equal(t, 0, queueDepth(t, c, queueURL))

	// On a terminal: "n" refuses, "y" proceeds.
	r := b.runTTY(t, "n\n", "purge", "--older-than", "30d", "--outbox-only")
	require.Equal(t, 1, r.code)
	require.Contains(t, r.err, "[y/N]")
	require.Equal(t, before, b.fingerprint(t))
	r = b.runTTY(t, "y\n", "purge", "--older-than", "30d", "--outbox-only")
	require.Equal(t, 0, r.code, r.err)
	require.Contains(t, r.out, "deleted 1 published outbox rows")
}

// A dry run changes nothing and reports exactly what the run then does, including where the
// batched walk stops early (a batch holding a row created after the cutoff).
func TestPurgeDryRunReportsWhatTheRunDoes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	old := 40 * 24 * time.Hour
	id1, _ := b.insertOutbox(t, outboxRow{age: old, publishedAgo: ago(old)})
	b.insertOutbox(t, outboxRow{age: old, publishedAgo: ago(old)})
	id3, _ := b.insertOutbox(t, outboxRow{age: old, publishedAgo: ago(old)})
	b.insertOutbox(t, outboxRow{age: time.Hour})                   // young: the walk stops after its batch
	b.insertOutbox(t, outboxRow{age: old, publishedAgo: ago(old)}) // beyond it: kept by this run
	b.insertOutbox(t, outboxRow{age: old, publishedAgo: ago(old)}) // likewise
	b.insertInbox(t, "billing", "b-old", "processed", old)
	b.insertInbox(t, "billing", "b-old2", "processed", old)
	b.insertInbox(t, "shipping", "s-old", "processed", old)
	b.insertInbox(t, "shipping", "s-new", "processed", time.Hour)
	b.insertInbox(t, "shipping", "s-parked", "parked", old)

	before := b.fingerprint(t)
	out := b.ok(t, "purge", "--older-than", "30d", "--batch-size", "2", "--dry-run")
	require.Equal(t, before, b.fingerprint(t), "a dry run changes nothing")
	require.Contains(t, out, "Dry run: would delete rows older than the cutoff")
	require.Contains(t, out, fmt.Sprintf("outbox_event: 3 published rows, ids %d..%d", id1, id3))
	require.Contains(t, out, "inbox_event: 3 processed rows")
	require.Contains(t, out, "consumer billing: 2 rows")
	require.Contains(t, out, "consumer shipping: 1 rows")

	planLines := jsonLines(t, b.ok(t, "purge", "--older-than", "30d", "--batch-size", "2", "--dry-run", "--json"))
	plan := lineOf(t, planLines, "plan")["plan"].(map[string]any)
	require.EqualValues(t, 3, plan["outbox"].(map[string]any)["rows"])
	require.EqualValues(t, 3, plan["inbox"].(map[string]any)["rows"])
	require.Equal(t, before, b.fingerprint(t))

	out = b.ok(t, "purge", "--older-than", "30d", "--batch-size", "2", "--yes")
	require.Contains(t, out, "deleted 3 published outbox rows")
	require.Contains(t, out, "deleted 3 processed inbox rows")
	require.Equal(t, 3, b.count(t, "SELECT count(*) FROM outbox_event"))
	require.Equal(t, 0, b.count(t, fmt.Sprintf("SELECT count(*) FROM outbox_event WHERE id <= %d", id3)))
	require.Equal(t, 2, b.count(t, "SELECT count(*) FROM inbox_event"))
}

func TestPartitionMaintainDryRunReportsWhatTheRunDrops(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.ok(t, "partition", "convert", "outbox", "--size", "2", "--ahead", "1", "--yes")
	for range 4 {
		b.insertOutbox(t, outboxRow{age: 50 * 24 * time.Hour, publishedAgo: ago(40 * 24 * time.Hour)})
	}
	b.ok(t, "partition", "maintain", "--outbox-only", "--size", "2", "--ahead", "3")
	b.insertOutbox(t, outboxRow{age: 50 * 24 * time.Hour}) // unpublished: its partition is kept

	before := b.fingerprint(t)
	layout := b.ok(t, "partition", "status")
	out := b.ok(t, "partition", "maintain", "--outbox-only", "--older-than", "30d", "--dry-run")
	require.Equal(t, before, b.fingerprint(t))
	require.Equal(t, layout, b.ok(t, "partition", "status"), "a dry run creates and drops nothing")
	drop := regexp.MustCompile(`outbox_event: would drop (\S+ \[[^)]*\))`).FindAllStringSubmatch(out, -1)
	require.Len(t, drop, 2, out)

	out = b.ok(t, "partition", "maintain", "--outbox-only", "--older-than", "30d", "--yes")
	got := regexp.MustCompile(`outbox_event: dropped (\S+ \[[^)]*\))`).FindAllStringSubmatch(out, -1)
	require.Equal(t, drop[0][1], got[0][1])
	require.Equal(t, drop[1][1], got[1][1])
	require.Len(t, got, 2)
}

func TestRedriveDryRunReportsWhatTheRunMoves(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	c := b.withAWS(t)
	queueURL, dlqURL := queuePair(t, c, false)
	for i := range 7 {
		_, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(dlqURL), MessageBody: aws.String(strconv.Itoa(i))})
		require.NoError(t, err)
	}
	out := b.ok(t, "redrive", "--dlq", dlqURL, "--dry-run")
	require.Contains(t, out, fmt.Sprintf("Dry run: would move ~7 messages from %s to %s", dlqURL, queueURL))
	require.Equal(t, 7, queueDepth(t, c, dlqURL))
	require.Equal(t, 0, queueDepth(t, c, queueURL))

	lines := jsonLines(t, b.ok(t, "redrive", "--dlq", dlqURL, "--yes", "--json"))
	require.EqualValues(t, 7, lineOf(t, lines, "plan")["plan"].(map[string]any)["messages"])
	require.EqualValues(t, 7, lineOf(t, lines, "result")["moved"])
	require.Equal(t, 7, queueDepth(t, c, queueURL))
	require.Equal(t, 0, queueDepth(t, c, dlqURL))
}

// stopAfter is stdout that cancels the command's context once it printed n progress lines
// (Ctrl-C in the middle of a purge).
type stopAfter struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	n      int
	cancel context.CancelFunc
}

func (s *stopAfter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if bytes.Contains(p, []byte(`"event":"progress"`)) {
		if s.n--; s.n == 0 {
			s.cancel()
		}
	}
	return s.buf.Write(p)
}

// A purge of a large table shows its progress as JSON lines, and Ctrl-C stops it at a batch
// boundary with how to resume; running it again finishes.
func TestPurgeProgressAndInterruptionOnALargeTable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	const rows, batch = 30000, 1000
	_, err := b.pool.Exec(ctx, `
		INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload, created_at, published_at)
		SELECT gen_random_uuid(), 'orders', 'order', 'o-' || g, 'OrderCreated', 'o-' || g, '{}', now() - interval '40 days', now() - interval '40 days'
		FROM generate_series(1, $1) g`, rows)
	require.NoError(t, err)

	ictx, cancel := context.WithCancel(ctx)
	defer cancel()
	out := &stopAfter{n: 3, cancel: cancel}
	var errb bytes.Buffer
	code := cli.Run(ictx, []string{"purge", "--older-than", "30d", "--outbox-only", "--batch-size", strconv.Itoa(batch), "--yes", "--json"},
		cli.IO{Out: out, Err: &errb, Getenv: func(k string) string { return b.env[k] }})
	require.Equal(t, 1, code, errb.String())
	require.Contains(t, errb.String(), "interrupted after deleting")
	require.Contains(t, errb.String(), "at a batch boundary")
	require.Contains(t, errb.String(), "run the same command to continue")

	lines := jsonLines(t, out.buf.String())
	require.EqualValues(t, rows, lineOf(t, lines, "plan")["plan"].(map[string]any)["outbox"].(map[string]any)["rows"])
	p := lineOf(t, lines, "progress")
	require.EqualValues(t, rows, p["total"])
	require.Contains(t, p, "rate_per_second")
	require.Contains(t, p, "done")
	res := lineOf(t, lines, "result")
	require.Equal(t, true, res["interrupted"])
	deleted := int(res["outbox_deleted"].(float64))
	require.Positive(t, deleted)
	require.Less(t, deleted, rows, "stopped before the end")
	require.Zero(t, deleted%batch, "stopped at a batch boundary")
	require.Equal(t, rows-deleted, b.count(t, "SELECT count(*) FROM outbox_event"), "exactly what it reported is gone")

	require.Contains(t, b.ok(t, "purge", "--older-than", "30d", "--outbox-only", "--yes"), fmt.Sprintf("deleted %d published outbox rows", rows-deleted))
	require.Equal(t, 0, b.count(t, "SELECT count(*) FROM outbox_event"))
}
