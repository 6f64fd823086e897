package admin

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Forever is the retention of a source that keeps its messages without a time limit (a Kafka
// topic with retention.ms -1, or compacted): no inbox retention outlasts it.
const Forever = time.Duration(math.MaxInt64)

// KinesisDescriber reads a Kinesis stream's summary; *kinesis.Client is one.
type KinesisDescriber interface {
	DescribeStreamSummary(ctx context.Context, in *kinesis.DescribeStreamSummaryInput, opts ...func(*kinesis.Options)) (*kinesis.DescribeStreamSummaryOutput, error)
}

var _ KinesisDescriber = (*kinesis.Client)(nil)

// KinesisRetention reads how long the Kinesis stream (a name or an ARN) keeps its records: its
// RetentionPeriodHours. A consumer's event source mapping that is reset to the stream's start
// delivers every record that young again.
func KinesisRetention(ctx context.Context, c KinesisDescriber, stream string) (time.Duration, error) {
	in := &kinesis.DescribeStreamSummaryInput{StreamName: aws.String(stream)}
	if strings.HasPrefix(stream, "arn:") {
		in = &kinesis.DescribeStreamSummaryInput{StreamARN: aws.String(stream)}
	}
	out, err := c.DescribeStreamSummary(ctx, in)
	if err != nil {
		return 0, fmt.Errorf("read the retention of Kinesis stream %s: %w", stream, err)
	}
	if out.StreamDescriptionSummary == nil || out.StreamDescriptionSummary.RetentionPeriodHours == nil {
		return 0, fmt.Errorf("read the retention of Kinesis stream %s: the answer has no RetentionPeriodHours", stream)
	}
	return time.Duration(*out.StreamDescriptionSummary.RetentionPeriodHours) * time.Hour, nil
}

// KafkaRequester sends a Kafka request to the cluster; *kgo.Client is one.
type KafkaRequester interface {
	Request(ctx context.Context, req kmsg.Request) (kmsg.Response, error)
}

// KafkaRetention reads how long the Kafka topic keeps its records: its retention.ms, or
// Forever when that is -1 or the topic is compacted without deletion (cleanup.policy compact),
// as the broker reports them (the topic's own setting, else the broker's default). A consumer
// group reset to the earliest offset delivers every record the topic still holds again.
func KafkaRetention(ctx context.Context, c KafkaRequester, topic string) (time.Duration, error) {
	req := kmsg.NewPtrDescribeConfigsRequest()
	res := kmsg.NewDescribeConfigsRequestResource()
	res.ResourceType = kmsg.ConfigResourceTypeTopic
	res.ResourceName = topic
	res.ConfigNames = []string{"retention.ms", "cleanup.policy"}
	req.Resources = append(req.Resources, res)
	resp, err := c.Request(ctx, req)
	if err != nil {
		return 0, fmt.Errorf("read the retention of Kafka topic %s: %w", topic, err)
	}
	out := resp.(*kmsg.DescribeConfigsResponse)
	if len(out.Resources) != 1 {
		return 0, fmt.Errorf("read the retention of Kafka topic %s: %d resources in the answer", topic, len(out.Resources))
	}
	r := out.Resources[0]
	if err := kerr.ErrorForCode(r.ErrorCode); err != nil {
		msg := ""
		if r.ErrorMessage != nil {
			msg = ": " + *r.ErrorMessage
		}
		return 0, fmt.Errorf("read the retention of Kafka topic %s: %w%s", topic, err, msg)
	}
	var retention, policy *string
	for _, cfg := range r.Configs {
		switch cfg.Name {
		case "retention.ms":
			retention = cfg.Value
		case "cleanup.policy":
			policy = cfg.Value
		}
	}
	if policy != nil && strings.Contains(*policy, "compact") && !strings.Contains(*policy, "delete") {
		return Forever, nil
	}
	if retention == nil {
		return 0, fmt.Errorf("read the retention of Kafka topic %s: the broker reported no retention.ms", topic)
	}
	ms, err := strconv.ParseInt(*retention, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("read the retention of Kafka topic %s: retention.ms %q: %w", topic, *retention, err)
	}
	if ms < 0 {
		return Forever, nil
	}
	if ms > int64(Forever/time.Millisecond) {
		return Forever, nil
	}
	return time.Duration(ms) * time.Millisecond, nil
}
