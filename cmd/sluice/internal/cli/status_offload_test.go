package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/cmd/sluice/internal/cli"
)

// status counts the pending payloads above the claim check's threshold (from the flag, then
// SLUICE_CLAIM_CHECK_THRESHOLD, then SNS's limit), leaving out quarantined and published rows.
func TestStatusCountsPendingPayloadsAboveTheOffloadThreshold(t *testing.T) {
	t.Parallel()
	b := setup(t)
	insert := func(size int, state string) {
		t.Helper()
		payload := fmt.Sprintf(`{"pad": %q}`, strings.Repeat("x", size-len(`{"pad": ""}`)))
		_, err := b.pool.Exec(context.Background(), `
			INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload, published_at, quarantined_at)
			VALUES ($1, 'docs', 'doc', 'd', 'DocumentStored', 'd', $2, CASE WHEN $3 = 'published' THEN now() END, CASE WHEN $3 = 'quarantined' THEN now() END)`,
			uuid.New(), payload, state)
		require.NoError(t, err)
	}
	insert(300<<10, "pending")
	insert(2<<20, "pending")
	insert(1000, "pending")
	insert(5000, "pending")
	insert(3<<20, "quarantined")
	insert(3<<20, "published")

	status := func(args ...string) cli.OffloadStatus {
		var st cli.Status
		require.NoError(t, json.Unmarshal([]byte(b.ok(t, append([]string{"status", "--json"}, args...)...)), &st))
		return st.Outbox.Offload
	}
	require.Equal(t, cli.OffloadStatus{ThresholdBytes: 256 << 10, PendingAboveThreshold: 2, PendingAboveThresholdBytes: 300<<10 + 2<<20,
		Examined: 4, Complete: true}, status(), "SNS's limit by default")
	require.Equal(t, int64(3), status("--offload-threshold", "4096").PendingAboveThreshold)
	b.env["SLUICE_CLAIM_CHECK_THRESHOLD"] = "1048576"
	require.Equal(t, int64(1), status().PendingAboveThreshold, "the relay's setting")
	require.Contains(t, b.ok(t, "status"), "OFFLOAD: 1 pending payloads above 1048576 bytes (2097152 bytes in all), of 4 pending rows")

	b.env["SLUICE_CLAIM_CHECK_THRESHOLD"] = "lots"
	requireOneLineError(t, b.run(t, "status"), 1, "SLUICE_CLAIM_CHECK_THRESHOLD must be an integer")
	requireOneLineError(t, b.run(t, "status", "--offload-threshold", "-5"), 2, "--offload-threshold must be a positive number of bytes")
}
