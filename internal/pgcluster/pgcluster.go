// Package pgcluster starts a throwaway PostgreSQL cluster from the machine's server binaries,
// for tests and the local demo. PostgreSQL refuses to run as root, so when the caller is root
// the cluster runs as the unprivileged "postgres" account.
package pgcluster

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/url"
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
	// Password, when set, makes the server require TLS and scram-sha-256 on every TCP
	// connection, as a managed server (RDS) does: initdb stores it as the superuser's
	// password (scram-sha-256), a self-signed certificate is generated for the server
	// (ssl=on), pg_hba.conf accepts only hostssl with scram-sha-256 (the Unix socket stays
	// trust, for initdb's tools), and URL carries the password with sslmode=require. Roles
	// created with a password are then authenticated the same way. Defaults to none: trust,
	// without TLS.
	Password string
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
	initdbArgs := []string{"-D", data, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync", "--no-instructions"}
	if opts.Password != "" {
		pwfile := filepath.Join(dir, "pwfile")
		if err := writeOwned(pwfile, []byte(opts.Password+"\n"), cred); err != nil {
			return fail(err)
		}
		initdbArgs = append(initdbArgs, "--pwfile", pwfile, "--auth-host=scram-sha-256", "--auth-local=trust")
	}
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), initdbArgs...)
	initdb.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	initdb.Dir = dir
	if out, err := initdb.CombinedOutput(); err != nil {
		return fail(fmt.Errorf("initdb: %w: %s", err, out))
	}
	if opts.Password != "" {
		if err := secure(data, cred); err != nil {
			return fail(err)
		}
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
	if opts.Password != "" {
		cmd.Args = append(cmd.Args, "-c", "ssl=on", "-c", "password_encryption=scram-sha-256")
		u := url.URL{Scheme: "postgres", User: url.UserPassword("postgres", opts.Password), Host: fmt.Sprintf("127.0.0.1:%d", opts.Port),
			Path: "/postgres", RawQuery: "sslmode=require"}
		c.URL = u.String()
	}
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

// secure sets up TLS and scram-sha-256 in the data directory initdb made (Options.Password):
// a self-signed certificate as server.crt and server.key (the server's default file names),
// and a pg_hba.conf that accepts TCP connections only over TLS with scram-sha-256.
func secure(data string, cred *syscall.Credential) error {
	certPEM, keyPEM, err := selfSignedCert()
	if err != nil {
		return fmt.Errorf("make a self-signed certificate: %w", err)
	}
	hba := "# written by internal/pgcluster (Options.Password)\n" +
		"local all all trust\n" +
		"hostssl all all 127.0.0.1/32 scram-sha-256\n" +
		"hostssl all all ::1/128 scram-sha-256\n"
	for name, b := range map[string][]byte{"server.crt": certPEM, "server.key": keyPEM, "pg_hba.conf": []byte(hba)} {
		if err := writeOwned(filepath.Join(data, name), b, cred); err != nil {
			return err
		}
	}
	return nil
}

// selfSignedCert returns a PEM certificate for 127.0.0.1 and localhost, valid for a year, and
// its ECDSA P-256 private key.
func selfSignedCert() (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		return nil, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial, Subject: pkix.Name{CommonName: "sluice throwaway PostgreSQL"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().AddDate(1, 0, 0),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

// writeOwned writes a file only its owner may read (the server refuses a key others can), owned
// by cred's account when the server runs as another (see serverCredential).
func writeOwned(path string, b []byte, cred *syscall.Credential) error {
	if err := os.WriteFile(path, b, 0o600); err != nil {
		return err
	}
	if cred != nil {
		if err := os.Chown(path, int(cred.Uid), int(cred.Gid)); err != nil {
			return fmt.Errorf("hand %s to the postgres account: %w", filepath.Base(path), err)
		}
	}
	return nil
}
