package inbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	s3types "github.com/aws/aws-sdk-go-v2/service/s3/types"
	"github.com/aws/smithy-go"

	"github.com/sluicehq/sluice/internal/wire"
)

// The claim check: a producer (sluice's relay with outbox.ClaimCheck, or an AWS extended client
// for SNS or SQS in Java or Python) stores a payload too large for the message in S3 and sends a
// pointer instead: the body ["software.amazon.payloadoffloading.PayloadS3Pointer",
// {"s3BucketName": ..., "s3Key": ...}] (or the older class com.amazon.sqs.javamessaging.
// MessageS3Pointer) with the Number attribute ExtendedPayloadSize (or the older
// SQSLargePayloadSize), in raw delivery or inside the SNS envelope; destinations without
// attributes (EventBridge, Kinesis) carry the size as the wire.Envelope's
// metadata.extendedPayloadSize. Parse recognises the pointer (no I/O) and sets
// Message.Offloaded; the Consumer fetches every pointed-to payload of a batch before it opens a
// transaction, so the handler (and the asynchronous mode's stored row) sees the real body.
//
// A payload that cannot be fetched (no such object, larger than MaxPayloadBytes, S3 refusing or
// unreachable, no ClaimCheck configured) fails its record with ErrClaimCheck: SQS delivers it
// again and, after maxReceiveCount, moves it to the DLQ; it is never skipped. The inbox never
// deletes objects: the bucket's lifecycle does, after the queues' and DLQs' retention.
//
// A source other than SQS builds its Messages itself: it sets Offloaded with
// offloadedPointer(metadata.ExtendedPayloadSize, data) and lets fetchPayloads (or
// fetchPayload, for one message) resolve it like an SQS record's.

// DefaultMaxPayloadBytes is ClaimCheck.MaxPayloadBytes's default: the relay's default
// (outbox.RelaySetting("ClaimCheck.MaxPayloadBytes").Default, 32 MiB), so a consumer reads whatever a relay with default
// settings stores.
const DefaultMaxPayloadBytes = 32 << 20

// MaxPayloadBytesLimit bounds ClaimCheck.MaxPayloadBytes (the relay's bound, 256 MiB): a payload
// is held in memory whole.
const MaxPayloadBytesLimit = 256 << 20

// defaultFetchConcurrency is ClaimCheck.Concurrency's default.
const defaultFetchConcurrency = 4

// ErrClaimCheck marks a record whose payload is in S3 and could not be fetched: the object is
// missing, larger than ClaimCheck.MaxPayloadBytes, unreadable, or the Consumer has no
// ClaimCheck. The record fails and comes back (and reaches the DLQ after maxReceiveCount).
var ErrClaimCheck = errors.New("inbox: claim-checked payload not fetched")

// ErrPayloadMissing marks a pointer to an object that does not exist (S3 NoSuchKey or
// NoSuchBucket); it comes wrapped with ErrClaimCheck.
var ErrPayloadMissing = errors.New("no such object")

// ErrPayloadLocation marks a pointer to an object outside ClaimCheck.Locations: the record
// fails (it comes wrapped with ErrClaimCheck) before any S3 call, so a message cannot make the
// consumer read, with its role, whatever bucket the message names.
var ErrPayloadLocation = errors.New("payload pointer outside the configured locations")

// PayloadLocation is where a consumer fetches claim-checked payloads from: a bucket, the key
// prefix its objects are under, and the account that must own the bucket.
type PayloadLocation struct {
	// Bucket is the S3 bucket's name. Required.
	Bucket string
	// KeyPrefix is the prefix every object key has, e.g. "outbox/" (the relay's
	// ClaimCheck.KeyPrefix). Defaults to "": any key of the bucket.
	KeyPrefix string
	// ExpectedBucketOwner is the account id that owns the bucket, sent with each GetObject
	// (S3 refuses the request when another account owns it, e.g. a bucket deleted and
	// re-created elsewhere under the same name). Defaults to "": not checked.
	ExpectedBucketOwner string
}

// URI returns s3://Bucket/KeyPrefix.
func (l PayloadLocation) URI() string { return "s3://" + l.Bucket + "/" + l.KeyPrefix }

