package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/localaws"
	"github.com/sluicehq/sluice/internal/localrun"
)

// pipeline is the running broker and functions of one transport, as the demo reports them.
type pipeline struct {
	kind     string // "standard", "FIFO" or "Kafka"
	hop      string // the waterfall's label for broker → consumer
	settled  string // what the event source does with a handled record: "deleted", "committed"
	ordered  bool   // per-customer order is promised, so verified
	schedule *localrun.Schedule
	source   interface {
		Stats() localrun.EventSourceStats
	}
	stop func()
}

// pipelineEnv is what starting a pipeline needs from the demo.
type pipelineEnv struct {
	rie, binDir, dbURL, runID string
	log                       *slog.Logger
	logFile                   io.Writer
	spans                     *spanLog
	step                      func(format string, args ...any)
}

// startSNS starts the emulator (unless AWS_ENDPOINT_URL is set), the topic → queue pipeline and
// the functions with their EventBridge and SQS drivers.
func startSNS(ctx context.Context, o options, e pipelineEnv) (*pipeline, error) {
	var stops []func()
	stopAll := func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	endpoint := os.Getenv(localaws.EnvEndpoint)
	if endpoint == "" {
		em, err := localaws.Start(ctx, localaws.Options{Port: 4566, Log: e.logFile})
		if err != nil && !errors.Is(err, localaws.ErrNotInstalled) {
			e.log.Warn("port 4566 unavailable; starting the emulator on a free port", "error", err)
			em, err = localaws.Start(ctx, localaws.Options{Log: e.logFile})
		}
		if err != nil {
			return nil, fmt.Errorf("start the AWS emulator %s (or set AWS_ENDPOINT_URL): %w", localaws.Chosen(), err)
		}
		stops = append(stops, em.Stop)
		endpoint = em.URL
		e.step("%s (SNS/SQS) started at %s", em.Kind, endpoint)
	} else {
		e.step("SNS/SQS: using AWS_ENDPOINT_URL=%s", endpoint)
	}
	kind := "standard"
	if o.fifo {
		kind = "FIFO"
	}
	st, err := localrun.StartStack(ctx, localrun.StackOptions{RIE: e.rie, BinDir: e.binDir, DatabaseURL: e.dbURL, Endpoint: endpoint,
		Name: "sluice-demo-" + e.runID, FIFO: o.fifo, Log: e.spans, Logger: e.log,
		RelayEnv: functionTraceEnv, ConsumerEnv: functionTraceEnv})
	if err != nil {
		stopAll()
		return nil, err
	}
	stops = append(stops, func() {
		st.Stop()
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		st.Pipeline.Delete(dctx, st.SNS, st.SQS)
		cancel()
	})
	e.step("%s topic → queue (raw delivery, DLQ after 3 receives) created: %s", kind, st.Pipeline.TopicARN)
	e.step("relay (2 instances, EventBridge every 4s, 10s timeout) and consumer (2 instances, SQS batches of 10) running under aws-lambda-rie")
	return &pipeline{kind: kind, hop: "SNS → SQS → event source → consumer", settled: "deleted", ordered: o.fifo,
		schedule: st.Schedule, source: st.Source, stop: stopAll}, nil
}

// startKafka starts an in-process Kafka (kfake) with the orders topic, the relay publishing to
// it (SLUICE_TOPIC_ARNS {"orders":"kafka://orders"}, SLUICE_KAFKA_BROKERS) and the consumer
// behind a driver playing the MSK event source mapping.
func startKafka(ctx context.Context, o options, e pipelineEnv) (*pipeline, error) {
	topic := "orders"
	cluster, err := localrun.StartKafka(int32(o.partitions), topic)
	if err != nil {
		return nil, err
	}
	e.step("Kafka (in-process kfake, %d partitions of %q) listening at %s", o.partitions, topic, strings.Join(cluster.Brokers, ","))
	st, err := localrun.StartKafkaStack(ctx, localrun.KafkaStackOptions{RIE: e.rie, BinDir: e.binDir, DatabaseURL: e.dbURL,
		Brokers: cluster.Brokers, Topic: topic, Group: "sluice-ledger-" + e.runID, Log: e.spans, Logger: e.log,
		RelayEnv: functionTraceEnv, ConsumerEnv: functionTraceEnv})
	if err != nil {
		cluster.Close()
		return nil, err
	}
	e.step(`relay (2 instances, EventBridge every 4s, 10s timeout) publishing to kafka://%s (key = customer), consumer (2 instances, Kafka batches of up to 100, partial batch responses) running under aws-lambda-rie`, topic)
	return &pipeline{kind: "Kafka", hop: "Kafka → event source → consumer", settled: "committed", ordered: true,
		schedule: st.Schedule, source: st.Source, stop: func() { st.Stop(); cluster.Close() }}, nil
}
