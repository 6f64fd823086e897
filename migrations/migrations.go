// Package migrations holds sluice's numbered SQL migrations, embedded into every binary,
// and applies them with jackc/tern.
//
// Files are named NNNN_name.up.sql and NNNN_name.down.sql. Migrating takes a PostgreSQL
// advisory lock, so several processes (Lambdas, the CLI, a deploy hook) may migrate at once.
//
// The files are plain SQL in golang-migrate's layout, and grants/ holds the database roles'
// privileges with psql variables, so a team that runs goose, golang-migrate or Atlas applies
// them with its own tool instead (README, "Tables in your own migrations").
package migrations

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/tern/v2/migrate"
)

// FS holds the embedded migration files, and in grants/ the privileges of the relay's and the
// consumers' database roles as plain SQL with psql variables (the migrations custom resource
// applies them; teams running their own migrations copy them).
//
//go:embed *.sql grants/*.sql
var FS embed.FS

// VersionTable is the table in which tern records the applied version.
const VersionTable = "public.sluice_schema_version"

var fileName = regexp.MustCompile(`^(\d{4})_([a-z0-9_]+)\.(up|down)\.sql$`)

// Migration is one numbered step.
type Migration struct {
	Version int32
	Name    string
	Up      string
	Down    string
}

// List returns the embedded migrations in version order. It fails when a version is missing,
// duplicated or lacks its up file, so a broken set never reaches a database.
func List() ([]Migration, error) {
	return list(FS)
}

func list(fsys fs.FS) ([]Migration, error) {
	entries, err := fs.ReadDir(fsys, ".")
	if err != nil {
		return nil, fmt.Errorf("read migrations: %w", err)
	}
	byVersion := map[int32]*Migration{}
	for _, e := range entries {
		m := fileName.FindStringSubmatch(e.Name())
		if m == nil {
			continue
		}
		v, _ := strconv.Atoi(m[1])
		body, err := fs.ReadFile(fsys, e.Name())
		if err != nil {
			return nil, fmt.Errorf("read migration %s: %w", e.Name(), err)
		}
		mig := byVersion[int32(v)]
		if mig == nil {
			mig = &Migration{Version: int32(v), Name: m[2]}
			byVersion[int32(v)] = mig
		}
		if mig.Name != m[2] {
			return nil, fmt.Errorf("migration %04d has two names: %q and %q", v, mig.Name, m[2])
		}
		if m[3] == "up" {
			mig.Up = string(body)
		} else {
			mig.Down = string(body)
		}
	}
	out := make([]Migration, 0, len(byVersion))
	for _, m := range byVersion {
		out = append(out, *m)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i, m := range out {
		if m.Version != int32(i+1) {
			return nil, fmt.Errorf("migration versions must be 1..N without gaps: found %04d at position %d", m.Version, i+1)
		}
		if m.Up == "" {
			return nil, fmt.Errorf("migration %04d_%s has no .up.sql file", m.Version, m.Name)
		}
	}
	return out, nil
}

// Latest returns the highest embedded version.
func Latest() int32 {
	ms, err := List()
	if err != nil || len(ms) == 0 {
		return 0
	}
	return ms[len(ms)-1].Version
}

func migrator(ctx context.Context, conn *pgx.Conn) (*migrate.Migrator, error) {
	ms, err := List()
	if err != nil {
		return nil, err
	}
	m, err := migrate.NewMigrator(ctx, conn, VersionTable)
	if err != nil {
		return nil, fmt.Errorf("prepare migrator: %w", err)
	}
	for _, mig := range ms {
		m.AppendMigration(fmt.Sprintf("%04d_%s", mig.Version, mig.Name), mig.Up, mig.Down)
	}
	return m, nil
}

// Up applies every embedded migration that the database lacks.
func Up(ctx context.Context, conn *pgx.Conn) error {
	return To(ctx, conn, Latest())
}

// To migrates up or down to version (0 removes every sluice table).
func To(ctx context.Context, conn *pgx.Conn, version int32) error {
	m, err := migrator(ctx, conn)
	if err != nil {
		return err
	}
	if err := m.MigrateTo(ctx, version); err != nil {
		return fmt.Errorf("migrate to version %d: %w", version, err)
	}
	return nil
}

// Current returns the version the database is at.
func Current(ctx context.Context, conn *pgx.Conn) (int32, error) {
	m, err := migrator(ctx, conn)
	if err != nil {
		return 0, err
	}
	v, err := m.GetCurrentVersion(ctx)
	if err != nil {
		return 0, fmt.Errorf("read schema version: %w", err)
	}
	return v, nil
}
