package main

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-lambda-go/cfn"
	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/secretsmanager"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
	sluicemetrics "github.com/sluicehq/sluice/pkg/metrics"
	"github.com/sluicehq/sluice/pkg/outbox"
	"github.com/sluicehq/sluice/pkg/partition"
)

// secretBook holds secrets in Secrets Manager's request and response shapes.
type secretBook struct {
	mu      sync.Mutex
	secrets map[string]string
	puts    int
}

func (b *secretBook) GetSecretValue(_ context.Context, in *secretsmanager.GetSecretValueInput, _ ...func(*secretsmanager.Options)) (*secretsmanager.GetSecretValueOutput, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	v, ok := b.secrets[aws.ToString(in.SecretId)]
	if !ok {
		return nil, errors.New("ResourceNotFoundException: " + aws.ToString(in.SecretId))
	}
	return &secretsmanager.GetSecretValueOutput{SecretString: aws.String(v)}, nil
}

func (b *secretBook) PutSecretValue(_ context.Context, in *secretsmanager.PutSecretValueInput, _ ...func(*secretsmanager.Options)) (*secretsmanager.PutSecretValueOutput, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.secrets[aws.ToString(in.SecretId)] = aws.ToString(in.SecretString)
	b.puts++
	return &secretsmanager.PutSecretValueOutput{}, nil
}

func (b *secretBook) fields(t *testing.T, arn string) map[string]any {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	var m map[string]any
	require.NoError(t, json.Unmarshal([]byte(b.secrets[arn]), &m))
	return m
}

// connectAs connects to the test database as role (the test server trusts local connections,
// so this proves what the role may do, not its password; TestSCRAMVerifier covers that).
func connectAs(t *testing.T, dbURL, role string) *pgx.Conn {
	t.Helper()
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	u.User = url.User(role)
	conn, err := pgx.Connect(context.Background(), u.String())
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

func requireSQLState(t *testing.T, err error, state, msg string) {
	t.Helper()
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr, msg)
	require.Equal(t, state, pgErr.Code, "%s: %s", msg, pgErr.Message)
}

