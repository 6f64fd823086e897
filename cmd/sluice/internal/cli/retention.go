package cli

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/kinesis"
	"github.com/spf13/pflag"

	"github.com/sluicehq/sluice/internal/admin"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
)

// InboxSources name where an inbox consumer's messages can come from again, so that its rows
// are kept as long as a message can come back (a purge, or a drop of inbox partitions, is
// refused otherwise): an SQS queue redelivers or its DLQ is redriven within their retention; a
// Kinesis stream or a Kafka topic is read again from its start (a new event source mapping, a
// reset consumer group) within its retention. Without any, the bound is SQS's 14-day maximum.
type InboxSources struct {
	// Queues are SQS queue URLs: their MessageRetentionPeriod and their DLQs'.
	Queues []string
	// KinesisStreams are Kinesis stream names or ARNs: their RetentionPeriodHours, read with
	// Kinesis (required with them).
	KinesisStreams []string
	Kinesis        admin.KinesisDescriber
	// KafkaTopics are Kafka (MSK) topics: their retention.ms (or forever, when -1 or
	// compacted), read with Kafka (required with them).
	KafkaTopics []string
	Kafka       admin.KafkaRequester
	// Retention, when positive, is a source's retention given by hand (one the CLI cannot
	// reach); the bound is the longest of it and what is read.
	Retention time.Duration
}

func (s *InboxSources) flags(fl *pflag.FlagSet) {
	fl.StringArrayVar(&s.Queues, "queue", nil, "SQS queue URL of an inbox consumer (fed by SNS or EventBridge); refuse if its (or its DLQ's) retention is not shorter than --older-than (repeatable)")
	fl.StringArrayVar(&s.KinesisStreams, "kinesis-stream", nil, "Kinesis stream (name or ARN) an inbox consumer reads; refuse if its retention is not shorter than --older-than (repeatable)")
	fl.StringArrayVar(&s.KafkaTopics, "kafka-topic", nil, "Kafka (MSK) topic an inbox consumer reads, on the brokers of $"+lambdaenv.KafkaBrokers+"; refuse if its retention.ms is not shorter than --older-than (repeatable)")
	fl.Var(&durationValue{d: &s.Retention}, "source-retention", "retention of an inbox consumer's source given by hand (a stream or topic this machine cannot reach); refuse if it is not shorter than --older-than")
}

func (s InboxSources) named() bool {
	return len(s.Queues)+len(s.KinesisStreams)+len(s.KafkaTopics) > 0 || s.Retention > 0
}

// connect opens the clients the named sources need (SQS for queues; Kinesis; Kafka from the
// relay's settings), and returns the SQS client and a function that closes what it opened.
func (a *app) connectSources(ctx context.Context, s *InboxSources) (SQSAPI, func(), error) {
	var c SQSAPI
	closeAll := func() {}
	if len(s.Queues) > 0 {
		var err error
		if c, err = a.sqsClient(ctx); err != nil {
			return nil, closeAll, err
		}
	}
	if len(s.KinesisStreams) > 0 && s.Kinesis == nil {
		cfg, err := a.awsConfig(ctx)
		if err != nil {
			return nil, closeAll, err
		}
		s.Kinesis = kinesis.NewFromConfig(cfg)
	}
	if len(s.KafkaTopics) > 0 && s.Kafka == nil {
		cfg, err := a.awsConfig(ctx)
		if err != nil {
			return nil, closeAll, err
		}
		kc, err := lambdaenv.KafkaClient(ctx, a.io.Getenv, cfg)
		if err != nil {
			return nil, closeAll, fmt.Errorf("--kafka-topic: %w (or give the topic's retention with --source-retention)", err)
		}
		s.Kafka, closeAll = kc, kc.Close
	}
	return c, closeAll, nil
}

// longestRetention returns the longest time a message of the sources can come back, and which
// source has it.
func (s InboxSources) longestRetention(ctx context.Context, c SQSAPI) (time.Duration, string, error) {
	var (
		longest time.Duration
		from    string
	)
	take := func(d time.Duration, what string) {
		if d > longest {
			longest, from = d, what
		}
	}
	if len(s.Queues) > 0 {
		if c == nil {
			return 0, "", errors.New("cli: an SQS client is needed to check the queues' retention")
		}
		d, what, err := queuesRetention(ctx, c, s.Queues)
		if err != nil {
			return 0, "", err
		}
		take(d, what)
	}
	for _, st := range s.KinesisStreams {
		if s.Kinesis == nil {
			return 0, "", errors.New("cli: a Kinesis client is needed to check the streams' retention")
		}
		d, err := admin.KinesisRetention(ctx, s.Kinesis, st)
		if err != nil {
			return 0, "", fmt.Errorf("%w (or give its retention with --source-retention)", err)
		}
		take(d, "Kinesis stream "+st)
	}
	for _, topic := range s.KafkaTopics {
		if s.Kafka == nil {
			return 0, "", errors.New("cli: a Kafka client is needed to check the topics' retention")
		}
		d, err := admin.KafkaRetention(ctx, s.Kafka, topic)
		if err != nil {
			return 0, "", fmt.Errorf("%w (or give its retention with --source-retention)", err)
		}
		take(d, "Kafka topic "+topic)
	}
	take(s.Retention, "--source-retention")
	return longest, from, nil
}

// checkInboxRetention refuses (ErrGuarantee) to remove inbox rows younger than the longest
// retention a message of the sources can come back from (SQS's 14-day maximum when none is
// named), unless allow; then it returns a warning. It returns that bound and its source.
func checkInboxRetention(ctx context.Context, c SQSAPI, src InboxSources, olderThan time.Duration, allow bool, verb string) (bound time.Duration, from, warning string, err error) {
	bound, from = sqsMaxRetention, "SQS's 14-day maximum retention; name the consumer's sources with --queue, --kinesis-stream or --kafka-topic to check theirs (a Kinesis stream keeps records up to 365 days, a Kafka topic possibly forever)"
	if src.named() {
		if bound, from, err = src.longestRetention(ctx, c); err != nil {
			return 0, "", "", err
		}
	}
	if olderThan > bound {
		return bound, from, "", nil
	}
	var msg, above string
	if bound == admin.Forever {
		msg = fmt.Sprintf("%s keeps its messages without a time limit: a message read again after its inbox row is gone would be applied twice, whatever --older-than", from)
		above = "--outbox-only"
	} else {
		msg = fmt.Sprintf("--older-than %s is not longer than the message retention of %s (%s): a message redelivered or redriven after its inbox row is gone would be applied twice",
			FormatDuration(olderThan), from, FormatDuration(bound))
		above = "--older-than above " + FormatDuration(bound) + ", --outbox-only"
	}
	if !allow {
		return bound, from, "", guaranteeError{"refusing to " + verb + ": " + msg + ". Use " + above + ", or --allow-duplicate-applies to accept it. Nothing was changed"}
	}
	return bound, from, msg + " (--allow-duplicate-applies)", nil
}
