package inbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/localaws"
	"github.com/sluicehq/sluice/internal/localrun"
	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/internal/wire"
	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// fleetBundle is a fleet of tenant databases, each migrated, and the pools a consumer opens
// on them. Every connection the pools open carries app, so pg_stat_activity shows them.
type fleetBundle struct {
	urls  map[string]string // tenant → database URL
	dbs   map[string]*pgxpool.Pool
	app   string
	pools *inbox.TenantPools
}

func setupFleet(t *testing.T, cfg inbox.TenantPoolsConfig, tenants ...string) *fleetBundle {
	t.Helper()
	ctx := context.Background()
	b := &fleetBundle{urls: map[string]string{}, dbs: map[string]*pgxpool.Pool{}, app: "sluice-test-" + uuid.NewString()[:8]}
	for _, name := range tenants {
		b.urls[name] = testdb.URL(t)
		db, err := pgxpool.New(ctx, b.urls[name])
		require.NoError(t, err)
		t.Cleanup(db.Close)
		_, err = db.Exec(ctx, `CREATE TABLE applied (seq bigserial PRIMARY KEY, message_id text NOT NULL, tenant text NOT NULL, key text NOT NULL, n int NOT NULL)`)
		require.NoError(t, err)
		b.dbs[name] = db
	}
	cfg.Resolve = func(_ context.Context, tenant string) (*pgxpool.Config, error) {
		u, ok := b.urls[tenant]
		if !ok {
			return nil, fmt.Errorf("tenant %q: %w", tenant, inbox.ErrUnknownTenant)
		}
		pc, err := pgxpool.ParseConfig(u)
		if err != nil {
			return nil, err
		}
		pc.ConnConfig.RuntimeParams["application_name"] = b.app
		return pc, nil
	}
	cfg.Logger = quiet
	pools, err := inbox.NewTenantPools(cfg)
	require.NoError(t, err)
	t.Cleanup(pools.Close)
	b.pools = pools
	return b
}

// tenantKeyed is the payload of the fleet tests: a key's events carry N = 0, 1, 2, ... and name
// the tenant that wrote them, so a handler can tell where it was applied.
type tenantKeyed struct {
	Tenant string `json:"tenant"`
	Key    string `json:"key"`
	N      int    `json:"n"`
}