// The custom resource gives each function its own role with only what it needs: the relay
// reads and updates outbox rows and nothing of the inbox; a consumer reads and writes its own
// inbox rows and the tables it declared, and nothing of the outbox.
func TestRolesGrantEachFunctionOnlyWhatItNeeds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := testdb.EmptyURL(t)
	admin, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, `CREATE TABLE invoice (order_id text PRIMARY KEY, cents int NOT NULL)`)
	require.NoError(t, err)

	suffix := fmt.Sprint(time.Now().UnixNano())
	relay, billing, audit := "sluice_relay_"+suffix, "sluice_billing_"+suffix, "sluice_audit_"+suffix
	for _, r := range []string{relay, billing, audit} {
		t.Cleanup(func() {
			// Roles are cluster-wide: drop what they hold in the test database, then them.
			c, err := pgx.Connect(context.Background(), dbURL)
			if err == nil {
				_, _ = c.Exec(context.Background(), "DROP OWNED BY "+r)
				c.Close(context.Background())
			}
		})
	}
	book := &secretBook{secrets: map[string]string{}}
	for _, r := range []string{relay, billing, audit} {
		book.secrets["arn:"+r] = fmt.Sprintf(`{"username":%q,"password":"pw-%s"}`, r, r)
	}
	roles := []any{
		map[string]any{"Name": relay, "Kind": KindRelay, "SecretArn": "arn:" + relay},
		map[string]any{"Name": billing, "Kind": KindConsumer, "SecretArn": "arn:" + billing, "Consumer": "billing",
			"Grants": []any{map[string]any{"Table": "invoice", "Privileges": []any{"SELECT", "INSERT", "DELETE"}}}},
		map[string]any{"Name": audit, "Kind": KindConsumer, "SecretArn": "arn:" + audit, "Consumer": "audit"},
	}
	h := &handler{getenv: func(k string) string { return map[string]string{lambdaenv.DatabaseURL: dbURL}[k] }, secrets: book, log: slog.New(slog.DiscardHandler)}
	ev := createEvent(t)
	ev.ResourceProperties = map[string]any{RolesProperty: roles}
	_, _, err = h.Handle(ctx, ev)
	require.NoError(t, err)

	t.Run("role secrets are completed with the database endpoint", func(t *testing.T) {
		u, _ := url.Parse(dbURL)
		s := book.fields(t, "arn:"+billing)
		require.Equal(t, billing, s["username"])
		require.Equal(t, "pw-"+billing, s["password"], "the password stays")
		require.Equal(t, u.Hostname(), s["host"])
		require.Equal(t, u.Port(), fmt.Sprint(s["port"]))
		require.Equal(t, strings.TrimPrefix(u.Path, "/"), s["dbname"])
		require.Equal(t, "postgres", s["engine"])
		var stored string
		require.NoError(t, admin.QueryRow(ctx, "SELECT rolpassword FROM pg_authid WHERE rolname = $1", billing).Scan(&stored))
		require.True(t, strings.HasPrefix(stored, "SCRAM-SHA-256$4096:"), "a SCRAM verifier, not the password: %s", stored)
	})

	// Rows as the producers and consumers would leave them.
	_, err = admin.Exec(ctx, `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
		VALUES (gen_random_uuid(), 'orders', 'order', 'o-1', 'OrderCreated', 'o-1', '{}')`)
	require.NoError(t, err)
	_, err = admin.Exec(ctx, `INSERT INTO inbox_event (consumer, message_id, event_type) VALUES ('audit', 'm-audit', 'OrderCreated')`)
	require.NoError(t, err)

	t.Run("relay: reads and updates outbox rows, nothing else", func(t *testing.T) {
		c := connectAs(t, dbURL, relay)
		tag, err := c.Exec(ctx, `UPDATE outbox_event SET published_at = now(), attempts = attempts + 1 WHERE id IN
			(SELECT id FROM outbox_event WHERE published_at IS NULL ORDER BY id LIMIT 10 FOR UPDATE SKIP LOCKED)`)
		require.NoError(t, err)
		require.EqualValues(t, 1, tag.RowsAffected())
		var epoch int64
		require.NoError(t, c.QueryRow(ctx, `SELECT admin_epoch FROM outbox_control`).Scan(&epoch))
		_, err = c.Exec(ctx, `SELECT count(*) FROM inbox_event`)
		requireSQLState(t, err, "42501", "the relay reads no inbox rows")
		_, err = c.Exec(ctx, `DELETE FROM outbox_event`)
		requireSQLState(t, err, "42501", "the relay deletes no outbox rows")
		_, err = c.Exec(ctx, `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
			VALUES (gen_random_uuid(), 'x', 'x', 'x', 'X', 'x', '{}')`)
		requireSQLState(t, err, "42501", "the relay writes no events")
		_, err = c.Exec(ctx, `SELECT count(*) FROM invoice`)
		requireSQLState(t, err, "42501", "the relay reads no service tables")
		var stats bool
		require.NoError(t, c.QueryRow(ctx, "SELECT pg_has_role(current_user, 'pg_read_all_stats', 'MEMBER')").Scan(&stats))
		require.False(t, stats, "the relay does not hold pg_read_all_stats")

		// Another role's session, idle in a transaction that wrote, after a query whose text
		// holds a secret literal: the relay gets the horizon it holds back, never the text.
		ocfg, err := pgx.ParseConfig(dbURL)
		require.NoError(t, err)
		ocfg.RuntimeParams["application_name"] = "forgotten-psql"
		other, err := pgx.ConnectConfig(ctx, ocfg)
		require.NoError(t, err)
		defer other.Close(context.WithoutCancel(ctx))
		otx, err := other.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = otx.Rollback(context.WithoutCancel(ctx)) }()
		_, err = otx.Exec(ctx, `UPDATE invoice SET cents = 1 WHERE order_id = 'card-4111111111111111'`)
		require.NoError(t, err)
		_, err = otx.Exec(ctx, `CREATE TEMP TABLE scratch (n int); INSERT INTO scratch VALUES (1)`)
		require.NoError(t, err)
		h, err := outbox.HorizonOf(ctx, c)
		require.NoError(t, err)
		require.Contains(t, h.HeldBy, fmt.Sprintf("session %d (forgotten-psql, idle in transaction)", other.PgConn().PID()))
		require.Positive(t, h.OldestTransactionAge)
		require.Positive(t, h.XIDAge)
		var query string
		require.NoError(t, c.QueryRow(ctx, "SELECT coalesce(query, '') FROM pg_stat_activity WHERE pid = $1", other.PgConn().PID()).Scan(&query))
		require.NotContains(t, query, "4111", "the relay does not see another session's query text")
		require.Equal(t, "<insufficient privilege>", query)
		_ = otx.Rollback(ctx)

		// What the role allows is what the relay needs: a real relay, logged in as the role,
		// publishes a row (advisory locks, plan guards, the admin epoch, the horizon metric).
		_, err = admin.Exec(ctx, `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
			VALUES (gen_random_uuid(), 'orders', 'order', 'o-2', 'OrderCreated', 'o-2', '{}')`)
		require.NoError(t, err)
		u, err := url.Parse(dbURL)
		require.NoError(t, err)
		u.User = url.User(relay)
		pool, err := pgxpool.New(ctx, u.String())
		require.NoError(t, err)
		defer pool.Close()
		var metrics strings.Builder
		r, err := outbox.NewRelay(pool, outbox.RelayConfig{Publisher: acceptAll{}, DefaultTopic: "arn:aws:sns:us-east-1:000000000000:orders",
			Metrics: &metrics, MetricsInterval: time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		st, err := r.RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, st.Published)
		runCtx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		require.NoError(t, r.Run(runCtx))
		require.Contains(t, metrics.String(), sluicemetrics.OldestTransactionAge.Name)
	})

	t.Run("consumer: its own inbox rows and its declared tables, no outbox", func(t *testing.T) {
		c := connectAs(t, dbURL, billing)
		err := pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, `INSERT INTO inbox_event (consumer, message_id, event_type, processed_at) VALUES ('billing', 'm-1', 'OrderCreated', now())
				ON CONFLICT DO NOTHING`); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO invoice (order_id, cents) VALUES ('o-1', 4200)`)
			return err
		})
		require.NoError(t, err, "the inbox row and the effect in one transaction")
		_, err = c.Exec(ctx, `UPDATE inbox_event SET attempts = attempts + 1 WHERE consumer = 'billing'`)
		require.NoError(t, err)

		var visible int
		require.NoError(t, c.QueryRow(ctx, `SELECT count(*) FROM inbox_event`).Scan(&visible))
		require.Equal(t, 1, visible, "another consumer's rows are invisible")
		tag, err := c.Exec(ctx, `UPDATE inbox_event SET last_error = 'x' WHERE consumer = 'audit'`)
		require.NoError(t, err)
		require.Zero(t, tag.RowsAffected(), "another consumer's rows cannot be changed")
		tag, err = c.Exec(ctx, `DELETE FROM inbox_event WHERE consumer = 'audit'`)
		require.NoError(t, err)
		require.Zero(t, tag.RowsAffected(), "another consumer's rows cannot be deleted")
		_, err = c.Exec(ctx, `INSERT INTO inbox_event (consumer, message_id, event_type) VALUES ('audit', 'm-forged', 'OrderCreated')`)
		requireSQLState(t, err, "42501", "no rows in another consumer's name (row level security)")

		_, err = c.Exec(ctx, `UPDATE outbox_event SET published_at = NULL, attempts = 0`)
		requireSQLState(t, err, "42501", "the consumer cannot write outbox bookkeeping")
		_, err = c.Exec(ctx, `SELECT count(*) FROM outbox_event`)
		requireSQLState(t, err, "42501", "the consumer reads no outbox rows")
		_, err = c.Exec(ctx, `UPDATE invoice SET cents = 0`)
		requireSQLState(t, err, "42501", "only the declared privileges on the declared table")
		_, err = c.Exec(ctx, `CREATE TABLE sneaky (id int)`)
		requireSQLState(t, err, "42501", "no schema changes without a declared CREATE")
	})

	t.Run("update: removed grants are revoked, removed roles cannot log in", func(t *testing.T) {
		ev := createEvent(t)
		ev.RequestType = cfn.RequestUpdate
		ev.OldResourceProperties = map[string]any{RolesProperty: roles}
		ev.ResourceProperties = map[string]any{RolesProperty: []any{
			roles[0],
			map[string]any{"Name": billing, "Kind": KindConsumer, "SecretArn": "arn:" + billing, "Consumer": "billing",
				"Grants": []any{map[string]any{"Table": "invoice", "Privileges": []any{"SELECT", "INSERT"}}}},
		}}
		puts := book.puts
		_, _, err := h.Handle(ctx, ev)
		require.NoError(t, err)
		require.Equal(t, puts, book.puts, "complete secrets are not written again")

		var canDelete, canInsert, auditLogin bool
		require.NoError(t, admin.QueryRow(ctx, `SELECT has_table_privilege($1, 'invoice', 'DELETE'), has_table_privilege($1, 'invoice', 'INSERT')`, billing).Scan(&canDelete, &canInsert))
		require.False(t, canDelete, "DELETE was removed from the grants")
		require.True(t, canInsert)
		require.NoError(t, admin.QueryRow(ctx, `SELECT rolcanlogin FROM pg_roles WHERE rolname = $1`, audit).Scan(&auditLogin))
		require.False(t, auditLogin)
	})
}

func TestRolesPropertyIsValidatedBeforeAnythingChanges(t *testing.T) {
	t.Parallel()
	_, err := parseRoles(map[string]any{RolesProperty: []any{
		map[string]any{"Name": "Bad Name", "Kind": "writer", "SecretArn": ""},
		map[string]any{"Name": "sluice_c", "Kind": KindConsumer, "SecretArn": "arn:x",
			"Grants": []any{map[string]any{"Table": "invoice; DROP TABLE outbox_event", "Privileges": []any{"SELECT"}},
				map[string]any{"Schema": "public", "Privileges": []any{"SELECT"}}}},
	}})
	require.Error(t, err)
	for _, want := range []string{
		"Name must be a lower-case PostgreSQL identifier", `Kind must be "relay" or "consumer", got "writer"`, "SecretArn is required",
		"a consumer role needs its Consumer name", `table "invoice; DROP TABLE outbox_event" is not`, `privilege "SELECT" is not one of USAGE, CREATE`,
	} {
		require.ErrorContains(t, err, want)
	}
}

// The verifier is checked against the SCRAM-SHA-256 exchange published in RFC 7677 (section 3):
// the client's proof must verify against the stored key and the server key must produce the
// server signature, exactly as PostgreSQL checks a login against pg_authid.rolpassword.
func TestSCRAMVerifier(t *testing.T) {
	t.Parallel()
	salt, err := base64.StdEncoding.DecodeString("W22ZaJ0SNY7soEsUEjb6gQ==")
	require.NoError(t, err)
	v, err := scramVerifierWithSalt("pencil", salt, 4096)
	require.NoError(t, err)
	parts := strings.Split(v, "$")
	require.Len(t, parts, 3)
	require.Equal(t, "SCRAM-SHA-256", parts[0])
	require.Equal(t, "4096:W22ZaJ0SNY7soEsUEjb6gQ==", parts[1])
	keys := strings.Split(parts[2], ":")
	storedKey, err := base64.StdEncoding.DecodeString(keys[0])
	require.NoError(t, err)
	serverKey, err := base64.StdEncoding.DecodeString(keys[1])
	require.NoError(t, err)

	const nonce = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
	authMessage := "n=user,r=rOprNGfwEbeRWgbNEkqO" + "," + "r=" + nonce + ",s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096" + "," + "c=biws,r=" + nonce
	mac := func(key []byte) []byte {
		h := hmac.New(sha256.New, key)
		h.Write([]byte(authMessage))
		return h.Sum(nil)
	}
	proof, err := base64.StdEncoding.DecodeString("dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
	require.NoError(t, err)
	clientSignature := mac(storedKey)
	clientKey := make([]byte, len(proof))
	for i := range proof {
		clientKey[i] = proof[i] ^ clientSignature[i]
	}
	sum := sha256.Sum256(clientKey)
	require.Equal(t, storedKey, sum[:], "the RFC's client proof verifies against the stored key")
	require.Equal(t, "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=", base64.StdEncoding.EncodeToString(mac(serverKey)), "the RFC's server signature")

	a, err := scramVerifier("pencil")
	require.NoError(t, err)
	b, err := scramVerifier("pencil")
	require.NoError(t, err)
	require.NotEqual(t, a, b, "a fresh salt each time")
}

// acceptAll acknowledges every event: the broker is not what these tests are about.
type acceptAll struct{}

func (acceptAll) PublishBatch(_ context.Context, _ string, events []*outbox.Event) []error {
	return make([]error, len(events))
}

// consumerRecord is a raw-delivery SQS record of event type Invoiced whose handler inserts an
// invoice row and fails when the body says so.
func consumerRecord(id string, fail bool) events.SQSMessage {
	body := fmt.Sprintf(`{"order":%q,"fail":%t}`, id, fail)
	attr := func(v string) events.SQSMessageAttribute {
		return events.SQSMessageAttribute{DataType: "String", StringValue: aws.String(v)}
	}
	return events.SQSMessage{MessageId: "sqs-" + id, Body: body, EventSource: "aws:sqs",
		Attributes: map[string]string{"ApproximateReceiveCount": "1"},
		MessageAttributes: map[string]events.SQSMessageAttribute{
			"messageId": attr(id), "eventType": attr("Invoiced"), "aggregateType": attr("order"), "aggregateId": attr(id),
		}}
}

// invoicing is the consumer's handler: an effect in a service table, then a failure on demand.
func invoicing(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
	v, err := inbox.Decode[struct {
		Order string `json:"order"`
		Fail  bool   `json:"fail"`
	}](msg)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, `INSERT INTO invoice (order_id, cents) VALUES ($1, 100)`, v.Order); err != nil {
		return err
	}
	if v.Fail {
		return errors.New("scripted failure")
	}
	return nil
}

// What the roles allow is what the real functions need, on plain and on partitioned tables: an
// inbox.Consumer logged in as the consumer's role applies a batch with a failing record in both
// synchronous commit modes (the batched mode deletes the failed record's inbox row before its
// commit), and an outbox relay logged in as the relay's role publishes.
func TestRolesRunTheRealConsumerAndRelay(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := testdb.EmptyURL(t)
	admin, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, `CREATE TABLE invoice (order_id text PRIMARY KEY, cents int NOT NULL)`)
	require.NoError(t, err)

	suffix := fmt.Sprint(time.Now().UnixNano())
	relay, billing := "sluice_relay_real_"+suffix, "sluice_billing_real_"+suffix
	book := &secretBook{secrets: map[string]string{}}
	for _, r := range []string{relay, billing} {
		book.secrets["arn:"+r] = fmt.Sprintf(`{"username":%q,"password":"pw"}`, r)
		t.Cleanup(func() {
			c, err := pgx.Connect(context.Background(), dbURL)
			if err == nil {
				_, _ = c.Exec(context.Background(), "DROP OWNED BY "+r)
				c.Close(context.Background())
			}
		})
	}
	h := &handler{getenv: func(k string) string { return map[string]string{lambdaenv.DatabaseURL: dbURL}[k] }, secrets: book, log: slog.New(slog.DiscardHandler)}
	ev := createEvent(t)
	ev.ResourceProperties = map[string]any{RolesProperty: []any{
		map[string]any{"Name": relay, "Kind": KindRelay, "SecretArn": "arn:" + relay},
		map[string]any{"Name": billing, "Kind": KindConsumer, "SecretArn": "arn:" + billing, "Consumer": "billing",
			"Grants": []any{map[string]any{"Table": "invoice", "Privileges": []any{"INSERT"}}}},
	}}
	_, _, err = h.Handle(ctx, ev)
	require.NoError(t, err)

	poolAs := func(t *testing.T, role string) *pgxpool.Pool {
		u, err := url.Parse(dbURL)
		require.NoError(t, err)
		u.User = url.User(role)
		pool, err := pgxpool.New(ctx, u.String())
		require.NoError(t, err)
		t.Cleanup(pool.Close)
		return pool
	}
	consumerPool, relayPool := poolAs(t, billing), poolAs(t, relay)
	router := inbox.NewRouter(inbox.FailUnknown)
	router.Handle("Invoiced", invoicing)

	run := func(t *testing.T, layout string) {
		for _, mode := range []inbox.Mode{inbox.PerRecord, inbox.Batched} {
			c, err := inbox.NewConsumer(consumerPool, inbox.ConsumerConfig{Consumer: "billing", Router: router, Mode: mode, Logger: slog.New(slog.DiscardHandler)})
			require.NoError(t, err)
			p := layout + "-" + mode.String() + "-"
			resp, err := c.HandleSQS(ctx, events.SQSEvent{Records: []events.SQSMessage{
				consumerRecord(p+"ok-1", false), consumerRecord(p+"bad", true), consumerRecord(p+"ok-2", false),
			}})
			require.NoError(t, err, mode.String())
			require.Equal(t, []events.SQSBatchItemFailure{{ItemIdentifier: "sqs-" + p + "bad"}}, resp.BatchItemFailures,
				"%s: only the failing record comes back", mode)
			var inboxRows, invoices []string
			rows, err := admin.Query(ctx, `SELECT message_id FROM inbox_event WHERE message_id LIKE $1 || '%' ORDER BY 1`, p)
			require.NoError(t, err)
			inboxRows, err = pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			rows, err = admin.Query(ctx, `SELECT order_id FROM invoice WHERE order_id LIKE $1 || '%' ORDER BY 1`, p)
			require.NoError(t, err)
			invoices, err = pgx.CollectRows(rows, pgx.RowTo[string])
			require.NoError(t, err)
			want := []string{p + "ok-1", p + "ok-2"}
			require.Equal(t, want, inboxRows, "%s: the failed record left no inbox row", mode)
			require.Equal(t, want, invoices, "%s: the failed record's effect was rolled back", mode)

			// Redelivered, the applied records are duplicates and the fixed one is applied.
			fixed := consumerRecord(p+"bad", false)
			resp, err = c.HandleSQS(ctx, events.SQSEvent{Records: []events.SQSMessage{consumerRecord(p+"ok-1", false), fixed}})
			require.NoError(t, err)
			require.Empty(t, resp.BatchItemFailures, mode.String())
			var n int
			require.NoError(t, admin.QueryRow(ctx, `SELECT count(*) FROM invoice WHERE order_id LIKE $1 || '%'`, p).Scan(&n))
			require.Equal(t, 3, n, "%s: each message applied once", mode)
		}

		_, err := admin.Exec(ctx, `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
			VALUES (gen_random_uuid(), 'orders', 'order', $1, 'OrderCreated', $1, '{}')`, layout)
		require.NoError(t, err)
		r, err := outbox.NewRelay(relayPool, outbox.RelayConfig{Publisher: acceptAll{}, DefaultTopic: "arn:aws:sns:us-east-1:000000000000:orders",
			Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		st, err := r.RunOnce(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, st.Published, "the relay role publishes (%s tables)", layout)
	}

	t.Run("plain tables", func(t *testing.T) { run(t, "plain") })

	// The conversion keeps the grants and policies (the partitions inherit nothing: the
	// functions reach them only through the partitioned table).
	_, err = partition.Convert(ctx, admin, partition.Outbox, &partition.Options{Size: 1000}, nil)
	require.NoError(t, err)
	_, err = partition.Convert(ctx, admin, partition.Inbox, nil, nil)
	require.NoError(t, err)
	for _, table := range []string{"outbox_event", "inbox_event"} {
		var kind string
		require.NoError(t, admin.QueryRow(ctx, `SELECT relkind::text FROM pg_class WHERE oid = to_regclass($1)`, table).Scan(&kind))
		require.Equal(t, "p", kind, table)
	}
	t.Run("partitioned tables", func(t *testing.T) { run(t, "partitioned") })
}

// A relay role that follows the WAL (WALPublication) gets the publication, created once by the
// owner, carrying inserts of the wake-up's columns only, and the right to replicate (the
// REPLICATION attribute on a server without RDS's rds_replication role).
func TestRolesRelayThatFollowsTheWAL(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := testdb.EmptyURL(t)
	admin, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer admin.Close(ctx)
	relay := fmt.Sprintf("sluice_relay_wal_%d", time.Now().UnixNano())
	t.Cleanup(func() {
		c, err := pgx.Connect(context.Background(), dbURL)
		if err == nil {
			_, _ = c.Exec(context.Background(), "DROP OWNED BY "+relay)
			c.Close(context.Background())
		}
	})
	book := &secretBook{secrets: map[string]string{"arn:" + relay: fmt.Sprintf(`{"username":%q,"password":"pw"}`, relay)}}
	h := &handler{getenv: func(k string) string { return map[string]string{lambdaenv.DatabaseURL: dbURL}[k] }, secrets: book, log: slog.New(slog.DiscardHandler)}
	for range 2 { // an update finds the publication there and keeps it
		ev := createEvent(t)
		ev.ResourceProperties = map[string]any{RolesProperty: []any{
			map[string]any{"Name": relay, "Kind": KindRelay, "SecretArn": "arn:" + relay, "WALPublication": "sluice_outbox"}}}
		_, _, err = h.Handle(ctx, ev)
		require.NoError(t, err)
	}
	var cols []string
	var ins, upd, replication bool
	require.NoError(t, admin.QueryRow(ctx, `SELECT p.attnames, pub.pubinsert, pub.pubupdate FROM pg_publication_tables p
		JOIN pg_publication pub USING (pubname) WHERE pubname = 'sluice_outbox'`).Scan(&cols, &ins, &upd))
	require.ElementsMatch(t, []string{"id", "topic", "partition_key"}, cols)
	require.True(t, ins)
	require.False(t, upd, "only inserts")
	require.NoError(t, admin.QueryRow(ctx, "SELECT rolreplication FROM pg_roles WHERE rolname = $1", relay).Scan(&replication))
	require.True(t, replication, "the relay may open replication connections")

	ev := createEvent(t)
	ev.ResourceProperties = map[string]any{RolesProperty: []any{
		map[string]any{"Name": relay, "Kind": KindConsumer, "Consumer": "x", "SecretArn": "arn:" + relay, "WALPublication": "sluice_outbox"}}}
	_, _, err = h.Handle(ctx, ev)
	require.ErrorContains(t, err, "WALPublication must be a lower-case PostgreSQL identifier, on a relay role")
}
