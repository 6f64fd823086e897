package localrun

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"
)

// Schedule plays EventBridge: it invokes a function with a "Scheduled Event" every interval,
// as a rate() rule does. Like EventBridge it does not wait for earlier invocations; when every
// instance is busy the tick is skipped (Lambda would throttle it).
type Schedule struct {
	// Function is invoked. Required.
	Function *Function
	// Every is the rule's rate. Defaults to 1 minute, EventBridge's floor.
	Every time.Duration
	// Rule names the rule in the event's resources. Defaults to "sluice-relay-schedule".
	Rule string
	// Logger receives failed invocations. Defaults to slog.Default().
	Logger *slog.Logger

	invocations, failures atomic.Int64
	mu                    sync.Mutex
	spans                 []Span
}

// Span is one invocation a Schedule made: when it was sent and when its response came back.
type Span struct {
	Start, End time.Time
	// Failed: the invocation returned an error.
	Failed bool
}

// Run fires at once and then every interval until ctx ends, and waits for the invocations it started.
func (s *Schedule) Run(ctx context.Context) {
	every, rule, log := s.Every, s.Rule, s.Logger
	if every == 0 {
		every = time.Minute
	}
	if rule == "" {
		rule = "sluice-relay-schedule"
	}
	if log == nil {
		log = slog.Default()
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	fire := func() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ev := events.EventBridgeEvent{Version: "0", ID: uuid.NewString(), DetailType: "Scheduled Event", Source: "aws.events",
				AccountID: "000000000000", Time: time.Now().UTC().Truncate(time.Second), Region: region(),
				Resources: []string{"arn:aws:events:" + region() + ":000000000000:rule/" + rule}, Detail: json.RawMessage("{}")}
			var in *instance
			select {
			case in = <-s.Function.free:
			default:
				return // every instance busy: Lambda would throttle this tick
			}
			defer func() { s.Function.free <- in }()
			s.invocations.Add(1)
			start := time.Now()
			err := s.Function.invokeOn(ctx, in, ev, nil)
			s.mu.Lock()
			s.spans = append(s.spans, Span{Start: start, End: time.Now(), Failed: err != nil})
			s.mu.Unlock()
			if err != nil && ctx.Err() == nil {
				s.failures.Add(1)
				log.Warn("scheduled invocation failed", "function", s.Function.opts.Name, "error", err)
			}
		}()
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for fire(); ; {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			fire()
		}
	}
}

// Spans returns the invocations that ended so far, in the order they ended.
func (s *Schedule) Spans() []Span {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Span(nil), s.spans...)
}

// Invocations returns the number of invocations made and of those that failed.
func (s *Schedule) Invocations() (total, failed int64) {
	return s.invocations.Load(), s.failures.Load()
}

// EventSource plays the SQS event source mapping with ReportBatchItemFailures: pollers
// long-poll the queue, invoke the function with each batch, and delete only the records the
// function did not report as failed. A failed invocation deletes nothing. Undeleted records
// reappear after the visibility timeout and move to the DLQ after maxReceiveCount.
type EventSource struct {
	// SQS is the client. Required.
	SQS *sqs.Client
	// QueueURL and QueueARN name the queue. Required.
	QueueURL, QueueARN string
	// Function is invoked. Required.
	Function *Function
	// BatchSize is the most records per invocation (SQS's limit per receive is 10). Defaults to 10.
	BatchSize int
	// Pollers is the number of concurrent pollers. Defaults to the function's instances.
	Pollers int
	// Logger receives errors. Defaults to slog.Default().
	Logger *slog.Logger

	invocations, failedInvocations, deleted, reportedFailures atomic.Int64
	// receiving makes the pollers of a FIFO queue take turns to receive (see poll).
	receiving sync.Mutex
}

// EventSourceStats counts what an EventSource did.
type EventSourceStats struct {
	Invocations, FailedInvocations, Deleted, ReportedFailures int64
	// Discarded counts records a stream mapping passed over after its last retry
	// (KafkaEventSource.MaxRetryAttempts); SQS moves them to the DLQ instead.
	Discarded int64
}

// Stats returns the counts so far.
func (e *EventSource) Stats() EventSourceStats {
	return EventSourceStats{Invocations: e.invocations.Load(), FailedInvocations: e.failedInvocations.Load(),
		Deleted: e.deleted.Load(), ReportedFailures: e.reportedFailures.Load()}
}

// Run polls until ctx ends.
func (e *EventSource) Run(ctx context.Context) {
	n := e.Pollers
	if n == 0 {
		n = len(e.Function.instances)
	}
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e.poll(ctx)
		}()
	}
	wg.Wait()
}

