package console

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/cmd/sluice/internal/human"
	"github.com/sluicehq/sluice/internal/wire"
	"github.com/sluicehq/sluice/pkg/fleet"
	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// listLimit bounds the rows a page lists of each kind.
const listLimit = 500

// deadLimit bounds the dead letters the dead-letter page groups (they are meant to be few).
const deadLimit = 10000

func (s *Server) routes() {
	m := http.NewServeMux()
	m.HandleFunc("GET /{$}", s.overviewPage)
	m.HandleFunc("GET /live/overview", s.overviewLive)
	m.HandleFunc("GET /live/overview/stream", s.overviewStream)
	m.HandleFunc("GET /key", s.keyPage)
	m.HandleFunc("GET /event/{ref}", s.eventPage)
	m.HandleFunc("GET /event", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/event/"+url.PathEscape(strings.TrimSpace(r.URL.Query().Get("ref"))), http.StatusSeeOther)
	})
	m.HandleFunc("GET /dead", s.deadPage)
	m.HandleFunc("GET /dead/letter", s.deadLetterPage)
	m.HandleFunc("GET /retry/plan", s.planPage)
	m.HandleFunc("POST /retry", s.retryPost)
	m.HandleFunc("GET /audit", s.auditPage)
	m.HandleFunc("GET /fleet", s.fleetPage)
	m.HandleFunc("GET /redrive/plan", s.redrivePlanPage)
	m.HandleFunc("POST /redrive", s.redrivePost)
	m.Handle("GET /static/", s.static)
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			s.refuse(w, r, http.StatusMethodNotAllowed, "this page only reads")
			return
		}
		s.refuse(w, r, http.StatusNotFound, "no such page: "+r.URL.Path)
	})
	s.mux = m
}

// page is what every template gets.
type page struct {
	Title    string
	Nav      string
	Database string
	ReadOnly bool
	Hidden   bool // payloads hidden
	CSRF     string
	Data     any
}

