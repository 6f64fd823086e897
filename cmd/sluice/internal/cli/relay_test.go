package cli_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/cmd/sluice/internal/cli"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
	"github.com/sluicehq/sluice/pkg/outbox"
)

const relayTestARN = "arn:aws:sns:us-east-1:000000000000:orders"

// `sluice relay` reads the relay Lambda's settings: a value out of range is refused naming its
// variable, before anything is connected or changed; a valid one is the relay's.
func TestRelayCommandHonoursTheLambdasSettings(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertOutbox(t, outboxRow{})
	before := b.fingerprint(t)
	for name, value := range map[string]string{
		"SLUICE_RELAY_LEASE":           "50ms", // below 100ms
		"SLUICE_RELAY_PUBLISH_TIMEOUT": "20m",  // above 15m
		"SLUICE_RELAY_BACKOFF_BASE":    "25h",  // above 24h
	} {
		b.env[name] = value
		r := b.run(t, "relay", "--once", "--topic", "orders="+relayTestARN)
		delete(b.env, name)
		require.Equal(t, cli.ExitUsage, r.code, "%s=%s: %s", name, value, r.err)
		require.Contains(t, r.err, "sluice: relay settings: "+name+": ", "the error names the variable")
		require.NotContains(t, r.err, "\n"+name, "one line")
		b.env[name] = "soon"
		r = b.run(t, "relay", "--once", "--topic", "orders="+relayTestARN)
		delete(b.env, name)
		require.Equal(t, cli.ExitUsage, r.code)
		require.Contains(t, r.err, name+" must be a Go duration", "a malformed value names the variable too")
	}
	require.Equal(t, before, b.fingerprint(t), "nothing changed")

	// Valid values reach the relay: the command prints the settings it runs with. With the only
	// row's topic unmapped (no SNS call), the drain quarantines it.
	b.env["SLUICE_RELAY_LEASE"], b.env["SLUICE_RELAY_PUBLISH_TIMEOUT"], b.env["SLUICE_RELAY_BACKOFF_BASE"] = "45s", "7s", "250ms"
	r := b.run(t, "relay", "--once", "--topic", "payments="+relayTestARN)
	require.Equal(t, cli.ExitOK, r.code, r.err)
	for _, want := range []string{"SLUICE_RELAY_LEASE" + "=45s", "SLUICE_RELAY_PUBLISH_TIMEOUT" + "=7s", "SLUICE_RELAY_BACKOFF_BASE" + "=250ms",
		"SLUICE_RELAY_MAX_PER_KEY" + "=10"} {
		require.Contains(t, r.err, want)
	}
	require.Contains(t, r.out, "quarantined 1")
}

// stubBroker acknowledges every event.
type stubBroker struct {
	mu     sync.Mutex
	events []*outbox.Event
}

func (s *stubBroker) PublishBatch(_ context.Context, _ string, events []*outbox.Event) []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.events = append(s.events, events...)
	return make([]error, len(events))
}

// Relay is the command without a command line: its configuration is the environment's, the
// options on top, outbox's defaults under both.
func TestRelayFunctionRunsWithTheEnvironmentsSettings(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	_, eventID := b.insertOutbox(t, outboxRow{})
	env := map[string]string{lambdaenv.TopicARNs: `{"orders":"` + relayTestARN + `"}`, "SLUICE_RELAY_LEASE": "45s",
		"SLUICE_RELAY_PUBLISH_TIMEOUT": "7s", "SLUICE_RELAY_BACKOFF_BASE": "250ms", "SLUICE_RELAY_BATCH_SIZE": "40"}
	broker := &stubBroker{}
	res, err := cli.Relay(ctx, b.pool, broker, cli.RelayOptions{Getenv: func(k string) string { return env[k] }, Once: true, Settings: map[string]int64{"BatchSize": 7}})
	require.NoError(t, err)
	require.Equal(t, 45*time.Second, res.Config.Lease)
	require.Equal(t, 7*time.Second, res.Config.PublishTimeout)
	require.Equal(t, 250*time.Millisecond, res.Config.BackoffBase)
	require.Equal(t, 7, res.Config.BatchSize, "the option wins over the environment")
	require.EqualValues(t, outbox.RelaySetting("MaxPerKey").Default, res.Config.MaxPerKey, "outbox's default where nothing is set")
	require.Equal(t, map[string]string{"orders": relayTestARN}, res.Config.Topics)
	require.Equal(t, 1, res.Stats.Published)
	require.Len(t, broker.events, 1)
	require.Equal(t, eventID, broker.events[0].EventID)

	_, err = cli.Relay(ctx, b.pool, broker, cli.RelayOptions{Getenv: func(k string) string { return env[k] }, Once: true, Settings: map[string]int64{"BatchSize": -1}})
	require.ErrorIs(t, err, cli.ErrUsage)
	require.ErrorContains(t, err, "--batch-size: BatchSize must be between 1 and 10000, got -1")
	env["SLUICE_RELAY_LEASE"] = "1h1m"
	_, err = cli.Relay(ctx, b.pool, broker, cli.RelayOptions{Getenv: func(k string) string { return env[k] }, Once: true})
	require.ErrorIs(t, err, cli.ErrUsage)
	require.ErrorContains(t, err, "SLUICE_RELAY_LEASE")
}

// The help lists every variable of outbox.RelaySettings with its default, and each setting
// that has a flag gets it, from the table: a new entry needs no change here.
func TestRelayHelpAndFlagsComeFromTheSettingsTable(t *testing.T) {
	t.Parallel()
	b := &testBundle{env: map[string]string{}}
	r := b.run(t, "relay", "--help")
	require.Equal(t, 0, r.code, r.err)
	help := strings.Join(strings.Fields(r.out), " ")
	flags := 0
	for _, s := range outbox.RelaySettings() {
		if s.Env != "" && s.Default != 0 {
			require.Contains(t, help, s.Env+" ["+s.Format(s.Default)+"]")
		}
		if s.Flag != "" {
			flags++
			require.Contains(t, help, "--"+s.Flag+" ")
			r := b.run(t, "relay", "--once", "--"+s.Flag, "nonsense", "--topic", "orders="+relayTestARN)
			require.Equal(t, cli.ExitUsage, r.code)
			require.Contains(t, r.err, "--"+s.Flag)
		}
	}
	require.Positive(t, flags, "--batch-size at least")
}
