package main

import (
	"bufio"
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/internal/pgcluster"
	"github.com/sluicehq/sluice/migrations"
)

// Env is the PostgreSQL server the benchmarks run against. Each suite gets a fresh database
// on it (NewDatabase), so no run sees another's rows, bloat or statistics.
type Env struct {
	// AdminURL connects to the server's maintenance database.
	AdminURL string
	// Source says where the server came from, for the report.
	Source string
	// Durable says commits wait for their WAL flush (synchronous_commit=on on every connection,
	// and fsync on when the harness started the server), as on a production server.
	Durable bool
	// durable is the server for the durable runs (see DurableEnv), once opened.
	durable *Env
	// closers close further servers a suite opened (the WAL wake-up suite's).
	closers []func()
	cluster *pgcluster.Cluster
	dbs     []string
	log     *slog.Logger
}

// DurableEnv returns the server for the durable-commit runs of the producer and consumer suites,
// opening it on first use. The default throwaway cluster runs with fsync, synchronous_commit and
// full_page_writes off, so a commit costs next to nothing there, unlike on RDS; the durable runs
// get a second throwaway cluster with all three on (pgcluster.Options.Durable). With a server
// named by DATABASE_URL it is that server, with synchronous_commit=on on every connection
// (fsync is server-wide: the report shows what the server has).
func (e *Env) DurableEnv(ctx context.Context) (*Env, error) {
	if e.Durable {
		return e, nil
	}
	if e.durable != nil {
		return e.durable, nil
	}
	if e.cluster == nil {
		e.durable = &Env{AdminURL: e.AdminURL, Source: e.Source + ", with synchronous_commit=on per session", Durable: true, log: e.log}
		return e.durable, nil
	}
	e.log.Info("starting a second, durable throwaway PostgreSQL cluster (fsync, synchronous_commit, full_page_writes on)")
	c, err := pgcluster.Start(ctx, pgcluster.Options{Durable: true})
	if err != nil {
		return nil, fmt.Errorf("start the durable PostgreSQL cluster: %w", err)
	}
	e.durable = &Env{AdminURL: c.URL, Source: "a second throwaway cluster started by the harness (internal/pgcluster, Durable)", Durable: true, cluster: c, log: e.log}
	return e.durable, nil
}

// benchMaxConnections is the throwaway server's max_connections: room for the fleet suite's
// budget (defaultFleetBudget) beside its 199 producers and the harness.
const benchMaxConnections = 500

// openEnv uses DATABASE_URL or TEST_DATABASE_URL when set, else starts a throwaway cluster.
func openEnv(ctx context.Context, log *slog.Logger) (*Env, error) {
	for _, name := range []string{"DATABASE_URL", "TEST_DATABASE_URL"} {
		if u := os.Getenv(name); u != "" {
			return &Env{AdminURL: u, Source: "the server named by " + name, log: log}, nil
		}
	}
	log.Info("starting a throwaway PostgreSQL cluster")
	c, err := pgcluster.Start(ctx, pgcluster.Options{MaxConnections: benchMaxConnections})
	if err != nil {
		return nil, fmt.Errorf("start PostgreSQL (or set DATABASE_URL): %w", err)
	}
	return &Env{AdminURL: c.URL, Source: "a throwaway cluster started by the harness (internal/pgcluster)", cluster: c, log: log}, nil
}

// Close drops the databases the run created and stops the throwaway cluster, if any.
func (e *Env) Close() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if e.durable != nil {
		e.durable.Close()
	}
	for _, c := range e.closers {
		c()
	}
	if e.cluster != nil {
		e.cluster.Stop()
		return
	}
	conn, err := pgx.Connect(ctx, e.AdminURL)
	if err != nil {
		return
	}
	defer conn.Close(ctx)
	for _, db := range e.dbs {
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{db}.Sanitize()+" WITH (FORCE)"); err != nil {
			e.log.Warn("drop benchmark database", "db", db, "error", err)
		}
	}
}