func (b *fleetBundle) consumer(t *testing.T, mode inbox.Mode) *inbox.Consumer {
	t.Helper()
	r := inbox.NewRouter(inbox.FailUnknown)
	r.Handle("Keyed", func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		k, err := inbox.Decode[tenantKeyed](msg)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO applied (message_id, tenant, key, n) VALUES ($1, $2, $3, $4)`, msg.ID, k.Tenant, k.Key, k.N)
		return err
	})
	c, err := inbox.NewConsumer(nil, inbox.ConsumerConfig{Consumer: "ledger", Router: r, Mode: mode, Tenants: b.pools, Logger: quiet})
	require.NoError(t, err)
	return c
}

// fleetMessage is an SQS message as a fleet relay publishes it (raw delivery): tenant "" sends
// none of the header.
func fleetMessage(tenant, eventType, key string, n int) sqstypes.SendMessageBatchRequestEntry {
	id := uuid.NewString()
	body, _ := json.Marshal(tenantKeyed{Tenant: tenant, Key: key, N: n})
	attrs := map[string]sqstypes.MessageAttributeValue{}
	for k, v := range map[string]string{"messageId": id, "eventType": eventType, "aggregateType": "order", "aggregateId": key,
		"createdAt": time.Now().UTC().Format(time.RFC3339Nano), outbox.TenantHeader: tenant} {
		if v != "" {
			attrs[k] = sqstypes.MessageAttributeValue{DataType: aws.String("String"), StringValue: aws.String(v)}
		}
	}
	return sqstypes.SendMessageBatchRequestEntry{Id: aws.String(id), MessageBody: aws.String(string(body)), MessageAttributes: attrs,
		MessageGroupId: aws.String(key), MessageDeduplicationId: aws.String(id)}
}

// Messages of three tenants arrive mixed in the batches of one FIFO queue (the real local SQS),
// in groups whose names the tenants share. Each is applied in its own tenant's database, once
// (every batch is processed twice, as SQS redelivers: the second time is all duplicates), each
// tenant's key in order. A message naming no tenant, or one nobody knows, fails alone with
// ErrUnknownTenant and is recorded nowhere; a message its tenant's handlers refuse leaves its
// dead letter in that tenant's database only.
func TestTenantsApplyEachMessageInItsTenantsDatabaseOnceInKeyOrder(t *testing.T) {
	forModes(t, func(t *testing.T, mode inbox.Mode) {
		ctx := context.Background()
		tenants := []string{"acme", "globex", "initech"}
		b := setupFleet(t, inbox.TenantPoolsConfig{}, tenants...)
		c := b.consumer(t, mode)

		sq := sqs.NewFromConfig(localaws.TestConfigServing(t, localaws.ServiceSQS))
		name := "tenants-" + uuid.NewString()[:8] + ".fifo"
		q, err := sq.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name),
			Attributes: map[string]string{"FifoQueue": "true", "VisibilityTimeout": "2"}})
		require.NoError(t, err)
		qa, err := sq.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: q.QueueUrl,
			AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
		require.NoError(t, err)
		queueARN := qa.Attributes["QueueArn"]

		const keys, perKey = 2, 4
		var entries []sqstypes.SendMessageBatchRequestEntry
		for n := range perKey {
			for k := range keys {
				for _, tenant := range tenants {
					entries = append(entries, fleetMessage(tenant, "Keyed", fmt.Sprintf("k%d", k), n))
				}
			}
		}
		written := len(entries)
		bad := map[string]error{}
		for _, e := range []sqstypes.SendMessageBatchRequestEntry{
			fleetMessage("nobody", "Keyed", "orphan", 0),   // a tenant the registry does not know
			fleetMessage("", "Keyed", "headless", 0),       // no tenant header
			fleetMessage("globex", "Refused", "poison", 0), // its tenant has no handler for it
		} {
			entries = append(entries, e)
			bad[aws.ToString(e.Id)] = inbox.ErrUnknownTenant
		}
		bad[aws.ToString(entries[len(entries)-1].Id)] = inbox.ErrUnknownEventType
		for len(entries) > 0 {
			n := min(10, len(entries))
			out, err := sq.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: q.QueueUrl, Entries: entries[:n]})
			require.NoError(t, err)
			require.Empty(t, out.Failed)
			entries = entries[n:]
		}

		applied, failed := 0, map[string]error{}
		w := testwait.Watch[int](t, "every tenant's messages applied")
		for applied < written || len(failed) < len(bad) {
			w.Check(applied + len(failed))
			out, err := sq.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{QueueUrl: q.QueueUrl, MaxNumberOfMessages: 10, WaitTimeSeconds: 1,
				MessageAttributeNames:       []string{"All"},
				MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll}})
			require.NoError(t, err)
			if len(out.Messages) == 0 {
				continue
			}
			ev := localrun.SQSEvent(out.Messages, queueARN)
			first := c.Process(ctx, ev)
			again := c.Process(ctx, ev) // SQS delivers the batch again
			for i, res := range first.Results {
				id := ev.Records[i].MessageAttributes["messageId"].StringValue
				if want, ok := bad[*id]; ok {
					require.Equal(t, inbox.Failed, res.Outcome, "%s", *id)
					require.ErrorIs(t, res.Err, want)
					failed[*id] = res.Err
					continue
				}
				require.Equal(t, inbox.Applied, res.Outcome, "%+v", res)
				require.Equal(t, inbox.Duplicate, again.Results[i].Outcome, "%+v", again.Results[i])
				applied++
			}
			for _, m := range out.Messages { // the failed ones as if moved to the DLQ
				_, err := sq.DeleteMessage(ctx, &sqs.DeleteMessageInput{QueueUrl: q.QueueUrl, ReceiptHandle: m.ReceiptHandle})
				require.NoError(t, err)
			}
		}
		require.Equal(t, written, applied)

		for _, tenant := range tenants {
			db := b.dbs[tenant]
			rows, err := db.Query(ctx, `SELECT tenant, key, n FROM applied ORDER BY seq`)
			require.NoError(t, err)
			got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[tenantKeyed])
			require.NoError(t, err)
			require.Len(t, got, keys*perKey, "tenant %s: each of its messages applied once", tenant)
			next := map[string]int{}
			for _, k := range got {
				require.Equal(t, tenant, k.Tenant, "only the tenant's own messages are applied in its database")
				require.Equal(t, next[k.Key], k.N, "tenant %s, key %s applied in order", tenant, k.Key)
				next[k.Key]++
			}
			require.Equal(t, keys*perKey, count(t, db, `SELECT count(*) FROM inbox_event WHERE consumer = 'ledger' AND processed_at IS NOT NULL`))
			letters := count(t, db, `SELECT count(*) FROM inbox_dead_letter`)
			if tenant == "globex" {
				require.Equal(t, 1, letters, "the refused message's dead letter is in its tenant's database")
				require.Equal(t, 1, count(t, db, `SELECT count(*) FROM inbox_dead_letter WHERE error_class = $1`, inbox.ClassUnknownEventType))
			} else {
				require.Zero(t, letters, "messages of unknown tenants are recorded nowhere")
			}
		}
	})
}

// A tenant's pool holds at most MaxConnsPerTenant connections and all pools together at most
// MaxConns, measured on the server (pg_stat_activity, by database) while many callers use
// three tenants at once; with room for two pools, the third tenant's callers wait for an idle
// pool to close, and every call completes.
func TestTenantPoolsBoundConnectionsPerTenantAndInTotal(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tenants := []string{"acme", "globex", "initech"}
	b := setupFleet(t, inbox.TenantPoolsConfig{MaxConnsPerTenant: 2, MaxConns: 4}, tenants...)

	var mu sync.Mutex
	maxPerDB, maxTotal := map[string]int{}, 0
	var wg sync.WaitGroup
	errs := make(chan error, 24)
	for i := range 24 {
		tenant := tenants[i%len(tenants)]
		wg.Go(func() {
			err := b.pools.WithTenant(ctx, tenant, func(db *pgxpool.Pool) error {
				conn, err := db.Acquire(ctx) // held while counting: the count sees the pool busy
				if err != nil {
					return err
				}
				defer conn.Release()
				perDB, total := b.connections(ctx, conn)
				mu.Lock()
				maxPerDB[tenant] = max(maxPerDB[tenant], perDB)
				maxTotal = max(maxTotal, total)
				mu.Unlock()
				_, err = conn.Exec(ctx, `SELECT pg_sleep(0.02)`)
				return err
			})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for _, tenant := range tenants {
		require.NotZero(t, maxPerDB[tenant], "tenant %s was served", tenant)
		require.LessOrEqual(t, maxPerDB[tenant], 2, "tenant %s: connections of its pool", tenant)
	}
	require.LessOrEqual(t, maxTotal, 4, "connections of every tenant pool")
}

// connections counts, from the server, the connections the fleet's pools hold on conn's
// database and on all databases. A connection a closed pool ended leaves pg_stat_activity a
// moment after its client closed it, so a count above what is open is read again.
func (b *fleetBundle) connections(ctx context.Context, conn *pgxpool.Conn) (perDB, total int) {
	for range 20 {
		_ = conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE datname = current_database()), count(*)
			FROM pg_stat_activity WHERE application_name = $1`, b.app).Scan(&perDB, &total)
		if perDB <= 2 && total <= 4 {
			return perDB, total
		}
		time.Sleep(10 * time.Millisecond)
	}
	return perDB, total
}

