package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	ktypes "github.com/aws/aws-sdk-go-v2/service/kinesis/types"
	"github.com/aws/smithy-go"
)

// KinesisAPI is the one Kinesis call a KinesisPublisher makes: *kinesis.Client has it, and a
// wrapping client may stand in.
type KinesisAPI interface {
	PutRecords(ctx context.Context, in *kinesis.PutRecordsInput, opts ...func(*kinesis.Options)) (*kinesis.PutRecordsOutput, error)
}

var _ KinesisAPI = (*kinesis.Client)(nil)

// kinesisLimits are PutRecords': 500 records, each up to the stream's maximum record size (data
// and partition key: 1 MiB by default, up to 10 MiB; the relay's limit is
// MessageLimits.Kinesis), 5 MiB in all (a larger record goes alone).
var kinesisLimits = Limits{MaxEntries: 500, MaxMessageBytes: int(RelaySetting("MessageLimits.Kinesis").Max), MaxCallBytes: 5 << 20}

// KinesisPublisher publishes events to Kinesis data streams with PutRecords: the partition key
// is the row's partition key (hashed when longer than Kinesis's 256 characters), so a key stays
// on one shard, and the data is the envelope {"metadata": {...}, "data": payload}
// (wire.Envelope). The relay sends a key's next row only after its previous one was
// acknowledged, so a key's records are in id order on its shard (docs/destinations.md).
type KinesisPublisher struct {
	client KinesisAPI
}

// NewKinesisPublisher returns a Publisher over a Kinesis client.
func NewKinesisPublisher(client KinesisAPI) *KinesisPublisher {
	return &KinesisPublisher{client: client}
}

var (
	_ LimitedPublisher   = (*KinesisPublisher)(nil)
	_ DestinationChecker = (*KinesisPublisher)(nil)
)

// MessageSize implements LimitedPublisher: the record's data (the envelope) and partition key.
func (p *KinesisPublisher) MessageSize(_ string, e *Event, payloadLen int) int {
	return messageSize(Kinesis, e, payloadLen, "")
}

// Limits implements LimitedPublisher.
func (p *KinesisPublisher) Limits(string) Limits { return kinesisLimits }

// CheckDestination implements DestinationChecker: dest must be a stream ARN.
func (p *KinesisPublisher) CheckDestination(dest string) error {
	if d, err := ParseDestination(dest); err != nil || d.Kind != Kinesis {
		return fmt.Errorf("destination %q is not a Kinesis stream ARN (arn:aws:kinesis:REGION:ACCOUNT:stream/NAME)", dest)
	}
	return nil
}

// permanentKinesisCodes are error codes that retrying the same request cannot fix.
var permanentKinesisCodes = map[string]bool{
	"ResourceNotFoundException": true, "InvalidArgumentException": true, "ValidationException": true,
}

// PublishBatch implements Publisher. Records go out in as few PutRecords calls as the request
// limit allows. Throttling (ProvisionedThroughputExceededException) is retryable: the row backs
// off, or the stream as a whole when every record is throttled.
func (p *KinesisPublisher) PublishBatch(ctx context.Context, stream string, events []*Event) []error {
	errs := make([]error, len(events))
	var (
		records []ktypes.PutRecordsRequestEntry
		index   []int
		size    int
	)
	flush := func() {
		if len(records) == 0 {
			return
		}
		for j, err := range p.put(ctx, stream, records) {
			errs[index[j]] = err
		}
		records, index, size = nil, nil, 0
	}
	for i, e := range events {
		data, err := envelopeOf(e)
		if err != nil {
			errs[i] = Permanent(fmt.Errorf("kinesis: envelope of event %s: %w", e.EventID, err))
			continue
		}
		key := streamKey(e.PartitionKey)
		n := len(data) + len(key)
		if n > kinesisLimits.MaxMessageBytes {
			errs[i] = Permanent(fmt.Errorf("kinesis: event %s is %d bytes as a record, above the %d Kinesis takes", e.EventID, n, kinesisLimits.MaxMessageBytes))
			continue
		}
		if len(records) > 0 && size+n > kinesisLimits.MaxCallBytes || len(records) == kinesisLimits.MaxEntries {
			flush()
		}
		records = append(records, ktypes.PutRecordsRequestEntry{Data: data, PartitionKey: aws.String(key)})
		index, size = append(index, i), size+n
	}
	flush()
	return errs
}

func (p *KinesisPublisher) put(ctx context.Context, stream string, records []ktypes.PutRecordsRequestEntry) []error {
	out, err := p.client.PutRecords(ctx, &kinesis.PutRecordsInput{StreamARN: aws.String(stream), Records: records})
	if err != nil {
		err = fmt.Errorf("kinesis put records to %s: %w", stream, err)
		var apiErr smithy.APIError
		if errors.As(err, &apiErr) && permanentKinesisCodes[apiErr.ErrorCode()] {
			err = Permanent(err)
		}
		return CallFailed(len(records), err)
	}
	errs := make([]error, len(records))
	for i := range records {
		if i >= len(out.Records) {
			errs[i] = errors.New("kinesis put records: record missing from the response")
			continue
		}
		if code := aws.ToString(out.Records[i].ErrorCode); code != "" {
			errs[i] = fmt.Errorf("kinesis rejected record: %s: %s", code, aws.ToString(out.Records[i].ErrorMessage))
		}
	}
	return errs
}
