package outbox_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// Scenario 4, relay side: a hostile plain-SQL payload is bounded by what was stored. Numbers
// that jsonb would print in full (74 KB of 1e131071, ~970 MB as jsonb text) are published as
// written; a row too large to publish is set aside by itself, its key's later rows wait, and
// every other key is published.
func TestHostilePlainSQLPayloadsAreBoundedByTheirStoredSize(t *testing.T) {
	t.Parallel()
	b := setup(t)
	insert := `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
		SELECT gen_random_uuid(), 'orders', 'order', $1, 'Hostile', $1, s.p FROM (SELECT %s) s(p)`
	b.exec(t, fmt.Sprintf(insert, `('[' || string_agg('1e131071', ',') || ']')::json FROM generate_series(1, 8200)`), "numbers")
	b.exec(t, fmt.Sprintf(insert, `('[' || string_agg('0e-16383', ',') || ']')::json FROM generate_series(1, 4000)`), "zeros")
	// 300 KB stored: above SNS's 256 KiB.
	b.exec(t, fmt.Sprintf(insert, `json_build_object('blob', repeat('x', 300000))`), "large")
	b.writeKey(t, "large", testTopic, 2) // behind the large row: blocked, in order
	for _, k := range idleKeys(20) {
		b.writeKey(t, k, testTopic, 1)
	}
	st, err := b.relay(t).RunOnce(context.Background())
	require.NoError(t, err, "no claim fails")
	require.Equal(t, 22, st.Published)
	require.Equal(t, 1, st.Quarantined)
	require.Equal(t, 1, b.countWhere(t, "partition_key = 'large' AND quarantined_at IS NOT NULL AND last_error LIKE '%above the destination%'"))
	require.Equal(t, 2, b.countWhere(t, "partition_key = 'large' AND quarantined_at IS NULL AND published_at IS NULL"))

	sizes := map[string]int{}
	for _, e := range b.rec.received {
		sizes[e.PartitionKey] = len(e.Payload)
	}
	require.Equal(t, 1+8200*len("1e131071,"), sizes["numbers"], "published as written, not as jsonb would print it")
	require.Equal(t, 1+4000*len("0e-16383,"), sizes["zeros"])
}
