package inbox_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/localaws"
	"github.com/sluicehq/sluice/internal/localrun"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/internal/wire"
	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// pointerBody is the extended clients' pointer, written by hand as a Java or Python producer
// would send it.
func pointerBody(class, bucket, key string) string {
	return fmt.Sprintf(`["%s",{"s3BucketName":"%s","s3Key":"%s"}]`, class, bucket, key)
}

// memoryStore is an inbox.PayloadStore in memory that counts its reads.
type memoryStore struct {
	mu      sync.Mutex
	objects map[string][]byte
	gets    int
}

func (s *memoryStore) put(bucket, key string, body []byte) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.objects == nil {
		s.objects = map[string][]byte{}
	}
	s.objects[bucket+"/"+key] = body
}

func (s *memoryStore) GetPayload(_ context.Context, loc inbox.PayloadLocation, key string, maxBytes int) ([]byte, error) {
	bucket := loc.Bucket
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gets++
	b, ok := s.objects[bucket+"/"+key]
	if !ok {
		return nil, fmt.Errorf("s3://%s/%s: %w", bucket, key, inbox.ErrPayloadMissing)
	}
	if len(b) > maxBytes {
		return nil, fmt.Errorf("s3://%s/%s is %d bytes, above %d", bucket, key, len(b), maxBytes)
	}
	return b, nil
}

// offloadedRec is a raw-delivery record of event type Scripted whose payload is at bucket/key,
// declared as size bytes with the attribute sizeAttr.
func offloadedRec(id, class, sizeAttr, bucket, key string, size int) events.SQSMessage {
	r := record("sqs-"+id, pointerBody(class, bucket, key), map[string]string{
		"messageId": id, "eventType": "Scripted", "aggregateType": "test", "aggregateId": id, "createdAt": "2026-11-29T10:00:00Z",
	})
	n := strconv.Itoa(size)
	r.MessageAttributes[sizeAttr] = events.SQSMessageAttribute{DataType: "Number", StringValue: &n}
	return r
}

// captured records what handlers saw.
type captured struct {
	mu   sync.Mutex
	msgs map[string]inbox.Message
}

func (c *captured) router(consumer string) *inbox.Router {
	r := inbox.NewRouter(inbox.FailUnknown)
	h := scripted(consumer)
	r.Handle("Scripted", func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		c.mu.Lock()
		if c.msgs == nil {
			c.msgs = map[string]inbox.Message{}
		}
		c.msgs[msg.ID] = msg
		c.mu.Unlock()
		return h(ctx, tx, msg)
	})
	return r
}

func (c *captured) get(id string) (inbox.Message, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	m, ok := c.msgs[id]
	return m, ok
}

// The handler sees the payload, not the pointer, for both attribute names and both pointer
// classes, in every mode; Message.Offloaded says where it was. The attribute is no header.
func TestClaimCheckHandlerSeesThePayloadInEveryMode(t *testing.T) {
	t.Parallel()
	for _, mode := range []inbox.Mode{inbox.PerRecord, inbox.Batched, inbox.Async} {
		t.Run(mode.String(), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			b := setup(t)
			store := &memoryStore{}
			big := fmt.Sprintf(`{"n": 7, "pad": %q}`, strings.Repeat("p", 300<<10))
			store.put("bkt", "new", []byte(big))
			store.put("bkt", "legacy", []byte(`{"n": 8}`))
			var seen captured
			c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "docs", Router: seen.router("docs"), Mode: mode, Logger: quiet,
				ClaimCheck: &inbox.ClaimCheck{Store: store, Locations: []inbox.PayloadLocation{{Bucket: "bkt"}}}})
			require.NoError(t, err)
			rep := c.Process(ctx, batchOf(
				offloadedRec("m-new", wire.PointerClass, wire.ExtendedPayloadSize, "bkt", "new", len(big)),
				offloadedRec("m-legacy", wire.LegacyPointerClass, wire.LegacyPayloadSize, "bkt", "legacy", 8),
				rec("m-plain", script{N: 9}),
			))
			require.Zero(t, rep.Count(inbox.Failed), "%+v", rep.Results)
			if mode == inbox.Async {
				require.Equal(t, 3, rep.Count(inbox.Stored))
				var stored string
				require.NoError(t, b.pool.QueryRow(ctx, `SELECT payload::text FROM inbox_event WHERE message_id = 'm-new'`).Scan(&stored))
				require.JSONEq(t, big, stored, "the asynchronous mode stores the fetched payload: the processor needs no S3")
				p, err := inbox.NewProcessor(b.pool, inbox.ProcessorConfig{Consumer: "docs", Router: seen.router("docs"), Logger: quiet})
				require.NoError(t, err)
				st, err := p.Drain(ctx)
				require.NoError(t, err)
				require.Equal(t, 3, st.Applied)
			} else {
				require.Equal(t, 3, rep.Count(inbox.Applied))
			}
			require.Equal(t, []string{"docs/m-legacy/8", "docs/m-new/7", "docs/m-plain/9"}, dbState(t, b.pool).Effects)
			m, ok := seen.get("m-new")
			require.True(t, ok)
			require.JSONEq(t, big, string(m.Payload))
			require.NotContains(t, m.Headers, wire.ExtendedPayloadSize)
			if mode != inbox.Async {
				require.Equal(t, &inbox.Offloaded{Bucket: "bkt", Key: "new", Size: len(big)}, m.Offloaded)
				lm, _ := seen.get("m-legacy")
				require.Equal(t, "s3://bkt/legacy", lm.Offloaded.URI())
			}
			pm, _ := seen.get("m-plain")
			require.Nil(t, pm.Offloaded)
		})
	}
}