// The least recently used idle pool is closed first when a new tenant's pool needs its room,
// and a pool idle for IdleClose is closed at the next use of any pool; the pools still in use
// keep their connections.
func TestTenantPoolsCloseTheLeastRecentlyUsedIdlePoolFirst(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupFleet(t, inbox.TenantPoolsConfig{MaxConnsPerTenant: 1, MaxConns: 2, IdleClose: time.Hour}, "acme", "globex", "initech")
	use := func(tenant string) {
		require.NoError(t, b.pools.WithTenant(ctx, tenant, func(db *pgxpool.Pool) error {
			_, err := db.Exec(ctx, `SELECT 1`)
			return err
		}))
	}
	open := func() map[string]bool {
		rows, err := b.dbs["acme"].Query(ctx, `SELECT datname FROM pg_stat_activity WHERE application_name = $1`, b.app)
		require.NoError(t, err)
		names, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err)
		out := map[string]bool{}
		for tenant, db := range b.dbs {
			for _, n := range names {
				if n == db.Config().ConnConfig.Database {
					out[tenant] = true
				}
			}
		}
		return out
	}
	use("acme")
	use("globex")
	use("acme") // globex is now the least recently used
	use("initech")
	testwait.Until(t, "globex's pool closed, acme's and initech's open", func() bool {
		o := open()
		return !o["globex"] && o["acme"] && o["initech"]
	})

	idle, err := inbox.NewTenantPools(inbox.TenantPoolsConfig{Resolve: func(ctx context.Context, tenant string) (*pgxpool.Config, error) {
		pc, err := pgxpool.ParseConfig(b.urls[tenant])
		if err == nil {
			pc.ConnConfig.RuntimeParams["application_name"] = b.app + "-idle"
		}
		return pc, err
	}, IdleClose: 50 * time.Millisecond})
	require.NoError(t, err)
	defer idle.Close()
	require.NoError(t, idle.WithTenant(ctx, "acme", func(db *pgxpool.Pool) error { return db.Ping(ctx) }))
	time.Sleep(100 * time.Millisecond)
	require.NoError(t, idle.WithTenant(ctx, "globex", func(db *pgxpool.Pool) error { return db.Ping(ctx) }))
	testwait.Until(t, "acme's idle pool closed", func() bool {
		return count(t, b.dbs["acme"], `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND datname = current_database()`, b.app+"-idle") == 0
	})
}

