package console_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/emulation"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/cmd/sluice/internal/console"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// envChromium names the browser the browser tests drive, when it is not chromium on PATH.
const envChromium = "SLUICE_CHROMIUM"

// envScreenshot, when set, names the PNG file the browser test writes the overview's screenshot
// to (README's docs/console.png: SLUICE_CONSOLE_SCREENSHOT=$PWD/docs/console.png).
const envScreenshot = "SLUICE_CONSOLE_SCREENSHOT"

// browserWait bounds each wait of a browser test: the pages answer from a local database, so
// this only ends a test that hangs, on however busy a machine.
const browserWait = 3 * time.Minute

// browser starts a headless Chromium for t and returns its context; each step runs under
// step(ctx). A missing browser fails the test (make deps installs it); it is never skipped.
func browser(t *testing.T) context.Context {
	t.Helper()
	path := os.Getenv(envChromium)
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if path != "" {
			break
		}
		path, _ = exec.LookPath(name)
	}
	if path == "" {
		t.Fatalf("no Chromium to drive: run `make deps` (it installs the chromium package), or set %s", envChromium)
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(path), chromedp.NoSandbox,
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.WindowSize(1280, 900))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	// The first run starts the browser, for as long as ctx lives: no timeout on it.
	require.NoError(t, chromedp.Do(ctx, chromedp.Navigate("about:blank")), "start Chromium at %s", path)
	return ctx
}

// step runs steps in the browser, bounded by browserWait.
func step(t *testing.T, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, browserWait)
	defer cancel()
	require.NoError(t, chromedp.Do(sctx, steps...))
}

// read runs a in the browser, bounded by browserWait, and returns its value.
func read[T any](t *testing.T, ctx context.Context, a chromedp.Action[T]) T {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, browserWait)
	defer cancel()
	v, err := chromedp.Run(sctx, a)
	require.NoError(t, err)
	return v
}

// In a real browser: the overview reflects the backlog and updates live, a quarantined key's
// page says why it waits, a long payload does not widen the page, and a dead-letter group's
// retry shows the CLI's plan, asks, and once confirmed stores the letters in the inbox once.
func TestBrowserOverviewChainAndConfirmedRetry(t *testing.T) {
	t.Parallel()
	b := setup(t, true, func(c *console.Config) { c.SampleEvery = time.Second })
	ctx := browser(t)
	css := func(s string) chromedp.CSS { return chromedp.CSS(s) }

	// The overview, then live: two more rows appear without a reload.
	step(t, ctx, chromedp.Navigate(b.srv.URL+"/"), chromedp.WaitVisible(css("#destinations")))
	require.Equal(t, "5", strings.TrimSpace(read(t, ctx, chromedp.Text(css("#outbox-pending")))))
	tx, err := b.pool.Begin(context.Background())
	require.NoError(t, err)
	m := outbox.Message{Topic: "orders", AggregateType: "order", AggregateID: "o-9", EventType: "OrderCreated", PartitionKey: "order-9", Payload: json.RawMessage(`{}`)}
	_, err = outbox.Write(context.Background(), tx, m, m)
	require.NoError(t, err)
	require.NoError(t, tx.Commit(context.Background()))
	updated := read(t, ctx, chromedp.Poll[bool](`document.getElementById("outbox-pending").textContent.trim() === "7"`,
		chromedp.WithPollingTimeout(browserWait)))
	require.True(t, updated, "the overview updates itself")
	if path := os.Getenv(envScreenshot); path != "" {
		step(t, ctx, chromedp.EmulateViewport(1280, 900))
		png := read(t, ctx, chromedp.FullScreenshot(100))
		require.NoError(t, os.WriteFile(path, png, 0o644))
	}

	// Follow the quarantined key to its chain.
	step(t, ctx, chromedp.Click(css(`a[href="/key?k=order-2"]`)), chromedp.WaitVisible(css("#chain")))
	text := read(t, ctx, chromedp.Text(css("#chain")))
	require.Contains(t, text, "Quarantined")
	require.Contains(t, text, "SNS rejected the message: InvalidParameter")
	require.Contains(t, text, "Behind row")

	// A 100 KiB payload: truncated, and the page stays as wide as the window.
	step(t, ctx, chromedp.Navigate(b.srv.URL+"/event/"+strconv.FormatInt(b.bigID, 10)), chromedp.WaitVisible(css("pre.payload")))
	require.True(t, read(t, ctx, chromedp.Evaluate[bool](`document.documentElement.scrollWidth <= window.innerWidth`)),
		"a long payload does not widen the page")

	// Retry the dead-letter group: the plan, then the confirmation.
	const stored = `SELECT count(*) FROM inbox_event WHERE consumer = 'billing' AND message_id IN ('m-1', 'm-2')`
	require.Equal(t, 0, b.count(t, stored))
	step(t, ctx, chromedp.Navigate(b.srv.URL+"/dead"), chromedp.Click(css("a.retry-group")), chromedp.WaitVisible(css("#plan")))
	text = read(t, ctx, chromedp.Text(css("#plan")))
	require.Contains(t, text, "would retry dead letter billing/m-1 (OrderCreated)")
	require.Contains(t, text, "would retry dead letter billing/m-2 (OrderCreated)")
	require.Equal(t, 0, b.count(t, stored), "the plan changes nothing")
	step(t, ctx, chromedp.Click(css("#confirm-button")), chromedp.WaitVisible(css("#result")))
	require.Contains(t, read(t, ctx, chromedp.Text(css("#result"))), "stored 2 dead letters for the consumer's processor")
	require.Equal(t, 2, b.count(t, stored), "confirmed: stored in the inbox once")
}