func (e *EventSource) poll(ctx context.Context) {
	log := e.Logger
	if log == nil {
		log = slog.Default()
	}
	batch := e.BatchSize
	if batch == 0 {
		batch = 10
	}
	// On a FIFO queue the pollers take turns to receive. SQS never hands out a message group's
	// next message while an earlier one is in flight, and the Lambda ESM relies on it; moto_server
	// checks the groups in flight when a long poll begins, so a poll that was already waiting
	// when another poller took a group's head can return that group's next message, and two
	// invocations then apply one group out of order. One receive at a time begins every poll
	// after the previous one returned, which keeps the group's order on any emulator.
	fifo := strings.HasSuffix(e.QueueURL, ".fifo")
	for ctx.Err() == nil {
		if fifo {
			e.receiving.Lock()
		}
		out, err := e.SQS.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(e.QueueURL), MaxNumberOfMessages: int32(min(batch, 10)), WaitTimeSeconds: 1,
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll},
			MessageAttributeNames:       []string{"All"},
		})
		if fifo {
			e.receiving.Unlock()
		}
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("event source: receive failed", "error", err)
				sleep(ctx, 500*time.Millisecond)
			}
			continue
		}
		if len(out.Messages) == 0 {
			continue
		}
		ev := SQSEvent(out.Messages, e.QueueARN)
		var resp events.SQSEventResponse
		e.invocations.Add(1)
		// The invocation runs to its end even when we are stopping, as Lambda's would.
		if err := e.Function.Invoke(context.WithoutCancel(ctx), ev, &resp); err != nil {
			e.failedInvocations.Add(1)
			log.Warn("event source: invocation failed; the batch will be received again", "error", err)
			continue
		}
		failed := map[string]bool{}
		for _, f := range resp.BatchItemFailures {
			failed[f.ItemIdentifier] = true
		}
		if failed[""] {
			// An empty identifier fails the whole batch, as Lambda does.
			e.reportedFailures.Add(int64(len(out.Messages)))
			continue
		}
		var del []sqstypes.DeleteMessageBatchRequestEntry
		for i, m := range out.Messages {
			if failed[aws.ToString(m.MessageId)] {
				e.reportedFailures.Add(1)
				continue
			}
			del = append(del, sqstypes.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle})
		}
		if len(del) == 0 {
			continue
		}
		d, err := e.SQS.DeleteMessageBatch(context.WithoutCancel(ctx), &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(e.QueueURL), Entries: del})
		if err != nil {
			log.Warn("event source: delete failed; the records will be delivered again", "error", err)
			continue
		}
		e.deleted.Add(int64(len(d.Successful)))
	}
}

// SQSEvent converts received messages into the Lambda SQS event the event source mapping sends.
func SQSEvent(msgs []sqstypes.Message, queueARN string) events.SQSEvent {
	ev := events.SQSEvent{Records: make([]events.SQSMessage, 0, len(msgs))}
	for _, m := range msgs {
		rec := events.SQSMessage{
			MessageId: aws.ToString(m.MessageId), ReceiptHandle: aws.ToString(m.ReceiptHandle), Body: aws.ToString(m.Body),
			Md5OfBody: aws.ToString(m.MD5OfBody), Md5OfMessageAttributes: aws.ToString(m.MD5OfMessageAttributes),
			Attributes: m.Attributes, MessageAttributes: map[string]events.SQSMessageAttribute{},
			EventSourceARN: queueARN, EventSource: "aws:sqs", AWSRegion: region(),
		}
		for k, v := range m.MessageAttributes {
			rec.MessageAttributes[k] = events.SQSMessageAttribute{DataType: aws.ToString(v.DataType), StringValue: v.StringValue, BinaryValue: v.BinaryValue}
		}
		ev.Records = append(ev.Records, rec)
	}
	return ev
}

// Redrive moves every message from the queue at from to the queue at to (receive, send, delete),
// keeping body and message attributes and, for FIFO queues, the message group. It returns the
// number moved. It is the portable equivalent of StartMessageMoveTask, which emulators lack.
func Redrive(ctx context.Context, sqsc *sqs.Client, from, to string, fifo bool) (int, error) {
	moved, empty := 0, 0
	for empty < 2 {
		out, err := sqsc.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(from), MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
			VisibilityTimeout:           30,
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll},
			MessageAttributeNames:       []string{"All"}})
		if err != nil {
			return moved, fmt.Errorf("receive from %s: %w", from, err)
		}
		if len(out.Messages) == 0 {
			empty++
			continue
		}
		empty = 0
		for _, m := range out.Messages {
			in := &sqs.SendMessageInput{QueueUrl: aws.String(to), MessageBody: m.Body, MessageAttributes: m.MessageAttributes}
			if fifo {
				in.MessageGroupId = aws.String(m.Attributes[string(sqstypes.MessageSystemAttributeNameMessageGroupId)])
				// A new deduplication id: the original may still be inside the 5-minute window.
				in.MessageDeduplicationId = aws.String("redrive-" + aws.ToString(m.MessageId))
			}
			if _, err := sqsc.SendMessage(ctx, in); err != nil {
				return moved, fmt.Errorf("send %s to %s: %w", aws.ToString(m.MessageId), to, err)
			}
			if _, err := sqsc.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(from), ReceiptHandle: m.ReceiptHandle}); err != nil {
				return moved, fmt.Errorf("delete %s from %s after sending it (it may be redriven twice; the inbox dedups): %w", aws.ToString(m.MessageId), from, err)
			}
			moved++
		}
	}
	return moved, nil
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
