package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/demoapp"
	"github.com/sluicehq/sluice/internal/localaws"
	"github.com/sluicehq/sluice/internal/localrun"
	"github.com/sluicehq/sluice/pkg/inbox"
)

// The proof of consumer dead letters, end to end through the real relay and ledger Lambdas: a
// poison order (a currency the ledger's reference data lacks) fails every receive and SQS moves
// it to the DLQ; `sluice dead list` and `sluice dead show` give its error and payload; the cause
// is fixed (the currency added); `sluice dead retry` applies it once through the consumer's
// processor schedule; `sluice redrive` of the DLQ copy too applies nothing more.
func TestDeadLetterRetryAfterTheDLQ(t *testing.T) {
	t.Parallel()
	const maxReceives = 2
	b := setup(t, func(o *localrun.StackOptions) { o.MaxReceiveCount = maxReceives })
	cli := newSluiceCLI(t, b.dbURL, localaws.TestEndpoint(t))
	poisonID, _ := b.placePoison(t, 6)

	b.waitUntil(t, 90*time.Second, "the poison order in the DLQ and dead", func() (bool, string) {
		dlq := b.queueDepth(t, b.stack.Pipeline.DLQURL)
		st := b.deadLetterState(t, poisonID)
		return dlq == 1 && st == inbox.DeadDead, fmt.Sprintf("DLQ %d, dead letter %q", dlq, st)
	})
	list := cli.ok(t, "dead", "list", "--consumer", localrun.DefaultConsumerName)
	require.Contains(t, list, "Consumer dead letters: 1")
	require.Regexp(t, poisonID+`\s+OrderCreated\s+aws:sqs\s+`+strconv.Itoa(maxReceives)+`\s+dead\s+\S+\s+handler-error\s+message `+poisonID, list)
	show := cli.ok(t, "dead", "show", "--consumer", localrun.DefaultConsumerName, poisonID)
	require.Contains(t, show, `unknown currency "XTS"`, "the error")
	require.Contains(t, show, `"currency":"XTS"`, "the payload")
	require.Regexp(t, `Receive count:\s+`+strconv.Itoa(maxReceives), show)
	require.Contains(t, show, b.stack.Pipeline.QueueARN)

	b.fixCurrency(t, "XTS")
	require.Contains(t, cli.ok(t, "dead", "retry", "--consumer", localrun.DefaultConsumerName, poisonID, "--yes"), "stored 1 dead letters")
	b.waitUntil(t, 60*time.Second, "the retried order applied by the processor", func() (bool, string) {
		n := b.ledgerEntries(t, poisonID)
		return n == 1, fmt.Sprintf("%d ledger entries", n)
	})

	// The DLQ copy redriven too: the consumer finds it in the inbox.
	before := b.stack.Source.Stats().Deleted
	require.Contains(t, cli.ok(t, "redrive", "--dlq", b.stack.Pipeline.DLQURL, "--yes"), "1")
	b.waitUntil(t, 60*time.Second, "the redriven copy consumed", func() (bool, string) {
		after := b.stack.Source.Stats().Deleted
		return after > before && b.queueDepth(t, b.stack.Pipeline.DLQURL) == 0, fmt.Sprintf("deleted %d → %d", before, after)
	})
	v := b.waitApplied(t, 60*time.Second)
	require.Zero(t, v.Lost)
	require.Zero(t, v.AppliedTwice)
	require.Equal(t, 1, b.ledgerEntries(t, poisonID), "applied exactly once")
	require.Equal(t, inbox.DeadApplied, b.deadLetterState(t, poisonID))
	require.Contains(t, cli.ok(t, "dead", "list", "--consumer", localrun.DefaultConsumerName), "Consumer dead letters: 0")
}

// The same through a Kafka event source mapping's failure path: the mapping passes over the
// poison record after its last retry (its failure record holds offsets, not the data); the dead
// letter holds the payload; after the fix `sluice dead retry` applies it once, and the record
// delivered again (the mapping re-reading the topic, or `sluice replay`) applies nothing more.
func TestDeadLetterRetryAfterAKafkaMappingGivesUp(t *testing.T) {
	t.Parallel()
	const retries = 2
	k := setupKafkaWith(t, 1, func(o *localrun.KafkaStackOptions) { o.MaxRetryAttempts = retries })
	cli := newSluiceCLI(t, k.dbURL, "")
	poisonID, poisonOrder := k.placePoison(t, 6)

	k.waitUntil(t, 90*time.Second, "the mapping past the poison record, its dead letter dead", func() (bool, string) {
		st := k.deadLetterState(t, poisonID)
		return k.kstack.Source.Stats().Discarded == 1 && st == inbox.DeadDead, fmt.Sprintf("%+v, dead letter %q", k.kstack.Source.Stats(), st)
	})
	show := cli.ok(t, "dead", "show", "--consumer", localrun.DefaultConsumerName, poisonID)
	require.Contains(t, show, `"currency":"XTS"`)
	require.Regexp(t, `Attempts:\s+`+strconv.Itoa(retries+1), show)
	require.Regexp(t, `Source:\s+kafka`, show)
	require.Regexp(t, `Position:\s+0@\d+`, show)
	// The orders after it in its partition went on.
	k.waitUntil(t, 60*time.Second, "the other orders applied", func() (bool, string) {
		p, err := demoapp.ProgressOf(k.ctx, k.pool, k.prefix)
		require.NoError(t, err)
		return p.Applied == k.written-1, fmt.Sprintf("%d of %d", p.Applied, k.written-1)
	})

	k.fixCurrency(t, "XTS")
	require.Contains(t, cli.ok(t, "dead", "retry", "--consumer", localrun.DefaultConsumerName, poisonID, "--yes"), "stored 1 dead letters")
	k.waitUntil(t, 60*time.Second, "the retried order applied by the processor", func() (bool, string) {
		n := k.ledgerEntries(t, poisonID)
		return n == 1, fmt.Sprintf("%d ledger entries", n)
	})

	// Delivered again: `sluice replay` has the relay publish the event once more, and the
	// mapping delivers it: a duplicate.
	before := k.kstack.Source.Stats()
	require.Contains(t, cli.ok(t, "replay", "--since", "-1h", "--aggregate-type", "order", "--aggregate-id", poisonOrder, "--yes"), "marked 1 events")
	k.waitUntil(t, 60*time.Second, "the record delivered again and acknowledged", func() (bool, string) {
		now := k.kstack.Source.Stats()
		return now.Deleted > before.Deleted, fmt.Sprintf("before %+v, now %+v", before, now)
	})
	require.Equal(t, before.ReportedFailures, k.kstack.Source.Stats().ReportedFailures, "the duplicate did not fail")
	k.waitApplied(t, 60*time.Second)
	require.Equal(t, 1, k.ledgerEntries(t, poisonID), "applied exactly once")
	require.Equal(t, inbox.DeadApplied, k.deadLetterState(t, poisonID))
}