// ClaimCheck lets a Consumer fetch payloads stored in S3 by a claim check.
type ClaimCheck struct {
	// Store reads the payloads: NewS3PayloadStore(s3.NewFromConfig(cfg)). Required.
	Store PayloadStore
	// Locations are the only places payloads are fetched from: the relay's bucket and key
	// prefix (and those of any extended-client producer you trust). A pointer elsewhere fails
	// its record with ErrClaimCheck and ErrPayloadLocation, without an S3 call. Required: at
	// least one. The Lambdas: SLUICE_CLAIM_CHECK_BUCKET, SLUICE_CLAIM_CHECK_PREFIX and
	// SLUICE_CLAIM_CHECK_BUCKET_OWNER.
	Locations []PayloadLocation
	// MaxPayloadBytes bounds what one record downloads: a larger payload (by its pointer's
	// declared size, or by what S3 sends) fails its record with ErrClaimCheck. Defaults to
	// DefaultMaxPayloadBytes (32 MiB); at most MaxPayloadBytesLimit. A batch's payloads are in
	// memory together: size the function for its batch size times this.
	MaxPayloadBytes int
	// Concurrency is how many payloads of a batch are fetched at once, at most 64. Defaults to 4.
	Concurrency int
}

func (c *ClaimCheck) withDefaults() *ClaimCheck {
	out := *c
	if out.MaxPayloadBytes == 0 {
		out.MaxPayloadBytes = DefaultMaxPayloadBytes
	}
	if out.Concurrency == 0 {
		out.Concurrency = defaultFetchConcurrency
	}
	return &out
}

