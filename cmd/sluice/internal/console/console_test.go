package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/cmd/sluice/internal/console"
)

// The overview reflects the written backlog: per destination, the quarantined key, and the
// consumer's dead letters; its live part is served alone for the page's script.
func TestOverviewReflectsTheBacklog(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	page := b.ok(t, "/")
	require.Contains(t, page, `<dd id="outbox-pending">5</dd>`, "5 pending rows besides the quarantined one")
	require.Contains(t, page, `<dd id="outbox-quarantined" class="bad">1</dd>`)
	require.Regexp(t, `<th scope="row">orders</th><td>5</td>`, page)
	require.Regexp(t, `<td>1</td><td>1</td><td>0</td>\s*</tr>`, page, "orders: 1 quarantined row, 1 key, none published in the last minute")
	require.Contains(t, page, `<a href="/key?k=order-2">order-2</a>`, "the quarantined key links to its chain")
	require.Contains(t, page, "SNS rejected the message: InvalidParameter")
	require.Regexp(t, `<th scope="row">billing</th><td>0</td><td>0s</td>\s*<td>0</td><td class="bad"><a href="/dead">3</a></td>`, page)
	require.Contains(t, page, "db.test:5432/app")
	require.Contains(t, page, "read-only")

	live := b.ok(t, "/live/overview")
	require.NotContains(t, live, "<html")
	require.Contains(t, live, `<dd id="outbox-pending">5</dd>`)
}

// A quarantined key's page says why it waits, and what waits behind it.
func TestKeyPageSaysWhyTheKeyWaits(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	page := b.ok(t, "/key?k=order-2")
	require.Contains(t, page, "2 pending rows")
	require.Contains(t, page, "<strong class=\"bad\">Quarantined</strong>")
	require.Contains(t, page, "SNS rejected the message: InvalidParameter")
	require.Contains(t, page, fmt.Sprintf(`Behind row <a href="/event/%d">%d</a>`, b.quarantinedID, b.quarantinedID))
	require.Contains(t, page, "No relay holds this key right now.")
	require.Contains(t, page, fmt.Sprintf(`href="/retry/plan?id=%d"`, b.quarantinedID))

	ready := b.ok(t, "/key?k=order-1")
	require.Contains(t, ready, "the next relay round publishes it")

	status, _ := b.get(t, "/key")
	require.Equal(t, http.StatusBadRequest, status)
}