// The SNS envelope form (raw delivery off): the attribute is in the notification's
// MessageAttributes, the pointer is its Message.
func TestClaimCheckReadsTheSNSEnvelopeForm(t *testing.T) {
	t.Parallel()
	b := setup(t)
	store := &memoryStore{}
	store.put("bkt", "k", []byte(`{"n": 3}`))
	env, _ := json.Marshal(map[string]any{
		"Type": "Notification", "MessageId": "sns-1", "TopicArn": "arn:aws:sns:us-east-1:000000000000:docs",
		"Message": pointerBody(wire.PointerClass, "bkt", "k"),
		"MessageAttributes": map[string]any{
			"messageId": map[string]string{"Type": "String", "Value": "m-env"}, "eventType": map[string]string{"Type": "String", "Value": "Scripted"},
			wire.ExtendedPayloadSize: map[string]string{"Type": "Number", "Value": "8"},
		},
	})
	r := events.SQSMessage{MessageId: "sqs-env", Body: string(env), Attributes: map[string]string{"ApproximateReceiveCount": "1"}}
	msg, err := inbox.Parse(r)
	require.NoError(t, err)
	require.True(t, msg.Enveloped)
	require.Equal(t, &inbox.Offloaded{Bucket: "bkt", Key: "k", Size: 8}, msg.Offloaded, "Parse recognises the pointer")
	require.Equal(t, pointerBody(wire.PointerClass, "bkt", "k"), string(msg.Payload), "Parse does no I/O")

	var seen captured
	c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "docs", Router: seen.router("docs"), Logger: quiet, ClaimCheck: &inbox.ClaimCheck{Store: store, Locations: []inbox.PayloadLocation{{Bucket: "bkt"}}}})
	require.NoError(t, err)
	rep := c.Process(context.Background(), batchOf(r))
	require.Equal(t, 1, rep.Count(inbox.Applied), "%+v", rep.Results)
	m, _ := seen.get("m-env")
	require.JSONEq(t, `{"n": 3}`, string(m.Payload))
}

