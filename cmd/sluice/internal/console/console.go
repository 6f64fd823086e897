// Package console is `sluice console`: an operator's web console over the outbox and the inbox,
// served from the same database connection the CLI uses. Pages are rendered on the server with
// html/template; the stylesheet and a small script (live updates of the overview) are embedded.
//
// It is safe by default: read-only unless Config.Actions is set (the CLI's --allow-actions);
// every action first shows the CLI's own dry-run plan and changes exactly what that plan listed,
// after a confirmation carried by a POST with a CSRF token; with a Token every request must
// carry it (bearer or basic auth); it never renders connection strings, and with HidePayloads
// no payload. CheckListen refuses a non-loopback address without a token.
package console

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/sluicehq/sluice/pkg/fleet"
)

// Querier is what the console reads with: a *pgxpool.Pool (or a *pgx.Conn).
type Querier interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// RetryRequest names rows to retry as `sluice dead retry` does: outbox row ids (IDs without
// Consumer), one consumer's parked rows and dead letters by message id (IDs with Consumer), or
// All (narrowed by Consumer).
type RetryRequest struct {
	Consumer string
	IDs      []string
	All      bool
}

// Plan is what a retry would change: the text `sluice dead retry --dry-run` prints, how many rows
// it chose, and a digest of exactly those rows.
type Plan struct {
	Text   string
	Chosen int
	// Digest identifies the chosen rows; Retry changes nothing when the rows it would choose
	// now have another digest.
	Digest string
	// Command is the equivalent command line.
	Command string
}

// Queue is an SQS queue's depth and its DLQ's, as the overview shows them.
type Queue struct {
	URL                        string
	Visible, InFlight, Delayed int64
	// DLQ is the dead-letter queue's URL ("" when the queue has no redrive policy), DLQVisible
	// its visible messages.
	DLQ        string
	DLQVisible int64
}

// LagPoint is one point of the relay's lag history (Config.LagHistory): the oldest pending row's
// age and the pending rows at a time (the maxima of a period, for CloudWatch).
type LagPoint struct {
	At        time.Time
	OldestAge time.Duration
	Pending   int64
}

// LagHistoryEvery is how often the sampler reads Config.LagHistory: the relay's metrics have a
// one-minute resolution.
const LagHistoryEvery = time.Minute

// FleetReport is what `sluice status --fleet` printed: a line per tenant, failing ones first
// with their error, then the worst backlog first.
type FleetReport struct {
	Text             string
	Tenants, Failing int
}

// AuditResult is what `sluice audit` printed and found.
type AuditResult struct {
	// Report is the report as the command prints it.
	Report string
	// Problems says what is missing or was never published; "" when nothing is.
	Problems string
}

// ErrPlanChanged is returned by Actions.Retry when the rows chosen now are not those of the
// plan the operator confirmed: nothing was changed.
var ErrPlanChanged = errors.New("the rows to retry changed since the plan was shown; nothing was changed")

// Actions are the changes the console can make, implemented by the CLI's own commands (the
// console has no second implementation of them).
type Actions interface {
	// PlanRetry chooses the rows as `sluice dead retry --dry-run` does, and changes nothing.
	PlanRetry(ctx context.Context, req RetryRequest) (Plan, error)
	// Retry chooses the rows again and, when their digest is digest, retries exactly those,
	// returning the report `sluice dead retry` prints; otherwise ErrPlanChanged.
	Retry(ctx context.Context, req RetryRequest, digest string) (string, error)
	// PlanRedrive is `sluice redrive --dlq DLQ --max N --dry-run`, N being the DLQ's visible
	// messages now: it names the destination and moves nothing.
	PlanRedrive(ctx context.Context, dlq string) (Plan, error)
	// Redrive moves at most the plan's N messages to the plan's destination when digest is the
	// plan's, returning the report `sluice redrive` prints; otherwise ErrPlanChanged.
	Redrive(ctx context.Context, dlq, digest string) (string, error)
}

// Defaults of Config.
const (
	// DefaultListen is where `sluice console` listens: the loopback interface only.
	DefaultListen = "127.0.0.1:8089"
	// DefaultSampleEvery is how often the console samples the outbox's lag for its chart.
	DefaultSampleEvery = 10 * time.Second
	// ChartWindow is how far back the lag chart reaches.
	ChartWindow = time.Hour
	// DefaultPayloadLimit is how much of a payload a page shows before truncating it.
	DefaultPayloadLimit = 64 << 10
)

