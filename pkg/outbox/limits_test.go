package outbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	ebtypes "github.com/aws/aws-sdk-go-v2/service/eventbridge/types"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	ktypes "github.com/aws/aws-sdk-go-v2/service/kinesis/types"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	snstypes "github.com/aws/aws-sdk-go-v2/service/sns/types"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/internal/wire"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// The services, as far as size goes: each fake counts the request it receives the way its
// service documents (from the request's own bytes, not with the publishers' MessageSize), refuses what
// is above the limit, and remembers what it accepted.
type sizedServices struct {
	mu       sync.Mutex
	limits   outbox.MessageLimits
	accepted map[string]string // event id → the published body (payload or pointer)
	refused  []string
}

func (s *sizedServices) accept(id, body string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.accepted[id] = body
}

func (s *sizedServices) refuse(why string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refused = append(s.refused, why)
}

// SNS: the body and each attribute's name, type and value, at most the topic's
// MaximumMessageSize; SQS (raw delivery) counts the same and holds the queue's.
func (s *sizedServices) PublishBatch(_ context.Context, in *sns.PublishBatchInput, _ ...func(*sns.Options)) (*sns.PublishBatchOutput, error) {
	out := &sns.PublishBatchOutput{}
	for _, e := range in.PublishBatchRequestEntries {
		n := len(aws.ToString(e.Message))
		for k, v := range e.MessageAttributes {
			n += len(k) + len(aws.ToString(v.DataType)) + len(aws.ToString(v.StringValue))
		}
		if n > min(s.limits.SNS, s.limits.SQS) {
			s.refuse(fmt.Sprintf("sns %d", n))
			out.Failed = append(out.Failed, snstypes.BatchResultErrorEntry{Id: e.Id, Code: aws.String("InvalidParameter"), SenderFault: true})
			continue
		}
		s.accept(aws.ToString(e.MessageAttributes[wire.MessageID].StringValue), aws.ToString(e.Message))
		out.Successful = append(out.Successful, snstypes.PublishBatchResultEntry{Id: e.Id})
	}
	return out, nil
}

// EventBridge: Time 14 bytes, Source, DetailType, Detail, less than 256 KB; and the event a
// rule delivers to a queue ({"version","id","detail-type","source","account","time","region",
// "resources","detail"}) must fit the queue.
func (s *sizedServices) PutEvents(_ context.Context, in *eventbridge.PutEventsInput, _ ...func(*eventbridge.Options)) (*eventbridge.PutEventsOutput, error) {
	out := &eventbridge.PutEventsOutput{}
	for _, e := range in.Entries {
		n := 14 + len(aws.ToString(e.Source)) + len(aws.ToString(e.DetailType)) + len(aws.ToString(e.Detail))
		var deliveredBuf bytes.Buffer
		enc := json.NewEncoder(&deliveredBuf)
		enc.SetEscapeHTML(false) // EventBridge's serializer leaves <, > and & as they are
		_ = enc.Encode(map[string]any{"version": "0", "id": "6a7e8feb-b491-4cf7-a9f1-bf3703467718",
			"detail-type": aws.ToString(e.DetailType), "source": aws.ToString(e.Source), "account": "111122223333",
			"time": "2017-12-22T18:43:48Z", "region": "ap-southeast-1", "resources": []string{},
			"detail": json.RawMessage(aws.ToString(e.Detail))})
		delivered := bytes.TrimSpace(deliveredBuf.Bytes())
		if n >= 256*1024 || len(delivered) > s.limits.SQS {
			s.refuse(fmt.Sprintf("eventbridge entry %d, delivered %d", n, len(delivered)))
			out.Entries = append(out.Entries, ebtypes.PutEventsResultEntry{ErrorCode: aws.String("ValidationException")})
			continue
		}
		var env wire.Envelope
		if err := json.Unmarshal([]byte(aws.ToString(e.Detail)), &env); err != nil {
			return nil, err
		}
		s.accept(env.Metadata.MessageID, string(env.Data))
		out.Entries = append(out.Entries, ebtypes.PutEventsResultEntry{EventId: aws.String("x")})
	}
	return out, nil
}

