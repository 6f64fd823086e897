package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/pgcluster"
	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
)

// A team that runs its own migrations applies the published grant files with psql (or pastes
// them with its role names); the custom resource applies the same files to the roles it
// creates. Either way a role ends up with exactly the same privileges, memberships and row
// level security policies, even for a consumer name that needs quoting.
func TestGrantFilesGiveWhatTheCustomResourceGrants(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL := testdb.URL(t)
	admin, err := pgx.Connect(ctx, dbURL)
	require.NoError(t, err)
	defer admin.Close(ctx)

	suffix := fmt.Sprint(time.Now().UnixNano())
	const consumer = `bill'ing\eu`
	relayCR, consumerCR := "sluice_relay_cr_"+suffix, "sluice_billing_cr_"+suffix
	relayPSQL, consumerPSQL := "sluice_relay_psql_"+suffix, "sluice_billing_psql_"+suffix
	for _, r := range []string{relayCR, consumerCR, relayPSQL, consumerPSQL} {
		t.Cleanup(func() {
			c, err := pgx.Connect(context.Background(), dbURL)
			if err == nil {
				_, _ = c.Exec(context.Background(), "DROP OWNED BY "+r)
				c.Close(context.Background())
			}
		})
	}

	// The custom resource's way.
	book := &secretBook{secrets: map[string]string{}}
	for _, r := range []string{relayCR, consumerCR} {
		book.secrets["arn:"+r] = fmt.Sprintf(`{"username":%q,"password":"pw"}`, r)
	}
	h := &handler{getenv: func(k string) string { return map[string]string{lambdaenv.DatabaseURL: dbURL}[k] }, secrets: book, log: slog.New(slog.DiscardHandler)}
	ev := createEvent(t)
	ev.ResourceProperties = map[string]any{RolesProperty: []any{
		map[string]any{"Name": relayCR, "Kind": KindRelay, "SecretArn": "arn:" + relayCR},
		map[string]any{"Name": consumerCR, "Kind": KindConsumer, "SecretArn": "arn:" + consumerCR, "Consumer": consumer},
	}}
	_, _, err = h.Handle(ctx, ev)
	require.NoError(t, err)

	// The psql way, with the files as published.
	bin, err := pgcluster.BinDir()
	require.NoError(t, err)
	psql := func(file string, vars ...string) {
		t.Helper()
		args := []string{"--no-psqlrc", "--quiet", "-v", "ON_ERROR_STOP=1", "--dbname=" + dbURL, "-f", filepath.Join("..", "..", "migrations", "grants", file)}
		for _, v := range vars {
			args = append(args, "-v", v)
		}
		var out bytes.Buffer
		cmd := exec.Command(filepath.Join(bin, "psql"), args...)
		cmd.Stdout, cmd.Stderr = &out, &out
		require.NoError(t, cmd.Run(), "psql -f %s: %s", file, out.String())
	}
	for _, r := range []string{relayPSQL, consumerPSQL} {
		_, err := admin.Exec(ctx, "CREATE ROLE "+r+" LOGIN")
		require.NoError(t, err)
	}
	psql("relay.sql", "role="+relayPSQL)
	psql("consumer.sql", "role="+consumerPSQL, "consumer="+consumer, "policy=sluice_inbox_"+consumerPSQL)

	relay := privileges(t, admin, relayCR)
	require.Contains(t, relay, "table outbox_event UPDATE", "the relay's privileges are read")
	require.Contains(t, relay, "function sluice_horizon EXECUTE")
	require.Equal(t, relay, privileges(t, admin, relayPSQL))
	billing := privileges(t, admin, consumerCR)
	require.Contains(t, billing, "table inbox_event DELETE")
	require.Contains(t, billing, fmt.Sprintf("policy on inbox_event ALL: USING (consumer = '%s'::text) WITH CHECK (consumer = '%s'::text) (row level security on)",
		strings.ReplaceAll(consumer, "'", "''"), strings.ReplaceAll(consumer, "'", "''")))
	require.Equal(t, billing, privileges(t, admin, consumerPSQL))
}

// privileges lists what role holds in the database: privileges on relations and functions,
// role memberships and the row level security policies that name it (tables' RLS flags too).
func privileges(t *testing.T, conn *pgx.Conn, role string) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), `
		SELECT format('table %s %s', c.relname, a.privilege_type)
		FROM pg_class c, aclexplode(c.relacl) a
		WHERE a.grantee = $1::regrole
		UNION ALL
		SELECT format('function %s %s', p.proname, a.privilege_type)
		FROM pg_proc p, aclexplode(p.proacl) a
		WHERE a.grantee = $1::regrole
		UNION ALL
		SELECT format('schema %s %s', n.nspname, a.privilege_type)
		FROM pg_namespace n, aclexplode(n.nspacl) a
		WHERE a.grantee = $1::regrole
		UNION ALL
		SELECT format('member of %s', m.roleid::regrole) FROM pg_auth_members m WHERE m.member = $1::regrole
		UNION ALL
		SELECT format('policy on %s %s: USING %s WITH CHECK %s (row level security %s)', p.polrelid::regclass,
		              CASE p.polcmd WHEN '*' THEN 'ALL' ELSE p.polcmd::text END,
		              pg_get_expr(p.polqual, p.polrelid), pg_get_expr(p.polwithcheck, p.polrelid),
		              CASE WHEN c.relrowsecurity THEN 'on' ELSE 'off' END)
		FROM pg_policy p JOIN pg_class c ON c.oid = p.polrelid
		WHERE $1::regrole = ANY (p.polroles)
		ORDER BY 1`, role)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	return out
}

// A grant file rendered without one of its variables is refused before anything runs, naming it.
func TestRenderGrantsNamesMissingVariables(t *testing.T) {
	t.Parallel()
	_, err := renderGrants("consumer.sql", map[string]string{"role": "sluice_consumer_billing"})
	require.ErrorContains(t, err, "consumer.sql use variables without a value: consumer, policy")
	sql, err := renderGrants("relay.sql", map[string]string{"role": `odd"name`})
	require.NoError(t, err)
	require.Contains(t, sql, `GRANT SELECT, UPDATE ON TABLE outbox_event TO "odd""name";`)
	require.NotContains(t, sql, `:"role"`)
}