// Config configures a console Server.
type Config struct {
	// DB is the database the console reads (and acts on, through Actions). Required.
	DB Querier
	// Actions, when set, allows the actions (the CLI's --allow-actions). Defaults to nil:
	// read-only; every POST is refused.
	Actions Actions
	// Token, when set, must come with every request: as "Authorization: Bearer TOKEN", or as
	// the password of basic auth (any user name), which browsers prompt for. Defaults to "":
	// no authentication (loopback only, see CheckListen).
	Token string
	// HidePayloads shows payloads' sizes but never their contents. Defaults to false.
	HidePayloads bool
	// PayloadLimit is how many bytes of a payload a page shows. Defaults to DefaultPayloadLimit.
	PayloadLimit int
	// SampleEvery is the lag chart's sampling interval. Defaults to DefaultSampleEvery.
	SampleEvery time.Duration
	// Database names the database in the page header, without credentials (e.g. "db.internal:5432/orders").
	// Defaults to "".
	Database string
	// ClaimCheckBucket and ClaimCheckPrefix, when the relays offload large payloads to S3, let
	// an event's page say where its payload is published. Default "": not shown.
	ClaimCheckBucket, ClaimCheckPrefix string
	// ClaimCheckThreshold is the payload size above which a relay with a claim check offloads.
	// Defaults to 0: not shown.
	ClaimCheckThreshold int
	// AllowedHosts are host names (without port) the console answers to besides loopback ones
	// when it has no Token, e.g. the name an authenticating proxy forwards. Without a token, a
	// request for another host is refused, so that a web page cannot reach the console through
	// DNS rebinding. Defaults to none.
	AllowedHosts []string
	// Queues, when set, reads the SQS queues the overview shows with their DLQs (the CLI's
	// --queue). The sampler calls it every SampleEvery, so a slow AWS API never slows a page;
	// the overview shows the last reading and its time. Defaults to nil: no queues.
	Queues func(context.Context) ([]Queue, error)
	// Audit, when set, runs `sluice audit` for the audit page: consumer ("" for every one)
	// since a time or a duration ago; an error when it could not run. Defaults to nil: no
	// audit page.
	Audit func(ctx context.Context, consumer, since string) (AuditResult, error)
	// Fleet, when set, reads every tenant of a fleet as `sluice status --fleet` does, for the
	// fleet page. Defaults to nil: no fleet page.
	Fleet func(context.Context) (FleetReport, error)
	// LagHistory, when set, reads the relay's lag over [since, until] from where its metrics
	// are kept (CloudWatch: the CLI's --cloudwatch-namespace), oldest first; the overview's lag
	// charts then show it instead of the console's own samples, which stay the fallback while it
	// fails or has no datapoints. The sampler calls it at start and every LagHistoryEvery, so a
	// slow API never slows a page. Defaults to nil: the console's own samples.
	LagHistory func(ctx context.Context, since, until time.Time) ([]LagPoint, error)
	// LagHistorySource names where LagHistory reads, for the charts' caption (no secrets), e.g.
	// "CloudWatch Sluice/OutboxOldestPendingAgeSeconds {Service=relay} in eu-west-1".
	LagHistorySource string
	// FleetTurns, when set, reads the fleet relay's own view of its registered tenants, worst
	// first, as `sluice fleet status` does (from fleet.TurnStateTable in the control database):
	// a tenant without a recorded turn has its name alone. The fleet page shows it. Defaults to
	// nil: not shown.
	FleetTurns func(context.Context) ([]fleet.TurnState, error)
	// Logger logs requests that failed. Defaults to slog.Default().
	Logger *slog.Logger
}

//go:embed templates/*.html static/*
var assets embed.FS

// Server is the console's HTTP handler and its lag sampler.
type Server struct {
	cfg     Config
	pages   *template.Template
	static  http.Handler
	mux     *http.ServeMux
	samples *samples
	queues  reading[[]Queue]
	history reading[[]LagPoint]
	// csrfKey signs the CSRF tokens: a token is HMAC(csrfKey, the browser's cookie).
	csrfKey []byte
}