// Kinesis: the data and the partition key, at most the stream's maximum record size.
func (s *sizedServices) PutRecords(_ context.Context, in *kinesis.PutRecordsInput, _ ...func(*kinesis.Options)) (*kinesis.PutRecordsOutput, error) {
	out := &kinesis.PutRecordsOutput{}
	for _, r := range in.Records {
		if n := len(r.Data) + len(aws.ToString(r.PartitionKey)); n > s.limits.Kinesis {
			s.refuse(fmt.Sprintf("kinesis %d", n))
			out.Records = append(out.Records, ktypes.PutRecordsResultEntry{ErrorCode: aws.String("ValidationException")})
			continue
		}
		var env wire.Envelope
		if err := json.Unmarshal(r.Data, &env); err != nil {
			return nil, err
		}
		s.accept(env.Metadata.MessageID, string(env.Data))
		out.Records = append(out.Records, ktypes.PutRecordsResultEntry{SequenceNumber: aws.String("1")})
	}
	return out, nil
}

// Kafka: franz-go's record size (key, value, header keys and values) plus the record batch's
// 61-byte header, at most the brokers' message.max.bytes (a lower bound of the real batch).
func (s *sizedServices) ProduceSync(_ context.Context, rs ...*kgo.Record) kgo.ProduceResults {
	var res kgo.ProduceResults
	for _, r := range rs {
		n := 61 + len(r.Key) + len(r.Value)
		var id string
		for _, h := range r.Headers {
			n += len(h.Key) + len(h.Value)
			if h.Key == wire.MessageID {
				id = string(h.Value)
			}
		}
		if n > s.limits.Kafka {
			s.refuse(fmt.Sprintf("kafka %d", n))
			res = append(res, kgo.ProduceResult{Record: r, Err: kerr.MessageTooLarge})
			continue
		}
		s.accept(id, string(r.Value))
		res = append(res, kgo.ProduceResult{Record: r})
	}
	return res
}

// nullExecutor lets Write validate without a database.
type nullExecutor struct{}

func (nullExecutor) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, nil
}
func (nullExecutor) CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error) {
	return 0, nil
}

