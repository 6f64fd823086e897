package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// countingConn counts what a connection sends: each flush of the client's buffer is one
// write, so with small statements one write is one round trip.
type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// countingConnect opens a connection to a fresh migrated database whose socket writes are
// counted in writes.
func countingConnect(tb testing.TB, writes *atomic.Int64) *pgx.Conn {
	tb.Helper()
	ctx := context.Background()
	cfg, err := pgx.ParseConfig(testdb.URL(tb))
	require.NoError(tb, err)
	var d net.Dialer
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return countingConn{Conn: c, writes: writes}, nil
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = conn.Close(context.WithoutCancel(ctx)) })
	return conn
}

// Write is one round trip once its statement is prepared on the connection: no statement
// prepared or described per call, nothing sent beside the INSERT (no set_config, no tracing
// query), whether the message carries trace headers or not and however many messages it
// writes below CopyThreshold. Issue 45's producer cost rests on this.
func TestWriteIsOneRoundTripPerCall(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var writes atomic.Int64
	conn := countingConnect(t, &writes)

	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{2}, TraceFlags: trace.FlagsSampled})
	traced := trace.ContextWithSpanContext(ctx, sc)
	msg := func(i int) outbox.Message {
		return outbox.Message{Topic: testTopic, AggregateType: "order", AggregateID: "o-" + strconv.Itoa(i), EventType: "OrderCreated",
			Payload: json.RawMessage(`{"orderId":"o-` + strconv.Itoa(i) + `"}`)}
	}
	calls := []struct {
		name string
		ctx  context.Context
		msgs []outbox.Message
	}{
		{"one message", ctx, []outbox.Message{msg(1)}},
		{"one message with trace headers", traced, []outbox.Message{msg(2)}},
		{"five messages", ctx, []outbox.Message{msg(3), msg(4), msg(5), msg(6), msg(7)}},
	}
	tx, err := conn.Begin(ctx)
	require.NoError(t, err)
	// The first call of each statement prepares it on the connection (pgx's statement cache).
	for _, c := range calls {
		_, err := outbox.Write(c.ctx, tx, c.msgs...)
		require.NoError(t, err, c.name)
	}
	for _, c := range calls {
		before := writes.Load()
		written, err := outbox.Write(c.ctx, tx, c.msgs...)
		require.NoError(t, err, c.name)
		require.Len(t, written, len(c.msgs))
		require.Equal(t, int64(1), writes.Load()-before, "%s: round trips of a Write whose statement is prepared", c.name)
	}
	require.NoError(t, tx.Commit(ctx))
	var rows int
	require.NoError(t, conn.QueryRow(ctx, "SELECT count(*) FROM outbox_event").Scan(&rows))
	require.Equal(t, 14, rows, "every Write's rows are committed")
}

// BenchmarkWriteInTx is one event written inside an open transaction on a real server, by
// outbox.Write and by the hand-written minimal row (the bench suite's "order + minimal row"),
// so that their client and server costs can be compared and profiled
// (go test -bench WriteInTx -cpuprofile). Each op is one INSERT; the transaction commits
// every 1,000 ops. It reports the socket writes per op (round trips), this process's CPU time
// per op (getrusage: the client's work, pgx and the Go runtime) and, when the server runs on
// this machine and its process is readable, the backend's (/proc/<pid>/schedstat): CPU time,
// unlike ns/op, hardly moves with the machine's other load.
func BenchmarkWriteInTx(b *testing.B) {
	const minimalSQL = `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
		VALUES ($1, 'orders', 'order', $2, 'OrderCreated', $2, $3)`
	variants := []struct {
		name  string
		write func(ctx context.Context, tx pgx.Tx, oid string) error
	}{
		{"minimal row", func(ctx context.Context, tx pgx.Tx, oid string) error {
			_, err := tx.Exec(ctx, minimalSQL, uuid.Must(uuid.NewV7()), oid,
				`{"orderId":"`+oid+`","customerId":"c-42","totalCents":1299,"currency":"EUR","schemaVersion":1}`)
			return err
		}},
		{"outbox.Write", func(ctx context.Context, tx pgx.Tx, oid string) error {
			_, err := outbox.Write(ctx, tx, outbox.Message{Topic: "orders", AggregateType: "order", AggregateID: oid, EventType: "OrderCreated",
				Payload: json.RawMessage(`{"orderId":"` + oid + `","customerId":"c-42","totalCents":1299,"currency":"EUR","schemaVersion":1}`)})
			return err
		}},
	}
	for _, v := range variants {
		b.Run(v.name, func(b *testing.B) {
			ctx := context.Background()
			var writes atomic.Int64
			conn := countingConnect(b, &writes)
			tx, err := conn.Begin(ctx)
			require.NoError(b, err)
			require.NoError(b, v.write(ctx, tx, "o-warm"))
			var pid int
			require.NoError(b, tx.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
			b.ReportAllocs()
			backend0, backendOK := backendCPU(pid)
			self0 := processCPU()
			before, i := writes.Load(), 0
			for b.Loop() {
				i++
				if i%1000 == 0 {
					require.NoError(b, tx.Commit(ctx))
					if tx, err = conn.Begin(ctx); err != nil {
						b.Fatal(err)
					}
				}
				if err := v.write(ctx, tx, "o-"+strconv.Itoa(i)); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(writes.Load()-before-int64(2*(i/1000)))/float64(i), "roundtrips/op")
			b.ReportMetric(float64(processCPU()-self0)/1e3/float64(i), "client-µs/op")
			if backend1, ok := backendCPU(pid); ok && backendOK {
				b.ReportMetric(float64(backend1-backend0)/1e3/float64(i), "backend-µs/op")
			}
			require.NoError(b, tx.Commit(ctx))
		})
	}
}

// processCPU is this process's CPU time so far, in nanoseconds (user and system).
func processCPU() int64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return ru.Utime.Nano() + ru.Stime.Nano()
}

// backendCPU is the CPU time so far of the server process pid, in nanoseconds, when it runs
// on this machine and its schedstat is readable.
func backendCPU(pid int) (int64, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/schedstat", pid))
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, false
	}
	v, err := strconv.ParseInt(f[0], 10, 64)
	return v, err == nil
}
