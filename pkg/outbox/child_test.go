package outbox_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/pkg/outbox"
)

// childRelayEnv, when set to a database URL, makes the test binary run one relay (RunOnce)
// against it instead of the tests: a relay in a process of its own, which a test can SIGKILL.
const childRelayEnv = "SLUICE_TEST_CHILD_RELAY_URL"

// startChildRelay starts the test binary as a relay process with the given lease.
func startChildRelay(t *testing.T, url string, lease time.Duration) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childRelayEnv+"="+url, "SLUICE_TEST_CHILD_LEASE="+lease.String())
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	return cmd
}

// runChildRelay is the child process: it relays once, as application sluice-child-relay.
func runChildRelay(url string) int {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child relay:", err)
		return 1
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "sluice-child-relay"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child relay:", err)
		return 1
	}
	defer pool.Close()
	lease, err := time.ParseDuration(os.Getenv("SLUICE_TEST_CHILD_LEASE"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "child relay:", err)
		return 1
	}
	r, err := outbox.NewRelay(pool, outbox.RelayConfig{Publisher: newRecorder(), Topics: map[string]string{testTopic: testARN},
		Lease: lease, PublishTimeout: lease / 4, Logger: testLogger()})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child relay:", err)
		return 1
	}
	if _, err := r.RunOnce(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "child relay:", err)
		return 1
	}
	return 0
}
