package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/localaws"
	"github.com/sluicehq/sluice/internal/testdb"
)

func TestMain(m *testing.M) { testdb.Main(m) }

// Issue 10, scenario 5, in a process of its own: 1,000 pending rows of 250 KB (250 MB) are
// published by a relay configured as in a 256 MB Lambda (the round budget derived from
// AWS_LAMBDA_FUNCTION_MEMORY_SIZE, GOMEMLIMIT as the CDK sets it), and the process's peak
// resident memory stays below the function's memory. Before the byte budget it reached 639 MB.
func TestRelayProcessFitsA256MBLambdaWith1000RowsOf250KB(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	bin := filepath.Join(t.TempDir(), "sluice")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Stderr = os.Stderr
	require.NoError(t, build.Run())

	dbURL := testdb.URL(t)
	conn, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
		SELECT gen_random_uuid(), 'orders', 'order', 'o', 'Big', 'k' || (i % 100), jsonb_build_object('blob', repeat(md5(i::text), 7800))
		FROM generate_series(1, 1000) i`)
	require.NoError(t, err)

	endpoint := localaws.TestEndpoint(t)
	topic, err := sns.NewFromConfig(localaws.TestConfig(t)).CreateTopic(ctx, &sns.CreateTopicInput{Name: aws.String(fmt.Sprintf("memory-%d", os.Getpid()))})
	require.NoError(t, err)

	cmd := exec.Command(bin, "relay", "--once")
	cmd.Env = append(os.Environ(),
		"DATABASE_URL="+dbURL, "AWS_ENDPOINT_URL="+endpoint, "AWS_REGION="+localaws.Region(),
		"AWS_ACCESS_KEY_ID=test", "AWS_SECRET_ACCESS_KEY=test",
		`SLUICE_TOPIC_ARNS={"orders":"`+aws.ToString(topic.TopicArn)+`"}`,
		"AWS_LAMBDA_FUNCTION_MEMORY_SIZE=256", "GOMEMLIMIT=230MiB",
		// A round's statements are cancelled after half the lease; on a machine whose cores are
		// busy, measuring 1,000 payloads of 250 KB took longer than the default 15s. This test
		// is about memory, not time.
		"SLUICE_RELAY_LEASE=2m")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Contains(t, string(out), "published 1000,")
	peak := cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss * 1024 // kilobytes on Linux
	t.Logf("peak RSS %d MiB", peak>>20)
	require.Less(t, peak, int64(256<<20), "peak resident memory %d MiB", peak>>20)
}