// What cannot be fetched fails its record, never reaches a handler as a pointer and leaves no
// inbox row: a missing object, a payload above MaxPayloadBytes (refused by its declared size
// before any download), an object that is not JSON, a consumer without a ClaimCheck. A marked
// message whose body is no pointer is a bad message. In a FIFO queue the rest of the group
// fails behind it.
func TestClaimCheckFailuresFailTheRecord(t *testing.T) {
	t.Parallel()
	forModes(t, func(t *testing.T, mode inbox.Mode) {
		ctx := context.Background()
		b := setup(t)
		store := &memoryStore{}
		store.put("bkt", "notjson", []byte(`<html>`))
		store.put("bkt", "ok", []byte(`{"n": 1}`))
		var seen captured
		c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "docs", Router: seen.router("docs"), Mode: mode, Logger: quiet,
			ClaimCheck: &inbox.ClaimCheck{Store: store, MaxPayloadBytes: 1 << 20, Locations: []inbox.PayloadLocation{{Bucket: "bkt"}}}})
		require.NoError(t, err)
		notPointer := rec("m-notpointer", script{N: 5})
		n := "12"
		notPointer.MessageAttributes[wire.ExtendedPayloadSize] = events.SQSMessageAttribute{DataType: "Number", StringValue: &n}
		rep := c.Process(ctx, batchOf(
			fifo(offloadedRec("m-missing", wire.PointerClass, wire.ExtendedPayloadSize, "bkt", "gone", 10), "g1"),
			fifo(offloadedRec("m-after", wire.PointerClass, wire.ExtendedPayloadSize, "bkt", "ok", 8), "g1"),
			fifo(offloadedRec("m-huge", wire.PointerClass, wire.ExtendedPayloadSize, "bkt", "huge", 2<<20), "g2"),
			fifo(offloadedRec("m-notjson", wire.PointerClass, wire.ExtendedPayloadSize, "bkt", "notjson", 6), "g3"),
			fifo(notPointer, "g4"),
			fifo(offloadedRec("m-good", wire.PointerClass, wire.ExtendedPayloadSize, "bkt", "ok", 8), "g5"),
		))
		errOf := map[string]error{}
		for _, r := range rep.Results {
			errOf[r.SQSMessageID] = r.Err
		}
		require.Equal(t, []string{"sqs-m-missing:failed", "sqs-m-after:failed", "sqs-m-huge:failed", "sqs-m-notjson:failed",
			"sqs-m-notpointer:failed", "sqs-m-good:applied"}, outcomes(rep))
		require.ErrorIs(t, errOf["sqs-m-missing"], inbox.ErrClaimCheck)
		require.ErrorIs(t, errOf["sqs-m-missing"], inbox.ErrPayloadMissing)
		require.ErrorIs(t, errOf["sqs-m-after"], inbox.ErrGroupBlocked, "the group stays in order")
		require.ErrorIs(t, errOf["sqs-m-huge"], inbox.ErrClaimCheck)
		require.ErrorContains(t, errOf["sqs-m-huge"], "MaxPayloadBytes")
		require.ErrorIs(t, errOf["sqs-m-notjson"], inbox.ErrBadMessage)
		require.ErrorIs(t, errOf["sqs-m-notpointer"], inbox.ErrBadMessage)
		require.Equal(t, []string{"docs/m-good/1"}, dbState(t, b.pool).Effects)
		require.Equal(t, []string{"docs/m-good/true"}, dbState(t, b.pool).Inbox, "a failed record leaves no inbox row")
		store.mu.Lock()
		gets := store.gets
		store.mu.Unlock()
		require.Equal(t, 4, gets, "missing, after, notjson, good; the huge one is refused by its declared size")

		// Without a ClaimCheck the message fails too, saying what to set.
		plain := newConsumer(t, b.pool, "plain", mode)
		rep = plain.Process(ctx, batchOf(offloadedRec("m-x", wire.PointerClass, wire.ExtendedPayloadSize, "bkt", "ok", 8)))
		require.Equal(t, 1, rep.Count(inbox.Failed))
		require.ErrorIs(t, rep.Results[0].Err, inbox.ErrClaimCheck)
		require.ErrorContains(t, rep.Results[0].Err, "SLUICE_CLAIM_CHECK_BUCKET")
	})
}

func TestClaimCheckConfigIsValidated(t *testing.T) {
	t.Parallel()
	b := setup(t)
	loc := []inbox.PayloadLocation{{Bucket: "bkt"}}
	for _, cc := range []*inbox.ClaimCheck{{Locations: loc}, {Store: &memoryStore{}, MaxPayloadBytes: inbox.MaxPayloadBytesLimit + 1, Locations: loc},
		{Store: &memoryStore{}, Concurrency: -1, Locations: loc}, {Store: &memoryStore{}}, {Store: &memoryStore{}, Locations: []inbox.PayloadLocation{{KeyPrefix: "outbox/"}}}} {
		_, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "c", Router: router("c"), ClaimCheck: cc})
		require.ErrorIs(t, err, inbox.ErrInvalidConfig)
	}
	relayMax := outbox.RelaySetting("ClaimCheck.MaxPayloadBytes")
	require.EqualValues(t, relayMax.Default, inbox.DefaultMaxPayloadBytes, "a consumer reads what a relay with defaults stores")
	require.EqualValues(t, relayMax.Max, inbox.MaxPayloadBytesLimit)
}

// s3Bucket creates a bucket on the local emulator with a path-style client.
func s3Bucket(t *testing.T) (string, *s3.Client) {
	t.Helper()
	client := s3.NewFromConfig(localaws.TestConfig(t), func(o *s3.Options) { o.UsePathStyle, o.DisableLogOutputChecksumValidationSkipped = true, true })
	bucket := "sluice-inbox-" + strings.ReplaceAll(uuid.NewString(), "-", "")[:16]
	_, err := client.CreateBucket(context.Background(), &s3.CreateBucketInput{Bucket: aws.String(bucket)})
	require.NoError(t, err)
	return bucket, client
}

