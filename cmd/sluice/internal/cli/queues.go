package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
)

// SQSAPI is the part of the SQS API the CLI uses.
type SQSAPI interface {
	GetQueueAttributes(ctx context.Context, in *sqs.GetQueueAttributesInput, opts ...func(*sqs.Options)) (*sqs.GetQueueAttributesOutput, error)
	GetQueueUrl(ctx context.Context, in *sqs.GetQueueUrlInput, opts ...func(*sqs.Options)) (*sqs.GetQueueUrlOutput, error)
	ListQueues(ctx context.Context, in *sqs.ListQueuesInput, opts ...func(*sqs.Options)) (*sqs.ListQueuesOutput, error)
	ListDeadLetterSourceQueues(ctx context.Context, in *sqs.ListDeadLetterSourceQueuesInput, opts ...func(*sqs.Options)) (*sqs.ListDeadLetterSourceQueuesOutput, error)
	StartMessageMoveTask(ctx context.Context, in *sqs.StartMessageMoveTaskInput, opts ...func(*sqs.Options)) (*sqs.StartMessageMoveTaskOutput, error)
	ListMessageMoveTasks(ctx context.Context, in *sqs.ListMessageMoveTasksInput, opts ...func(*sqs.Options)) (*sqs.ListMessageMoveTasksOutput, error)
	ReceiveMessage(ctx context.Context, in *sqs.ReceiveMessageInput, opts ...func(*sqs.Options)) (*sqs.ReceiveMessageOutput, error)
	SendMessageBatch(ctx context.Context, in *sqs.SendMessageBatchInput, opts ...func(*sqs.Options)) (*sqs.SendMessageBatchOutput, error)
	DeleteMessageBatch(ctx context.Context, in *sqs.DeleteMessageBatchInput, opts ...func(*sqs.Options)) (*sqs.DeleteMessageBatchOutput, error)
	ChangeMessageVisibilityBatch(ctx context.Context, in *sqs.ChangeMessageVisibilityBatchInput, opts ...func(*sqs.Options)) (*sqs.ChangeMessageVisibilityBatchOutput, error)
}

var _ SQSAPI = (*sqs.Client)(nil)

// sqsClient returns the SQS client for this invocation.
func (a *app) sqsClient(ctx context.Context) (SQSAPI, error) {
	cfg, err := a.awsConfig(ctx)
	if err != nil {
		return nil, err
	}
	var c SQSAPI = sqs.NewFromConfig(cfg)
	if a.io.Hooks != nil && a.io.Hooks.WrapSQS != nil {
		c = a.io.Hooks.WrapSQS(c)
	}
	return c, nil
}

// queueInfo is what the CLI reads about a queue.
type queueInfo struct {
	URL, ARN, Name string
	FIFO           bool
	Visible        int64
	InFlight       int64
	Delayed        int64
	// RetentionSeconds is MessageRetentionPeriod.
	RetentionSeconds int64
	// DLQARN is the redrive policy's deadLetterTargetArn ("" when the queue has none).
	DLQARN          string
	MaxReceiveCount int
	ContentDedup    bool
}

// errNoSuchQueue is returned for a queue URL the endpoint does not know.
var errNoSuchQueue = errors.New("queue does not exist")

// isNoSuchQueue recognises SQS's "queue does not exist" in its JSON and query protocol spellings.
func isNoSuchQueue(err error) bool {
	var nq *sqstypes.QueueDoesNotExist
	if errors.As(err, &nq) {
		return true
	}
	var api smithy.APIError
	if errors.As(err, &api) {
		code := api.ErrorCode()
		return strings.Contains(code, "NonExistentQueue") || strings.Contains(code, "QueueDoesNotExist")
	}
	return false
}

// isUnsupported recognises an endpoint that does not implement an action (an emulator): an
// AWS error code saying so, or an HTTP 500/501 whose body is not an AWS error at all (moto
// answers actions it lacks with an HTML error page). A real SQS answers errors in its own
// format, so mistaking a real failure for this costs at most the receive/send/delete path,
// which is correct everywhere.
func isUnsupported(err error) bool {
	var de *smithy.DeserializationError
	var re *awshttp.ResponseError
	if errors.As(err, &de) && errors.As(err, &re) {
		if code := re.HTTPStatusCode(); code == http.StatusInternalServerError || code == http.StatusNotImplemented {
			return true
		}
	}
	var api smithy.APIError
	if !errors.As(err, &api) {
		return false
	}
	switch code := api.ErrorCode(); {
	case strings.Contains(code, "InvalidAction"), strings.Contains(code, "UnknownOperation"),
		strings.Contains(code, "UnsupportedOperation"), strings.Contains(code, "NotImplemented"):
		return true
	}
	return strings.Contains(strings.ToLower(api.ErrorMessage()), "unknown action")
}