// sizedMessage returns a message whose payload is exactly n bytes, full of characters JSON
// encoders like to escape, with headers and a partition key at their lengths.
func sizedMessage(n int) outbox.Message {
	const fill = `<tag a=1>&amp; \u00e9 é ✓ `
	body := []byte(`{"s":"`)
	for len(body) < n-2 {
		body = append(body, fill...)
	}
	body = append(body[:n-2], `"}`...)
	for i := n - 3; !(json.Valid(body) && utf8.Valid(body)) && i > 6; i-- { // a cut character or escape: pad with ASCII
		body[i] = 'x'
	}
	return outbox.Message{
		Topic: "sized", EventType: "DocumentIssued", AggregateType: "document", AggregateID: strings.Repeat("d", 200),
		PartitionKey: strings.Repeat("κ", 300), // above Kinesis's 256 characters: hashed there, whole on Kafka
		Payload:      json.RawMessage(body),
		Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			"tenant": strings.Repeat("t<&>", 250), "x-long": strings.Repeat("h", 2000), "x-quote": strings.Repeat(`"\`, 500)},
	}
}

// writeBoundary returns the largest payload Write accepts for sizedMessage with w.
func writeBoundary(t *testing.T, w *outbox.Writer) int {
	lo, hi := 64, int(outbox.RelaySetting("ClaimCheck.MaxPayloadBytes").Max)
	for lo < hi {
		mid := (lo + hi + 1) / 2
		if _, err := w.Write(context.Background(), nullExecutor{}, sizedMessage(mid)); err == nil {
			lo = mid
		} else {
			require.ErrorIs(t, err, outbox.ErrInvalidMessage)
			hi = mid - 1
		}
	}
	return lo
}

// For every destination kind, with and without the claim check, payloads at and around every
// limit (Write's, the destination's as it counts, the claim check's threshold), carrying
// escaped characters, headers and long keys: what Write accepts is delivered, inline or
// offloaded; what it refuses is a ValidationError; nothing is quarantined as too large.
func TestEveryDestinationDeliversWhatWriteAccepts(t *testing.T) {
	t.Parallel()
	dests := map[outbox.Kind]string{
		outbox.SNS:         "arn:aws:sns:us-east-1:111122223333:sized",
		outbox.EventBridge: "arn:aws:events:us-east-1:111122223333:event-bus/sized",
		outbox.Kinesis:     "arn:aws:kinesis:us-east-1:111122223333:stream/sized",
		outbox.Kafka:       "kafka://sized",
	}
	for kind, dest := range dests {
		for _, claimCheck := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/claimcheck=%v", kind, claimCheck), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				b := setup(t)
				limits := outbox.MessageLimits{}.WithDefaults()
				svc := &sizedServices{limits: limits, accepted: map[string]string{}}
				source := strings.Repeat("s", 200) // a long Source: Write must allow for it
				pubs := outbox.Publishers{SNS: outbox.NewSNSPublisher(svc), EventBridge: outbox.NewEventBridgePublisher(svc, source),
					Kinesis: outbox.NewKinesisPublisher(svc), Kafka: outbox.NewKafkaPublisher(svc, limits.Kafka)}
				store := &memoryStore{}
				wcfg := outbox.WriterConfig{}
				if claimCheck {
					wcfg.MaxMessageBytes = 4 << 20
				}
				w, err := outbox.NewWriter(wcfg)
				require.NoError(t, err)

				// Sizes at and around Write's boundary and the destination's own (as the
				// destination counts the message, found through its publisher's measure).
				maxWrite := writeBoundary(t, w)
				probe := sizedMessage(1000)
				e := &outbox.Event{EventType: probe.EventType, AggregateType: probe.AggregateType, AggregateID: probe.AggregateID,
					PartitionKey: probe.PartitionKey, Headers: probe.Headers, CreatedAt: time.Now()}
				atDest := limits.Of(kind) - (pubs.MessageSize(dest, e, 1000) - 1000)
				sizes := []int{maxWrite - 1, maxWrite, maxWrite + 1, atDest - 1, atDest, atDest + 1}

				var accepted []outbox.Message
				for _, n := range sizes {
					got, err := w.Write(ctx, nullExecutor{}, sizedMessage(n))
					if err != nil {
						var ve *outbox.ValidationError
						require.True(t, errors.As(err, &ve), "a refusal is a ValidationError: %v", err)
						require.Greater(t, n, maxWrite, "%v", err)
						continue
					}
					tx, err := b.pool.Begin(ctx)
					require.NoError(t, err)
					got, err = w.Write(ctx, tx, got...)
					require.NoError(t, err)
					require.NoError(t, tx.Commit(ctx))
					accepted = append(accepted, got...)
				}
				require.NotEmpty(t, accepted)

				r := b.relay(t, func(c *outbox.RelayConfig) {
					c.Publisher = pubs
					c.Topics = map[string]string{"sized": dest}
					if claimCheck {
						c.ClaimCheck = &outbox.ClaimCheck{Store: store, Bucket: "payloads", KeyPrefix: "outbox/"}
					}
				})
				drainUntil(t, r, func() bool { return b.countWhere(t, "published_at IS NULL AND quarantined_at IS NULL") == 0 })
				var reasons []string
				rows, err := b.pool.Query(ctx, "SELECT last_error FROM outbox_event WHERE quarantined_at IS NOT NULL")
				require.NoError(t, err)
				for rows.Next() {
					var s string
					require.NoError(t, rows.Scan(&s))
					reasons = append(reasons, s)
				}
				require.NoError(t, rows.Err())
				require.Empty(t, reasons, "nothing Write accepted is quarantined")
				require.Empty(t, svc.refused, "the relay never sends what the destination refuses")
				for _, m := range accepted {
					body, ok := svc.accepted[m.EventID.String()]
					require.True(t, ok, "event of %d bytes delivered", len(m.Payload))
					if body == string(m.Payload) {
						continue // inline, byte for byte
					}
					require.True(t, claimCheck, "only the claim check changes a body")
					stored, ok := store.get("payloads/outbox/" + m.EventID.String())
					require.True(t, ok, "the pointer's object exists")
					require.Equal(t, string(m.Payload), string(stored))
				}
			})
		}
	}
}
