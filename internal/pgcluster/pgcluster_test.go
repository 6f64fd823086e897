package pgcluster

import (
	"context"
	"net/url"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Options.Settings reach the server and override the defaults.
func TestStartWithSettings(t *testing.T) {
	t.Parallel()
	if _, err := BinDir(); err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := Start(ctx, Options{Settings: map[string]string{"full_page_writes": "on", "application_name": "pgcluster_test"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var fpw, fsync string
	if err := conn.QueryRow(ctx, "SELECT current_setting('full_page_writes'), current_setting('fsync')").Scan(&fpw, &fsync); err != nil {
		t.Fatal(err)
	}
	if fpw != "on" || fsync != "off" {
		t.Fatalf("full_page_writes=%s (want on, the setting), fsync=%s (want off, the default)", fpw, fsync)
	}
}

// With Options.Password the server takes TCP connections only over TLS and with the password:
// URL's connection is encrypted, a wrong password and a connection without TLS are refused.
func TestStartWithPassword(t *testing.T) {
	t.Parallel()
	if _, err := BinDir(); err != nil {
		t.Skip(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := Start(ctx, Options{Password: "s3cret word"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	conn, err := pgx.Connect(ctx, c.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var ssl bool
	var enc string
	if err := conn.QueryRow(ctx, "SELECT ssl, current_setting('password_encryption') FROM pg_stat_ssl WHERE pid = pg_backend_pid()").Scan(&ssl, &enc); err != nil {
		t.Fatal(err)
	}
	if !ssl || enc != "scram-sha-256" {
		t.Fatalf("URL's session: ssl %v, password_encryption %s; want true, scram-sha-256", ssl, enc)
	}
	u, err := url.Parse(c.URL)
	if err != nil {
		t.Fatal(err)
	}
	wrong := *u
	wrong.User = url.UserPassword("postgres", "not it")
	plain := *u
	plain.RawQuery = "sslmode=disable"
	for name, bad := range map[string]string{"a wrong password": wrong.String(), "no TLS": plain.String()} {
		if c, err := pgx.Connect(ctx, bad); err == nil {
			c.Close(ctx)
			t.Errorf("%s: connected", name)
		}
	}
}
