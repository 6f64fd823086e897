package cli_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/spf13/cobra"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/cmd/sluice/internal/cli"
)

// unguardedCommands are the commands that change data without the guard, and why that is
// safe. A new command that changes data goes through the guard, or is added here with its
// reason for a reviewer to judge.
var unguardedCommands = map[string]string{
	"sluice migrate":    "applies missing migrations only (the Lambdas do at every cold start)",
	"sluice migrate up": "likewise",
	"sluice relay":      "publishes pending rows, the relay's own work",
	"sluice fleet init": "creates the registry table when it does not exist",
}

// every command of the tree, root first.
func walk(cmd *cobra.Command, visit func(*cobra.Command)) {
	visit(cmd)
	for _, c := range cmd.Commands() {
		walk(c, visit)
	}
}

// dbFingerprint digests every table of the database (its list and every row), to prove a
// command changed nothing: the outbox, the inbox, dead letters, the schema version table, the
// fleet registry, partitions.
func dbFingerprint(t *testing.T, b *testBundle) string {
	t.Helper()
	var fp string
	err := b.pool.QueryRow(context.Background(), `
		SELECT string_agg(c.relname || ':' || md5(query_to_xml(format('SELECT * FROM %I.%I t ORDER BY t::text', n.nspname, c.relname), false, false, '')::text), ',' ORDER BY c.relname)
		FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%'`).Scan(&fp)
	require.NoError(t, err)
	return fp
}

// Every command of the CLI says what it changes. Each one that changes data goes through the
// guard (--dry-run, --yes, --json): without a terminal and without --yes it refuses and changes
// nothing, on a terminal it asks and "n" changes nothing, and --dry-run prints the plan (one
// JSON line with --json) and changes nothing. The test walks the command table, so a command
// added later cannot skip the guard without failing here.
func TestEveryCommandThatChangesDataIsGuarded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	c := b.withAWS(t)

	// Something for every guarded command to change.
	b.ok(t, "partition", "convert", "outbox", "--size", "2", "--ahead", "1", "--yes")
	for range 4 {
		b.insertOutbox(t, outboxRow{age: 50 * 24 * time.Hour, publishedAgo: ago(40 * 24 * time.Hour)})
	}
	b.ok(t, "partition", "maintain", "--outbox-only", "--size", "2", "--ahead", "3")
	b.insertOutbox(t, outboxRow{quarantined: true})
	b.insertInbox(t, "billing", "m-1", "parked", time.Hour)
	b.ok(t, "fleet", "init", "--fleet-registry", b.url)
	b.ok(t, "fleet", "add", "acme", "--url", b.url, "--fleet-registry", b.url, "--yes")
	_, dlqURL := queuePair(t, c, false)
	_, err := c.SendMessage(ctx, &sqs.SendMessageInput{QueueUrl: aws.String(dlqURL), MessageBody: aws.String(`{}`)})
	require.NoError(t, err)

	// The arguments that make each guarded command change something.
	cases := map[string][]string{
		"sluice dead retry":         {"dead", "retry", "--all"},
		"sluice fleet add":          {"fleet", "add", "acme", "--url", b.url + "&application_name=other", "--fleet-registry", b.url},
		"sluice fleet remove":       {"fleet", "remove", "acme", "--fleet-registry", b.url},
		"sluice migrate down":       {"migrate", "down"},
		"sluice partition convert":  {"partition", "convert", "inbox"},
		"sluice partition maintain": {"partition", "maintain", "--outbox-only", "--older-than", "30d"},
		"sluice purge":              {"purge", "--older-than", "30d", "--outbox-only"},
		"sluice redrive":            {"redrive", "--dlq", dlqURL},
		"sluice replay":             {"replay", "--since", "-400d"},
	}
	if !strings.Contains(b.url, "?") {
		cases["sluice fleet add"][3] = b.url + "?application_name=other"
	}

	var guarded []string
	walk(cli.CommandTree(), func(cmd *cobra.Command) {
		path := cmd.CommandPath()
		changes := cmd.Annotations[cli.ChangesAnnotation]
		switch {
		case changes == cli.ChangesNothing:
		case changes == cli.ChangesGuarded:
			guarded = append(guarded, path)
			for _, flag := range []string{"dry-run", "yes", "json"} {
				require.NotNil(t, cmd.Flags().Lookup(flag), "%s changes data: it needs the guard's --%s", path, flag)
			}
			require.Contains(t, cases, path, "%s changes data: give the test the arguments that make it change something", path)
		case strings.HasPrefix(changes, cli.ChangesUnguarded):
			require.Contains(t, unguardedCommands, path, "%s changes data without the guard (%s): guard it, or justify it in unguardedCommands", path, changes)
		default:
			t.Errorf("%s does not say what it changes (readsOnly, unguarded, or the guard's flags)", path)
		}
	})
	require.Len(t, guarded, len(cases), "every case is a guarded command: %v", guarded)

	before, depth := dbFingerprint(t, b), queueDepth(t, c, dlqURL)
	unchanged := func(what string) {
		t.Helper()
		require.Equal(t, before, dbFingerprint(t, b), what)
		require.Equal(t, depth, queueDepth(t, c, dlqURL), what)
	}
	for _, path := range guarded {
		args := cases[path]
		r := b.run(t, args...)
		requireOneLineError(t, r, cli.ExitError, "stdin is not a terminal; pass --yes")
		require.Contains(t, r.err, "not confirmed", path)
		unchanged(path + " without --yes nor a terminal")

		r = b.runTTY(t, "n\n", args...)
		require.Equal(t, cli.ExitError, r.code, "%s answered n: %s", path, r.err)
		require.Contains(t, r.err, "[y/N]", path)
		unchanged(path + " answered n")

		out := b.ok(t, append(args, "--dry-run")...)
		require.NotEmpty(t, out, "%s --dry-run prints its plan", path)
		unchanged(path + " --dry-run")

		lines := jsonLines(t, b.ok(t, append(args, "--dry-run", "--json")...))
		plan := lineOf(t, lines, "plan")
		require.Equal(t, true, plan["dry_run"], path)
		require.NotNil(t, plan["plan"], path)
		unchanged(path + " --dry-run --json")
	}
}
