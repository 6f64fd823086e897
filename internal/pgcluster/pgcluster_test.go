package pgcluster

import (
	"context"
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
