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

// childPauseEnv, when set to a file name, makes the child relay stop before a round's claim (the
// batch that locks its keys and reads their rows) until that file exists, after making the same
// name with childPausedSuffix: a test can then block the read.
const childPauseEnv = "SLUICE_TEST_CHILD_PAUSE_FILE"

// childPausedSuffix names the file the paused child makes (childPauseEnv).
const childPausedSuffix = ".paused"

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
		cfg.ConnConfig.Tracer = pauseBeforeClaim{file: f}
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

// pauseBeforeClaim holds the child relay before it sends a round's claim until its file exists.
type pauseBeforeClaim struct{ file string }

func (p pauseBeforeClaim) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	return ctx
}

func (p pauseBeforeClaim) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TraceBatchStart pauses before the batch that holds the round's lock statement goes out. It
// first prepares the batch's statements with parameters (named by their text, which the batch
// then uses), as a relay that ran a round before has them: the read's preparation would wait
// for a table lock before the lock statement ran.
func (p pauseBeforeClaim) TraceBatchStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceBatchStartData) context.Context {
	claim := false
	for _, q := range data.Batch.QueuedQueries {
		claim = claim || strings.Contains(q.SQL, "pg_try_advisory_lock")
	}
	if !claim {
		return ctx
	}
	for _, q := range data.Batch.QueuedQueries {
		if strings.Contains(q.SQL, "$1") {
			if _, err := conn.Prepare(ctx, q.SQL, q.SQL); err != nil {
				fmt.Fprintln(os.Stderr, "child relay: prepare:", err)
			}
		}
	}
	if err := os.WriteFile(p.file+childPausedSuffix, nil, 0o600); err != nil {
		fmt.Fprintln(os.Stderr, "child relay:", err)
	}
	for {
		if _, err := os.Stat(p.file); err == nil {
			return ctx
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (p pauseBeforeClaim) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}

func (p pauseBeforeClaim) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {}
