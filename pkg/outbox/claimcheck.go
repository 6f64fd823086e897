package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"

	"github.com/sluicehq/sluice/internal/wire"
)

// ClaimCheck stores the payloads of messages too large for their destination in S3 and
// publishes, instead of the payload, a pointer in the format of AWS's extended client
// libraries (the body ["software.amazon.payloadoffloading.PayloadS3Pointer",
// {"s3BucketName": ..., "s3Key": ...}] and the Number attribute ExtendedPayloadSize), which the
// inbox, and consumers written with the extended clients in Java or Python, resolve. The
// object's key is KeyPrefix + event_id, so a republished row overwrites its object instead of
// leaving another; the relay never deletes objects (the bucket's lifecycle does).
type ClaimCheck struct {
	// Store receives the payloads: NewS3PayloadStore(s3.NewFromConfig(cfg)). Required.
	Store PayloadStore
	// Bucket is the S3 bucket. Required.
	Bucket string
	// KeyPrefix is put before each object's key (the event id), e.g. "outbox/". Defaults to "".
	KeyPrefix string
	// Threshold: a message larger than this (payload and attributes, as the destination counts
	// them) has its payload stored in S3. Defaults to 0: the destination's message limit
	// (Limits.MaxMessageBytes), which it never exceeds.
	Threshold int
	// MaxPayloadBytes is the largest payload the relay stores in S3; a larger row is
	// quarantined. Defaults to 32 MiB.
	MaxPayloadBytes int
}

// Check reports every problem of c at once (what NewRelay refuses), for tools that check a
// configuration before deploying it.
func (c *ClaimCheck) Check() error { return c.validate() }

func (c *ClaimCheck) validate() error {
	var errs []error
	if c.Store == nil {
		errs = append(errs, errors.New("ClaimCheck.Store is required"))
	}
	if strings.TrimSpace(c.Bucket) == "" {
		errs = append(errs, errors.New("ClaimCheck.Bucket is required"))
	}
	if len(c.KeyPrefix) > 900 {
		errs = append(errs, fmt.Errorf("ClaimCheck.KeyPrefix is %d bytes; S3 keys are at most 1,024 with the event id", len(c.KeyPrefix)))
	}
	cfg := RelayConfig{ClaimCheck: c}
	for _, s := range relaySettings {
		if strings.HasPrefix(s.Field, "ClaimCheck.") {
			if v := s.Get(cfg); v != 0 { // 0: the default
				errs = append(errs, s.Check(v))
			}
		}
	}
	return errors.Join(errs...)
}

func (c *ClaimCheck) maxPayload() int {
	if c.MaxPayloadBytes == 0 {
		return settingDefault("ClaimCheck.MaxPayloadBytes")
	}
	return c.MaxPayloadBytes
}

// threshold returns the message size above which a message of a destination with lim is offloaded.
func (c *ClaimCheck) threshold(lim Limits) int {
	if c.Threshold == 0 {
		return lim.MaxMessageBytes
	}
	return min(c.Threshold, lim.MaxMessageBytes)
}

// key returns the object key of e's payload.
func (c *ClaimCheck) key(e *Event) string { return c.KeyPrefix + e.EventID.String() }

// pointer returns the body that replaces e's payload.
func (c *ClaimCheck) pointer(e *Event) []byte {
	return payloadPointer(c.Bucket, c.key(e))
}

// payloadPointer returns the extended clients' pointer body for an object.
func payloadPointer(bucket, key string) []byte {
	ref, _ := json.Marshal(struct {
		Bucket string `json:"s3BucketName"`
		Key    string `json:"s3Key"`
	}{bucket, key})
	var b bytes.Buffer
	b.WriteString(`["` + wire.PointerClass + `",`)
	b.Write(ref)
	b.WriteString("]")
	return b.Bytes()
}

// offloadedShape returns what e's message is once its payload of payloadLen bytes is
// offloaded, for measuring it: e with ExtendedPayloadSize set (its payload is not read), and
// the pointer's length, the published payload's.
func (c *ClaimCheck) offloadedShape(e *Event, payloadLen int) (*Event, int) {
	o := *e
	o.ExtendedPayloadSize = payloadLen
	return &o, len(c.pointer(e))
}

// offloaded returns a copy of e whose payload is the pointer to the stored one.
func (c *ClaimCheck) offloaded(e *Event) *Event {
	o := *e
	o.ExtendedPayloadSize = len(e.Payload)
	o.Payload = c.pointer(e)
	return &o
}

// PayloadStore stores claim-checked payloads.
type PayloadStore interface {
	// PutPayload stores body at bucket/key, replacing what is there. An error wrapped with
	// Permanent means retrying cannot help.
	PutPayload(ctx context.Context, bucket, key string, body []byte) error
}

