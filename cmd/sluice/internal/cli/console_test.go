package cli_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/cmd/sluice/internal/cli"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/pkg/fleet"
)

// `sluice console` refuses a non-loopback address without a token, changing nothing and
// opening nothing.
func TestConsoleRefusesAnOpenAddressWithoutAToken(t *testing.T) {
	t.Parallel()
	b := setup(t)
	requireOneLineError(t, b.run(t, "console", "--listen", "0.0.0.0:0"), cli.ExitUsage, "is not a loopback address: pass --token")
	requireOneLineError(t, b.run(t, "console", "--sample-every", "10ms"), cli.ExitUsage, "--sample-every must be at least 1s")
}

// serveConsole runs `sluice console args...` with the bundle's environment until the test
// ends or stop is called, and returns its base URL once it listens, and stop, which returns its
// exit code.
func serveConsole(t *testing.T, b *testBundle, args ...string) (base string, stop func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	outR, outW := io.Pipe()
	done := make(chan int, 1)
	go func() {
		done <- cli.Run(ctx, append([]string{"console"}, args...), cli.IO{Out: outW, Err: io.Discard,
			Getenv: func(k string) string { return b.env[k] }})
		outW.Close()
	}()
	line, err := bufio.NewReader(outR).ReadString('\n')
	require.NoError(t, err)
	m := regexp.MustCompile(`^sluice console on (http://127\.0\.0\.1:\d+) \((read-only|actions allowed)\)\n$`).FindStringSubmatch(line)
	require.NotNil(t, m, line)
	go func() { _, _ = io.Copy(io.Discard, outR) }()
	var code *int
	stop = func() int {
		if code == nil {
			cancel()
			c := <-done
			code = &c
		}
		return *code
	}
	t.Cleanup(func() { stop() })
	return m[1], stop
}

func getPage(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := http.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
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

	base, stop := serveConsole(t, b, "--listen", "127.0.0.1:0")
	status, page := getPage(t, base+"/")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, page, "<strong>read-only</strong>")
	require.Contains(t, page, "database "+u.Host+u.Path)
	require.NotContains(t, page, "hunter2-secret")
	require.NotContains(t, page, u.User.Username()+"@")
	require.NotContains(t, page, "sslmode", "no connection parameters are shown")

	resp, err := http.PostForm(base+"/retry", url.Values{"all": {"1"}, "digest": {"x"}})
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "read-only without --allow-actions")

	require.Equal(t, cli.ExitOK, stop())
	_, err = http.Get(base + "/")
	require.Error(t, err, "the console stopped listening")
}

// With --queue, the overview shows each queue's depth and its DLQ's, as sluice status does; a
// wrong URL is refused at start.
func TestConsoleShowsQueueAndDLQDepth(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.withAWS(t)
	qURL, dlqURL := queuePair(t, c, false)
	for _, u := range []string{dlqURL, dlqURL, qURL} {
		_, err := c.SendMessage(context.Background(), &sqs.SendMessageInput{QueueUrl: aws.String(u), MessageBody: aws.String(`{}`)})
		require.NoError(t, err)
	}
	requireOneLineError(t, b.run(t, "console", "--listen", "127.0.0.1:0", "--queue", qURL+"-missing"), cli.ExitError, "does not exist")

	base, _ := serveConsole(t, b, "--listen", "127.0.0.1:0", "--queue", qURL, "--sample-every", "1s")
	var page string
	testwait.Until(t, "the overview shows the queues' first reading", func() bool {
		_, page = getPage(t, base+"/")
		return strings.Contains(page, `<table id="queues">`) && !strings.Contains(page, "Not read yet.")
	})
	require.Regexp(t, `<th scope="row">`+regexp.QuoteMeta(qURL)+`</th><td>1</td><td>0</td><td>0</td><td class="bad">2</td>`, page)
}

// With --allow-actions, a DLQ of a --queue is redriven after the plan of sluice redrive
// --dry-run is shown and confirmed (CSRF token included); a queue that is not one of the
// console's DLQs is refused.
func TestConsoleRedrivesADLQAfterItsPlan(t *testing.T) {
	t.Parallel()
	b := setup(t)
	c := b.withAWS(t)
	qURL, dlqURL := queuePair(t, c, false)
	for range 2 {
		_, err := c.SendMessage(context.Background(), &sqs.SendMessageInput{QueueUrl: aws.String(dlqURL), MessageBody: aws.String(`{}`)})
		require.NoError(t, err)
	}
	base, _ := serveConsole(t, b, "--listen", "127.0.0.1:0", "--queue", qURL, "--allow-actions", "--sample-every", "1s")
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	client := &http.Client{Jar: jar}
	get := func(path string) string {
		resp, err := client.Get(base + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
		return string(body)
	}
	testwait.Until(t, "the overview offers the DLQ's redrive", func() bool {
		return strings.Contains(get("/"), `href="/redrive/plan?dlq=`)
	})
	plan := get("/redrive/plan?dlq=" + url.QueryEscape(dlqURL))
	require.Contains(t, plan, "Dry run: would move ~2 messages from "+dlqURL+" to "+qURL)
	require.Contains(t, plan, "sluice redrive --dlq "+dlqURL+" --max 2 --dry-run")
	require.Equal(t, 2, queueDepth(t, c, dlqURL), "the plan moves nothing")
	form := url.Values{}
	for _, m := range regexp.MustCompile(`<input type="hidden" name="([a-z]+)" value="([^"]*)">`).FindAllStringSubmatch(plan, -1) {
		form.Set(m[1], strings.ReplaceAll(m[2], "&amp;", "&"))
	}
	require.Equal(t, dlqURL, form.Get("dlq"))

	other := url.Values{"csrf": {form.Get("csrf")}, "digest": {form.Get("digest")}, "dlq": {qURL}}
	resp, err := client.PostForm(base+"/redrive", other)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusBadRequest, resp.StatusCode, "only the DLQs of the console's queues")

	resp, err = client.PostForm(base+"/redrive", form)
	require.NoError(t, err)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
	require.Contains(t, string(body), "moved 2 messages from "+dlqURL+" to "+qURL)
	require.Equal(t, 0, queueDepth(t, c, dlqURL))
	require.Equal(t, 2, queueDepth(t, c, qURL))
}

