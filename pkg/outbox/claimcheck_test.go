package outbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/localaws"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/internal/wire"
	"github.com/sluicehq/sluice/pkg/metrics"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// claimCheckBucket creates a bucket of its own on the local emulator (fauxqs or moto) through
// the standard S3 API, with a path-style client (a local endpoint has no per-bucket host names).
func claimCheckBucket(t *testing.T) (string, *s3.Client) {
	t.Helper()
	client := s3.NewFromConfig(localaws.TestConfig(t), func(o *s3.Options) { o.UsePathStyle, o.DisableLogOutputChecksumValidationSkipped = true, true })
	bucket := "sluice-cc-" + strings.ReplaceAll(uuid.NewString(), "-", "")[:16]
	_, err := client.CreateBucket(context.Background(), &s3.CreateBucketInput{Bucket: aws.String(bucket)})
	require.NoError(t, err)
	return bucket, client
}

func getObject(t *testing.T, c *s3.Client, bucket, key string) []byte {
	t.Helper()
	out, err := c.GetObject(context.Background(), &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	require.NoError(t, err, "s3://%s/%s", bucket, key)
	defer out.Body.Close()
	b, err := io.ReadAll(out.Body)
	require.NoError(t, err)
	return b
}

func objectKeys(t *testing.T, c *s3.Client, bucket, prefix string) []string {
	t.Helper()
	out, err := c.ListObjectsV2(context.Background(), &s3.ListObjectsV2Input{Bucket: aws.String(bucket), Prefix: aws.String(prefix)})
	require.NoError(t, err)
	var keys []string
	for _, o := range out.Contents {
		keys = append(keys, aws.ToString(o.Key))
	}
	return keys
}

// pointerOf decodes an extended-client pointer body; ok is false for any other body.
func pointerOf(body string) (bucket, key string, ok bool) {
	var parts []json.RawMessage
	if json.Unmarshal([]byte(body), &parts) != nil || len(parts) != 2 {
		return "", "", false
	}
	var class string
	var ref struct {
		Bucket string `json:"s3BucketName"`
		Key    string `json:"s3Key"`
	}
	if json.Unmarshal(parts[0], &class) != nil || class != wire.PointerClass || json.Unmarshal(parts[1], &ref) != nil {
		return "", "", false
	}
	return ref.Bucket, ref.Key, true
}

// insertSized commits, with plain SQL (as any service may), a row whose payload PostgreSQL
// prints as {"pad": "xxx..."} and whose message (payload and attributes, as SNS counts them)
// is exactly size bytes. created_at is fixed so that the attribute's length is known.
func insertSized(t *testing.T, b *bundle, key string, size int) uuid.UUID {
	t.Helper()
	id := uuid.New()
	created := time.Date(2026, 1, 2, 3, 4, 5, 123456000, time.UTC)
	e := &outbox.Event{EventID: id, EventType: "DocumentStored", AggregateType: "doc", AggregateID: key, CreatedAt: created}
	attrs := 0
	for k, v := range outbox.Attributes(e) {
		attrs += len(k) + len(aws.ToString(v.DataType)) + len(aws.ToString(v.StringValue))
	}
	pad := size - attrs - len(`{"pad": ""}`)
	require.Positive(t, pad)
	payload := `{"pad": "` + strings.Repeat("x", pad) + `"}`
	_, err := b.pool.Exec(context.Background(), `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload, created_at)
		VALUES ($1, $2, 'doc', $3, 'DocumentStored', $3, $4, $5)`, id, testTopic, key, payload, created)
	require.NoError(t, err)
	var printed int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT octet_length(payload::text) FROM outbox_event WHERE event_id = $1`, id).Scan(&printed))
	require.Equal(t, len(payload), printed, "PostgreSQL prints the payload as written")
	return id
}

// The threshold is inclusive: a message of exactly Threshold bytes goes out as it is, one of a
// byte more has its payload stored in S3 (at KeyPrefix + event_id) and carries the extended
// clients' pointer and the Number attribute ExtendedPayloadSize, through SNS and SQS.
func TestClaimCheckThresholdIsInclusiveAndOffloadsThroughS3(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	topicARN, queueURL, sqsClient, snsClient := topicWithRawQueue(t, false)
	bucket, s3c := claimCheckBucket(t)
	const threshold = 4096
	at := insertSized(t, b, "k-at", threshold)
	over := insertSized(t, b, "k-over", threshold+1)

	r, err := outbox.NewRelay(b.pool, outbox.RelayConfig{Publisher: outbox.NewSNSPublisher(snsClient), Topics: map[string]string{testTopic: topicARN},
		Logger: testLogger(), ClaimCheck: &outbox.ClaimCheck{Store: outbox.NewS3PayloadStore(s3c), Bucket: bucket, KeyPrefix: "events/", Threshold: threshold}})
	require.NoError(t, err)
	st, err := r.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 2, st.Published)
	require.Equal(t, 1, st.Offloaded, "only the message above the threshold")

	var overPayload string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT payload::text FROM outbox_event WHERE event_id = $1`, over).Scan(&overPayload))
	require.Equal(t, len(overPayload), st.OffloadedBytes)
	require.Equal(t, 1, b.countWhere(t, "event_id = '"+over.String()+"' AND payload::text = '"+overPayload+"'"), "the row keeps its payload in PostgreSQL")

	got := receiveAll(t, sqsClient, queueURL, 2)
	byID := map[string]sqstypes.Message{}
	for _, m := range got {
		byID[aws.ToString(m.MessageAttributes[wire.MessageID].StringValue)] = m
	}
	atMsg, overMsg := byID[at.String()], byID[over.String()]
	require.NotContains(t, atMsg.MessageAttributes, wire.ExtendedPayloadSize)
	_, _, isPointer := pointerOf(aws.ToString(atMsg.Body))
	require.False(t, isPointer, "exactly at the threshold: the payload itself")

	gotBucket, key, isPointer := pointerOf(aws.ToString(overMsg.Body))
	require.True(t, isPointer, "one byte over: a pointer, got %.100s", aws.ToString(overMsg.Body))
	require.Equal(t, bucket, gotBucket)
	require.Equal(t, "events/"+over.String(), key, "the key is KeyPrefix + event_id")
	size := overMsg.MessageAttributes[wire.ExtendedPayloadSize]
	require.Equal(t, "Number", aws.ToString(size.DataType))
	require.Equal(t, strconv.Itoa(len(overPayload)), aws.ToString(size.StringValue))
	for _, a := range []string{wire.EventType, wire.AggregateType, wire.AggregateID, wire.CreatedAt} {
		require.Contains(t, overMsg.MessageAttributes, a, "the attributes stay on the message")
	}
	require.Equal(t, overPayload, string(getObject(t, s3c, bucket, key)), "the object is the payload, byte for byte")
	require.Equal(t, []string{key}, objectKeys(t, s3c, bucket, "events/"), "nothing stored for the message at the threshold")
}

