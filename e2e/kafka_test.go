package e2e

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluicehq/sluice/internal/demoapp"
	"github.com/sluicehq/sluice/internal/localrun"
	"github.com/sluicehq/sluice/internal/testdb"
)

// kafkaBundle is one test's pipeline on Kafka: an in-process cluster (kfake), the real relay
// publishing to kafka://orders, and the ledger consumer behind the local MSK event source
// mapping. Per-customer order is promised (a customer is a record key, so one partition), so it
// is verified too.
type kafkaBundle struct {
	*bundle
	kstack *localrun.KafkaStack
}

func setupKafka(t *testing.T, partitions int32) *kafkaBundle {
	t.Helper()
	return setupKafkaWith(t, partitions, nil)
}

// setupKafkaWith is setupKafka with mod adjusting the stack's options.
func setupKafkaWith(t *testing.T, partitions int32, mod func(*localrun.KafkaStackOptions)) *kafkaBundle {
	t.Helper()
	rie, bins := binaries(t)
	ctx := context.Background()
	dbURL := testdb.URL(t)
	pool, err := pgxpool.New(ctx, dbURL)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	require.NoError(t, demoapp.ApplySchema(ctx, pool))
	cluster, err := localrun.StartKafka(partitions, demoapp.Topic)
	require.NoError(t, err)
	t.Cleanup(cluster.Close)

	logPath := filepath.Join(t.TempDir(), "functions.log")
	logFile, err := os.Create(logPath)
	require.NoError(t, err)
	o := localrun.KafkaStackOptions{RIE: rie, BinDir: bins, DatabaseURL: dbURL, Brokers: cluster.Brokers,
		RelayEvery: 3 * time.Second, RelayTimeout: 8 * time.Second, Log: logFile, Logger: slog.New(slog.NewTextHandler(logFile, nil))}
	if mod != nil {
		mod(&o)
	}
	st, err := localrun.StartKafkaStack(ctx, o)
	require.NoError(t, err)
	t.Cleanup(func() {
		st.Stop()
		logFile.Close()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 20000 {
				b = b[len(b)-20000:]
			}
			t.Logf("function logs (tail):\n%s", b)
		}
	})
	prefix := fmt.Sprintf("e2e-kafka-%x-", time.Now().UnixNano())
	return &kafkaBundle{bundle: &bundle{ctx: ctx, dbURL: dbURL, pool: pool, prefix: prefix, fifo: true}, kstack: st}
}

// waitApplied waits (up to limit, a liveness bound) until every placed order is in the ledger,
// then checks that every committed event was applied exactly once and in its customer's order.
func (k *kafkaBundle) waitApplied(t *testing.T, limit time.Duration) demoapp.Verification {
	t.Helper()
	k.waitUntil(t, limit, "every order applied", func() (bool, string) {
		p, err := demoapp.ProgressOf(k.ctx, k.pool, k.prefix)
		require.NoError(t, err)
		return p.Applied >= k.written, fmt.Sprintf("%d of %d applied", p.Applied, k.written)
	})
	time.Sleep(time.Second) // anything still in flight (a redelivery) gets a moment to land
	v, err := demoapp.Verify(k.ctx, k.pool, k.prefix)
	require.NoError(t, err)
	t.Logf("produced %d, exactly once %d, lost %d, twice %d, out of order %d; event source %+v",
		v.Produced, v.ExactlyOnce, v.Lost, v.AppliedTwice, v.OrderViolations, k.kstack.Source.Stats())
	if v.OrderViolations > 0 {
		k.logOrderViolations(t)
	}
	require.Equal(t, k.written, v.Produced, "orders committed")
	require.Empty(t, v.Problems(true), "every committed event applied exactly once, in its customer's order")
	return v
}

// Happy path: the relay publishes to Kafka, the event source mapping delivers, every event is
// applied once and each customer's in order.
func TestKafkaHappyPath(t *testing.T) {
	t.Parallel()
	k := setupKafka(t, 4)
	k.place(t, 150, 8, 5*time.Millisecond, nil)
	k.waitApplied(t, 90*time.Second)
}

// The consumer's processes are SIGKILLed again and again: an invocation that dies commits
// nothing, its whole batch comes again, and the inbox finds what had committed before the kill.
// Nothing is lost, nothing applied twice, no customer out of order.
func TestKafkaConsumerKilledRepeatedly(t *testing.T) {
	t.Parallel()
	k := setupKafka(t, 4)
	kills, stop := repeatFault(300*time.Millisecond, func(context.Context) int64 { return int64(k.kstack.Consumer.KillRuntimes()) })
	k.place(t, 200, 10, 10*time.Millisecond, func(_ int, o *demoapp.OrderCreated) { o.HoldMillis = 5 })
	k.waitUntil(t, time.Minute, "the consumer was killed 3 times", func() (bool, string) {
		return kills() >= 3, fmt.Sprintf("%d kills", kills())
	})
	stop()
	t.Logf("consumer processes killed: %d", kills())
	k.waitApplied(t, 90*time.Second)
}

// A poison event (an unknown currency) fails every delivery: its partition waits at it, so
// nothing after it on that partition is applied (whichever customer), while the other
// partitions flow. Once the operator adds the currency, the partition resumes at it, in order.
func TestKafkaPoisonEventBlocksOnlyItsPartition(t *testing.T) {
	t.Parallel()
	const partitions = 4
	k := setupKafka(t, partitions)
	// The relay's client partitions by murmur2 of the key, as every Kafka client does.
	partitionOf := func(key string) int {
		return kgo.StickyKeyPartitioner(nil).ForTopic(demoapp.Topic).Partition(&kgo.Record{Key: []byte(key)}, partitions)
	}
	k.place(t, 1, 1, 0, func(_ int, o *demoapp.OrderCreated) { o.Customer, o.Currency = "poison", "XTS" })
	// Once Kafka has it, every later event of its partition is behind it.
	k.waitUntil(t, time.Minute, "the poison event published", func() (bool, string) {
		p, err := demoapp.ProgressOf(k.ctx, k.pool, k.prefix)
		require.NoError(t, err)
		return p.Published == 1, fmt.Sprintf("%d published", p.Published)
	})
	k.place(t, 60, 12, 5*time.Millisecond, nil) // customers c00..c11, 5 orders each
	var flowing, waiting []string
	for c := range 12 {
		if name := fmt.Sprintf("c%02d", c); partitionOf(name) == partitionOf("poison") {
			waiting = append(waiting, name)
		} else {
			flowing = append(flowing, name)
		}
	}
	require.NotEmpty(t, flowing)
	appliedOf := func(customers []string) int {
		var n int
		require.NoError(t, k.pool.QueryRow(k.ctx, `SELECT count(DISTINCT message_id) FROM demo_ledger WHERE order_id LIKE $1 AND customer = ANY($2)`,
			k.prefix+"%", customers).Scan(&n))
		return n
	}
	k.waitUntil(t, 90*time.Second, "the customers on the other partitions applied", func() (bool, string) {
		n := appliedOf(flowing)
		return n == 5*len(flowing), fmt.Sprintf("%d of %d", n, 5*len(flowing))
	})
	require.Zero(t, appliedOf(append([]string{"poison"}, waiting...)), "the poison event and everything after it on its partition (%v) wait", waiting)
	require.Positive(t, k.kstack.Source.Stats().ReportedFailures)

	_, err := k.pool.Exec(k.ctx, `INSERT INTO demo_currencies (code) VALUES ('XTS')`)
	require.NoError(t, err)
	k.waitApplied(t, 60*time.Second)
}