// The pages follow the system's theme (light and dark, each with its own text and background)
// and are usable from the keyboard: the first Tab reaches the skip link, and a retry is reached
// and opened with Tab and Enter.
func TestBrowserThemesAndKeyboard(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	ctx := browser(t)
	colors := func(scheme string) string {
		step(t, ctx, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			_, err := cdp.Call(ctx, tg, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{
				Features: []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: scheme}}})
			return err
		}), chromedp.Navigate(b.srv.URL+"/dead"), chromedp.WaitVisible(chromedp.CSS("#quarantined")))
		return read(t, ctx, chromedp.Evaluate[string](`getComputedStyle(document.body).backgroundColor + " / " + getComputedStyle(document.body).color`))
	}
	require.Equal(t, "rgb(255, 255, 255) / rgb(27, 31, 36)", colors("light"))
	require.Equal(t, "rgb(13, 17, 23) / rgb(230, 237, 243)", colors("dark"))

	step(t, ctx, chromedp.KeyEvent("\t"))
	require.Equal(t, "Skip to content", read(t, ctx, chromedp.Evaluate[string](`document.activeElement.textContent`)))
	// Tab until the quarantined row's Retry… link has the focus, then Enter opens its plan.
	want := fmt.Sprintf("/retry/plan?id=%d", b.quarantinedID)
	for range 60 {
		if read(t, ctx, chromedp.Evaluate[string](`document.activeElement.getAttribute("href") || ""`)) == want {
			break
		}
		step(t, ctx, chromedp.KeyEvent("\t"))
	}
	require.Equal(t, want, read(t, ctx, chromedp.Evaluate[string](`document.activeElement.getAttribute("href") || ""`)), "the retry is reachable with Tab")
	step(t, ctx, chromedp.KeyEvent("\r"), chromedp.WaitVisible(chromedp.CSS("#plan-error")))
	require.Contains(t, read(t, ctx, chromedp.Text(chromedp.CSS("#plan-error"))), "The console is read-only")
}

// counting counts the requests for each path the console serves.
type counting struct {
	h  http.Handler
	mu sync.Mutex
	n  map[string]int
}

func (c *counting) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	c.n[r.URL.Path]++
	c.mu.Unlock()
	c.h.ServeHTTP(w, r)
}

func (c *counting) count(path string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[path]
}

// The overview subscribes to the server's event stream: rows written after the page loaded
// appear without a reload and without a poll. A browser without EventSource polls instead and
// still sees them.
func TestBrowserOverviewUpdatesByServerSentEvents(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	s, err := console.New(console.Config{DB: b.pool, SampleEvery: time.Second})
	require.NoError(t, err)
	c := &counting{h: s, n: map[string]int{}}
	base := serve(t, c)
	write := func() {
		tx, err := b.pool.Begin(context.Background())
		require.NoError(t, err)
		m := outbox.Message{Topic: "orders", AggregateType: "order", AggregateID: "o-9", EventType: "OrderCreated", PartitionKey: "order-9", Payload: json.RawMessage(`{}`)}
		_, err = outbox.Write(context.Background(), tx, m, m)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(context.Background()))
	}
	pendingIs := func(ctx context.Context, n string) {
		t.Helper()
		ok := read(t, ctx, chromedp.Poll[bool](`document.getElementById("outbox-pending").textContent.trim() === "`+n+`"`,
			chromedp.WithPollingTimeout(browserWait)))
		require.True(t, ok, "the overview shows %s pending", n)
	}

	ctx := browser(t)
	step(t, ctx, chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS("#destinations")))
	pendingIs(ctx, "5")
	write()
	pendingIs(ctx, "7")
	require.Positive(t, c.count("/live/overview/stream"), "the page subscribed to the stream")
	require.Zero(t, c.count("/live/overview"), "and never polled")
	require.Contains(t, read(t, ctx, chromedp.Text(chromedp.CSS("#live-status"))), "last update")
	// An update keeps the keyboard focus on a link of a section that did not change.
	stamp := read(t, ctx, chromedp.Evaluate[string](`document.querySelector('a[href="/key?k=order-2"]').focus(); document.querySelector("#live .stamp").textContent`))
	require.True(t, read(t, ctx, chromedp.Poll[bool](`document.querySelector("#live .stamp").textContent !== `+strconv.Quote(stamp),
		chromedp.WithPollingTimeout(browserWait))), "another update came")
	require.Equal(t, "/key?k=order-2", read(t, ctx, chromedp.Evaluate[string](`document.activeElement.getAttribute("href") || ""`)))

	// A browser without EventSource.
	old := browser(t)
	step(t, old, chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
		_, err := cdp.Call(ctx, tg, page.AddScriptToEvaluateOnNewDocument,
			page.AddScriptToEvaluateOnNewDocumentParams{Source: `delete window.EventSource;`})
		return err
	}), chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS("#destinations")))
	streams := c.count("/live/overview/stream")
	pendingIs(old, "7")
	write()
	pendingIs(old, "9")
	require.Positive(t, c.count("/live/overview"), "it polled")
	require.Equal(t, streams, c.count("/live/overview/stream"), "it opened no stream")
}