// New checks cfg and returns a Server. Run its sampler with Run.
func New(cfg Config) (*Server, error) {
	if cfg.DB == nil {
		return nil, errors.New("console: Config.DB is required")
	}
	if cfg.PayloadLimit <= 0 {
		cfg.PayloadLimit = DefaultPayloadLimit
	}
	if cfg.SampleEvery <= 0 {
		cfg.SampleEvery = DefaultSampleEvery
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	pages, err := template.New("").Funcs(funcs).ParseFS(assets, "templates/*.html")
	if err != nil {
		return nil, fmt.Errorf("console: parse templates: %w", err)
	}
	static, err := fs.Sub(assets, "static")
	if err != nil {
		return nil, err
	}
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, pages: pages, static: http.StripPrefix("/static/", http.FileServerFS(static)),
		samples: newSamples(int(ChartWindow / cfg.SampleEvery)), csrfKey: key}
	s.routes()
	return s, nil
}

// CheckListen refuses to listen on a non-loopback address without a token: the console shows
// the outbox's rows (and, with actions, changes them) to whoever reaches it.
func CheckListen(addr string, token string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("--listen %q is not HOST:PORT: %v", addr, err)
	}
	if isLoopback(host) || token != "" {
		return nil
	}
	return fmt.Errorf("--listen %s is not a loopback address: pass --token (or set SLUICE_CONSOLE_TOKEN) so that only those who have it get in, or listen on 127.0.0.1 and reach it through SSM port forwarding or an authenticating proxy (docs/console.md)", addr)
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// Run samples the outbox's lag every SampleEvery (and reads the queues, and the lag history
// every LagHistoryEvery) until ctx ends.
func (s *Server) Run(ctx context.Context) {
	t := time.NewTicker(s.cfg.SampleEvery)
	defer t.Stop()
	for {
		s.sample(ctx)
		s.readQueues(ctx)
		s.readHistory(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// ServeHTTP serves the console: authentication, security headers, then the page.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cache-Control", "no-store")
	if s.cfg.Token != "" && !s.authorized(r) {
		h.Set("WWW-Authenticate", `Basic realm="sluice console", charset="UTF-8"`)
		http.Error(w, "sluice console: a token is required (bearer, or as the basic-auth password)", http.StatusUnauthorized)
		return
	}
	if s.cfg.Token == "" && !s.knownHost(r.Host) {
		http.Error(w, "sluice console: host "+r.Host+" is not served (use 127.0.0.1 or localhost, or start the console with --allow-host)", http.StatusMisdirectedRequest)
		return
	}
	s.mux.ServeHTTP(w, r)
}

// knownHost reports whether the Host header names a loopback host or an allowed one.
func (s *Server) knownHost(hostport string) bool {
	host := hostport
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		host = h
	}
	host = strings.Trim(host, "[]")
	return isLoopback(host) || slices.Contains(s.cfg.AllowedHosts, host)
}

// authorized reports whether r carries the token, as a bearer token or a basic-auth password.
func (s *Server) authorized(r *http.Request) bool {
	got := ""
	if _, pw, ok := r.BasicAuth(); ok {
		got = pw
	} else if b, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		got = strings.TrimSpace(b)
	}
	want := sha256.Sum256([]byte(s.cfg.Token))
	have := sha256.Sum256([]byte(got))
	return got != "" && subtle.ConstantTimeCompare(want[:], have[:]) == 1
}

// csrfCookie is the cookie a CSRF token is bound to: a random value per browser.
const csrfCookie = "sluice_console_csrf"

// csrfToken returns the token forms carry, setting the browser's cookie when it has none.
func (s *Server) csrfToken(w http.ResponseWriter, r *http.Request) string {
	c, err := r.Cookie(csrfCookie)
	value := ""
	if err == nil && len(c.Value) == 64 {
		value = c.Value
	} else {
		b := make([]byte, 32)
		_, _ = rand.Read(b)
		value = hex.EncodeToString(b)
		http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: value, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	}
	return s.sign(value)
}

func (s *Server) sign(value string) string {
	m := hmac.New(sha256.New, s.csrfKey)
	m.Write([]byte(value))
	return hex.EncodeToString(m.Sum(nil))
}

// checkPost refuses a POST without a valid CSRF token (the form field "csrf" signed for the
// browser's cookie) or from another origin.
func (s *Server) checkPost(r *http.Request) error {
	if o := r.Header.Get("Origin"); o != "" && o != "null" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return fmt.Errorf("a request from origin %s is refused", o)
		}
	}
	c, err := r.Cookie(csrfCookie)
	if err != nil {
		return errors.New("no CSRF cookie: reload the page and try again")
	}
	got := r.PostFormValue("csrf")
	if got == "" || !hmac.Equal([]byte(got), []byte(s.sign(c.Value))) {
		return errors.New("missing or invalid CSRF token: reload the page and try again")
	}
	return nil
}
