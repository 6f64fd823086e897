package outbox

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sns/types"
	"github.com/aws/smithy-go"

	"github.com/sluicehq/sluice/internal/wire"
)

// SNSAPI is the one SNS call an SNSPublisher makes: *sns.Client has it, and a wrapping client
// (retries, metrics, a test double) may stand in.
type SNSAPI interface {
	PublishBatch(ctx context.Context, in *sns.PublishBatchInput, opts ...func(*sns.Options)) (*sns.PublishBatchOutput, error)
}

var _ SNSAPI = (*sns.Client)(nil)

// SNSPublisher publishes events with SNS PublishBatch, carrying the contract's attributes and,
// on FIFO topics (ARN ending in .fifo), MessageGroupId = partition key (qualified by the
// tenant, "tenant:key", on a fleet's messages: see groupID) and MessageDeduplicationId = event id.
type SNSPublisher struct {
	client SNSAPI
}

// NewSNSPublisher returns a Publisher over an SNS client (which honours AWS_ENDPOINT_URL when
// built with config.LoadDefaultConfig).
func NewSNSPublisher(client SNSAPI) *SNSPublisher {
	return &SNSPublisher{client: client}
}

// permanentSNSCodes are error codes that retrying the same request cannot fix.
var permanentSNSCodes = map[string]bool{
	"NotFound": true, "NotFoundException": true, "InvalidParameter": true, "InvalidParameterException": true,
	"InvalidParameterValue": true, "InvalidParameterValueException": true, "ParameterValueInvalid": true,
	"BatchEntryIdsNotDistinct": true, "EmptyBatchRequest": true, "InvalidBatchEntryId": true,
	"TooManyEntriesInBatchRequest": true, "BatchRequestTooLong": true, "InvalidSecurity": true,
}

var (
	_ LimitedPublisher   = (*SNSPublisher)(nil)
	_ DestinationChecker = (*SNSPublisher)(nil)
)

// Limits implements LimitedPublisher: 10 entries and 256 KiB a call.
func (p *SNSPublisher) Limits(string) Limits { return snsLimits }

// MessageSize implements LimitedPublisher: the body and each attribute's name, type and
// value, as SNS (and SQS, for raw delivery) count them.
func (p *SNSPublisher) MessageSize(_ string, e *Event, payloadLen int) int {
	return messageSize(SNS, e, payloadLen, "")
}

// CheckDestination implements DestinationChecker: dest must be an SNS topic ARN.
func (p *SNSPublisher) CheckDestination(dest string) error {
	if d, err := ParseDestination(dest); err != nil || d.Kind != SNS {
		return fmt.Errorf("destination %q is not an SNS topic ARN (arn:aws:sns:REGION:ACCOUNT:NAME)", dest)
	}
	return nil
}

// PublishBatch implements Publisher.
func (p *SNSPublisher) PublishBatch(ctx context.Context, topicARN string, events []*Event) []error {
	if len(events) == 0 {
		return nil
	}
	fifo := strings.HasSuffix(topicARN, ".fifo")
	entries := make([]types.PublishBatchRequestEntry, len(events))
	for i, e := range events {
		entries[i] = types.PublishBatchRequestEntry{
			Id:                aws.String(strconv.Itoa(i)),
			Message:           aws.String(string(e.Payload)),
			MessageAttributes: attributes(e),
		}
		if fifo {
			entries[i].MessageGroupId = aws.String(groupID(e.Headers[wire.Tenant], e.PartitionKey))
			entries[i].MessageDeduplicationId = aws.String(e.EventID.String())
		}
	}
	out, err := p.client.PublishBatch(ctx, &sns.PublishBatchInput{TopicArn: aws.String(topicARN), PublishBatchRequestEntries: entries})
	if err != nil {
		err = fmt.Errorf("sns publish batch to %s: %w", topicARN, err)
		var apiErr smithy.APIError
		if errors.As(err, &apiErr) && permanentSNSCodes[apiErr.ErrorCode()] {
			err = Permanent(err)
		}
		return CallFailed(len(events), err)
	}
	errs := CallFailed(len(events), errors.New("sns publish batch: entry missing from the response"))
	for _, s := range out.Successful {
		if i, ok := entryIndex(s.Id, len(events)); ok {
			errs[i] = nil
		}
	}
	for _, f := range out.Failed {
		i, ok := entryIndex(f.Id, len(events))
		if !ok {
			continue
		}
		code := aws.ToString(f.Code)
		err := fmt.Errorf("sns rejected entry: %s: %s", code, aws.ToString(f.Message))
		if permanentSNSCodes[code] {
			err = Permanent(err)
		}
		errs[i] = err
	}
	return errs
}