// placePoison places n orders of which the middle one has a currency the ledger does not know,
// and returns that order's event id (its message id) and order id.
func (b *bundle) placePoison(t *testing.T, n int) (eventID, orderID string) {
	t.Helper()
	poison := ""
	b.place(t, n, 3, 0, func(i int, o *demoapp.OrderCreated) {
		if i == n/2 {
			o.Currency, poison = "XTS", o.OrderID
		}
	})
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT event_id::text FROM outbox_event WHERE aggregate_id = $1`, poison).Scan(&eventID))
	return eventID, poison
}

// fixCurrency adds code to the ledger's reference data: the fix of the poison order's cause.
func (b *bundle) fixCurrency(t *testing.T, code string) {
	t.Helper()
	_, err := b.pool.Exec(b.ctx, `INSERT INTO demo_currencies (code) VALUES ($1) ON CONFLICT DO NOTHING`, code)
	require.NoError(t, err)
}

// ledgerEntries counts the ledger entries of a message.
func (b *bundle) ledgerEntries(t *testing.T, messageID string) int {
	t.Helper()
	var n int
	require.NoError(t, b.pool.QueryRow(b.ctx, `SELECT count(*) FROM demo_ledger WHERE message_id = $1`, messageID).Scan(&n))
	return n
}

// deadLetterState is the state of a message's dead letter, "" when it has none.
func (b *bundle) deadLetterState(t *testing.T, messageID string) inbox.DeadLetterState {
	t.Helper()
	dl, err := inbox.ListDeadLetters(b.ctx, b.pool, inbox.DeadLetterFilter{Consumer: localrun.DefaultConsumerName, Keys: []string{messageID}, IncludeApplied: true})
	require.NoError(t, err)
	if len(dl) == 0 {
		return ""
	}
	return dl[0].State
}

// queueDepth is a queue's visible plus in-flight messages.
func (b *bundle) queueDepth(t *testing.T, url string) int {
	t.Helper()
	out, err := b.stack.SQS.GetQueueAttributes(b.ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(url),
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameApproximateNumberOfMessages, sqstypes.QueueAttributeNameApproximateNumberOfMessagesNotVisible}})
	require.NoError(t, err)
	visible, _ := strconv.Atoi(out.Attributes[string(sqstypes.QueueAttributeNameApproximateNumberOfMessages)])
	inFlight, _ := strconv.Atoi(out.Attributes[string(sqstypes.QueueAttributeNameApproximateNumberOfMessagesNotVisible)])
	return visible + inFlight
}

var (
	cliOnce sync.Once
	cliBin  string
	cliErr  error
)

// sluiceCLI runs the operator CLI (cmd/sluice, built once per test binary) against one
// test's database and AWS endpoint.
type sluiceCLI struct {
	bin string
	env []string
}

func newSluiceCLI(t *testing.T, dbURL, endpoint string) *sluiceCLI {
	t.Helper()
	_, bins := binaries(t)
	cliOnce.Do(func() {
		root, err := localaws.RepoRoot()
		if err != nil {
			cliErr = err
			return
		}
		cliBin = filepath.Join(bins, "sluice")
		cmd := exec.Command("go", "build", "-trimpath", "-o", cliBin, "./cmd/sluice")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			cliErr = fmt.Errorf("build the sluice CLI: %w: %s", err, out)
		}
	})
	require.NoError(t, cliErr)
	env := append(os.Environ(), "DATABASE_URL="+dbURL, "AWS_REGION="+localaws.Region(), "AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test")
	if endpoint != "" {
		env = append(env, "AWS_ENDPOINT_URL="+endpoint)
	}
	return &sluiceCLI{bin: cliBin, env: env}
}

// ok runs the CLI with args, requires it to succeed, and returns its output.
func (c *sluiceCLI) ok(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, c.bin, args...)
	cmd.Env = c.env
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "sluice %s: %s", strings.Join(args, " "), out)
	return string(out)
}