// A message produced by hand in the AWS extended clients' format (the object put in S3, the
// pointer body and the Number attribute ExtendedPayloadSize sent straight to SQS, as the Java
// or Python extended client does) is read by the inbox from the emulator's S3; one whose object
// is missing fails on every delivery and reaches the DLQ after maxReceiveCount, and its object
// is never deleted by the inbox (nor created).
func TestClaimCheckReadsAnExtendedClientMessageAndDeadLettersAMissingObject(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	cfg := localaws.TestConfig(t)
	snsc, sqsc := sns.NewFromConfig(cfg), sqs.NewFromConfig(cfg)
	p, err := localrun.CreatePipeline(ctx, snsc, sqsc, localrun.PipelineOptions{Name: "cc-" + uuid.NewString()[:8], MaxReceiveCount: 2, VisibilityTimeout: time.Second})
	require.NoError(t, err)
	t.Cleanup(func() { p.Delete(context.WithoutCancel(ctx), snsc, sqsc) })
	bucket, s3c := s3Bucket(t)

	payload := []byte(fmt.Sprintf(`{"n": 42, "doc": %q}`, strings.Repeat("d", 2<<20)))
	_, err = s3c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String("java/one"), Body: bytes.NewReader(payload)})
	require.NoError(t, err)
	send := func(id, key string, size int) {
		_, err := sqsc.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(p.QueueURL), MessageBody: aws.String(pointerBody(wire.PointerClass, bucket, key)),
			MessageAttributes: map[string]sqstypes.MessageAttributeValue{
				wire.ExtendedPayloadSize: {DataType: aws.String("Number"), StringValue: aws.String(strconv.Itoa(size))},
				"eventType":              {DataType: aws.String("String"), StringValue: aws.String("Scripted")},
				"messageId":              {DataType: aws.String("String"), StringValue: aws.String(id)},
			}})
		require.NoError(t, err)
	}
	send("java-1", "java/one", len(payload))
	send("java-missing", "java/none", 100)

	var seen captured
	c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "docs", Router: seen.router("docs"), Logger: quiet,
		ClaimCheck: &inbox.ClaimCheck{Store: inbox.NewS3PayloadStore(s3c), Locations: []inbox.PayloadLocation{{Bucket: bucket, KeyPrefix: "java/"}}}})
	require.NoError(t, err)
	// The event source: receive, process, delete what succeeded; failures come back after the
	// visibility timeout until SQS moves them to the DLQ.
	w := testwait.Watch[[2]int](t, "java-1 applied and java-missing dead-lettered (failures, DLQ depth)")
	failures := 0
	for {
		dlq, err := localrun.Depth(ctx, sqsc, p.DLQURL)
		require.NoError(t, err)
		if _, ok := seen.get("java-1"); ok && dlq == 1 {
			break
		}
		w.Check([2]int{failures, dlq})
		out, err := sqsc.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: aws.String(p.QueueURL), MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
			MessageAttributeNames: []string{"All"}, MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll}})
		require.NoError(t, err)
		if len(out.Messages) == 0 {
			continue
		}
		rep := c.Process(ctx, localrun.SQSEvent(out.Messages, p.QueueARN))
		for i, r := range rep.Results {
			if r.Outcome == inbox.Failed {
				failures++
				require.Equal(t, "java-missing", r.MessageID)
				require.ErrorIs(t, r.Err, inbox.ErrPayloadMissing)
				continue
			}
			_, err := sqsc.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: aws.String(p.QueueURL), ReceiptHandle: out.Messages[i].ReceiptHandle})
			require.NoError(t, err)
		}
	}
	require.GreaterOrEqual(t, failures, 2, "failed on each of its maxReceiveCount deliveries")
	m, _ := seen.get("java-1")
	require.Equal(t, string(payload), string(m.Payload))
	require.Equal(t, &inbox.Offloaded{Bucket: bucket, Key: "java/one", Size: len(payload)}, m.Offloaded)
	require.Equal(t, []string{"docs/java-1/true"}, dbState(t, b.pool).Inbox)
	_, err = s3c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: aws.String(bucket), Key: aws.String("java/one")})
	require.NoError(t, err, "the inbox never deletes objects")

	// The S3 store refuses an object above the bound without reading it whole.
	_, err = inbox.NewS3PayloadStore(s3c).GetPayload(ctx, inbox.PayloadLocation{Bucket: bucket}, "java/one", 1<<20)
	require.ErrorContains(t, err, "above the 1048576 allowed")
	_, err = inbox.NewS3PayloadStore(s3c).GetPayload(ctx, inbox.PayloadLocation{Bucket: bucket}, "java/none", 1<<20)
	require.True(t, errors.Is(err, inbox.ErrPayloadMissing), "%v", err)
}