func (c *ClaimCheck) validate() error {
	var errs []error
	if c.Store == nil {
		errs = append(errs, errors.New("ClaimCheck.Store is required"))
	}
	if len(c.Locations) == 0 {
		errs = append(errs, errors.New("ClaimCheck.Locations is required: the buckets (and key prefixes) payloads may be fetched from, e.g. the relay's"))
	}
	for i, l := range c.Locations {
		if strings.TrimSpace(l.Bucket) == "" {
			errs = append(errs, fmt.Errorf("ClaimCheck.Locations[%d].Bucket is required", i))
		}
	}
	if c.MaxPayloadBytes < 0 || c.MaxPayloadBytes > MaxPayloadBytesLimit {
		errs = append(errs, fmt.Errorf("ClaimCheck.MaxPayloadBytes must be between 0 (the default, %d) and %d, got %d",
			DefaultMaxPayloadBytes, MaxPayloadBytesLimit, c.MaxPayloadBytes))
	}
	if c.Concurrency < 0 || c.Concurrency > 64 {
		errs = append(errs, fmt.Errorf("ClaimCheck.Concurrency must be between 0 (the default, %d) and 64, got %d", defaultFetchConcurrency, c.Concurrency))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return nil
}

// Offloaded says where a message's payload was stored by a claim check.
type Offloaded struct {
	// Bucket and Key name the S3 object.
	Bucket, Key string
	// Size is the payload's size in bytes as the producer declared it (ExtendedPayloadSize).
	Size int
}

// URI returns s3://Bucket/Key.
func (o *Offloaded) URI() string { return "s3://" + o.Bucket + "/" + o.Key }

// offloadedFrom returns the pointer of a message whose attributes mark it as claim-checked
// (ExtendedPayloadSize, or the legacy SQSLargePayloadSize), nil for any other message.
func offloadedFrom(attrs map[string]attribute, body []byte) (*Offloaded, error) {
	for _, name := range []string{wire.ExtendedPayloadSize, wire.LegacyPayloadSize} {
		a, ok := attrs[name]
		if !ok {
			continue
		}
		size, err := payloadSize(a.text)
		if err != nil {
			return nil, badMessage("attribute %s: %v", name, err)
		}
		return offloadedPointer(size, body)
	}
	return nil, nil
}

// payloadSize parses a size attribute: an integer, as the extended clients write it (a Number
// attribute may also arrive as 1.5E6).
func payloadSize(s string) (int, error) {
	s = strings.TrimSpace(s)
	if n, err := strconv.Atoi(s); err == nil && n >= 0 {
		return n, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 || f > math.MaxInt32 || f != math.Trunc(f) {
		return 0, fmt.Errorf("not a payload size in bytes: %q", truncate(s, 32))
	}
	return int(f), nil
}

// offloadedPointer parses body as the pointer of a claim-checked message whose payload is size
// bytes (a source that carries the size elsewhere, e.g. wire.EnvelopeMetadata's
// ExtendedPayloadSize, calls it directly). A body that is not a pointer is a bad message: the
// producer marked it as one.
func offloadedPointer(size int, body []byte) (*Offloaded, error) {
	var parts []json.RawMessage
	if err := json.Unmarshal(body, &parts); err != nil || len(parts) != 2 {
		return nil, badMessage("marked as a claim check (%s) but the body is not a payload pointer [class, {s3BucketName, s3Key}]", wire.ExtendedPayloadSize)
	}
	var class string
	if err := json.Unmarshal(parts[0], &class); err != nil || (class != wire.PointerClass && class != wire.LegacyPointerClass) {
		return nil, badMessage("payload pointer of unknown class %s (want %s or %s)", truncate(string(parts[0]), 100), wire.PointerClass, wire.LegacyPointerClass)
	}
	var ref struct {
		Bucket string `json:"s3BucketName"`
		Key    string `json:"s3Key"`
	}
	if err := json.Unmarshal(parts[1], &ref); err != nil || ref.Bucket == "" || ref.Key == "" {
		return nil, badMessage("payload pointer without s3BucketName and s3Key: %s", truncate(string(parts[1]), 200))
	}
	return &Offloaded{Bucket: ref.Bucket, Key: ref.Key, Size: size}, nil
}

// fetchPayloads fetches the offloaded payloads of b's records, Concurrency at a time, before
// any transaction opens: a record whose payload cannot be fetched fails (r.err), as a record
// that cannot be parsed does, and blocks its FIFO group for the rest of the batch. The
// handlers, the batched mode's insert and the asynchronous mode's stored row all see the
// fetched body.
func (b *batch) fetchPayloads(ctx context.Context) {
	var todo []*record
	for i := range b.recs {
		if r := &b.recs[i]; r.err == nil && r.msg.Offloaded != nil {
			todo = append(todo, r)
		}
	}
	if len(todo) == 0 {
		return
	}
	n := defaultFetchConcurrency
	if cc := b.c.claimCheck; cc != nil {
		n = cc.Concurrency
	}
	sem := make(chan struct{}, n)
	var wg sync.WaitGroup
	for _, r := range todo {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			if err := b.c.fetchPayload(ctx, &r.msg); err != nil {
				r.err = fmt.Errorf("record %s: %w", r.id, err)
			}
		}()
	}
	wg.Wait()
}

// fetchPayload replaces msg's pointer with the payload it points to. It errs with ErrClaimCheck
// (and ErrDeadline when ctx ended first, ErrBadMessage when the object is not JSON).
func (c *Consumer) fetchPayload(ctx context.Context, msg *Message) error {
	o := msg.Offloaded
	if o == nil {
		return nil
	}
	cc := c.claimCheck
	if cc == nil {
		return fmt.Errorf("message %s: %w: its payload is in %s and this consumer has no ConsumerConfig.ClaimCheck (SLUICE_CLAIM_CHECK_BUCKET for the Lambdas)",
			msg.ID, ErrClaimCheck, o.URI())
	}
	loc, ok := cc.location(o)
	if !ok {
		return fmt.Errorf("message %s: %w: %w: it points at %s, and this consumer fetches only from %s (ClaimCheck.Locations; SLUICE_CLAIM_CHECK_BUCKET and SLUICE_CLAIM_CHECK_PREFIX for the Lambdas)",
			msg.ID, ErrClaimCheck, ErrPayloadLocation, o.URI(), cc.locationList())
	}
	if o.Size > cc.MaxPayloadBytes {
		return fmt.Errorf("message %s: %w: the payload in %s is %d bytes, above ClaimCheck.MaxPayloadBytes %d (SLUICE_CLAIM_CHECK_MAX_PAYLOAD)",
			msg.ID, ErrClaimCheck, o.URI(), o.Size, cc.MaxPayloadBytes)
	}
	body, err := cc.Store.GetPayload(ctx, loc, o.Key, cc.MaxPayloadBytes)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("message %s: %w: %w (%v)", msg.ID, ErrClaimCheck, ErrDeadline, err)
		}
		return fmt.Errorf("message %s: %w: %w", msg.ID, ErrClaimCheck, err)
	}
	body = bytes.TrimSpace(body)
	if len(body) == 0 || !json.Valid(body) {
		return fmt.Errorf("message %s: %w: %w: the object %s is not JSON (%d bytes)", msg.ID, ErrClaimCheck, ErrBadMessage, o.URI(), len(body))
	}
	msg.Payload = json.RawMessage(body)
	return nil
}

