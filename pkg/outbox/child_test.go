package outbox_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/pkg/outbox"
)

// childRelayEnv, when set to a database URL, makes the test binary run one relay (RunOnce)
// against it instead of the tests: a relay in a process of its own, which a test can SIGKILL.
const childRelayEnv = "SLUICE_TEST_CHILD_RELAY_URL"

// childPauseEnv, when set to a file name, makes the child relay stop after a round locked its
// keys, before it reads their rows, until that file exists: a test can then block the read.
const childPauseEnv = "SLUICE_TEST_CHILD_PAUSE_FILE"

// startChildRelay starts the test binary as a relay process with the given lease (and extra
// environment, such as childPauseEnv).
func startChildRelay(t *testing.T, url string, lease time.Duration, env ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(append(os.Environ(), childRelayEnv+"="+url, "SLUICE_TEST_CHILD_LEASE="+lease.String()), env...)
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
	if f := os.Getenv(childPauseEnv); f != "" {
		cfg.ConnConfig.Tracer = pauseAfterLock{file: f}
	}
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

// pauseAfterLock holds the child relay after the statement that locks a round's keys until its
// file exists.
type pauseAfterLock struct{ file string }

func (p pauseAfterLock) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (p pauseAfterLock) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (p pauseAfterLock) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	return ctx
}

// TraceBatchQuery pauses once the round's lock statement (sent in a batch with its settings)
// answered.
func (p pauseAfterLock) TraceBatchQuery(_ context.Context, _ *pgx.Conn, data pgx.TraceBatchQueryData) {
	if data.Err != nil || !strings.Contains(data.SQL, "pg_try_advisory_lock") {
		return
	}
	for {
		if _, err := os.Stat(p.file); err == nil {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (p pauseAfterLock) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