// NewDatabase creates a database named sluice_bench_<suite>_<pid>, migrates it, and returns a
// pool on it with maxConns connections (and the tracer, when not nil).
func (e *Env) NewDatabase(ctx context.Context, suite string, maxConns int32, tracer pgx.QueryTracer) (*pgxpool.Pool, string, error) {
	if e.Durable {
		suite += "_durable"
	}
	name := fmt.Sprintf("sluice_bench_%s_%d", suite, os.Getpid())
	admin, err := pgx.Connect(ctx, e.AdminURL)
	if err != nil {
		return nil, "", fmt.Errorf("connect: %w", err)
	}
	defer admin.Close(ctx)
	ident := pgx.Identifier{name}.Sanitize()
	if _, err := admin.Exec(ctx, "DROP DATABASE IF EXISTS "+ident+" WITH (FORCE)"); err != nil {
		return nil, "", fmt.Errorf("drop old %s: %w", name, err)
	}
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+ident); err != nil {
		return nil, "", fmt.Errorf("create database %s: %w", name, err)
	}
	e.dbs = append(e.dbs, name)
	u, err := url.Parse(e.AdminURL)
	if err != nil {
		return nil, "", fmt.Errorf("parse database URL: %w", err)
	}
	u.Path = "/" + name
	dbURL := u.String()

	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return nil, "", err
	}
	err = migrations.Up(ctx, conn)
	conn.Close(ctx)
	if err != nil {
		return nil, "", err
	}
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, "", err
	}
	cfg.MaxConns = maxConns
	if e.Durable {
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
	}
	if tracer != nil {
		cfg.ConnConfig.Tracer = tracer
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, "", err
	}
	return pool, dbURL, nil
}

// openPool opens a second pool of maxConns connections on a database NewDatabase made (for a
// workload that must not share the relay's pool and tracer).
func openPool(ctx context.Context, dbURL string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = maxConns
	return pgxpool.NewWithConfig(ctx, cfg)
}

// Machine describes where a run happened.
type Machine struct {
	CPU        string
	Cores      int
	Memory     string
	Kernel     string
	Go         string
	Postgres   string
	PGSettings string
	PGSource   string
	// PGSettingsDurable and PGSourceDurable describe the server of the durable runs, if any.
	PGSettingsDurable string
	PGSourceDurable   string
	LoadStart         string
	// Code is the sluice commit measured, and whether the working tree differed from it.
	Code string
}

func describeMachine(ctx context.Context, env *Env) Machine {
	m := Machine{
		Cores: runtime.NumCPU(), Go: runtime.Version() + " " + runtime.GOOS + "/" + runtime.GOARCH,
		CPU: firstMatch("/proc/cpuinfo", "model name"), Memory: memTotal(),
		PGSource: env.Source, LoadStart: loadAverage(), Code: codeVersion(ctx),
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = "Linux " + strings.TrimSpace(string(b))
	}
	m.Postgres, m.PGSettings = serverSettings(ctx, env.AdminURL, false)
	if env.durable != nil {
		_, m.PGSettingsDurable = serverSettings(ctx, env.durable.AdminURL, true)
		m.PGSourceDurable = env.durable.Source
	}
	return m
}

// serverSettings reads a server's version and the settings that decide what a commit costs
// (with synchronous_commit=on for the session when durable, as the durable runs set it).
func serverSettings(ctx context.Context, adminURL string, durable bool) (version, settings string) {
	cfg, err := pgx.ParseConfig(adminURL)
	if err != nil {
		return "", ""
	}
	if durable {
		cfg.RuntimeParams["synchronous_commit"] = "on"
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return "", ""
	}
	defer conn.Close(ctx)
	_ = conn.QueryRow(ctx, "SELECT version()").Scan(&version)
	var parts []string
	for _, s := range []string{"fsync", "synchronous_commit", "full_page_writes", "wal_sync_method", "shared_buffers", "max_wal_size"} {
		var v string
		if conn.QueryRow(ctx, "SELECT current_setting($1)", s).Scan(&v) == nil {
			parts = append(parts, s+"="+v)
		}
	}
	return version, strings.Join(parts, ", ")
}

// codeVersion names the commit of the main module (the parent directory, via the replace
// directive) and says whether pkg/, internal/ or migrations/ had uncommitted changes.
func codeVersion(ctx context.Context) string {
	out, err := exec.CommandContext(ctx, "git", "-C", "..", "rev-parse", "--short", "HEAD").Output()
	if err != nil {
		return "unknown (no git)"
	}
	v := "commit " + strings.TrimSpace(string(out))
	st, err := exec.CommandContext(ctx, "git", "-C", "..", "status", "--porcelain", "--", "pkg", "internal", "migrations").Output()
	if err == nil && len(strings.TrimSpace(string(st))) > 0 {
		v += " with uncommitted changes in: " + strings.Join(strings.Fields(strings.ReplaceAll(string(st), "\n", " ")), " ")
	}
	return v
}

func memTotal() string {
	var kb float64
	if _, err := fmt.Sscanf(firstMatch("/proc/meminfo", "MemTotal"), "%f kB", &kb); err != nil {
		return "unknown"
	}
	return fmt.Sprintf("%.1f GiB", kb/(1<<20))
}

func firstMatch(file, key string) string {
	f, err := os.Open(file)
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return "unknown"
}

// loadAverage returns the 1, 5 and 15 minute load averages.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " / ")
}
