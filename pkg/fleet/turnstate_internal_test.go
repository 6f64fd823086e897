package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// A tenant the activity poll does not see (sweep-only) is recorded as such once that is
// known, and a detection becoming known as the normal poll is no reason to write: the row a
// turn writes reads back as it was written.
func TestATurnRecordsASweepOnlyTenantOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	control, err := pgxpool.New(ctx, testdb.EmptyURL(t))
	require.NoError(t, err)
	t.Cleanup(control.Close)
	require.NoError(t, CreateTurnStateTable(ctx, control))
	var writes int
	counting := execFunc(func(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
		writes++
		return control.Exec(ctx, sql, args...)
	})
	f := &Fleet{cfg: Config{TurnState: counting, Shard: 1, Shards: 3}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	tn := &tenant{f: f, t: Tenant{Name: "far"}}
	turn := func(d Detection, lag outbox.Lag) {
		start := time.Now()
		tn.turnStarted.Store(start.UnixNano())
		tn.update(func(s *TenantStatus) {
			s.State, s.LastTurn, s.Detection, s.Lag, s.LagAt = StateIdle, start.Add(time.Millisecond), d, lag, start
		})
		tn.recordTurn(ctx, nil, time.Time{})
	}
	turn("", outbox.Lag{})
	require.Equal(t, 1, writes, "a tenant's first turn is recorded")
	turn("", outbox.Lag{})
	turn(DetectPoll, outbox.Lag{})
	require.Equal(t, 1, writes, "nothing changed: nothing written")
	turn(DetectSweepOnly, outbox.Lag{Pending: 3, OldestPendingAge: 90 * time.Second})
	require.Equal(t, 2, writes)
	turn(DetectSweepOnly, outbox.Lag{Pending: 3, OldestPendingAge: 95 * time.Second})
	require.Equal(t, 2, writes, "the same backlog, older: nothing written")

	states, err := ReadTurnStates(ctx, control)
	require.NoError(t, err)
	require.Len(t, states, 1)
	s := states[0]
	require.Equal(t, "far", s.Tenant)
	require.Equal(t, "1/3", s.Shard)
	require.True(t, s.SweepOnly())
	require.Equal(t, int64(3), s.Lag.Pending)
	require.Equal(t, 90*time.Second, s.Lag.OldestPendingAge)
	require.Equal(t, time.Millisecond, s.Took().Round(time.Microsecond))
	require.True(t, s.WorkedAt.IsZero(), "no turn published")
}

// A busy tenant's turns that only publish are recorded at most every turnStateEvery, their rows
// counted into the next record; a failure is recorded at once.
func TestABusyTenantsTurnsAreRecordedAtMostEveryTurnStateEvery(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	control, err := pgxpool.New(ctx, testdb.EmptyURL(t))
	require.NoError(t, err)
	t.Cleanup(control.Close)
	require.NoError(t, CreateTurnStateTable(ctx, control))
	var writes int
	counting := execFunc(func(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
		writes++
		return control.Exec(ctx, sql, args...)
	})
	f := &Fleet{cfg: Config{TurnState: counting, Shards: 1}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	tn := &tenant{f: f, t: Tenant{Name: "busy"}}
	turn := func(published int, err error) {
		tn.turnStarted.Store(time.Now().UnixNano())
		tn.update(func(s *TenantStatus) {
			s.State, s.LastTurn, s.Published = StateIdle, time.Now(), s.Published+published
			if err != nil {
				s.State, s.Failures, s.LastError = StateFailing, s.Failures+1, err.Error()
			}
		})
		tn.recordTurn(ctx, err, time.Now().Add(time.Second))
	}
	turn(5, nil)
	turn(3, nil)
	require.Equal(t, 1, writes, "the second turn within turnStateEvery is not written")
	tn.turnRecord.writtenAt = time.Now().Add(-turnStateEvery)
	turn(2, nil)
	require.Equal(t, 2, writes)
	states, err := ReadTurnStates(ctx, control)
	require.NoError(t, err)
	require.Equal(t, int64(5), states[0].Published, "the rows of the turn not written are counted in")
	turn(0, &pgconn.PgError{Code: "28P01", Message: "password authentication failed"})
	require.Equal(t, 3, writes, "a failure is written at once")
	states, err = ReadTurnStates(ctx, control)
	require.NoError(t, err)
	require.Equal(t, ErrorAuth, states[0].ErrorClass)
	require.False(t, states[0].WorkedAt.IsZero(), "when a turn last published is kept")
}

// A control database without the table: the failed write is not tried again at each turn.
func TestAFailedTurnWriteWaitsBeforeTheNext(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	control, err := pgxpool.New(ctx, testdb.EmptyURL(t)) // no CreateTurnStateTable
	require.NoError(t, err)
	t.Cleanup(control.Close)
	var writes int
	counting := execFunc(func(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
		writes++
		return control.Exec(ctx, sql, args...)
	})
	f := &Fleet{cfg: Config{TurnState: counting, Shards: 1}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	tn := &tenant{f: f, t: Tenant{Name: "busy"}}
	for i := range 3 {
		tn.turnStarted.Store(time.Now().UnixNano())
		tn.update(func(s *TenantStatus) { s.State, s.LastTurn, s.Published = StateIdle, time.Now(), s.Published+10 })
		tn.recordTurn(ctx, nil, time.Time{})
		require.Equal(t, 1, writes, "turn %d: one failed write, then none for turnStateRetry", i)
	}
	require.True(t, tn.turnRecord.failed)
}

type execFunc func(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)

func (f execFunc) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return f(ctx, sql, args...)
}

func TestTurnErrorsAreClassifiedAndRedacted(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want string
	}{
		{&pgconn.PgError{Code: "28P01"}, ErrorAuth},
		{fmt.Errorf("relay pass: %w", &pgconn.PgError{Code: "42P01"}), ErrorSchema},
		{&pgconn.PgError{Code: "53300"}, ErrorDatabase},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), ErrorTimeout},
		{errors.New("tenant x: connection settings: bad"), ErrorRelay},
	} {
		require.Equal(t, c.want, errorClassOf(c.err), "%v", c.err)
	}
	require.Equal(t, "cannot parse postgres://u:xxxxx@h/db: x; host=h password=xxxxx user=u",
		redactError("cannot parse postgres://u:pw@h/db: x; host=h password='p w' user=u"))
}