// Fleet mode is a choice of where to apply: a db and Tenants together, or neither, is refused;
// WithTenant names an unknown tenant with ErrUnknownTenant.
func TestTenantConsumerConfigAndUnknownTenant(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupFleet(t, inbox.TenantPoolsConfig{}, "acme")
	_, err := inbox.NewConsumer(b.dbs["acme"], inbox.ConsumerConfig{Consumer: "x", Router: router("x"), Tenants: b.pools})
	require.ErrorIs(t, err, inbox.ErrInvalidConfig)
	_, err = inbox.NewConsumer(nil, inbox.ConsumerConfig{Consumer: "x", Router: router("x")})
	require.ErrorIs(t, err, inbox.ErrInvalidConfig)
	_, err = inbox.NewTenantPools(inbox.TenantPoolsConfig{MaxConnsPerTenant: 5, MaxConns: 4})
	require.ErrorIs(t, err, inbox.ErrInvalidConfig)
	require.ErrorContains(t, err, "Resolve is required")

	err = b.pools.WithTenant(ctx, "nobody", func(*pgxpool.Pool) error { return errors.New("must not run") })
	require.ErrorIs(t, err, inbox.ErrUnknownTenant)
}

// A tenant's database that moved (renamed here; a new host or credentials in production)
// fails the records that reach its old pool, once: the failed Begin closes the pool, and the
// next batch resolves the tenant again and applies them in the database where it now is.
func TestTenantPoolsResolveATenantAgainAfterAFailedBegin(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupFleet(t, inbox.TenantPoolsConfig{}, "acme", "globex")
	c := b.consumer(t, inbox.PerRecord)
	msg := func(n int) events.SQSMessage {
		body, _ := json.Marshal(tenantKeyed{Tenant: "acme", Key: "k", N: n})
		return record(fmt.Sprintf("sqs-%d", n), string(body), map[string]string{"messageId": fmt.Sprintf("m-%d", n),
			"eventType": "Keyed", inbox.TenantHeader: "acme"})
	}
	rep := c.Process(ctx, batchOf(msg(0)))
	require.Equal(t, inbox.Applied, rep.Results[0].Outcome, "%+v", rep.Results[0])

	// The database moves: its connections end, and its name changes.
	admin := b.dbs["globex"]
	oldName := b.dbs["acme"].Config().ConnConfig.Database
	b.dbs["acme"].Close()
	newName := oldName + "_moved"
	testwait.Until(t, "acme's connections ended and the database renamed", func() bool {
		_, _ = admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1`, oldName)
		_, err := admin.Exec(ctx, `ALTER DATABASE `+pgx.Identifier{oldName}.Sanitize()+` RENAME TO `+pgx.Identifier{newName}.Sanitize())
		return err == nil
	})
	t.Cleanup(func() { // testdb drops the database by its first name
		_, _ = admin.Exec(context.WithoutCancel(ctx), `ALTER DATABASE `+pgx.Identifier{newName}.Sanitize()+` RENAME TO `+pgx.Identifier{oldName}.Sanitize())
	})
	u, err := url.Parse(b.urls["acme"])
	require.NoError(t, err)
	u.Path = "/" + newName
	b.urls["acme"] = u.String() // the registry knows where it went
	moved, err := pgxpool.New(ctx, u.String())
	require.NoError(t, err)
	defer moved.Close()

	rep = c.Process(ctx, batchOf(msg(1)))
	require.Equal(t, inbox.Failed, rep.Results[0].Outcome, "the old pool's Begin fails")
	testwait.Until(t, "the tenant is resolved again and its message applied", func() bool {
		return c.Process(ctx, batchOf(msg(1))).Results[0].Outcome == inbox.Applied
	})
	require.Equal(t, 2, count(t, moved, `SELECT count(*) FROM applied`))
}

// The relay's tenant header reaches Message.Tenant on every destination: an SQS attribute, an
// attribute inside the SNS envelope, the envelope's headers on EventBridge and Kinesis, a
// Kafka header.
func TestTenantHeaderIsReadOnEveryDestination(t *testing.T) {
	t.Parallel()
	envelope, _ := json.Marshal(wire.Envelope{Metadata: wire.EnvelopeMetadata{MessageID: "m-1", EventType: "Keyed", PartitionKey: "k",
		CreatedAt: "2026-11-29T10:00:00Z", Headers: map[string]string{inbox.TenantHeader: "acme"}}, Data: json.RawMessage(`{"n":1}`)})
	sns, _ := json.Marshal(map[string]any{"Type": "Notification", "MessageId": "sns-1", "TopicArn": "arn:aws:sns:eu-west-1:1:orders",
		"Message": `{"n":1}`, "MessageAttributes": map[string]any{"messageId": map[string]string{"Type": "String", "Value": "m-1"},
			"eventType": map[string]string{"Type": "String", "Value": "Keyed"}, inbox.TenantHeader: map[string]string{"Type": "String", "Value": "acme"}}})
	eventBridge, _ := json.Marshal(map[string]any{"id": "eb-1", "detail-type": "Keyed", "source": "sluice", "detail": json.RawMessage(envelope)})

	parse := map[string]func() (inbox.Message, error){
		"sqs": func() (inbox.Message, error) {
			return inbox.Parse(record("sqs-1", `{"n":1}`, map[string]string{"messageId": "m-1", "eventType": "Keyed", inbox.TenantHeader: "acme"}))
		},
		"sns": func() (inbox.Message, error) {
			return inbox.Parse(events.SQSMessage{MessageId: "sqs-1", Body: string(sns), EventSource: "aws:sqs"})
		},
		"eventbridge": func() (inbox.Message, error) {
			return inbox.Parse(events.SQSMessage{MessageId: "sqs-1", Body: string(eventBridge), EventSource: "aws:sqs"})
		},
		"kinesis": func() (inbox.Message, error) {
			return inbox.ParseKinesis(events.KinesisEventRecord{EventSource: "aws:kinesis", EventSourceArn: testStream,
				Kinesis: events.KinesisRecord{Data: envelope, PartitionKey: "k", SequenceNumber: "1"}})
		},
		"kafka": func() (inbox.Message, error) {
			r := kafkaRec(0, 1, "m-1", script{N: 1})
			r.Headers = append(r.Headers, map[string]events.JSONNumberBytes{inbox.TenantHeader: []byte("acme")})
			return inbox.ParseKafka(r)
		},
	}
	for dest, f := range parse {
		msg, err := f()
		require.NoError(t, err, dest)
		require.Equal(t, "acme", msg.Tenant(), dest)
	}
}

// The fleet's processor drains every tenant's stored rows in its own database; a tenant that
// cannot be opened is named in the error and costs the others nothing.
func TestTenantProcessorDrainsEveryTenantAndIsolatesFailures(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setupFleet(t, inbox.TenantPoolsConfig{}, "acme", "globex")
	store := b.consumer(t, inbox.Async)
	var recs []events.SQSMessage
	for i, tenant := range []string{"acme", "globex", "acme"} {
		body, _ := json.Marshal(tenantKeyed{Tenant: tenant, Key: "k", N: i})
		recs = append(recs, record(fmt.Sprintf("sqs-%d", i), string(body), map[string]string{"messageId": fmt.Sprintf("m-%d", i),
			"eventType": "Keyed", inbox.TenantHeader: tenant}))
	}
	rep := store.Process(ctx, batchOf(recs...))
	require.Equal(t, 3, rep.Count(inbox.Stored), "%+v", rep.Results)

	r := inbox.NewRouter(inbox.FailUnknown)
	r.Handle("Keyed", func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		k, err := inbox.Decode[tenantKeyed](msg)
		if err == nil {
			_, err = tx.Exec(ctx, `INSERT INTO applied (message_id, tenant, key, n) VALUES ($1, $2, $3, $4)`, msg.ID, k.Tenant, k.Key, k.N)
		}
		return err
	})
	p, err := inbox.NewTenantProcessor(b.pools, func(context.Context) ([]string, error) { return []string{"acme", "nobody", "globex"}, nil },
		inbox.ProcessorConfig{Consumer: "ledger", Router: r, Logger: quiet})
	require.NoError(t, err)
	st, err := p.Drain(ctx)
	require.ErrorIs(t, err, inbox.ErrUnknownTenant)
	require.ErrorContains(t, err, "tenant nobody")
	require.Equal(t, 3, st.Applied)
	require.Equal(t, 2, count(t, b.dbs["acme"], `SELECT count(*) FROM applied WHERE tenant = 'acme'`))
	require.Equal(t, 1, count(t, b.dbs["globex"], `SELECT count(*) FROM applied WHERE tenant = 'globex'`))
}
