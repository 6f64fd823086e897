package cli_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/aws/aws-lambda-go/events"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/pkg/inbox"
)

// sqsRecord is an SQS record of a sluice message (messageId and eventType attributes) on its
// last receive, or a body that is no message at all when id is "".
func sqsRecord(sqsID, id, body string) events.SQSMessage {
	m := events.SQSMessage{MessageId: sqsID, Body: body, EventSource: "aws:sqs", EventSourceARN: "arn:aws:sqs:eu-west-1:123456789012:billing",
		Attributes: map[string]string{"ApproximateReceiveCount": "1"}, MessageAttributes: map[string]events.SQSMessageAttribute{}}
	if id != "" {
		for k, v := range map[string]string{"messageId": id, "eventType": "OrderCreated"} {
			m.MessageAttributes[k] = events.SQSMessageAttribute{DataType: "String", StringValue: &v}
		}
	}
	return m
}

// The consumers' dead letters in `sluice dead`: listed with their state and class, shown with
// their payload and error chain, retried (stored for the processor) once; --all passes over a
// record that could not be parsed and says why.
func TestDeadLettersListShowRetry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	r := inbox.NewRouter(inbox.FailUnknown)
	r.Handle("OrderCreated", func(context.Context, pgx.Tx, inbox.Message) error { return errors.New("ledger closed") })
	c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "billing", Router: r, SQSMaxReceiveCount: 1})
	require.NoError(t, err)
	rep := c.Process(ctx, events.SQSEvent{Records: []events.SQSMessage{
		sqsRecord("sqs-1", "m-1", `{"order":1}`), sqsRecord("sqs-2", "", "garbage")}})
	require.True(t, rep.Results[0].Dead)
	require.True(t, rep.Results[1].Dead)

	out := b.ok(t, "dead", "list", "--consumer", "billing")
	require.Contains(t, out, "Consumer dead letters: 2")
	require.Regexp(t, `billing\s+m-1\s+OrderCreated\s+aws:sqs\s+1\s+dead\s+\S+\s+handler-error\s+.*ledger closed`, out)
	require.Regexp(t, `billing\s+arn:aws:sqs:eu-west-1:123456789012:billing/sqs-2\s+-\s+aws:sqs\s+1\s+dead\s+\S+\s+bad-message`, out)

	show := b.ok(t, "dead", "show", "--consumer", "billing", "m-1")
	require.Regexp(t, `Error class:\s+handler-error`, show)
	require.Contains(t, show, "*errors.errorString: ledger closed")
	require.Contains(t, show, "Payload:\n{\"order\":1}")
	var doc inbox.DeadLetter
	require.NoError(t, json.Unmarshal([]byte(b.ok(t, "dead", "show", "--consumer", "billing", "--json", "m-1")), &doc))
	require.Equal(t, inbox.DeadDead, doc.State)
	requireOneLineError(t, b.run(t, "dead", "show", "--consumer", "billing", "m-9"), 1, `no dead letter "m-9" of consumer "billing"`)
	requireOneLineError(t, b.run(t, "dead", "show", "m-1"), 2, "--consumer is required")

	before := b.fingerprint(t)
	out = b.ok(t, "dead", "retry", "--all", "--consumer", "billing", "--dry-run")
	require.Contains(t, out, "would retry dead letter billing/m-1 (OrderCreated)")
	require.Contains(t, out, "cannot retry dead letter billing/arn:aws:sqs:eu-west-1:123456789012:billing/sqs-2 through the inbox (bad-message)")
	require.Equal(t, before, b.fingerprint(t), "--dry-run changes nothing")

	out = b.ok(t, "dead", "retry", "--all", "--consumer", "billing", "--yes")
	require.Contains(t, out, "stored 1 dead letters for the consumer's processor: billing/m-1")
	require.Equal(t, 1, b.count(t, "SELECT count(*) FROM inbox_event WHERE consumer = 'billing' AND message_id = 'm-1' AND processed_at IS NULL"))
	require.Regexp(t, `billing\s+m-1\s+OrderCreated\s+aws:sqs\s+1\s+retrying`, b.ok(t, "dead", "list"))
	require.Contains(t, b.ok(t, "dead", "retry", "--consumer", "billing", "m-1", "--yes"), "already in the inbox, nothing to do (applied or waiting): billing/m-1")
	requireOneLineError(t, b.run(t, "dead", "retry", "--consumer", "billing", "arn:aws:sqs:eu-west-1:123456789012:billing/sqs-2"), 1,
		"cannot be retried through the inbox")
}
