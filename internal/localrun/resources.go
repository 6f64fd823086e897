package localrun

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
)

// defaultMaxReceiveCount is PipelineOptions.MaxReceiveCount's default.
const defaultMaxReceiveCount = 3

// PipelineOptions configure CreatePipeline.
type PipelineOptions struct {
	// Name prefixes every resource name. Required; at most 60 characters of letters, digits, - and _.
	Name string
	// FIFO creates a FIFO topic and FIFO queues (names ending in .fifo).
	FIFO bool
	// MaxReceiveCount is the queue's redrive policy: deliveries before a message moves to the
	// DLQ. Defaults to 3.
	MaxReceiveCount int
	// VisibilityTimeout is how long a received message stays hidden; a failed record reappears
	// after it. Defaults to 5 seconds (a Lambda setup uses six times the function timeout).
	VisibilityTimeout time.Duration
}

// Pipeline is an SNS topic fanned out to an SQS queue (raw delivery) with a DLQ.
type Pipeline struct {
	TopicARN, SubscriptionARN string
	QueueURL, QueueARN        string
	DLQURL, DLQARN            string
	FIFO                      bool
}

// CreatePipeline creates the topic, the DLQ, the queue with its redrive policy and its SNS
// access policy, and the raw-delivery subscription, through the standard APIs only.
func CreatePipeline(ctx context.Context, snsc *sns.Client, sqsc *sqs.Client, o PipelineOptions) (Pipeline, error) {
	o.MaxReceiveCount = orInt(o.MaxReceiveCount, defaultMaxReceiveCount)
	if o.VisibilityTimeout == 0 {
		o.VisibilityTimeout = 5 * time.Second
	}
	suffix := ""
	if o.FIFO {
		suffix = ".fifo"
	}
	p := Pipeline{FIFO: o.FIFO}
	topicAttrs := map[string]string{}
	if o.FIFO {
		topicAttrs["FifoTopic"] = "true"
		topicAttrs["ContentBasedDeduplication"] = "false"
	}
	t, err := snsc.CreateTopic(ctx, &sns.CreateTopicInput{Name: aws.String(o.Name + "-topic" + suffix), Attributes: topicAttrs})
	if err != nil {
		return p, fmt.Errorf("create topic: %w", err)
	}
	p.TopicARN = aws.ToString(t.TopicArn)

	queue := func(name string, attrs map[string]string) (string, string, error) {
		if o.FIFO {
			attrs[string(sqstypes.QueueAttributeNameFifoQueue)] = "true"
		}
		q, err := sqsc.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name + suffix), Attributes: attrs})
		if err != nil {
			return "", "", fmt.Errorf("create queue %s: %w", name, err)
		}
		a, err := sqsc.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: q.QueueUrl,
			AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
		if err != nil {
			return "", "", fmt.Errorf("read queue %s ARN: %w", name, err)
		}
		return aws.ToString(q.QueueUrl), a.Attributes[string(sqstypes.QueueAttributeNameQueueArn)], nil
	}
	if p.DLQURL, p.DLQARN, err = queue(o.Name+"-dlq", map[string]string{"MessageRetentionPeriod": "1209600"}); err != nil {
		return p, err
	}
	redrive, _ := json.Marshal(map[string]string{"deadLetterTargetArn": p.DLQARN, "maxReceiveCount": strconv.Itoa(o.MaxReceiveCount)})
	if p.QueueURL, p.QueueARN, err = queue(o.Name+"-queue", map[string]string{
		"VisibilityTimeout": strconv.Itoa(int(o.VisibilityTimeout / time.Second)),
		"RedrivePolicy":     string(redrive),
	}); err != nil {
		return p, err
	}
	// Real SQS refuses SNS deliveries without this policy; emulators ignore it.
	policy, _ := json.Marshal(map[string]any{
		"Version": "2012-10-17",
		"Statement": []map[string]any{{
			"Effect": "Allow", "Principal": map[string]string{"Service": "sns.amazonaws.com"},
			"Action": "sqs:SendMessage", "Resource": p.QueueARN,
			"Condition": map[string]any{"ArnEquals": map[string]string{"aws:SourceArn": p.TopicARN}},
		}},
	})
	if _, err := sqsc.SetQueueAttributes(ctx, &sqs.SetQueueAttributesInput{QueueUrl: aws.String(p.QueueURL),
		Attributes: map[string]string{"Policy": string(policy)}}); err != nil {
		return p, fmt.Errorf("set queue policy: %w", err)
	}
	sub, err := snsc.Subscribe(ctx, &sns.SubscribeInput{TopicArn: aws.String(p.TopicARN), Protocol: aws.String("sqs"),
		Endpoint: aws.String(p.QueueARN), Attributes: map[string]string{"RawMessageDelivery": "true"}, ReturnSubscriptionArn: true})
	if err != nil {
		return p, fmt.Errorf("subscribe queue to topic: %w", err)
	}
	p.SubscriptionARN = aws.ToString(sub.SubscriptionArn)
	return p, nil
}

// Delete removes the pipeline's resources, ignoring what is already gone.
func (p Pipeline) Delete(ctx context.Context, snsc *sns.Client, sqsc *sqs.Client) {
	if p.SubscriptionARN != "" {
		_, _ = snsc.Unsubscribe(ctx, &sns.UnsubscribeInput{SubscriptionArn: aws.String(p.SubscriptionARN)})
	}
	if p.TopicARN != "" {
		_, _ = snsc.DeleteTopic(ctx, &sns.DeleteTopicInput{TopicArn: aws.String(p.TopicARN)})
	}
	for _, u := range []string{p.QueueURL, p.DLQURL} {
		if u != "" {
			_, _ = sqsc.DeleteQueue(ctx, &sqs.DeleteQueueInput{QueueUrl: aws.String(u)})
		}
	}
}

// Depth returns the approximate number of visible plus in-flight messages of a queue.
func Depth(ctx context.Context, sqsc *sqs.Client, queueURL string) (int, error) {
	a, err := sqsc.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: aws.String(queueURL),
		AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameApproximateNumberOfMessages,
			sqstypes.QueueAttributeNameApproximateNumberOfMessagesNotVisible}})
	if err != nil {
		return 0, fmt.Errorf("read queue depth: %w", err)
	}
	n := 0
	for _, k := range []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameApproximateNumberOfMessages, sqstypes.QueueAttributeNameApproximateNumberOfMessagesNotVisible} {
		v, _ := strconv.Atoi(a.Attributes[string(k)])
		n += v
	}
	return n, nil
}
