package inbox_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/internal/localaws"
	"github.com/sluicehq/sluice/internal/localrun"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// TestOneTraceFromWriteToApply is the proof: events written inside spans go through a
// real outbox.Relay (PostgreSQL) to SNS and SQS (the local emulator) and through the inbox; each
// event's consumer spans are in its writer's trace, children of the writer's span, the relay's
// publish span links to the writer's span, and a duplicate delivery and a failing handler show
// as such.
func TestOneTraceFromWriteToApply(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	tp, exp := spans(t)
	cfg := localaws.TestConfig(t)
	snsc, sqsc := sns.NewFromConfig(cfg), sqs.NewFromConfig(cfg)
	p, err := localrun.CreatePipeline(ctx, snsc, sqsc, localrun.PipelineOptions{Name: "trace-" + uuid.NewString()[:8], VisibilityTimeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { p.Delete(context.WithoutCancel(ctx), snsc, sqsc) })

	// The orders service: two events, each written in its own span and transaction.
	writers := map[string]trace.SpanContext{}
	for _, s := range []struct {
		name string
		body script
	}{{"ok", script{N: 1}}, {"bad", script{N: 2, Fail: "error"}}} {
		wctx, span := tp.Tracer("orders").Start(ctx, "place order "+s.name)
		payload, _ := json.Marshal(s.body)
		tx, err := b.pool.Begin(wctx)
		require.NoError(t, err)
		w, err := outbox.Write(wctx, tx, outbox.Message{Topic: "orders", AggregateType: "order", AggregateID: s.name,
			EventType: "Scripted", Payload: payload})
		require.NoError(t, err)
		require.NoError(t, tx.Commit(wctx))
		span.End()
		writers[w[0].EventID.String()] = span.SpanContext()
	}

	relay, err := outbox.NewRelay(b.pool, outbox.RelayConfig{Publisher: outbox.NewSNSPublisher(snsc),
		Topics: map[string]string{"orders": p.TopicARN}, TracerProvider: tp, Logger: quiet})
	require.NoError(t, err)
	st, err := relay.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, st.Published)

	msgs := receive(t, sqsc, p.QueueURL, 2)
	event := localrun.SQSEvent(msgs, p.QueueARN)
	c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "ledger", Router: router("ledger"), Logger: quiet, TracerProvider: tp, TraceAsChild: true})
	require.NoError(t, err)
	first := c.Process(ctx, event)
	again := c.Process(ctx, event) // SQS delivers again: the applied one is a duplicate
	require.Equal(t, 1, first.Count(inbox.Applied))
	require.Equal(t, 1, first.Count(inbox.Failed))
	require.Equal(t, 1, again.Count(inbox.Duplicate))

	consumers := byMessage(t, exp)
	var publishLinks []sdktrace.Link
	for _, s := range exp.GetSpans() {
		if s.SpanKind == trace.SpanKindProducer {
			require.True(t, strings.HasPrefix(s.Name, "publish "), s.Name)
			publishLinks = append(publishLinks, s.Links...)
		}
	}
	for id, w := range writers {
		var linked bool
		for _, l := range publishLinks {
			linked = linked || l.SpanContext.SpanID() == w.SpanID()
		}
		require.True(t, linked, "the publish span links to the writer of %s", id)
		got := consumers[id]
		require.Len(t, got, 2, "a consumer span per delivery of %s", id)
		var seen []string
		for _, s := range got {
			require.Equal(t, w.TraceID(), s.SpanContext.TraceID(), "%s: the consumer span is in the writer's trace", id)
			require.Equal(t, w.SpanID(), s.Parent.SpanID(), "%s: a child of the writer's span", id)
			outcome := attrsOf(s)["sluice.inbox.outcome"].(string)
			seen = append(seen, outcome)
			if outcome == "failed" {
				require.Equal(t, codes.Error, s.Status.Code)
			}
		}
		if id == firstID(first, inbox.Applied) {
			require.ElementsMatch(t, []string{"applied", "duplicate"}, seen)
		} else {
			require.ElementsMatch(t, []string{"failed", "failed"}, seen)
		}
	}
}

func firstID(rep inbox.Report, o inbox.Outcome) string {
	for _, r := range rep.Results {
		if r.Outcome == o {
			return r.MessageID
		}
	}
	return ""
}

func receive(t *testing.T, c *sqs.Client, url string, n int) []sqstypes.Message {
	t.Helper()
	var got []sqstypes.Message
	w := testwait.Watch[int](t, "every message received")
	for len(got) < n {
		w.Check(len(got))
		out, err := c.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(url), MaxNumberOfMessages: 10, WaitTimeSeconds: 1, VisibilityTimeout: 30,
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll},
		})
		require.NoError(t, err)
		got = append(got, out.Messages...)
	}
	require.Len(t, got, n)
	return got
}