// A pointer can name any bucket and key: the consumer fetches only from its configured
// locations (bucket and key prefix), and fails anything else with a clear error before any S3
// call (issue 21, item 5).
func TestClaimCheckFetchesOnlyFromTheConfiguredLocations(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	store := &memoryStore{}
	store.put("relay-bucket", "outbox/ok", []byte(`{"n": 1}`))
	store.put("relay-bucket", "elsewhere/secret", []byte(`{"n": 2}`))
	store.put("other-bucket", "outbox/secret", []byte(`{"n": 3}`))
	var seen captured
	c, err := inbox.NewConsumer(b.pool, inbox.ConsumerConfig{Consumer: "docs", Router: seen.router("docs"), Logger: quiet,
		ClaimCheck: &inbox.ClaimCheck{Store: store, Locations: []inbox.PayloadLocation{{Bucket: "relay-bucket", KeyPrefix: "outbox/", ExpectedBucketOwner: "111122223333"}}}})
	require.NoError(t, err)
	rep := c.Process(ctx, batchOf(
		offloadedRec("m-ok", wire.PointerClass, wire.ExtendedPayloadSize, "relay-bucket", "outbox/ok", 8),
		offloadedRec("m-prefix", wire.PointerClass, wire.ExtendedPayloadSize, "relay-bucket", "elsewhere/secret", 8),
		offloadedRec("m-bucket", wire.PointerClass, wire.ExtendedPayloadSize, "other-bucket", "outbox/secret", 8),
	))
	require.Equal(t, 1, rep.Count(inbox.Applied), "%+v", rep.Results)
	require.Equal(t, 2, rep.Count(inbox.Failed), "%+v", rep.Results)
	for _, r := range rep.Results {
		if r.MessageID == "m-ok" {
			continue
		}
		require.ErrorIs(t, r.Err, inbox.ErrClaimCheck)
		require.ErrorIs(t, r.Err, inbox.ErrPayloadLocation)
		require.ErrorContains(t, r.Err, "s3://relay-bucket/outbox/")
	}
	require.Equal(t, 1, store.gets, "nothing outside the locations is fetched")
}

// ExpectedBucketOwner reaches S3 with every GetObject; a 403 (a missing object to a role that
// may not list the bucket, or a bucket of another account) says what it may mean, and a 404 is
// ErrPayloadMissing (issue 21, items 5 and 6).
func TestS3PayloadStoreSendsTheOwnerAndNamesA403(t *testing.T) {
	t.Parallel()
	var got *s3.GetObjectInput
	store := inbox.NewS3PayloadStore(s3GetterFunc(func(in *s3.GetObjectInput) error {
		got = in
		if aws.ToString(in.Key) == "missing" {
			return &smithyhttp.ResponseError{Response: &smithyhttp.Response{Response: &http.Response{StatusCode: 404}},
				Err: &s3types.NoSuchKey{Message: aws.String("The specified key does not exist.")}}
		}
		return &smithyhttp.ResponseError{Response: &smithyhttp.Response{Response: &http.Response{StatusCode: 403}},
			Err: &smithy.GenericAPIError{Code: "AccessDenied", Message: "Access Denied"}}
	}))
	loc := inbox.PayloadLocation{Bucket: "b", KeyPrefix: "outbox/", ExpectedBucketOwner: "111122223333"}
	_, err := store.GetPayload(context.Background(), loc, "missing", 10)
	require.ErrorIs(t, err, inbox.ErrPayloadMissing)
	require.Equal(t, "111122223333", aws.ToString(got.ExpectedBucketOwner))
	_, err = store.GetPayload(context.Background(), loc, "denied", 10)
	require.NotErrorIs(t, err, inbox.ErrPayloadMissing)
	require.ErrorContains(t, err, "s3:ListBucket")
}

type s3GetterFunc func(*s3.GetObjectInput) error

func (f s3GetterFunc) GetObject(_ context.Context, in *s3.GetObjectInput, _ ...func(*s3.Options)) (*s3.GetObjectOutput, error) {
	return nil, &smithy.OperationError{ServiceID: "S3", OperationName: "GetObject", Err: f(in)}
}
