package cli_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/cmd/sluice/internal/cli"
)

// `sluice console` refuses a non-loopback address without a token, changing nothing and
// opening nothing.
func TestConsoleRefusesAnOpenAddressWithoutAToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	requireOneLineError(t, b.run(t, "console", "--listen", "0.0.0.0:0"), cli.ExitUsage, "is not a loopback address: pass --token")
	requireOneLineError(t, b.run(t, "console", "--sample-every", "10ms"), cli.ExitUsage, "--sample-every must be at least 1s")
}

// `sluice console` serves the console until its context ends, read-only by default, naming the
// database without its credentials.
func TestConsoleServesUntilInterrupted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	u, err := url.Parse(b.url)
	require.NoError(t, err)
	u.User = url.UserPassword(u.User.Username(), "hunter2-secret") // the test cluster trusts local connections
	b.env["DATABASE_URL"] = u.String()

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	outR, outW := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- cli.Run(ctx, []string{"console", "--listen", "127.0.0.1:0"}, cli.IO{Out: outW, Err: io.Discard,
			Getenv: func(k string) string { return b.env[k] }})
		outW.Close()
	}()
	line, err := bufio.NewReader(outR).ReadString('\n')
	require.NoError(t, err)
	m := regexp.MustCompile(`^sluice console on (http://127\.0\.0\.1:\d+) \(read-only\)\n$`).FindStringSubmatch(line)
	require.NotNil(t, m, line)
	go func() { _, _ = io.Copy(io.Discard, outR) }()

	resp, err := http.Get(m[1] + "/")
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	page := string(body)
	require.Contains(t, page, "<strong>read-only</strong>")
	require.Contains(t, page, "database "+u.Host+u.Path)
	require.NotContains(t, page, "hunter2-secret")
	require.NotContains(t, page, u.User.Username()+"@")

	resp, err = http.PostForm(m[1]+"/retry", url.Values{"all": {"1"}, "digest": {"x"}})
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "read-only without --allow-actions")

	cancel()
	require.Equal(t, cli.ExitOK, <-done)
	_, err = http.Get(m[1] + "/")
	require.Error(t, err, "the console stopped listening")
	require.False(t, strings.Contains(page, "sslmode"), "no connection parameters are shown")
}