func (s *Server) render(w http.ResponseWriter, r *http.Request, status int, name, title, nav string, data any) {
	p := page{Title: title, Nav: nav, Database: s.cfg.Database, ReadOnly: s.cfg.Actions == nil, Hidden: s.cfg.HidePayloads,
		CSRF: s.csrfToken(w, r), Data: data}
	var buf bytes.Buffer
	if err := s.pages.ExecuteTemplate(&buf, name, p); err != nil {
		s.cfg.Logger.Error("console: render", "page", name, "error", err)
		http.Error(w, "sluice console: cannot render the page", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// refuse renders an error page.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, status int, msg string) {
	s.render(w, r, status, "error", http.StatusText(status), "", msg)
}

// failed renders a failure to read or change the database.
func (s *Server) failed(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	s.cfg.Logger.Warn("console: request failed", "path", r.URL.Path, "error", err)
	s.refuse(w, r, http.StatusInternalServerError, err.Error())
}

// overview is the overview page's live part.
type overview struct {
	Now          time.Time
	Lag          outbox.Lag
	Destinations []outbox.DestinationLag
	Consumers    []consumerRow
	Quarantined  []outbox.QuarantinedRow
	Charts       []chart
	SampleEvery  time.Duration
	// ChartSource names the lag history the charts show ("": the console's own samples);
	// ChartNote says why they show the console's samples though a history is configured.
	ChartSource, ChartNote string
	// Queues are the last reading of Config.Queues (QueuesOn), taken at QueuesAt; QueuesErr
	// the last reading's error.
	QueuesOn  bool
	Queues    []Queue
	QueuesAt  time.Time
	QueuesErr string
}

// consumerRow is one inbox consumer on the overview.
type consumerRow struct {
	inbox.Lag
	// DeadLetters counts its dead letters in the dead state; Failing those its source still retries.
	DeadLetters, Failing int64
}

func (s *Server) readOverview(ctx context.Context) (overview, error) {
	o := overview{Now: time.Now(), SampleEvery: s.cfg.SampleEvery}
	var err error
	if o.Lag, err = outbox.LagOf(ctx, s.cfg.DB); err != nil {
		return o, err
	}
	if o.Destinations, err = outbox.DestinationsOf(ctx, s.cfg.DB); err != nil {
		return o, err
	}
	if o.Quarantined, err = outbox.ListQuarantined(ctx, s.cfg.DB, 20); err != nil {
		return o, err
	}
	lags, err := inbox.LagOf(ctx, s.cfg.DB)
	if err != nil {
		return o, err
	}
	counts, err := inbox.CountDeadLetters(ctx, s.cfg.DB)
	if err != nil {
		return o, err
	}
	byName := map[string]*consumerRow{}
	for _, l := range lags {
		byName[l.Consumer] = &consumerRow{Lag: l}
	}
	for _, d := range counts {
		if d.State != inbox.DeadDead && d.State != inbox.DeadFailing {
			continue
		}
		c := byName[d.Consumer]
		if c == nil {
			c = &consumerRow{Lag: inbox.Lag{Consumer: d.Consumer}}
			byName[d.Consumer] = c
		}
		if d.State == inbox.DeadDead {
			c.DeadLetters += d.Count
		} else {
			c.Failing += d.Count
		}
	}
	for _, c := range byName {
		o.Consumers = append(o.Consumers, *c)
	}
	slices.SortFunc(o.Consumers, func(a, b consumerRow) int { return strings.Compare(a.Consumer, b.Consumer) })
	if o.QueuesOn = s.cfg.Queues != nil; o.QueuesOn {
		var qerr error
		o.Queues, o.QueuesAt, qerr = s.queues.get()
		if qerr != nil {
			o.QueuesErr = qerr.Error()
		}
	}
	ss, source, note := s.chartSamples(o.Now.Add(-ChartWindow))
	o.ChartSource, o.ChartNote = source, note
	o.Charts = []chart{
		lagChart("Oldest pending row's age", ss, o.Now, func(x sample) float64 { return x.OldestAge.Seconds() }, formatSeconds),
		lagChart("Pending rows", ss, o.Now, func(x sample) float64 { return float64(x.Pending) }, formatCount),
	}
	return o, nil
}

func (s *Server) overviewPage(w http.ResponseWriter, r *http.Request) {
	o, err := s.readOverview(r.Context())
	if err != nil {
		s.failed(w, r, err)
		return
	}
	s.render(w, r, http.StatusOK, "overview", "Overview", "overview", o)
}

// overviewLive is the overview's live part alone, which the page's script polls.
func (s *Server) overviewLive(w http.ResponseWriter, r *http.Request) {
	o, err := s.readOverview(r.Context())
	if err != nil {
		s.failed(w, r, err)
		return
	}
	s.render(w, r, http.StatusOK, "overview-live", "", "", o)
}

// liveEvery is how often the overview's stream sends the overview: every SampleEvery, at most
// maxLiveEvery apart.
func (s *Server) liveEvery() time.Duration { return min(s.cfg.SampleEvery, maxLiveEvery) }

// sseLines continues an event's data on a new "data:" line at each line break.
var sseLines = strings.NewReplacer("\r\n", "\ndata: ", "\r", "\ndata: ", "\n", "\ndata: ")

// maxLiveEvery bounds the time between two updates of the overview's stream.
const maxLiveEvery = 5 * time.Second

// overviewStream sends the overview's live part as server-sent events (event "overview", the
// HTML fragment as its data) at once and then every liveEvery, until the browser goes away or
// the server stops. The page's script subscribes with EventSource, and polls /live/overview
// where it has none.
func (s *Server) overviewStream(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("X-Accel-Buffering", "no") // a proxy in front (nginx) passes each event on at once
	w.WriteHeader(http.StatusOK)
	ctx := r.Context()
	every := s.liveEvery()
	// retry: how long the browser waits before it reconnects after the stream ended.
	if _, err := fmt.Fprintf(w, "retry: %d\n\n", every.Milliseconds()); err != nil || rc.Flush() != nil {
		return
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		var buf bytes.Buffer
		o, err := s.readOverview(ctx)
		if err == nil {
			err = s.pages.ExecuteTemplate(&buf, "overview-live", page{Data: o})
		}
		if ctx.Err() != nil {
			return
		}
		_ = rc.SetWriteDeadline(time.Now().Add(every + 10*time.Second))
		if err != nil {
			s.cfg.Logger.Warn("console: read the overview for its stream", "error", err)
			_, err = fmt.Fprintf(w, "event: failed\ndata: %s\n\n", strings.Join(strings.Fields(err.Error()), " "))
		} else {
			_, err = fmt.Fprintf(w, "event: overview\ndata: %s\n\n", sseLines.Replace(strings.TrimSpace(buf.String())))
		}
		if err != nil || rc.Flush() != nil {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// chainView is the key page.
type chainView struct {
	outbox.KeyChain
	Limit int
}

func (s *Server) keyPage(w http.ResponseWriter, r *http.Request) {
	key := r.URL.Query().Get("k")
	if !r.URL.Query().Has("k") {
		s.refuse(w, r, http.StatusBadRequest, "name a partition key: /key?k=KEY")
		return
	}
	c, err := outbox.ChainOf(r.Context(), s.cfg.DB, key, listLimit)
	if err != nil {
		s.failed(w, r, err)
		return
	}
	s.render(w, r, http.StatusOK, "key", "Key "+key, "", chainView{KeyChain: c, Limit: listLimit})
}

// payloadView is a payload as a page shows it.
type payloadView struct {
	Hidden    bool
	Size      int
	Text      string
	Truncated bool
	// Pointer is the S3 location of a claim check's pointer ("" when the payload is not one).
	Pointer string
}

// viewPayload prepares a payload of size bytes whose first bytes are text: pretty-printed
// JSON when whole, cut at the payload limit otherwise, a claim-check pointer named as such.
func (s *Server) viewPayload(text string, size int) payloadView {
	v := payloadView{Hidden: s.cfg.HidePayloads, Size: size}
	if v.Hidden {
		return v
	}
	if uri, ok := claimCheckPointer(text); ok {
		v.Pointer = uri
	}
	if len(text) > s.cfg.PayloadLimit {
		text = strings.ToValidUTF8(text[:s.cfg.PayloadLimit], "")
	}
	v.Truncated = len(text) < size
	if !v.Truncated {
		var b bytes.Buffer
		if json.Indent(&b, []byte(text), "", "  ") == nil {
			text = b.String()
		}
	}
	v.Text = text
	return v
}

// claimCheckPointer recognises the pointer a claim check publishes instead of a payload,
// [class, {"s3BucketName", "s3Key"}], and returns its S3 URI.
func claimCheckPointer(text string) (string, bool) {
	t := strings.TrimSpace(text)
	if !strings.HasPrefix(t, "[") || len(t) > 4096 {
		return "", false
	}
	var parts []json.RawMessage
	if json.Unmarshal([]byte(t), &parts) != nil || len(parts) != 2 {
		return "", false
	}
	var class string
	var loc struct {
		Bucket string `json:"s3BucketName"`
		Key    string `json:"s3Key"`
	}
	if json.Unmarshal(parts[0], &class) != nil || (class != wire.PointerClass && class != wire.LegacyPointerClass) ||
		json.Unmarshal(parts[1], &loc) != nil || loc.Bucket == "" || loc.Key == "" {
		return "", false
	}
	return "s3://" + loc.Bucket + "/" + loc.Key, true
}

// eventView is the event page.
type eventView struct {
	ID                          int64
	EventID                     uuid.UUID
	Topic, EventType, Key       string
	AggregateType, AggregateID  string
	Headers                     map[string]string
	HeaderNames                 []string
	TraceID                     string
	CreatedAt                   time.Time
	PublishedAt, AvailableAt    *time.Time
	FailingSince, QuarantinedAt *time.Time
	Attempts                    int
	LastError                   string
	Payload                     payloadView
	// Offload says where a relay with a claim check publishes the payload ("" when it does not).
	Offload   string
	Consumers []inboxState
}

// inboxState is one consumer's record of a message.
type inboxState struct {
	Consumer                string
	ReceivedAt              time.Time
	ProcessedAt, ParkedAt   *time.Time
	Attempts                int
	LastError               string
	DeadLetter, DeadLetterS string
}

// eventSQL reads one outbox row by id ($1) or event id ($2), its payload cut to $3 characters.
const eventSQL = `
SELECT id, event_id, topic, event_type, partition_key, aggregate_type, aggregate_id, headers, created_at,
       published_at, available_at, failing_since, quarantined_at, attempts, coalesce(last_error, ''),
       octet_length(payload::text), left(payload::text, $3)
FROM outbox_event WHERE ($1::bigint IS NOT NULL AND id = $1) OR ($2::uuid IS NOT NULL AND event_id = $2)
LIMIT 1`

// inboxStatesSQL reads what each consumer recorded of message $1: consumers are walked one
// index descent each on inbox_event's primary key (consumer, message_id), so the cost follows
// the number of consumers, not the table.
const inboxStatesSQL = `
WITH RECURSIVE c(consumer, n) AS (
    (SELECT consumer, 1 FROM inbox_event ORDER BY consumer LIMIT 1)
    UNION ALL
    SELECT (SELECT e.consumer FROM inbox_event e WHERE e.consumer > c.consumer ORDER BY e.consumer LIMIT 1), c.n + 1
    FROM c WHERE c.consumer IS NOT NULL AND c.n < 1000
)
SELECT e.consumer, e.received_at, e.processed_at, e.parked_at, e.attempts, coalesce(e.last_error, '')
FROM c JOIN inbox_event e ON e.consumer = c.consumer AND e.message_id = $1
ORDER BY e.consumer`

func (s *Server) eventPage(w http.ResponseWriter, r *http.Request) {
	ref := strings.TrimSpace(r.PathValue("ref"))
	var id *int64
	var eid *uuid.UUID
	if n, err := strconv.ParseInt(ref, 10, 64); err == nil {
		id = &n
	} else if u, err := uuid.Parse(ref); err == nil {
		eid = &u
	} else {
		s.refuse(w, r, http.StatusBadRequest, fmt.Sprintf("%q is neither an outbox row id nor an event id", ref))
		return
	}
	limit := s.cfg.PayloadLimit + 1
	if s.cfg.HidePayloads {
		limit = 0
	}
	ctx := r.Context()
	var e eventView
	var size int
	var text string
	err := s.cfg.DB.QueryRow(ctx, eventSQL, id, eid, limit).Scan(&e.ID, &e.EventID, &e.Topic, &e.EventType, &e.Key,
		&e.AggregateType, &e.AggregateID, &e.Headers, &e.CreatedAt, &e.PublishedAt, &e.AvailableAt, &e.FailingSince,
		&e.QuarantinedAt, &e.Attempts, &e.LastError, &size, &text)
	if errors.Is(err, pgx.ErrNoRows) {
		s.refuse(w, r, http.StatusNotFound, fmt.Sprintf("no outbox row %s (it may have been purged)", ref))
		return
	}
	if err != nil {
		s.failed(w, r, fmt.Errorf("read outbox row %s: %w", ref, err))
		return
	}
	e.Payload = s.viewPayload(text, size)
	for k := range e.Headers {
		e.HeaderNames = append(e.HeaderNames, k)
	}
	slices.Sort(e.HeaderNames)
	e.TraceID = traceID(e.Headers[wire.Traceparent])
	if s.cfg.ClaimCheckBucket != "" && s.cfg.ClaimCheckThreshold > 0 && size > s.cfg.ClaimCheckThreshold {
		e.Offload = "s3://" + s.cfg.ClaimCheckBucket + "/" + s.cfg.ClaimCheckPrefix + e.EventID.String()
	}
	rows, err := s.cfg.DB.Query(ctx, inboxStatesSQL, e.EventID.String())
	if err == nil {
		e.Consumers, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (inboxState, error) {
			var c inboxState
			err := r.Scan(&c.Consumer, &c.ReceivedAt, &c.ProcessedAt, &c.ParkedAt, &c.Attempts, &c.LastError)
			return c, err
		})
	}
	if err != nil {
		s.failed(w, r, fmt.Errorf("read the inbox records of %s: %w", e.EventID, err))
		return
	}
	s.render(w, r, http.StatusOK, "event", fmt.Sprintf("Event %d", e.ID), "", e)
}

// traceID returns the trace id of a W3C traceparent header ("" when it is not one).
func traceID(tp string) string {
	parts := strings.Split(strings.TrimSpace(tp), "-")
	if len(parts) < 4 || len(parts[1]) != 32 {
		return ""
	}
	if _, err := strconv.ParseUint(parts[1][:16], 16, 64); err != nil {
		return ""
	}
	if _, err := strconv.ParseUint(parts[1][16:], 16, 64); err != nil {
		return ""
	}
	return parts[1]
}

// deadGroup is the dead letters of one consumer that failed with one error class and message.
type deadGroup struct {
	Consumer, Class, Message string
	Letters                  []inbox.DeadLetter
	// Retryable are the keys a group retry releases: dead or parked letters that can go
	// through the inbox; the others are still retried by their source, already stored, or
	// cannot be retried through the inbox (their DLQ copy can be redriven).
	Retryable  []string
	LastFailed time.Time
	States     []stateCount
}

type stateCount struct {
	State string
	N     int
}

// deadView is the dead-letter page.
type deadView struct {
	Groups      []deadGroup
	Quarantined []outbox.QuarantinedRow
	Parked      []inbox.ParkedEvent
	Letters     int
}

var (
	uuidPattern   = regexp.MustCompile(`[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}`)
	numberPattern = regexp.MustCompile(`\d+`)
)

// errorGroup is the message dead letters are grouped by: the error's first line, with UUIDs
// and numbers replaced by placeholders, so that "order 17 not found" and "order 18 not found"
// are one group.
func errorGroup(text string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(text), "\n")
	line = uuidPattern.ReplaceAllString(line, "<id>")
	line = numberPattern.ReplaceAllString(line, "<n>")
	if len(line) > 300 {
		line = strings.ToValidUTF8(line[:300], "") + "…"
	}
	return line
}

// groupDeadLetters groups letters by consumer, error class and errorGroup, the group with the
// most recent failure first.
func groupDeadLetters(letters []inbox.DeadLetter) []deadGroup {
	type gk struct{ consumer, class, msg string }
	idx := map[gk]int{}
	var groups []deadGroup
	for _, d := range letters {
		k := gk{d.Consumer, d.ErrorClass, errorGroup(d.Error)}
		i, ok := idx[k]
		if !ok {
			i = len(groups)
			idx[k] = i
			groups = append(groups, deadGroup{Consumer: k.consumer, Class: k.class, Message: k.msg})
		}
		g := &groups[i]
		g.Letters = append(g.Letters, d)
		if d.LastFailedAt.After(g.LastFailed) {
			g.LastFailed = d.LastFailedAt
		}
		if (d.State == inbox.DeadDead || d.State == inbox.DeadParked) && d.MessageID != "" && d.ErrorClass != inbox.ClassClaimCheck {
			g.Retryable = append(g.Retryable, d.Key)
		}
	}
	for i := range groups {
		counts := map[string]int{}
		for _, d := range groups[i].Letters {
			counts[string(d.State)]++
		}
		for _, st := range []inbox.DeadLetterState{inbox.DeadDead, inbox.DeadFailing, inbox.DeadRetrying, inbox.DeadParked} {
			if n := counts[string(st)]; n > 0 {
				groups[i].States = append(groups[i].States, stateCount{string(st), n})
			}
		}
	}
	slices.SortStableFunc(groups, func(a, b deadGroup) int { return b.LastFailed.Compare(a.LastFailed) })
	return groups
}

func (s *Server) deadPage(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	letters, err := inbox.ListDeadLetters(ctx, s.cfg.DB, inbox.DeadLetterFilter{Limit: deadLimit})
	if err != nil {
		s.failed(w, r, err)
		return
	}
	v := deadView{Groups: groupDeadLetters(letters), Letters: len(letters)}
	if v.Quarantined, err = outbox.ListQuarantined(ctx, s.cfg.DB, listLimit); err != nil {
		s.failed(w, r, err)
		return
	}
	if v.Parked, err = inbox.ListParked(ctx, s.cfg.DB, "", listLimit); err != nil {
		s.failed(w, r, err)
		return
	}
	s.render(w, r, http.StatusOK, "dead", "Dead letters", "dead", v)
}

// letterView is one dead letter's page.
type letterView struct {
	inbox.DeadLetter
	HeaderNames []string
	Payload     payloadView
}

func (s *Server) deadLetterPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	consumer, key := q.Get("consumer"), q.Get("key")
	if consumer == "" || key == "" {
		s.refuse(w, r, http.StatusBadRequest, "name the dead letter: /dead/letter?consumer=NAME&key=KEY")
		return
	}
	found, err := inbox.ListDeadLetters(r.Context(), s.cfg.DB, inbox.DeadLetterFilter{Consumer: consumer, Keys: []string{key}, IncludeApplied: true, Limit: 1})
	if err != nil {
		s.failed(w, r, err)
		return
	}
	if len(found) == 0 {
		s.refuse(w, r, http.StatusNotFound, fmt.Sprintf("no dead letter %q of consumer %q", key, consumer))
		return
	}
	v := letterView{DeadLetter: found[0], Payload: s.viewPayload(found[0].Payload, len(found[0].Payload))}
	v.DeadLetter.Payload = "" // shown through Payload only, which honours HidePayloads
	for k := range v.Headers {
		v.HeaderNames = append(v.HeaderNames, k)
	}
	slices.Sort(v.HeaderNames)
	s.render(w, r, http.StatusOK, "letter", "Dead letter "+key, "dead", v)
}

// retryRequest reads a retry's rows from a form or query: consumer, id (repeated), all.
func retryRequest(r *http.Request) (RetryRequest, error) {
	if err := r.ParseForm(); err != nil {
		return RetryRequest{}, err
	}
	req := RetryRequest{Consumer: r.Form.Get("consumer"), IDs: r.Form["id"], All: r.Form.Get("all") == "1"}
	if req.All == (len(req.IDs) > 0) {
		return RetryRequest{}, errors.New("name the rows to retry (id=...) or all=1, not both and not neither")
	}
	return req, nil
}

// planView is the confirmation page of a retry.
type planView struct {
	Request RetryRequest
	Plan    Plan
	Result  string
	Error   string
}

// planPage shows what a retry would change: the CLI's dry run. It changes nothing, so it is
// shown in read-only mode too (without the button that confirms it).
func (s *Server) planPage(w http.ResponseWriter, r *http.Request) {
	req, err := retryRequest(r)
	if err != nil {
		s.refuse(w, r, http.StatusBadRequest, err.Error())
		return
	}
	if s.cfg.Actions == nil {
		s.render(w, r, http.StatusOK, "plan", "Retry", "dead", planView{Request: req,
			Error: "The console is read-only: start it with --allow-actions to retry. The CLI does the same: " + retryCommand(req, true)})
		return
	}
	plan, err := s.cfg.Actions.PlanRetry(r.Context(), req)
	v := planView{Request: req, Plan: plan}
	if err != nil {
		v.Error = err.Error()
	}
	s.render(w, r, http.StatusOK, "plan", "Retry", "dead", v)
}

// retryPost applies a confirmed plan: refused in read-only mode and without a valid CSRF token.
func (s *Server) retryPost(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Actions == nil {
		s.refuse(w, r, http.StatusForbidden, "the console is read-only: start it with --allow-actions to retry; nothing was changed")
		return
	}
	if err := s.checkPost(r); err != nil {
		s.refuse(w, r, http.StatusForbidden, err.Error()+"; nothing was changed")
		return
	}
	req, err := retryRequest(r)
	if err != nil {
		s.refuse(w, r, http.StatusBadRequest, err.Error())
		return
	}
	digest := r.PostFormValue("digest")
	if digest == "" {
		s.refuse(w, r, http.StatusBadRequest, "no plan was confirmed; nothing was changed")
		return
	}
	out, err := s.cfg.Actions.Retry(r.Context(), req, digest)
	v := planView{Request: req, Result: out}
	status := http.StatusOK
	if err != nil {
		v.Error = err.Error()
		status = http.StatusConflict
		if !errors.Is(err, ErrPlanChanged) {
			status = http.StatusInternalServerError
		}
		if plan, perr := s.cfg.Actions.PlanRetry(r.Context(), req); perr == nil {
			v.Plan = plan // the plan as it stands now, to confirm again
		}
	}
	s.render(w, r, status, "plan", "Retry", "dead", v)
}

// auditView is the audit page.
type auditView struct {
	On              bool
	Consumer, Since string
	Ran             bool
	Report          string
	Verdict, Error  string
}

// auditPage runs `sluice audit` when the form was submitted (it only reads).
func (s *Server) auditPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	v := auditView{On: s.cfg.Audit != nil, Consumer: strings.TrimSpace(q.Get("consumer")), Since: strings.TrimSpace(q.Get("since"))}
	if v.Since == "" {
		v.Since = "1h"
	}
	if v.On && q.Has("since") {
		res, err := s.cfg.Audit(r.Context(), v.Consumer, v.Since)
		v.Ran, v.Report, v.Verdict = err == nil, res.Report, res.Problems
		if err != nil {
			v.Error = err.Error()
		}
	}
	s.render(w, r, http.StatusOK, "audit", "Audit", "audit", v)
}

// fleetView is the fleet page: the fleet relay's own view of its tenants (TurnsOn), and the
// tenant databases read now (On).
type fleetView struct {
	Now time.Time
	On  bool
	// Report is Config.Fleet's reading, Error its failure.
	Report FleetReport
	Error  string
	// Turns are Config.FleetTurns' rows, TurnsError its failure; Failing, SweepOnly and
	// Unrecorded count its failing tenants, sweep-only ones, and those without a recorded turn.
	TurnsOn                        bool
	Turns                          []fleet.TurnState
	TurnsError                     string
	Failing, SweepOnly, Unrecorded int
}

// fleetPage reads the fleet relay's view of its tenants and every tenant database (it only reads).
func (s *Server) fleetPage(w http.ResponseWriter, r *http.Request) {
	v := fleetView{Now: time.Now(), On: s.cfg.Fleet != nil, TurnsOn: s.cfg.FleetTurns != nil}
	if v.TurnsOn {
		var err error
		if v.Turns, err = s.cfg.FleetTurns(r.Context()); err != nil {
			v.TurnsError = err.Error()
		}
		for _, t := range v.Turns {
			switch {
			case t.State == "":
				v.Unrecorded++
			case t.State == fleet.StateFailing:
				v.Failing++
			}
			if t.SweepOnly() {
				v.SweepOnly++
			}
		}
	}
	if v.On {
		var err error
		if v.Report, err = s.cfg.Fleet(r.Context()); err != nil {
			v.Error = err.Error()
		}
	}
	s.render(w, r, http.StatusOK, "fleet", "Fleet", "fleet", v)
}

// knownDLQ reports whether dlq is the DLQ of a queue the console reads (Config.Queues): the
// console redrives no other queue.
func (s *Server) knownDLQ(dlq string) bool {
	qs, _, _ := s.queues.get()
	for _, q := range qs {
		if q.DLQ != "" && q.DLQ == dlq {
			return true
		}
	}
	return false
}

// redriveView is the confirmation page of a redrive.
type redriveView struct {
	DLQ    string
	Plan   Plan
	Result string
	Error  string
}

// redrivePlanPage shows what a redrive of one of the console's DLQs would move: the CLI's dry run.
func (s *Server) redrivePlanPage(w http.ResponseWriter, r *http.Request) {
	dlq := r.URL.Query().Get("dlq")
	if !s.knownDLQ(dlq) {
		s.refuse(w, r, http.StatusBadRequest, fmt.Sprintf("%q is not the DLQ of a queue this console reads (--queue)", dlq))
		return
	}
	v := redriveView{DLQ: dlq}
	if s.cfg.Actions == nil {
		v.Error = "The console is read-only: start it with --allow-actions to redrive. The CLI does the same: sluice redrive --dlq " + shellQuote(dlq) + " --dry-run"
		s.render(w, r, http.StatusOK, "redrive", "Redrive", "", v)
		return
	}
	plan, err := s.cfg.Actions.PlanRedrive(r.Context(), dlq)
	v.Plan = plan
	if err != nil {
		v.Error = err.Error()
	}
	s.render(w, r, http.StatusOK, "redrive", "Redrive", "", v)
}

// redrivePost applies a confirmed redrive plan: refused in read-only mode, without a valid CSRF
// token, and for a queue that is not one of the console's DLQs.
func (s *Server) redrivePost(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Actions == nil {
		s.refuse(w, r, http.StatusForbidden, "the console is read-only: start it with --allow-actions to redrive; nothing was moved")
		return
	}
	if err := s.checkPost(r); err != nil {
		s.refuse(w, r, http.StatusForbidden, err.Error()+"; nothing was moved")
		return
	}
	dlq, digest := r.PostFormValue("dlq"), r.PostFormValue("digest")
	if !s.knownDLQ(dlq) || digest == "" {
		s.refuse(w, r, http.StatusBadRequest, "no plan of a known DLQ was confirmed; nothing was moved")
		return
	}
	out, err := s.cfg.Actions.Redrive(r.Context(), dlq, digest)
	v := redriveView{DLQ: dlq, Result: out}
	status := http.StatusOK
	if err != nil {
		v.Error, status = err.Error(), http.StatusInternalServerError
		if errors.Is(err, ErrPlanChanged) {
			status = http.StatusConflict
			if plan, perr := s.cfg.Actions.PlanRedrive(r.Context(), dlq); perr == nil {
				v.Plan = plan
			}
		}
	}
	s.render(w, r, status, "redrive", "Redrive", "", v)
}

// retryCommand is the `sluice dead retry` command line of req.
func retryCommand(req RetryRequest, dryRun bool) string {
	args := []string{"sluice", "dead", "retry"}
	if req.Consumer != "" {
		args = append(args, "--consumer", shellQuote(req.Consumer))
	}
	if req.All {
		args = append(args, "--all")
	}
	for _, id := range req.IDs {
		args = append(args, shellQuote(id))
	}
	if dryRun {
		args = append(args, "--dry-run")
	}
	return strings.Join(args, " ")
}

// RetryCommand is the `sluice dead retry --dry-run` command line of req, which prints the plan
// the console shows.
func RetryCommand(req RetryRequest) string { return retryCommand(req, true) }

var plainWord = regexp.MustCompile(`^[A-Za-z0-9_./:@%+=,-]+$`)

func shellQuote(s string) string {
	if plainWord.MatchString(s) {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// funcs are the templates' helpers.
var funcs = template.FuncMap{
	"age": func(now, t time.Time) string { return human.Duration(now.Sub(t)) },
	"dur": human.Duration,
	"ts": func(t any) string {
		switch v := t.(type) {
		case time.Time:
			return v.UTC().Format("2006-01-02 15:04:05Z")
		case *time.Time:
			if v == nil {
				return "-"
			}
			return v.UTC().Format("2006-01-02 15:04:05Z")
		}
		return fmt.Sprint(t)
	},
	"clip": func(n int, s string) string {
		s = strings.Join(strings.Fields(s), " ")
		if len(s) <= n {
			return s
		}
		return strings.ToValidUTF8(s[:n], "") + "…"
	},
	"after": func(a *time.Time, b time.Time) bool { return a != nil && a.After(b) },
	"wait":  func(r outbox.ChainRow) string { return string(r.Wait) },
	"cmd":   RetryCommand,
	"bytes": func(n int) string {
		switch {
		case n >= 1<<20:
			return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
		case n >= 1<<10:
			return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
		}
		return fmt.Sprintf("%d bytes", n)
	},
	"first": func(n int, keys []string) []string { return keys[:min(n, len(keys))] },
}