// describeQueue reads a queue's attributes; a missing queue yields an error naming the URL.
func describeQueue(ctx context.Context, c SQSAPI, url string) (queueInfo, error) {
	if url == "" {
		return queueInfo{}, usagef("empty queue URL")
	}
	if !strings.HasPrefix(url, "http://") && !strings.HasPrefix(url, "https://") {
		return queueInfo{}, usagef("%q is not a queue URL (want https://sqs.REGION.amazonaws.com/ACCOUNT/NAME)", url)
	}
	out, err := c.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{
		QueueUrl: aws.String(url), AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameAll},
	})
	if err != nil {
		if isNoSuchQueue(err) {
			return queueInfo{}, fmt.Errorf("queue %s: %w", url, errNoSuchQueue)
		}
		return queueInfo{}, fmt.Errorf("read attributes of queue %s: %w", url, err)
	}
	at := out.Attributes
	num := func(k string) int64 { n, _ := strconv.ParseInt(at[k], 10, 64); return n }
	q := queueInfo{
		URL: url, ARN: at["QueueArn"], FIFO: at["FifoQueue"] == "true",
		Visible: num("ApproximateNumberOfMessages"), InFlight: num("ApproximateNumberOfMessagesNotVisible"),
		Delayed: num("ApproximateNumberOfMessagesDelayed"), RetentionSeconds: num("MessageRetentionPeriod"),
		ContentDedup: at["ContentBasedDeduplication"] == "true",
	}
	q.Name = url[strings.LastIndex(url, "/")+1:]
	if rp := at["RedrivePolicy"]; rp != "" {
		var p struct {
			DeadLetterTargetArn string          `json:"deadLetterTargetArn"`
			MaxReceiveCount     json.RawMessage `json:"maxReceiveCount"`
		}
		if json.Unmarshal([]byte(rp), &p) == nil {
			q.DLQARN = p.DeadLetterTargetArn
			q.MaxReceiveCount, _ = strconv.Atoi(strings.Trim(string(p.MaxReceiveCount), `"`))
		}
	}
	return q, nil
}

// urlOfARN finds a queue's URL from its ARN (arn:aws:sqs:REGION:ACCOUNT:NAME).
func urlOfARN(ctx context.Context, c SQSAPI, arn string) (string, error) {
	parts := strings.Split(arn, ":")
	if len(parts) != 6 {
		return "", fmt.Errorf("%q is not an SQS queue ARN", arn)
	}
	in := &sqs.GetQueueUrlInput{QueueName: aws.String(parts[5])}
	if parts[4] != "" {
		in.QueueOwnerAWSAccountId = aws.String(parts[4])
	}
	out, err := c.GetQueueUrl(ctx, in)
	if err != nil {
		if isNoSuchQueue(err) {
			return "", fmt.Errorf("queue %s: %w", arn, errNoSuchQueue)
		}
		return "", fmt.Errorf("find the URL of queue %s: %w", arn, err)
	}
	return aws.ToString(out.QueueUrl), nil
}

// sourceQueues returns the URLs of the queues whose redrive policy targets dlqARN. It asks
// ListDeadLetterSourceQueues and, where the endpoint does not implement it, scans every
// queue's RedrivePolicy.
func sourceQueues(ctx context.Context, c SQSAPI, dlqURL, dlqARN string) ([]string, error) {
	var urls []string
	var next *string
	for {
		out, err := c.ListDeadLetterSourceQueues(ctx, &sqs.ListDeadLetterSourceQueuesInput{QueueUrl: aws.String(dlqURL), NextToken: next})
		if err != nil {
			if isUnsupported(err) {
				return scanSourceQueues(ctx, c, dlqARN)
			}
			return nil, fmt.Errorf("list the source queues of %s: %w", dlqURL, err)
		}
		urls = append(urls, out.QueueUrls...)
		if next = out.NextToken; next == nil {
			return urls, nil
		}
	}
}

func scanSourceQueues(ctx context.Context, c SQSAPI, dlqARN string) ([]string, error) {
	var urls []string
	var next *string
	for {
		out, err := c.ListQueues(ctx, &sqs.ListQueuesInput{NextToken: next, MaxResults: aws.Int32(1000)})
		if err != nil {
			return nil, fmt.Errorf("list queues: %w", err)
		}
		for _, u := range out.QueueUrls {
			q, err := describeQueue(ctx, c, u)
			if errors.Is(err, errNoSuchQueue) {
				continue // deleted meanwhile
			}
			if err != nil {
				return nil, err
			}
			if q.DLQARN == dlqARN {
				urls = append(urls, u)
			}
		}
		if next = out.NextToken; next == nil || aws.ToString(next) == "" {
			return urls, nil
		}
	}
}
