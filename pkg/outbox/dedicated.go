package outbox

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DedicatePool makes pcfg's connections relay connections: each takes a round's session
// settings (roundSettings for cfg's Lease) once, when it connects, and keeps them, instead of
// setting them at the start of every round and resetting them at its end. That is about twenty
// statements fewer per round, most of a round's statements when it carries a few rows (a
// fleet's quiet tenants). Use it only for a pool no one but relays uses: its sessions keep
// the plan guards, a statement timeout of half the lease and, on PostgreSQL 14 and later, an
// idle_session_timeout of the lease (the server closes a connection left idle that long, such
// as a frozen Lambda's; the pool pings a connection idle for half the lease, or for a second if
// that is shorter, before handing it out, and replaces it if it was closed).
//
// Call it before pgxpool.NewWithConfig; it keeps pcfg's own AfterConnect and ShouldPing hooks.
// A relay with another Lease on the pool sets and resets its settings around each round as
// on any other pool; a connection it used has the server's defaults again and is an ordinary
// one from then on.
func DedicatePool(pcfg *pgxpool.Config, cfg RelayConfig) {
	lease := cfg.WithDefaults().Lease
	after := pcfg.AfterConnect
	pcfg.AfterConnect = func(ctx context.Context, conn *pgx.Conn) error {
		if after != nil {
			if err := after(ctx, conn); err != nil {
				return err
			}
		}
		pg14 := serverMajor(conn.PgConn()) >= 14
		if _, err := conn.Exec(ctx, strings.Join(roundSettings(lease, pg14), "; "), pgx.QueryExecModeSimpleProtocol); err != nil {
			return fmt.Errorf("outbox: set a relay connection's session settings: %w", err)
		}
		conn.PgConn().CustomData()[dedicatedLeaseKey] = lease
		return nil
	}
	ping := pcfg.ShouldPing
	pcfg.ShouldPing = func(ctx context.Context, p pgxpool.ShouldPingParams) bool {
		if ping != nil && ping(ctx, p) {
			return true
		}
		return p.IdleDuration > min(time.Second, lease/2)
	}
}

// dedicatedLeaseKey marks, in a connection's CustomData, that DedicatePool's AfterConnect set
// the round settings of the lease it holds on the session.
const dedicatedLeaseKey = "sluice.outbox.dedicated-lease"

// dedicated reports whether conn's session holds the round settings for lease since it
// connected (DedicatePool): the mark is written by the code that set them, on the same
// connection, and removed by the only code that resets them (a round of a relay of another
// lease, roundConn.close).
func dedicated(conn *pgx.Conn, lease time.Duration) bool {
	l, ok := conn.PgConn().CustomData()[dedicatedLeaseKey].(time.Duration)
	return ok && l == lease
}

// undedicate removes conn's mark before a round resets its settings.
func undedicate(conn *pgx.Conn) { delete(conn.PgConn().CustomData(), dedicatedLeaseKey) }

// serverMajor returns the server's major version from the server_version it reported when
// the connection started, or 0.
func serverMajor(conn *pgconn.PgConn) int {
	v := conn.ParameterStatus("server_version")
	end := strings.IndexFunc(v, func(r rune) bool { return r < '0' || r > '9' })
	if end >= 0 {
		v = v[:end]
	}
	n, _ := strconv.Atoi(v)
	return n
}
