package fleet

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// TestClosingATurnsConnectionsEndsASessionStillOpening: a pass cut while one of its pipelines
// connects leaves the pool opening that session in the background. closeConns returns only
// once it is open and ended: right after it returns, the server shows none of the tenant's
// sessions, so the budget never counts free a connection whose session still lives.
func TestClosingATurnsConnectionsEndsASessionStillOpening(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := testdb.URL(t)
	admin, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(admin.Close)

	opening := make(chan struct{}, 1)
	connect := func(_ context.Context, tn Tenant) (*pgxpool.Config, error) {
		pc, err := pgxpool.ParseConfig(tn.DatabaseURL)
		if err != nil {
			return nil, err
		}
		pc.AfterConnect = func(context.Context, *pgx.Conn) error { // logged in: the session is on the server
			opening <- struct{}{}
			time.Sleep(300 * time.Millisecond)
			return nil
		}
		return pc, nil
	}
	f, err := New(Config{Registry: Static{}, Connect: connect,
		Relay: outbox.RelayConfig{Publisher: nopPublisher{}, Topics: map[string]string{"orders": "arn:aws:sns:us-east-1:000000000000:orders"}}})
	require.NoError(t, err)
	s := newServer(f, "test")
	tn := newTenant(f, Tenant{Name: "t", DatabaseURL: url, Server: "test"}, s)
	s.add(tn)
	t.Cleanup(func() { s.closeConn(context.Background()); tn.drop() })
	_, err = tn.open(ctx, 1)
	require.NoError(t, err)

	// A pipeline's acquire, cut (as a pass is by its share of time) while its session opens.
	cut, cancel := context.WithCancel(ctx)
	go func() { <-opening; cancel() }()
	_, err = tn.pool.Acquire(cut)
	require.ErrorIs(t, err, context.Canceled)

	tn.closeConns(ctx)
	var n int
	require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = 'sluice-fleet-relay'`).Scan(&n))
	require.Zero(t, n, "the tenant's sessions on the server once its connections are closed")
	require.Zero(t, tn.pool.Stat().TotalConns())
}

// nopPublisher acknowledges every event.
type nopPublisher struct{}

func (nopPublisher) PublishBatch(_ context.Context, _ string, events []*outbox.Event) []error {
	return make([]error, len(events))
}