// FIFO: an offloaded message keeps its MessageGroupId (the partition key) and deduplication id
// (the event id), and a key's messages, offloaded or not, arrive in write order.
func TestClaimCheckKeepsFIFOGroupAndDedupIDs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	topicARN, queueURL, sqsClient, snsClient := topicWithRawQueue(t, true)
	bucket, s3c := claimCheckBucket(t)
	w, err := outbox.NewWriter(outbox.WriterConfig{MaxMessageBytes: 2 << 20})
	require.NoError(t, err)
	var msgs []outbox.Message
	for i := range 6 {
		pad := 10
		if i%2 == 1 {
			pad = 600 << 10 // above SNS's 256 KiB
		}
		msgs = append(msgs, outbox.Message{Topic: testTopic, AggregateType: "doc", AggregateID: "d-1", EventType: "DocumentStored",
			Payload: json.RawMessage(fmt.Sprintf(`{"seq": %d, "pad": %q}`, i, strings.Repeat("y", pad)))})
	}
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	written, err := w.Write(ctx, tx, msgs...)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(ctx))

	r, err := outbox.NewRelay(b.pool, outbox.RelayConfig{Publisher: outbox.NewSNSPublisher(snsClient), Topics: map[string]string{testTopic: topicARN},
		Logger: testLogger(), ClaimCheck: &outbox.ClaimCheck{Store: outbox.NewS3PayloadStore(s3c), Bucket: bucket}})
	require.NoError(t, err)
	st, err := r.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 6, st.Published)
	require.Equal(t, 3, st.Offloaded)

	got := receiveAll(t, sqsClient, queueURL, 6)
	for i, m := range got {
		require.Equal(t, "d-1", m.Attributes[string(sqstypes.MessageSystemAttributeNameMessageGroupId)], "group id is the partition key")
		id := aws.ToString(m.MessageAttributes[wire.MessageID].StringValue)
		require.Equal(t, written[i].EventID.String(), id, "message %d in write order", i)
		require.Equal(t, id, m.Attributes[string(sqstypes.MessageSystemAttributeNameMessageDeduplicationId)], "dedup id is the event id")
		body := aws.ToString(m.Body)
		if i%2 == 0 {
			require.JSONEq(t, string(written[i].Payload), body)
			continue
		}
		gotBucket, key, ok := pointerOf(body)
		require.True(t, ok)
		require.Equal(t, bucket, gotBucket)
		require.Equal(t, id, key, "no prefix: the key is the event id")
		require.Equal(t, string(written[i].Payload), string(getObject(t, s3c, bucket, key)))
	}
}

