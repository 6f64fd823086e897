package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"

	"github.com/sluicehq/sluice/pkg/fleet"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
	"github.com/sluicehq/sluice/pkg/lambdatrace"
)

// fleetHandler is the relay in fleet mode (lambdaenv.FleetEnabled): one deployment serves
// every tenant database of the registry (pkg/fleet). The Fleet lives for the cold start;
// each scheduled invocation runs it until stopBefore ahead of its deadline.
type fleetHandler struct {
	fleet      *fleet.Fleet
	stopBefore time.Duration
	log        *slog.Logger
}

// FleetResult is what a fleet invocation returns (visible in the Lambda console and in tests).
type FleetResult struct {
	RanFor string `json:"ranFor"`
	// Tenants is the number of tenants this shard serves; Failing those whose last turn failed.
	Tenants int `json:"tenants"`
	Failing int `json:"failing"`
	// Published counts the events published for all tenants since the cold start.
	Published int `json:"published"`
}

// Handle runs the fleet until stopBefore ahead of the invocation's deadline.
func (h *fleetHandler) Handle(ctx context.Context, ev events.EventBridgeEvent) (FleetResult, error) {
	start := time.Now()
	stopAt := stopTime(ctx, start, h.stopBefore)
	h.log.InfoContext(ctx, "relay fleet invocation", "event_id", ev.ID, "scheduled_at", ev.Time, "stop_at", stopAt)
	runCtx, cancel := context.WithDeadline(ctx, stopAt)
	defer cancel()
	if err := h.fleet.Run(runCtx); err != nil {
		return FleetResult{}, fmt.Errorf("run fleet: %w", err)
	}
	res := FleetResult{RanFor: time.Since(start).Round(100 * time.Millisecond).String()}
	for _, s := range h.fleet.Status() {
		res.Tenants++
		res.Published += s.Published
		if s.State == fleet.StateFailing {
			res.Failing++
		}
	}
	return res, nil
}

// startFleet is main in fleet mode: it wires the fleet once and serves invocations, or exits
// with the cold start's error.
func startFleet(log *slog.Logger) {
	ctx := context.Background()
	awsCfg, err := config.LoadDefaultConfig(ctx)
	if err != nil {
		log.Error("relay fleet cold start failed", "error", fmt.Errorf("load AWS config: %w", err))
		os.Exit(1)
	}
	h, stop, err := wireFleet(ctx, os.Getenv, awsCfg, log)
	if err != nil {
		log.Error("relay fleet cold start failed", "error", err)
		os.Exit(1)
	}
	lambda.StartWithOptions(h.Handle, lambda.WithEnableSIGTERM(stop))
}

// wireFleet builds the fleet once per cold start: the registry (static tenants, the control
// table), the tenants' secrets' reader, the publisher shared by every tenant's relay.
func wireFleet(ctx context.Context, getenv lambdaenv.Getenv, awsCfg aws.Config, log *slog.Logger) (h *fleetHandler, stop func(), err error) {
	tp, stopTracing, err := lambdatrace.Setup(getenv, os.Stdout, "sluice-relay")
	if err != nil {
		return nil, nil, err
	}
	relayCfg, stopBefore, err := relayConfig(getenv)
	if err != nil {
		return nil, nil, err
	}
	cfg, closeRegistry, err := lambdaenv.FleetConfig(ctx, getenv, secretsmanager.NewFromConfig(awsCfg))
	if err != nil {
		return nil, nil, err
	}
	pub, closePub, err := lambdaenv.RelayPublisher(ctx, getenv, awsCfg, relayCfg.Destinations())
	if err != nil {
		closeRegistry()
		return nil, nil, err
	}
	relayCfg.Publisher = pub
	if relayCfg.ClaimCheck, err = lambdaenv.ClaimCheck(getenv, awsCfg); err != nil {
		closeRegistry()
		closePub()
		return nil, nil, err
	}
	relayCfg.Metrics, relayCfg.TracerProvider, relayCfg.Logger = os.Stdout, tp, log
	relayCfg.RoundMemory = lambdaenv.RoundMemory(getenv) // one budget for every tenant's rounds
	cfg.Relay, cfg.Logger = relayCfg, log
	f, err := fleet.New(cfg)
	if err != nil {
		closeRegistry()
		closePub()
		return nil, nil, err
	}
	stop = func() { _ = stopTracing(context.Background()); closePub(); closeRegistry() }
	return &fleetHandler{fleet: f, stopBefore: stopBefore, log: log}, stop, nil
}
