// Package pgcluster starts a throwaway PostgreSQL cluster from the machine's server binaries,
// for tests and the local demo. PostgreSQL refuses to run as root, so when the caller is root
// the cluster runs as the unprivileged "postgres" account.
package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/internal/localproc"
)

// Options tune a cluster. The zero value is ready to use.
type Options struct {
	// Port to listen on (127.0.0.1). Defaults to a free port.
	Port int
	// Log receives the server's output. Defaults to a file "postgres.log" in the cluster's directory.
	Log io.Writer
	// MaxConnections is the server's max_connections. Defaults to 400.
	MaxConnections int
	// Durable runs the server with fsync=on, synchronous_commit=on and full_page_writes=on, so a
	// commit waits for its WAL flush as on a production server. The default (false) turns all
	// three off, which makes commits nearly free: right for tests, wrong for measuring what a
	// commit costs (the benchmark harness starts a second, durable cluster for that).
	Durable bool
	// Settings are further server settings, each passed as -c name=value after the defaults
	// above, so they may override them (e.g. "shared_preload_libraries": "pg_stat_statements",
	// which only a server start can set). Defaults to none.
	Settings map[string]string
}

// Cluster is a running throwaway PostgreSQL server.
type Cluster struct {
	// URL connects to the "postgres" database as the superuser "postgres".
	URL  string
	dir  string
	proc *localproc.Process
	log  *os.File
}

// BinDir finds the directory holding initdb and postgres: the newest
// /usr/lib/postgresql/N/bin, else the directory of initdb on PATH.
func BinDir() (string, error) {
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "postgres")); err == nil {
			return d, nil
		}
	}
	p, err := exec.LookPath("initdb")
	if err != nil {
		return "", errors.New("no PostgreSQL server binaries: install postgresql (initdb, postgres) or set TEST_DATABASE_URL/DATABASE_URL")
	}
	if real, err := filepath.EvalSymlinks(p); err == nil {
		p = real
	}
	return filepath.Dir(p), nil
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

// Start initialises a cluster in a new temporary directory and starts it.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	if opts.Port == 0 {
		if opts.Port, err = localproc.FreePort(); err != nil {
			return nil, err
		}
	}
	if opts.MaxConnections == 0 {
		opts.MaxConnections = 400
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "sluice-pg-")
	if err != nil {
		return nil, err
	}
	c := &Cluster{dir: dir}
	fail := func(err error) (*Cluster, error) {
		os.RemoveAll(dir)
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return fail(fmt.Errorf("hand the cluster directory to the postgres account: %w", err))
		}
	}
	logW := opts.Log
	if logW == nil {
		f, err := os.Create(filepath.Join(dir, "postgres.log"))
		if err != nil {
			return fail(err)
		}
		if cred != nil {
			_ = f.Chown(int(cred.Uid), int(cred.Gid))
		}
		c.log = f
		logW = f
	}
	data := filepath.Join(dir, "data")
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "-D", data, "-U", "postgres",
		"-A", "trust", "-E", "UTF8", "--no-sync", "--no-instructions")
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	initdb.Dir = dir
	if out, err := initdb.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("initdb: %w: %s", err, out))
	}
	durability := "off"
	if opts.Durable {
		durability = "on"
	}
	// SIGQUIT on our death: an immediate shutdown, should this process die without cleaning up.
	cmd := exec.Command(filepath.Join(bin, "postgres"), "-D", data,
		"-p", strconv.Itoa(opts.Port), "-k", dir, "-c", "listen_addresses=127.0.0.1",
		"-c", "max_connections="+strconv.Itoa(opts.MaxConnections),
		"-c", "fsync="+durability, "-c", "synchronous_commit="+durability, "-c", "full_page_writes="+durability,
		"-c", "shared_buffers=256MB", "-c", "max_wal_size=4GB", "-c", "log_min_messages=warning")
	names := make([]string, 0, len(opts.Settings))
	for name := range opts.Settings {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		cmd.Args = append(cmd.Args, "-c", name+"="+opts.Settings[name])
	}
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logW, logW
	c.URL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", opts.Port)
	c.proc, err = localproc.Start(ctx, localproc.Spec{
		Name: "postgres", Cmd: cmd, Credential: cred, DeathSignal: syscall.SIGQUIT,
		// SIGINT is PostgreSQL's fast shutdown: roll back open transactions, then stop.
		StopSignal: syscall.SIGINT, StopGrace: 10 * time.Second,
		ExitHint: "see " + filepath.Join(dir, "postgres.log"),
		Ready: func(ctx context.Context) error {
			conn, err := pgx.Connect(ctx, c.URL)
			if err != nil {
				return err
			}
			return conn.Close(ctx)
		},
	})
	if err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// Stop shuts the server down (fast shutdown, then kill) and removes its directory.
func (c *Cluster) Stop() {
	if c.proc != nil {
		c.proc.Stop()
	}
	if c.log != nil {
		c.log.Close()
	}
	os.RemoveAll(c.dir)
}

// serverCredential returns the account to run the server as: nil (ourselves) unless we are root.
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, errors.New(`running as root, and PostgreSQL refuses root: create the "postgres" account (apt-get install postgresql does) or set TEST_DATABASE_URL/DATABASE_URL`)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}