// A replay publishes the offloaded event again with the same pointer: its object is written
// again at the same key (overwritten, not a second object), from the row's payload, which the
// row kept in PostgreSQL.
func TestClaimCheckReplayOverwritesTheSameObject(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	topicARN, queueURL, sqsClient, snsClient := topicWithRawQueue(t, false)
	bucket, s3c := claimCheckBucket(t)
	id := insertSized(t, b, "k-replay", 300<<10)
	cc := &outbox.ClaimCheck{Store: outbox.NewS3PayloadStore(s3c), Bucket: bucket, KeyPrefix: "replay/"}
	r, err := outbox.NewRelay(b.pool, outbox.RelayConfig{Publisher: outbox.NewSNSPublisher(snsClient), Topics: map[string]string{testTopic: topicARN},
		Logger: testLogger(), ClaimCheck: cc})
	require.NoError(t, err)
	st, err := r.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, st.Offloaded)
	first := receiveAll(t, sqsClient, queueURL, 1)[0]
	key := "replay/" + id.String()
	var payload string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT payload::text FROM outbox_event WHERE event_id = $1`, id).Scan(&payload))
	require.Equal(t, payload, string(getObject(t, s3c, bucket, key)))

	// Spoil the object: the replay must write it again.
	_, err = s3c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(key), Body: bytes.NewReader([]byte(`"spoiled"`))})
	require.NoError(t, err)
	n, err := outbox.Replay(ctx, b.pool, outbox.ReplayFilter{Since: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), AggregateID: "k-replay"})
	require.NoError(t, err)
	require.EqualValues(t, 1, n)
	st, err = r.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, st.Offloaded)
	again := receiveAll(t, sqsClient, queueURL, 1)[0]
	require.Equal(t, aws.ToString(first.Body), aws.ToString(again.Body), "the same pointer")
	require.Equal(t, payload, string(getObject(t, s3c, bucket, key)), "the object holds the payload again")
	require.Equal(t, []string{key}, objectKeys(t, s3c, bucket, "replay/"), "one object per event, however often it is published")
}

// memoryStore is a PayloadStore in memory that can fail.
type memoryStore struct {
	mu      sync.Mutex
	objects map[string][]byte
	puts    int
	fail    func(key string) error
}

func (s *memoryStore) PutPayload(_ context.Context, bucket, key string, body []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.puts++
	if s.fail != nil {
		if err := s.fail(key); err != nil {
			return err
		}
	}
	if s.objects == nil {
		s.objects = map[string][]byte{}
	}
	s.objects[bucket+"/"+key] = append([]byte(nil), body...)
	return nil
}

func (s *memoryStore) get(key string) ([]byte, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.objects[key]
	return b, ok
}

// A row whose payload cannot be stored is not published (a pointer to nothing would fail every
// consumer): it backs off like any failed row, its key waits behind it, and it goes out once
// the store works. A payload above MaxPayloadBytes is quarantined without a call.
func TestClaimCheckNeverPublishesAPointerBeforeItsObject(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	store := &memoryStore{}
	failing := true
	store.fail = func(string) error {
		if failing {
			return errors.New("s3 is down")
		}
		return nil
	}
	big := insertSized(t, b, "k1", 300<<10)
	after := insertSized(t, b, "k1", 400) // same key, behind the big one
	tooBig := insertSized(t, b, "k2", 2<<20)
	r := b.relay(t, func(c *outbox.RelayConfig) {
		c.ClaimCheck = &outbox.ClaimCheck{Store: store, Bucket: "b", MaxPayloadBytes: 1 << 20}
	})
	st, err := r.RunOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, st.Published, "nothing of key k1 goes out while its head cannot be stored")
	require.Equal(t, 1, st.Quarantined, "the payload above MaxPayloadBytes")
	require.Equal(t, 1, b.countWhere(t, "event_id = '"+tooBig.String()+"' AND quarantined_at IS NOT NULL AND last_error LIKE '%above the claim check%'"))
	require.Equal(t, 1, b.countWhere(t, "event_id = '"+big.String()+"' AND attempts >= 1 AND last_error LIKE '%s3 is down%'"))
	require.Zero(t, b.rec.count())

	store.mu.Lock()
	failing = false
	store.mu.Unlock()
	drainUntil(t, r, func() bool { return b.countWhere(t, "partition_key = 'k1' AND published_at IS NULL") == 0 })
	b.rec.requireKeyOrder(t)
	require.Equal(t, 2, b.rec.count())
	first := b.rec.received[0]
	require.Equal(t, big, first.EventID)
	require.Equal(t, after, b.rec.received[1].EventID)
	require.Positive(t, first.ExtendedPayloadSize)
	stored, ok := store.get("b/" + big.String())
	require.True(t, ok)
	require.Len(t, stored, first.ExtendedPayloadSize)
	require.Equal(t, string(outbox.PayloadPointer("b", big.String())), string(first.Payload))
	require.Zero(t, b.rec.received[1].ExtendedPayloadSize)
}

// Write keeps one attribute free for ExtendedPayloadSize, so an offloaded message carries every
// header Write accepted; a header may not take the claim check's attribute names.
func TestClaimCheckOffloadedMessageKeepsEveryHeader(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	w, err := outbox.NewWriter(outbox.WriterConfig{MaxMessageBytes: 1 << 20})
	require.NoError(t, err)
	headers := map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", "tenant": "t1", "region": "eu", "source": "web"}
	msg := outbox.Message{Topic: testTopic, AggregateType: "doc", AggregateID: "d-1", EventType: "DocumentStored", Headers: headers,
		Payload: json.RawMessage(`{"pad": "` + strings.Repeat("z", 400<<10) + `"}`)}
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = w.Write(ctx, tx, msg)
	require.NoError(t, err, "5 contract attributes and 4 headers: the most Write accepts")
	fifth := msg
	fifth.Headers = map[string]string{"a": "1", "b": "2", "c": "3", "d": "4", "e": "5"}
	_, err = w.Write(ctx, tx, fifth)
	require.ErrorIs(t, err, outbox.ErrInvalidMessage, "a fifth header would leave no room for ExtendedPayloadSize")
	require.ErrorContains(t, err, wire.ExtendedPayloadSize)
	for _, name := range []string{wire.ExtendedPayloadSize, "sqslargepayloadsize"} {
		bad := msg
		bad.Headers = map[string]string{name: "1"}
		_, err = w.Write(ctx, tx, bad)
		var ve *outbox.ValidationError
		require.ErrorAs(t, err, &ve)
		require.Equal(t, "Headers["+name+"]", ve.Field)
	}
	require.NoError(t, tx.Commit(ctx))

	store := &memoryStore{}
	r := b.relay(t, func(c *outbox.RelayConfig) { c.ClaimCheck = &outbox.ClaimCheck{Store: store, Bucket: "b"} })
	st, err := r.RunOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, st.Offloaded)
	attrs := outbox.Attributes(b.rec.received[0])
	require.Len(t, attrs, outbox.SNSMaxAttributes)
	for k, v := range headers {
		require.Equal(t, v, aws.ToString(attrs[k].StringValue), "header %s", k)
	}
	require.Equal(t, "Number", aws.ToString(attrs[wire.ExtendedPayloadSize].DataType))
}

// The writer's limit is configuration: SNS's 256 KiB by default (what any relay can publish),
// raised up to the claim check's largest payload for a relay with a claim check; the refusal says how.
func TestWriterAcceptsLargePayloadsOnlyWhenConfigured(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	large := outbox.Message{Topic: testTopic, EventType: "DocumentStored", AggregateID: "d", Payload: json.RawMessage(`"` + strings.Repeat("x", 3<<20) + `"`)}
	tx, err := b.pool.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	_, err = outbox.Write(ctx, tx, large)
	require.ErrorIs(t, err, outbox.ErrInvalidMessage)
	require.ErrorContains(t, err, "WriterConfig.MaxMessageBytes")
	require.ErrorContains(t, err, "claim check")

	w, err := outbox.NewWriter(outbox.WriterConfig{MaxMessageBytes: int(outbox.RelaySetting("ClaimCheck.MaxPayloadBytes").Default)})
	require.NoError(t, err)
	written, err := w.Write(ctx, tx, large)
	require.NoError(t, err)
	var n int
	require.NoError(t, tx.QueryRow(ctx, `SELECT octet_length(payload::text) FROM outbox_event WHERE event_id = $1`, written[0].EventID).Scan(&n))
	require.Equal(t, len(large.Payload), n, "the row holds the whole payload")

	_, err = outbox.NewWriter(outbox.WriterConfig{MaxMessageBytes: int(outbox.RelaySetting("ClaimCheck.MaxPayloadBytes").Max) + 1})
	require.ErrorContains(t, err, "ClaimCheck.MaxPayloadBytes' maximum")
}

// metricsSink is a metrics.Recorder that sums counters by name.
type metricsSink struct {
	mu   sync.Mutex
	sums map[string]float64
	unit map[string]metrics.Unit
}

func (m *metricsSink) Record(_ context.Context, _ metrics.Dimensions, ms ...metrics.Measurement) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.sums == nil {
		m.sums, m.unit = map[string]float64{}, map[string]metrics.Unit{}
	}
	for _, x := range ms {
		if x.Kind == metrics.Counter {
			m.sums[x.Name] += x.Value
			m.unit[x.Name] = x.Unit
		}
	}
}

// The relay's metrics count offloaded messages and their payload bytes.
func TestClaimCheckMetricsCountOffloadsAndBytes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	insertSized(t, b, "k1", 300<<10)
	insertSized(t, b, "k2", 400<<10)
	insertSized(t, b, "k3", 1000)
	var want int
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT sum(octet_length(payload::text)) FROM outbox_event WHERE partition_key IN ('k1', 'k2')`).Scan(&want))
	sink := &metricsSink{}
	r := b.relay(t, func(c *outbox.RelayConfig) {
		c.ClaimCheck = &outbox.ClaimCheck{Store: &memoryStore{}, Bucket: "b"}
		c.MetricsRecorder, c.MetricsInterval = sink, time.Hour // only the final emit, when Run ends
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()
	testwait.Progress(t, "Run publishes every row", func() (int, bool) {
		left := b.countWhere(t, "published_at IS NULL")
		return left, left == 0
	})
	cancel()
	require.NoError(t, <-done)
	sink.mu.Lock()
	defer sink.mu.Unlock()
	require.Equal(t, 3.0, sink.sums[metrics.Published.Name])
	require.Equal(t, 2.0, sink.sums[metrics.Offloaded.Name])
	require.Equal(t, float64(want), sink.sums[metrics.OffloadedBytes.Name])
	require.Equal(t, metrics.Bytes, sink.unit[metrics.OffloadedBytes.Name])
}

// OffloadBacklogOf's cost is bounded: it measures at most 1,000 pending rows (its documented bound) and
// says when that was not all of them; quarantined and published rows are not counted.
func TestOffloadBacklogIsBoundedAndSaysSo(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	insertSized(t, b, "a-big", 300<<10)
	back, err := outbox.OffloadBacklogOf(ctx, b.pool, int(outbox.RelaySetting("MessageLimits.SNS").Default))
	require.NoError(t, err)
	require.Equal(t, outbox.OffloadBacklog{Threshold: int(outbox.RelaySetting("MessageLimits.SNS").Default), Examined: 1, Above: 1, AboveBytes: back.AboveBytes, Complete: true}, back)
	require.Greater(t, back.AboveBytes, outbox.RelaySetting("MessageLimits.SNS").Default)

	b.write(t, outbox.OffloadSampleRows+5, 50)
	back, err = outbox.OffloadBacklogOf(ctx, b.pool, int(outbox.RelaySetting("MessageLimits.SNS").Default))
	require.NoError(t, err)
	require.EqualValues(t, 1000, back.Examined)
	require.False(t, back.Complete)
	_, err = outbox.OffloadBacklogOf(ctx, b.pool, 0)
	require.Error(t, err)
}