// The audit page runs `sluice audit` and shows its report and verdict: a consumer missing a
// published event is named, with the event.
func TestConsoleAuditPageNamesAMissingEvent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t)
	_, err := b.pool.Exec(ctx, `INSERT INTO outbox_event
		(event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload, created_at, published_at)
		SELECT gen_random_uuid(), 'orders', 'order', 'o-' || g, 'OrderCreated', 'o-' || g, '{}',
		       now() - interval '2 hours' + g * interval '1 second', now() - interval '2 hours' + g * interval '1 second'
		FROM generate_series(1, 20) g;
		INSERT INTO inbox_event (consumer, message_id, event_type, created_at, processed_at)
		SELECT 'billing', event_id::text, event_type, created_at, now() FROM outbox_event WHERE aggregate_id <> 'o-7'`)
	require.NoError(t, err)
	var missing string
	require.NoError(t, b.pool.QueryRow(ctx, `SELECT event_id::text FROM outbox_event WHERE aggregate_id = 'o-7'`).Scan(&missing))

	base, _ := serveConsole(t, b, "--listen", "127.0.0.1:0")
	status, page := getPage(t, base+"/audit")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, page, `id="audit-form"`)
	require.NotContains(t, page, "audit-report", "nothing runs before the form is submitted")

	status, page = getPage(t, base+"/audit?consumer=billing&since=3h")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, page, "audit: billing is missing 1 published events")
	require.Contains(t, page, "published 20, applied 19")
	require.Contains(t, page, missing)

	status, page = getPage(t, base+"/audit?consumer=billing&since=yesterday-ish")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, page, `role="alert"`)
	require.Contains(t, page, "since:")
}

// With --fleet-tenants, the fleet page reads every tenant as sluice status --fleet does: the
// failing one first, with its error, then the backlog.
func TestConsoleFleetPage(t *testing.T) {
	t.Parallel()
	busy := setup(t)
	busy.insertOutbox(t, outboxRow{aggID: "o-1", age: 2 * time.Hour})
	fb := setupFleet(t, fleet.Tenant{Name: "a-busy", DatabaseURL: busy.url}, fleet.Tenant{Name: "b-down", DatabaseURL: unreachableURL})
	b := setup(t)
	requireOneLineError(t, b.run(t, "console", "--fleet-tenants", "-"), cli.ExitUsage, "name a file")

	base, _ := serveConsole(t, b, "--listen", "127.0.0.1:0", "--fleet-tenants", fb.file)
	status, page := getPage(t, base+"/fleet")
	require.Equal(t, http.StatusOK, status)
	require.Contains(t, page, "2 tenants, 1 failing")
	require.Regexp(t, `(?s)b-down\s+FAILING: cannot reach the database.*a-busy\s+1\s+2h\d+m`, page)

	plain, _ := serveConsole(t, b, "--listen", "127.0.0.1:0")
	_, page = getPage(t, plain+"/fleet")
	require.Contains(t, page, "This console reads no fleet")
}

// The overview's event stream sends the overview at once, and ends when the console stops:
// an open stream does not hold the shutdown.
func TestConsoleEventStreamEndsWithTheConsole(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.insertOutbox(t, outboxRow{aggID: "o-1"})
	base, stop := serveConsole(t, b, "--listen", "127.0.0.1:0")
	resp, err := http.Get(base + "/live/overview/stream")
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, "text/event-stream", resp.Header.Get("Content-Type"))
	r := bufio.NewReader(resp.Body)
	var event strings.Builder
	for {
		if _, ev, ok := strings.Cut(event.String(), "event: overview\n"); ok && strings.Contains(ev, "\n\n") {
			break
		}
		line, err := r.ReadString('\n')
		require.NoError(t, err)
		event.WriteString(line)
	}
	require.Contains(t, event.String(), `<dd id="outbox-pending">1</dd>`)
	require.Equal(t, 0, stop(), "the console stops with a stream open")
	_, err = io.ReadAll(r)
	require.NoError(t, err, "the stream ended")
}
