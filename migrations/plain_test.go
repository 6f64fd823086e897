package migrations_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/pgcluster"
	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/migrations"
)

// golangMigrateName is golang-migrate's file name pattern (source.DefaultParse); Atlas reads the
// same layout with format=golang-migrate.
var golangMigrateName = regexp.MustCompile(`^([0-9]+)_(.*)\.(down|up)\.(.*)$`)

// Teams on goose, golang-migrate or Atlas copy or embed the numbered .up.sql files and apply them
// with their own tool: each file, in version order, run as one multi-statement string (what
// golang-migrate's PostgreSQL driver does). That builds, object for object, the schema
// migrations.Up builds, as pg_dump reads both from the catalog.
func TestPlainSQLFilesBuildWhatUpBuilds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	ms, err := migrations.List()
	require.NoError(t, err)
	plainURL := testdb.EmptyURL(t)
	plain, err := pgx.Connect(ctx, plainURL)
	require.NoError(t, err)
	defer plain.Close(ctx)
	for _, m := range ms {
		name := filepathFor(t, m.Version, "up")
		require.Regexp(t, golangMigrateName, name, "golang-migrate reads the file name")
		body, err := os.ReadFile(name)
		require.NoError(t, err)
		require.Equal(t, m.Up, string(body), "the published file is what migrations.Up applies")
		_, err = plain.Exec(ctx, string(body))
		require.NoError(t, err, "%s applies as plain SQL", name)
	}

	upURL := testdb.EmptyURL(t)
	up, err := pgx.Connect(ctx, upURL)
	require.NoError(t, err)
	defer up.Close(ctx)
	require.NoError(t, migrations.Up(ctx, up))

	want := schemaDump(t, upURL)
	require.Contains(t, want, "CREATE TABLE public.outbox_event", "the dump holds the schema")
	require.Equal(t, want, schemaDump(t, plainURL))
}

// filepathFor finds the file of version's direction in this directory.
func filepathFor(t *testing.T, version int32, direction string) string {
	t.Helper()
	names, err := filepath.Glob("*." + direction + ".sql")
	require.NoError(t, err)
	for _, n := range names {
		if m := golangMigrateName.FindStringSubmatch(n); m != nil {
			if v, err := strconv.Atoi(m[1]); err == nil && v == int(version) {
				return n
			}
		}
	}
	t.Fatalf("no %s file for version %d", direction, version)
	return ""
}

// schemaDump is pg_dump's schema of the database, without tern's version table and without the
// random key that pg_dump's \restrict lines carry.
func schemaDump(t *testing.T, url string) string {
	t.Helper()
	bin, err := pgcluster.BinDir()
	require.NoError(t, err)
	var out, stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(bin, "pg_dump"), "--schema-only", "--no-owner",
		"--exclude-table="+migrations.VersionTable, "--dbname="+url)
	cmd.Stdout, cmd.Stderr = &out, &stderr
	require.NoError(t, cmd.Run(), "pg_dump: %s", stderr.String())
	var kept []string
	for _, line := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(line, `\restrict`) || strings.HasPrefix(line, `\unrestrict`) {
			continue
		}
		kept = append(kept, line)
	}
	return strings.Join(kept, "\n")
}
