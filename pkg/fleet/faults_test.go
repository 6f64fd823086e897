package fleet_test

import (
	"context"
	"net"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/pkg/fleet"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// TestAFailingTenantKeepsItsBackoffWhileItsDatabaseIsWritten: a tenant whose turns fail (its
// database has no outbox) is retried on its 1 s-doubling backoff even while its database is
// written all the time: the activity poll's wake-ups do not cut the backoff short.
func TestAFailingTenantKeepsItsBackoffWhileItsDatabaseIsWritten(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	url := testdb.EmptyURL(t)
	db, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	_, err = db.Exec(ctx, `CREATE TABLE busy (id bigserial PRIMARY KEY, v int)`)
	require.NoError(t, err)

	f := runFleet(t, fleet.Config{Registry: fleet.Static{{Name: "no-schema", DatabaseURL: url}}, Relay: b.relay,
		RegistryRefresh: time.Hour, SweepInterval: time.Minute})
	// Writes all the time: every activity poll sees the database's counters move.
	const window = 6 * time.Second
	start := time.Now()
	for time.Since(start) < window {
		_, err := db.Exec(ctx, `INSERT INTO busy (v) SELECT g FROM generate_series(1, 10) g`)
		require.NoError(t, err)
		time.Sleep(20 * time.Millisecond)
	}
	s := statusOf(t, f, "no-schema")
	require.Equal(t, fleet.StateFailing, s.State)
	// The backoff (1 s, 2 s, 4 s, ...) allows turns at about 0, 1, 3 and 7 s: three in the
	// window, four with a late first one.
	require.LessOrEqual(t, s.Failures, 4, "failed turns in %v: the backoff allows 3", window)
}

// silentServer accepts connections and never answers: a control database that hangs.
func silentServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().String()
}

// TestStaticTenantsAreServedWhileTheControlDatabaseHangs: on a cold start whose control
// database accepts connections but never answers, the registry read times out and the static
// tenants are served; the read is retried every RegistryRefresh.
func TestStaticTenantsAreServedWhileTheControlDatabaseHangs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	control, err := pgxpool.New(context.Background(), "postgres://sluice@"+silentServer(t)+"/control?sslmode=disable")
	require.NoError(t, err)
	t.Cleanup(control.Close)
	acme := newTenantDB(t, "acme")
	acme.write(t, 3, 3, 0)
	runFleet(t, fleet.Config{Registry: fleet.Registries{fleet.Static{acme.tenant()}, fleet.Table{DB: control, Timeout: time.Second}},
		Relay: b.relay, RegistryRefresh: time.Hour})
	requireInOrder(t, b.receive(t, 3), map[string]int{"acme": 3})
	testwait.Until(t, "acme's rows marked published", func() bool { return acme.pending(t) == 0 })
}

// TestFIFOGroupsAreTenantQualified: two tenants' events with the same partition key go to
// different FIFO message groups ("tenant:key"), so one tenant's stuck message never holds the
// other's at the queue.
func TestFIFOGroupsAreTenantQualified(t *testing.T) {
	t.Parallel()
	b := setup(t)
	acme, globex := newTenantDB(t, "acme"), newTenantDB(t, "globex")
	acme.write(t, 2, 1, 0)
	globex.write(t, 2, 1, 0)
	runFleet(t, fleet.Config{Registry: fleet.Static{acme.tenant(), globex.tenant()}, Relay: b.relay, RegistryRefresh: time.Hour})
	groups := map[string]string{} // message id → group
	testwait.Progress(t, "every message received", func() (int, bool) {
		out, err := b.sqsc.ReceiveMessage(context.Background(), &sqs.ReceiveMessageInput{QueueUrl: aws.String(b.pipe.QueueURL),
			MaxNumberOfMessages: 10, WaitTimeSeconds: 1, MessageAttributeNames: []string{"All"},
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll}})
		require.NoError(t, err)
		for _, m := range out.Messages {
			tenant := aws.ToString(m.MessageAttributes[outbox.TenantHeader].StringValue)
			groups[aws.ToString(m.MessageAttributes["messageId"].StringValue)] = tenant + " " + m.Attributes["MessageGroupId"]
			_, err := b.sqsc.DeleteMessage(context.Background(), &sqs.DeleteMessageInput{QueueUrl: aws.String(b.pipe.QueueURL), ReceiptHandle: m.ReceiptHandle})
			require.NoError(t, err)
		}
		return len(groups), len(groups) >= 4
	})
	count := map[string]int{}
	for _, g := range groups {
		count[g]++
	}
	require.Equal(t, map[string]int{"acme acme:k-0": 2, "globex globex:k-0": 2}, count)
}

// TestATenantURLWithoutADatabaseNameIsFoundByTheActivityPoll: a tenant whose URL names no
// database (PostgreSQL takes the user's name) is recognized by its server's activity poll by
// the name the server knows (current_database()): its write is published though its sweep is
// an hour away, and its status says the poll sees it.
func TestATenantURLWithoutADatabaseNameIsFoundByTheActivityPoll(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	d := newTenantDB(t, "unnamed")
	var db string
	require.NoError(t, d.pool.QueryRow(ctx, `SELECT current_database()`).Scan(&db))
	// A role named as the database: a URL without a database name connects to it.
	_, err := d.pool.Exec(ctx, `CREATE ROLE "`+db+`" LOGIN SUPERUSER`)
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = d.pool.Exec(context.WithoutCancel(ctx), `DROP ROLE IF EXISTS "`+db+`"`) })
	u, err := url.Parse(d.url)
	require.NoError(t, err)
	u.User, u.Path = url.User(db), ""

	f := runFleet(t, fleet.Config{Registry: fleet.Static{{Name: "unnamed", DatabaseURL: u.String()}}, Relay: b.relay,
		RegistryRefresh: time.Hour, SweepInterval: time.Hour, IdleClose: time.Millisecond})
	testwait.Until(t, "the tenant's first turn and a poll after it", func() bool {
		st := f.Status()
		return len(st) == 1 && st[0].Detection == fleet.DetectPoll
	})
	d.write(t, 3, 3, 0) // after the first turn, which found nothing: only the poll can wake it now
	requireInOrder(t, b.receive(t, 3), map[string]int{"unnamed": 3})
}