// An event's page: trace id, attributes, state, and a large payload truncated, never whole.
func TestEventPageTruncatesALargePayload(t *testing.T) {
	t.Parallel()
	b := setup(t, false, func(c *console.Config) { c.PayloadLimit = 1000 })
	page := b.ok(t, fmt.Sprintf("/event/%d", b.bigID))
	require.Contains(t, page, `<code id="trace-id">4bf92f3577b34da6a3ce929d0e0e4736</code>`)
	require.Contains(t, page, "traceparent")
	require.Contains(t, page, "Payload truncated: showing the first 1000 bytes of")
	require.Less(t, len(page), 20000, "the page holds the first 1000 bytes of the payload, not 100 KiB")
	require.NotContains(t, page, `"END"`)

	small := b.ok(t, fmt.Sprintf("/event/%d", b.quarantinedID))
	require.Contains(t, small, "{\n  &#34;n&#34;: 4\n}", "a whole JSON payload is pretty-printed")
	require.Contains(t, small, `<span class="bad">quarantined</span>`)

	var eventID string
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT event_id::text FROM outbox_event WHERE id = $1`, b.bigID).Scan(&eventID))
	byEventID := b.ok(t, "/event/"+eventID)
	require.Contains(t, byEventID, fmt.Sprintf("<h1>Event %d</h1>", b.bigID))

	status, _ := b.get(t, "/event/not-an-id")
	require.Equal(t, http.StatusBadRequest, status)
	status, _ = b.get(t, "/event/999999")
	require.Equal(t, http.StatusNotFound, status)
}

// --hide-payloads shows sizes, never contents, on the event and dead-letter pages.
func TestHidePayloads(t *testing.T) {
	t.Parallel()
	b := setup(t, false, func(c *console.Config) { c.HidePayloads = true })
	page := b.ok(t, fmt.Sprintf("/event/%d", b.quarantinedID))
	require.Contains(t, page, "Payload hidden")
	require.NotContains(t, page, "&#34;n&#34;")
	letter := b.ok(t, "/dead/letter?consumer=billing&key=m-1")
	require.Contains(t, letter, "Payload hidden")
	require.NotContains(t, letter, "ledger&#34;")
}

// A claim check's pointer is shown as one, not as the payload.
func TestClaimCheckPointerIsShownAsSuch(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	_, err := b.pool.Exec(context.Background(), `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
		VALUES (gen_random_uuid(), 'orders', 'doc', 'd-1', 'DocumentIssued', 'd-1',
		'["software.amazon.payloadoffloading.PayloadS3Pointer",{"s3BucketName":"acme-payloads","s3Key":"outbox/d-1"}]')`)
	require.NoError(t, err)
	var id int64
	require.NoError(t, b.pool.QueryRow(context.Background(), `SELECT max(id) FROM outbox_event`).Scan(&id))
	page := b.ok(t, fmt.Sprintf("/event/%d", id))
	require.Contains(t, page, "<strong>Claim check pointer</strong>: the payload is stored in S3 at <code>s3://acme-payloads/outbox/d-1</code>")
}

// Dead letters are grouped by consumer, error class and message, with a retry of the group.
func TestDeadLettersAreGroupedByErrorClassAndMessage(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	page := b.ok(t, "/dead")
	require.Contains(t, page, "3 dead letters not applied since, in 2 groups")
	require.Contains(t, page, `<span class="tag class">handler-error</span> message m-&lt;n&gt; (OrderCreated): handler: ledger &lt;n&gt; closed</h2>`)
	require.Contains(t, page, "2 letters (2 dead)")
	require.Contains(t, page, `<span class="tag class">bad-message</span>`)
	require.Regexp(t, `href="/retry/plan\?consumer=billing&amp;id=m-[12]&amp;id=m-[12]">Retry this group \(2\)`, page)
	require.Contains(t, page, fmt.Sprintf(`<a class="button" href="/retry/plan?id=%d">Retry…</a>`, b.quarantinedID), "quarantined rows are listed with a retry")
}

// Read-only: the plan can be seen (a dry run changes nothing) but every POST is refused.
func TestReadOnlyRefusesRetries(t *testing.T) {
	t.Parallel()
	b := setup(t, false)
	plan := b.ok(t, "/retry/plan?consumer=billing&id=m-1&id=m-2")
	require.Contains(t, plan, "The console is read-only")
	require.Contains(t, plan, "sluice dead retry --consumer billing m-1 m-2 --dry-run")
	require.NotContains(t, plan, `id="confirm"`)

	before := b.fingerprint(t)
	status, body := b.post(t, "/retry", url.Values{"consumer": {"billing"}, "id": {"m-1", "m-2"}, "digest": {"x"}})
	require.Equal(t, http.StatusForbidden, status)
	require.Contains(t, body, "read-only")
	require.Equal(t, before, b.fingerprint(t))
}

// With actions: the plan is the CLI's dry run; a POST without the CSRF token is refused; the
// confirmed retry stores the group's dead letters in the inbox once, even when confirmed twice.
func TestGroupRetryShowsThePlanAndAppliesOnce(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	before := b.fingerprint(t)
	plan := b.ok(t, "/retry/plan?consumer=billing&id=m-1&id=m-2")
	require.Contains(t, plan, "would retry dead letter billing/m-1 (OrderCreated)")
	require.Contains(t, plan, "would retry dead letter billing/m-2 (OrderCreated)")
	require.Contains(t, plan, "<code>sluice dead retry --consumer billing m-1 m-2 --dry-run</code>")
	require.Equal(t, before, b.fingerprint(t), "showing the plan changes nothing")
	form := confirmForm(t, plan)

	noToken := url.Values{}
	for k, v := range form {
		if k != "csrf" {
			noToken[k] = v
		}
	}
	status, body := b.post(t, "/retry", noToken)
	require.Equal(t, http.StatusForbidden, status)
	require.Contains(t, body, "CSRF")
	forged := url.Values{}
	for k, v := range form {
		forged[k] = v
	}
	forged.Set("csrf", strings.Repeat("0", 64))
	status, _ = b.post(t, "/retry", forged)
	require.Equal(t, http.StatusForbidden, status)
	require.Equal(t, before, b.fingerprint(t), "refused POSTs change nothing")

	status, body = b.post(t, "/retry", form)
	require.Equal(t, http.StatusOK, status, body)
	require.Contains(t, body, "stored 2 dead letters for the consumer&#39;s processor: billing/m-1, billing/m-2")
	const stored = `SELECT count(*) FROM inbox_event WHERE consumer = 'billing' AND message_id IN ('m-1', 'm-2')`
	require.Equal(t, 2, b.count(t, stored))

	status, body = b.post(t, "/retry", form)
	require.Equal(t, http.StatusOK, status, body)
	require.Contains(t, body, "already in the inbox, nothing to do")
	require.Equal(t, 2, b.count(t, stored), "confirming twice stores nothing twice")
}

// A retry changes nothing when the rows it would choose are no longer those of the plan.
func TestRetryRefusesAChangedPlan(t *testing.T) {
	t.Parallel()
	b := setup(t, true)
	form := confirmForm(t, b.ok(t, "/retry/plan?all=1"))
	_, err := b.pool.Exec(context.Background(), `UPDATE outbox_event SET quarantined_at = now(), last_error = 'late' WHERE id = $1`, b.bigID)
	require.NoError(t, err)
	before := b.fingerprint(t)
	status, body := b.post(t, "/retry", form)
	require.Equal(t, http.StatusConflict, status)
	require.Contains(t, body, "changed since the plan was shown")
	require.Contains(t, body, fmt.Sprintf("would retry outbox row %d", b.bigID), "the new plan is shown to confirm again")
	require.Equal(t, before, b.fingerprint(t))

	status, body = b.post(t, "/retry", confirmForm(t, body))
	require.Equal(t, http.StatusOK, status, body)
	require.Equal(t, 0, b.count(t, `SELECT count(*) FROM outbox_event WHERE quarantined_at IS NOT NULL`))
}

// With a token, every request carries it, as a bearer token or the basic-auth password.
func TestTokenIsRequired(t *testing.T) {
	t.Parallel()
	b := setup(t, false, func(c *console.Config) { c.Token = "s3cret" })
	status, _ := b.get(t, "/")
	require.Equal(t, http.StatusUnauthorized, status)
	for _, auth := range []func(*http.Request){
		func(r *http.Request) { r.Header.Set("Authorization", "Bearer s3cret") },
		func(r *http.Request) { r.SetBasicAuth("ops", "s3cret") },
	} {
		req, err := http.NewRequest(http.MethodGet, b.srv.URL+"/", nil)
		require.NoError(t, err)
		auth(req)
		resp, err := b.client.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
	}
	req, err := http.NewRequest(http.MethodGet, b.srv.URL+"/", nil)
	require.NoError(t, err)
	req.SetBasicAuth("ops", "wrong")
	resp, err := b.client.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)
}

// Without a token, only loopback host names are served (no DNS rebinding), plus allowed ones.
func TestUnknownHostIsRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, false, func(c *console.Config) { c.AllowedHosts = []string{"console.internal"} })
	for host, want := range map[string]int{"attacker.example": http.StatusMisdirectedRequest, "console.internal": http.StatusOK, "localhost:8089": http.StatusOK} {
		req, err := http.NewRequest(http.MethodGet, b.srv.URL+"/", nil)
		require.NoError(t, err)
		req.Host = host
		resp, err := b.client.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, want, resp.StatusCode, host)
	}
}

func TestCheckListen(t *testing.T) {
	t.Parallel()
	for _, addr := range []string{"127.0.0.1:8089", "[::1]:8089", "localhost:0"} {
		require.NoError(t, console.CheckListen(addr, ""), addr)
	}
	for _, addr := range []string{"0.0.0.0:8089", ":8089", "10.0.0.5:8089"} {
		require.ErrorContains(t, console.CheckListen(addr, ""), "is not a loopback address: pass --token", addr)
		require.NoError(t, console.CheckListen(addr, "t"), addr)
	}
	require.Error(t, console.CheckListen("8089", ""))
}