// location returns the configured location o is in: its bucket, under its key prefix.
func (c *ClaimCheck) location(o *Offloaded) (PayloadLocation, bool) {
	for _, l := range c.Locations {
		if o.Bucket == l.Bucket && strings.HasPrefix(o.Key, l.KeyPrefix) {
			return l, true
		}
	}
	return PayloadLocation{}, false
}

func (c *ClaimCheck) locationList() string {
	uris := make([]string, len(c.Locations))
	for i, l := range c.Locations {
		uris[i] = l.URI()
	}
	return strings.Join(uris, ", ")
}

// PayloadStore reads claim-checked payloads.
type PayloadStore interface {
	// GetPayload returns the object key of the bucket at loc (its ExpectedBucketOwner
	// checked). It refuses one larger than maxBytes without reading it whole, and wraps
	// ErrPayloadMissing when there is no such object.
	GetPayload(ctx context.Context, loc PayloadLocation, key string, maxBytes int) ([]byte, error)
}

// S3Getter is the one S3 call an S3PayloadStore makes; *s3.Client implements it, and a test or
// a wrapper (metrics, retries) may stand in for it.
type S3Getter interface {
	GetObject(ctx context.Context, in *s3.GetObjectInput, opts ...func(*s3.Options)) (*s3.GetObjectOutput, error)
}

var _ S3Getter = (*s3.Client)(nil)

// S3PayloadStore is a PayloadStore on S3 (GetObject). It never deletes objects.
type S3PayloadStore struct{ client S3Getter }

// NewS3PayloadStore returns a PayloadStore over an S3 client (path-style addressing for a
// local endpoint: s3.NewFromConfig(cfg, func(o *s3.Options) { o.UsePathStyle = true })).
func NewS3PayloadStore(client S3Getter) *S3PayloadStore { return &S3PayloadStore{client: client} }

// GetPayload implements PayloadStore. A missing object is ErrPayloadMissing when S3 says so:
// 404 (NoSuchKey, NoSuchBucket), which S3 answers only to a caller that may list the bucket
// (s3:ListBucket, which the CDK grants the consumers on the claim check's prefix); to one that
// may not, S3 answers 403 for a missing key as for a denied one, and the error says so.
func (s *S3PayloadStore) GetPayload(ctx context.Context, loc PayloadLocation, key string, maxBytes int) ([]byte, error) {
	uri := "s3://" + loc.Bucket + "/" + key
	in := &s3.GetObjectInput{Bucket: aws.String(loc.Bucket), Key: aws.String(key)}
	if loc.ExpectedBucketOwner != "" {
		in.ExpectedBucketOwner = aws.String(loc.ExpectedBucketOwner)
	}
	out, err := s.client.GetObject(ctx, in)
	if err != nil {
		var noKey *s3types.NoSuchKey
		var noBucket *s3types.NoSuchBucket
		var apiErr smithy.APIError
		var status interface{ HTTPStatusCode() int }
		if errors.As(err, &noKey) || errors.As(err, &noBucket) ||
			(errors.As(err, &apiErr) && (apiErr.ErrorCode() == "NoSuchKey" || apiErr.ErrorCode() == "NoSuchBucket" || apiErr.ErrorCode() == "NotFound")) {
			return nil, fmt.Errorf("fetch payload %s: %w (expired by the bucket's lifecycle, deleted, or never stored): %w", uri, ErrPayloadMissing, err)
		}
		if errors.As(err, &status) && status.HTTPStatusCode() == 403 {
			return nil, fmt.Errorf("fetch payload %s: access denied (S3 answers 403 for a missing object to a role without s3:ListBucket on the bucket, "+
				"and for a bucket another account owns when ExpectedBucketOwner is set): %w", uri, err)
		}
		return nil, fmt.Errorf("fetch payload %s: %w", uri, err)
	}
	defer out.Body.Close()
	if n := aws.ToInt64(out.ContentLength); n > int64(maxBytes) {
		return nil, fmt.Errorf("fetch payload %s: the object is %d bytes, above the %d allowed (ClaimCheck.MaxPayloadBytes)", uri, n, maxBytes)
	}
	body, err := io.ReadAll(io.LimitReader(out.Body, int64(maxBytes)+1))
	if err != nil {
		return nil, fmt.Errorf("fetch payload %s: read: %w", uri, err)
	}
	if len(body) > maxBytes {
		return nil, fmt.Errorf("fetch payload %s: the object is larger than the %d bytes allowed (ClaimCheck.MaxPayloadBytes)", uri, maxBytes)
	}
	return body, nil
}