func entryIndex(id *string, n int) (int, bool) {
	i, err := strconv.Atoi(aws.ToString(id))
	return i, err == nil && i >= 0 && i < n
}

// attributes returns the message attributes of the wire contract for e (wireAttributes) as
// SNS takes them.
func attributes(e *Event) map[string]types.MessageAttributeValue {
	list := wireAttributes(e, make([]wireAttribute, 0, snsMaxAttributes))
	attrs := make(map[string]types.MessageAttributeValue, len(list))
	for _, a := range list {
		attrs[a.name] = types.MessageAttributeValue{DataType: aws.String(a.dataType), StringValue: aws.String(a.value)}
	}
	return attrs
}

// wireAttribute is one message attribute: its name, SNS data type and value.
type wireAttribute struct{ name, dataType, value string }

// wireAttributes appends to list the message attributes of the wire contract for e, in the
// order they are taken: the five contract attributes (empty values omitted, as SNS refuses
// them), the claim check's Number attribute ExtendedPayloadSize when the payload is in S3,
// and then headers, traceparent and tracestate first and the rest by name, while SNS's limit
// of 10 attributes allows. The one place that decides what a message carries: attributes
// publishes it, attributesSize measures it, droppedHeaders reports what did not fit.
func wireAttributes(e *Event, list []wireAttribute) []wireAttribute {
	put := func(k, v string) {
		if v != "" && len(list) < snsMaxAttributes {
			list = append(list, wireAttribute{k, "String", v})
		}
	}
	put(wire.MessageID, e.EventID.String())
	put(wire.EventType, e.EventType)
	put(wire.AggregateType, e.AggregateType)
	put(wire.AggregateID, e.AggregateID)
	put(wire.CreatedAt, e.CreatedAt.UTC().Format(time.RFC3339Nano))
	if e.ExtendedPayloadSize > 0 {
		list = append(list, wireAttribute{wire.ExtendedPayloadSize, "Number", extendedSizeAttr(e.ExtendedPayloadSize)})
	}
	for _, k := range headerOrder(e.Headers) {
		if checkHeaderName(k) == "" && checkAttrValue(e.Headers[k]) == "" {
			put(k, e.Headers[k])
		}
	}
	return list
}

// headerOrder returns h's names in the order wireAttributes takes them.
func headerOrder(h map[string]string) []string {
	if len(h) == 0 {
		return nil
	}
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	rank := func(k string) int {
		switch k {
		case wire.Tenant: // a fleet's consumers route by it: the last header ever dropped
			return 0
		case wire.Traceparent:
			return 1
		case wire.Tracestate:
			return 2
		}
		return 3
	}
	slices.SortFunc(keys, func(a, b string) int {
		if c := cmp.Compare(rank(a), rank(b)); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	return keys
}

// groupID turns a partition key into a valid FIFO MessageGroupId: the key itself when it fits
// SNS's 128 characters of printable ASCII, otherwise a stable SHA-256 of it; "_" for an empty key.
// A fleet's message (tenant set: its TenantHeader) has the group "tenant:key", hashed the same
// way when that does not fit: two tenants' events with the same key are in different groups,
// so that one tenant's failed or slow message never holds another tenant's at the queue. A
// tenant's name has no ':', so the group names one tenant's key and only it.
func groupID(tenant, key string) string {
	if tenant != "" {
		key = tenant + ":" + key
	}
	if key == "" {
		return "_"
	}
	ok := len(key) <= 128
	for i := 0; ok && i < len(key); i++ {
		ok = key[i] >= 0x21 && key[i] <= 0x7e
	}
	if ok {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "sha256-" + hex.EncodeToString(sum[:])
}

// attributesSize is the size SNS counts for a published event's attributes: names, types
// and values. The message's size is the payload's length plus this.
func attributesSize(e *Event) int {
	var buf [snsMaxAttributes]wireAttribute
	n := 0
	for _, a := range wireAttributes(e, buf[:0]) {
		n += len(a.name) + len(a.dataType) + len(a.value)
	}
	return n
}

// droppedHeaders returns the valid headers of e that do not fit SNS's attribute limit after
// the contract's attributes (rows written with plain SQL; Write refuses such messages).
func droppedHeaders(e *Event) []string {
	if len(e.Headers) <= snsMaxAttributes-attributesBeforeHeaders { // every header fits
		return nil
	}
	var buf [snsMaxAttributes]wireAttribute
	taken := wireAttributes(e, buf[:0])
	var dropped []string
	for _, k := range headerOrder(e.Headers) {
		if !slices.ContainsFunc(taken, func(a wireAttribute) bool { return a.name == k }) &&
			checkHeaderName(k) == "" && checkAttrValue(e.Headers[k]) == "" {
			dropped = append(dropped, k)
		}
	}
	return dropped
}