// S3API is the one S3 call an S3PayloadStore makes: *s3.Client has it, and a wrapping client
// may stand in.
type S3API interface {
	PutObject(ctx context.Context, in *s3.PutObjectInput, opts ...func(*s3.Options)) (*s3.PutObjectOutput, error)
}

var _ S3API = (*s3.Client)(nil)

// S3PayloadStore is a PayloadStore on S3 (PutObject, content type application/json).
type S3PayloadStore struct{ client S3API }

// NewS3PayloadStore returns a PayloadStore over an S3 client.
func NewS3PayloadStore(client S3API) *S3PayloadStore { return &S3PayloadStore{client: client} }

// PutPayload implements PayloadStore.
func (s *S3PayloadStore) PutPayload(ctx context.Context, bucket, key string, body []byte) error {
	_, err := s.client.PutObject(ctx, &s3.PutObjectInput{
		Bucket: aws.String(bucket), Key: aws.String(key), Body: bytes.NewReader(body),
		ContentLength: aws.Int64(int64(len(body))), ContentType: aws.String("application/json"),
	})
	if err != nil {
		err = fmt.Errorf("store payload in s3://%s/%s: %w", bucket, key, err)
		var apiErr smithy.APIError
		if errors.As(err, &apiErr) && (apiErr.ErrorCode() == "InvalidBucketName" || apiErr.ErrorCode() == "KeyTooLongError" || apiErr.ErrorCode() == "EntityTooLarge") {
			err = Permanent(err)
		}
	}
	return err
}

// extendedSizeAttr is the ExtendedPayloadSize attribute's value.
func extendedSizeAttr(n int) string { return strconv.Itoa(n) }

// OffloadBacklog is what a claim check still has to store: the pending rows whose payload is
// larger than a threshold, counted over a bounded sample (see OffloadBacklogOf).
type OffloadBacklog struct {
	// Threshold is the payload size, in bytes of the published text, rows are compared with.
	Threshold int
	// Examined is how many pending (unquarantined) rows were measured.
	Examined int64
	// Above is how many of them have a payload larger than Threshold, and AboveBytes the size
	// of those payloads: with a claim check the relay stores them in S3; without one it
	// quarantines them as too large.
	Above, AboveBytes int64
	// Complete reports that every pending row was examined.
	Complete bool
}

// Bounds of OffloadBacklogOf's sample.
const (
	// offloadSampleRows is the most pending rows OffloadBacklogOf measures.
	offloadSampleRows = 1000
	// offloadSampleStoredBytes bounds the stored (possibly compressed) payload bytes it reads.
	offloadSampleStoredBytes = 64 << 20
)

// OffloadBacklogOf counts the pending rows whose payload text is larger than threshold bytes
// (attributes not counted). Its cost is bounded whatever the backlog: it reads at most 1,000
// pending rows in the pending key index's order, and measures them (reads the payload's text)
// only while their stored sizes total at most 64 MiB; Complete says whether that covered every
// pending row.
func OffloadBacklogOf(ctx context.Context, db Querier, threshold int) (OffloadBacklog, error) {
	if threshold < 1 {
		return OffloadBacklog{}, fmt.Errorf("outbox: offload backlog needs a positive threshold, got %d", threshold)
	}
	b := OffloadBacklog{Threshold: threshold}
	var more bool
	err := db.QueryRow(ctx, offloadBacklogSQL, threshold, offloadSampleRows, offloadSampleStoredBytes).Scan(&b.Examined, &b.Above, &b.AboveBytes, &more)
	if err != nil {
		return OffloadBacklog{}, fmt.Errorf("read the claim check's backlog: %w", err)
	}
	b.Complete = !more
	return b, nil
}

// offloadBacklogSQL walks at most $2 + 1 pending rows along outbox_event_pending_key_idx (a
// LIMIT on an index scan), measures those whose stored sizes before them total less than $3,
// and counts the ones printing to more than $1 bytes.
const offloadBacklogSQL = `
WITH sample AS (
    SELECT e.payload, pg_column_size(e.payload) AS stored, e.quarantined_at IS NOT NULL AS quarantined
    FROM outbox_event e WHERE e.published_at IS NULL
    ORDER BY e.partition_key, e.id LIMIT $2 + 1
), ranked AS (
    SELECT s.*, row_number() OVER () AS rn,
           coalesce(sum(s.stored) OVER (ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING), 0) AS before
    FROM sample s WHERE NOT s.quarantined
), measured AS (
    SELECT r.rn, CASE WHEN r.rn <= $2 AND r.before < $3 THEN octet_length(r.payload::text) END AS len FROM ranked r
)
SELECT count(len), count(*) FILTER (WHERE len > $1), coalesce(sum(len) FILTER (WHERE len > $1), 0),
       count(*) > count(len) OR (SELECT count(*) FROM sample) > $2
FROM measured`
