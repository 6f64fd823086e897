package console_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/cmd/sluice/internal/console"
	"github.com/sluicehq/sluice/migrations"
)

// A role with only migrations/grants/console.sql's privileges renders every page, and cannot
// change a row.
func TestReadOnlyRoleOfTheGrantsFileServesEveryPage(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, false)
	suffix := make([]byte, 4)
	_, _ = rand.Read(suffix)
	role := "sluice_console_" + hex.EncodeToString(suffix)
	body, err := fs.ReadFile(migrations.FS, "grants/console.sql")
	require.NoError(t, err)
	grants := strings.NewReplacer(`:"role"`, pgx.Identifier{role}.Sanitize(), `:"policy"`, pgx.Identifier{role + "_read"}.Sanitize()).Replace(string(body))
	_, err = b.pool.Exec(ctx, fmt.Sprintf(`CREATE ROLE %s LOGIN`, pgx.Identifier{role}.Sanitize()))
	require.NoError(t, err)
	t.Cleanup(func() {
		ctx := context.WithoutCancel(ctx)
		_, _ = b.pool.Exec(ctx, fmt.Sprintf(`DROP OWNED BY %[1]s; DROP ROLE %[1]s`, pgx.Identifier{role}.Sanitize()))
	})
	// A deployed database has consumer roles, whose grants (consumer.sql) turn on row level
	// security: a role without a policy then reads no inbox row.
	_, err = b.pool.Exec(ctx, `ALTER TABLE inbox_event ENABLE ROW LEVEL SECURITY; ALTER TABLE inbox_dead_letter ENABLE ROW LEVEL SECURITY`)
	require.NoError(t, err)
	_, err = b.pool.Exec(ctx, grants)
	require.NoError(t, err)

	u, err := url.Parse(b.pool.Config().ConnString())
	require.NoError(t, err)
	u.User = url.User(role)
	ro, err := pgxpool.New(ctx, u.String())
	require.NoError(t, err)
	t.Cleanup(ro.Close)
	s, err := console.New(console.Config{DB: ro})
	require.NoError(t, err)
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)

	for _, path := range []string{"/", "/live/overview", "/key?k=order-2", fmt.Sprintf("/event/%d", b.bigID), "/dead",
		"/dead/letter?consumer=billing&key=m-1"} {
		resp, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
	}
	page := string(must(t, srv.URL+"/"))
	require.Contains(t, page, `<dd id="outbox-pending">5</dd>`, "the role reads the outbox")
	require.Contains(t, page, `<a href="/dead">3</a>`, "the role reads every consumer's dead letters")

	_, err = ro.Exec(ctx, `UPDATE outbox_event SET quarantined_at = NULL`)
	require.ErrorContains(t, err, "permission denied")
	_, err = ro.Exec(ctx, `UPDATE inbox_dead_letter SET retried_at = now()`)
	require.ErrorContains(t, err, "permission denied")
}

func must(t *testing.T, u string) []byte {
	t.Helper()
	resp, err := http.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return body
}
