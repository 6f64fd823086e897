package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/cmd/sluice/internal/console"
	"github.com/sluicehq/sluice/pkg/fleet"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
	"github.com/sluicehq/sluice/pkg/metrics"
)

// EnvConsoleToken is the environment variable `sluice console` reads its token from when
// --token is not given (a flag's value shows in the process list; the environment's does not).
const EnvConsoleToken = "SLUICE_CONSOLE_TOKEN"

// ConsoleActions are the console's actions, done by the CLI's own commands: a retry's plan is
// RetryDead's dry run printed as `sluice dead retry --dry-run` prints it, and the retry is
// RetryDead, which releases exactly the rows of the confirmed plan.
type ConsoleActions struct {
	DB Querier
	// SQS redrives the DLQs of the console's queues (--queue). Nil: no redrive.
	SQS SQSAPI
}

var _ console.Actions = ConsoleActions{}

func (c ConsoleActions) options(req console.RetryRequest) (DeadRetryOptions, error) {
	opts := DeadRetryOptions{Consumer: req.Consumer, All: req.All, IDs: req.IDs}
	if opts.All == (len(opts.IDs) > 0) {
		return opts, usagef("give either all or the ids to retry, not both and not neither")
	}
	if opts.Consumer == "" {
		if _, err := outboxIDs(opts.IDs); err != nil {
			return opts, err
		}
	}
	return opts, nil
}

// PlanRetry is `sluice dead retry --dry-run`: it chooses the rows and changes nothing.
func (c ConsoleActions) PlanRetry(ctx context.Context, req console.RetryRequest) (console.Plan, error) {
	opts, err := c.options(req)
	if err != nil {
		return console.Plan{}, err
	}
	opts.DryRun = true
	res, err := RetryDead(ctx, c.DB, opts)
	if err != nil {
		return console.Plan{}, err
	}
	var text bytes.Buffer
	printDeadRetry(&text, res, true, false)
	return console.Plan{Text: text.String(), Chosen: res.Chosen(), Digest: retryDigest(res), Command: console.RetryCommand(req)}, nil
}

// Retry is `sluice dead retry --yes` whose confirmation checks that the rows chosen now are
// those of the plan the operator confirmed (digest): otherwise nothing is changed.
func (c ConsoleActions) Retry(ctx context.Context, req console.RetryRequest, digest string) (string, error) {
	opts, err := c.options(req)
	if err != nil {
		return "", err
	}
	opts.Confirm = func(plan DeadRetryResult) error {
		if retryDigest(plan) != digest {
			return console.ErrPlanChanged
		}
		return nil
	}
	res, err := RetryDead(ctx, c.DB, opts)
	if err == nil && res.Chosen() == 0 && retryDigest(res) != digest {
		err = console.ErrPlanChanged
	}
	var text bytes.Buffer
	if err == nil {
		printDeadRetry(&text, res, false, true)
	}
	return text.String(), err
}

// PlanRedrive is `sluice redrive --dlq DLQ --max N --dry-run` with N the DLQ's visible
// messages now: the console moves at most the messages the operator saw counted.
func (c ConsoleActions) PlanRedrive(ctx context.Context, dlq string) (console.Plan, error) {
	if c.SQS == nil {
		return console.Plan{}, errors.New("the console reads no queue (--queue): nothing to redrive")
	}
	q, err := describeQueue(ctx, c.SQS, dlq)
	if err != nil {
		return console.Plan{}, err
	}
	if q.Visible == 0 {
		return console.Plan{Text: "the DLQ has no visible message to move\n", Command: "sluice redrive --dlq " + dlq + " --dry-run"}, nil
	}
	var plan RedrivePlan
	opts := RedriveOptions{DLQ: dlq, Max: int(q.Visible), DryRun: true, Confirm: func(p RedrivePlan) error { plan = p; return nil }}
	if _, err := Redrive(ctx, c.SQS, opts); err != nil {
		return console.Plan{}, err
	}
	return console.Plan{Text: plan.line(true) + "\n", Chosen: plan.Max, Digest: redriveDigest(plan),
		Command: fmt.Sprintf("sluice redrive --dlq %s --max %d --dry-run", dlq, plan.Max)}, nil
}

// Redrive is `sluice redrive --dlq DLQ --max N --yes` for the plan of digest: it moves nothing
// when the destination is no longer the plan's.
func (c ConsoleActions) Redrive(ctx context.Context, dlq, digest string) (string, error) {
	if c.SQS == nil {
		return "", errors.New("the console reads no queue (--queue): nothing to redrive")
	}
	n, _, ok := strings.Cut(digest, "-")
	limit, err := strconv.Atoi(n)
	if !ok || err != nil || limit < 1 {
		return "", console.ErrPlanChanged
	}
	opts := RedriveOptions{DLQ: dlq, Max: limit, Confirm: func(p RedrivePlan) error {
		if redriveDigest(p) != digest {
			return console.ErrPlanChanged
		}
		return nil
	}}
	res, err := Redrive(ctx, c.SQS, opts)
	if err != nil && errors.Is(err, console.ErrPlanChanged) {
		return "", err
	}
	out := res.line(dlq) + "\n"
	if res.Note != "" {
		out += res.Note + "\n"
	}
	return out, err
}

// redriveDigest identifies a redrive plan: at most Max messages from DLQ to Destination. It
// starts with Max, which Redrive reads back.
func redriveDigest(p RedrivePlan) string {
	h := sha256.Sum256([]byte(p.DLQ + "\x00" + p.Destination + "\x00" + strconv.Itoa(p.Max)))
	return strconv.Itoa(p.Max) + "-" + hex.EncodeToString(h[:])
}

// retryDigest identifies the rows a retry chose: outbox row ids, parked rows and dead letters
// by consumer and key.
func retryDigest(res DeadRetryResult) string {
	var ids []string
	for _, r := range res.Outbox {
		ids = append(ids, "outbox/"+strconv.FormatInt(r.ID, 10))
	}
	for _, p := range res.Inbox {
		ids = append(ids, "parked/"+p.Consumer+"\x00"+p.MessageID)
	}
	for _, d := range res.DeadLetters {
		ids = append(ids, "dead/"+d.Consumer+"\x00"+d.Key)
	}
	slices.Sort(ids)
	h := sha256.New()
	for _, id := range ids {
		h.Write([]byte(id))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

// consoleOptions are `sluice console`'s flags.
type consoleOptions struct {
	listen       string
	token        string
	allowActions bool
	hidePayloads bool
	allowHosts   []string
	sampleEvery  time.Duration
	queues       []string
	// cwNamespace and cwRegion: the lag charts from the relay's CloudWatch metrics.
	cwNamespace, cwRegion string
}

func (a *app) consoleCommand() *cobra.Command {
	o := consoleOptions{listen: console.DefaultListen, sampleEvery: console.DefaultSampleEvery}
	var src fleetSource
	cmd := &cobra.Command{
		Use:   "console",
		Short: "Serve an operator's web console: overview, a key's chain, events, dead letters",
		Long: `Serve a web console over the outbox and the inbox of the database: an overview per destination
and consumer with a lag chart of the last hour (sampled while it runs, or with
--cloudwatch-namespace the relay's CloudWatch metrics) that the server pushes live (server-sent
events), a partition key's pending rows and why each waits, an event's payload and state, dead
letters grouped by error class and message, and with --fleet-registry the fleet relay's own view
of its tenants (as sluice fleet status shows it).

It is read-only unless started with --allow-actions; then each retry first shows the plan of
` + "`sluice dead retry --dry-run`" + ` and changes exactly those rows once confirmed. It listens on
127.0.0.1 by default and refuses any other address without --token ($` + EnvConsoleToken + `),
which every request must then carry (as a bearer token, or as the basic-auth password a browser
asks for). --hide-payloads never shows payloads. docs/console.md says how to reach it in AWS.`,
		Example: `  sluice console
  sluice console --allow-actions --listen 127.0.0.1:9000
  sluice console --cloudwatch-namespace Sluice --fleet-registry postgres://sluice@control/fleet
  SLUICE_CONSOLE_TOKEN=$(openssl rand -hex 16) sluice console --listen 0.0.0.0:8089 --hide-payloads`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.token == "" {
				o.token = a.io.Getenv(EnvConsoleToken)
			}
			if err := console.CheckListen(o.listen, o.token); err != nil {
				return usageError{err}
			}
			if o.sampleEvery < time.Second {
				return usagef("--sample-every must be at least 1s, got %s", o.sampleEvery)
			}
			ctx := cmd.Context()
			pool, err := a.db(ctx)
			if err != nil {
				return err
			}
			u, _ := a.databaseURLResolved(ctx)
			cfg := console.Config{DB: pool, Token: o.token, HidePayloads: o.hidePayloads, SampleEvery: o.sampleEvery,
				Database: databaseLabel(u), AllowedHosts: o.allowHosts,
				ClaimCheckBucket: a.io.Getenv(lambdaenv.ClaimCheckBucket), ClaimCheckPrefix: a.io.Getenv(lambdaenv.ClaimCheckPrefix),
				Logger: slog.New(slog.NewJSONHandler(a.io.Err, nil))}
			if cfg.ClaimCheckBucket != "" {
				if cfg.ClaimCheckThreshold, err = lambdaenv.ClaimCheckThresholdOf(a.io.Getenv); err != nil {
					return err
				}
			}
			if src.tenantsFile == "-" {
				return usagef("--fleet-tenants - (stdin) cannot be read again at each visit of the fleet page: name a file")
			}
			if src.tenantsFile != "" || src.registryURL != "" {
				cfg.Fleet = func(ctx context.Context) (console.FleetReport, error) { return a.consoleFleet(ctx, src) }
				if src.registryURL != "" || a.io.Getenv(lambdaenv.FleetRegistryURL) != "" || a.io.Getenv(lambdaenv.FleetRegistrySecretARN) != "" {
					// The fleet relay's own view, from the control database: sluice fleet status's reader.
					cfg.FleetTurns = func(ctx context.Context) ([]fleet.TurnState, error) {
						ft, err := a.fleetTurns(ctx, src)
						return ft.Tenants, err
					}
				}
			}
			cfg.Audit = func(ctx context.Context, consumer, since string) (console.AuditResult, error) {
				return ConsoleAudit(ctx, pool, consumer, since)
			}
			var sqsc SQSAPI
			if len(o.queues) > 0 {
				if sqsc, err = a.sqsClient(ctx); err != nil {
					return err
				}
				// A wrong URL is reported now, not on the page.
				if _, err := consoleQueues(ctx, sqsc, o.queues); err != nil {
					return err
				}
				cfg.Queues = func(ctx context.Context) ([]console.Queue, error) { return consoleQueues(ctx, sqsc, o.queues) }
			}
			if o.cwNamespace != "" {
				if cfg.LagHistory, cfg.LagHistorySource, err = a.consoleLagHistory(ctx, o.cwNamespace, o.cwRegion); err != nil {
					return err
				}
			} else if o.cwRegion != "" {
				return usagef("--cloudwatch-region needs --cloudwatch-namespace")
			}
			if o.allowActions {
				cfg.Actions = ConsoleActions{DB: pool, SQS: sqsc}
			}
			srv, err := console.New(cfg)
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", o.listen)
			if err != nil {
				return fmt.Errorf("listen on %s: %w", o.listen, err)
			}
			mode := "read-only"
			if o.allowActions {
				mode = "actions allowed"
			}
			fmt.Fprintf(a.io.Out, "sluice console on http://%s (%s)\n", ln.Addr(), mode)
			return ServeConsole(ctx, srv, ln)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&o.listen, "listen", o.listen, "HOST:PORT to listen on; an address other than loopback needs --token")
	fl.StringVar(&o.token, "token", "", "token every request must carry (bearer, or basic-auth password); default $"+EnvConsoleToken)
	fl.BoolVar(&o.allowActions, "allow-actions", false, "allow retries (each shows its dry-run plan and asks for confirmation); read-only without it")
	fl.BoolVar(&o.hidePayloads, "hide-payloads", false, "never show payloads (sizes only), for sensitive data")
	fl.StringArrayVar(&o.allowHosts, "allow-host", nil, "host name besides localhost the console answers to without --token, e.g. the name an authenticating proxy forwards (repeatable)")
	fl.StringArrayVar(&o.queues, "queue", nil, "SQS queue URL whose depth and DLQ depth the overview shows, read every --sample-every (repeatable)")
	fl.StringVar(&o.cwNamespace, "cloudwatch-namespace", "", fmt.Sprintf("draw the lag charts from the relay's CloudWatch metrics in this `NAMESPACE` (the stack's: %s), read every minute; default: the console's own samples", metrics.Namespace))
	fl.StringVar(&o.cwRegion, "cloudwatch-region", "", "the `REGION` of --cloudwatch-namespace's metrics (default --region, $AWS_REGION)")
	src.flags(fl)
	fl.Var(&durationValue{d: &o.sampleEvery}, "sample-every", fmt.Sprintf("how often the lag chart samples the outbox (default %s)", console.DefaultSampleEvery))
	// Its own changes go through the dead retry command's code and plan, confirmed in the page.
	unguarded(cmd, "its retries run `sluice dead retry`'s code after its dry-run plan is shown and confirmed in the page, and only with --allow-actions")
	return cmd
}

// consoleFleet reads every tenant of the fleet as `sluice status --fleet` does, and prints it
// as that command does.
func (a *app) consoleFleet(ctx context.Context, src fleetSource) (console.FleetReport, error) {
	tenants, err := a.fleetTenants(ctx, src)
	if err != nil {
		return console.FleetReport{}, err
	}
	open, err := a.tenantOpener(ctx, tenants)
	if err != nil {
		return console.FleetReport{}, err
	}
	fs, err := ReadFleetStatus(ctx, tenants, FleetStatusOptions{Open: open.open})
	if err != nil {
		return console.FleetReport{}, err
	}
	var b strings.Builder
	if err := printFleetStatus(&b, fs); err != nil {
		return console.FleetReport{}, err
	}
	return console.FleetReport{Text: b.String(), Tenants: len(fs.Tenants), Failing: fs.Failing}, nil
}

// consoleQueues reads the queues' depths and their DLQs' as `sluice status --queue` does.
func consoleQueues(ctx context.Context, c SQSAPI, urls []string) ([]console.Queue, error) {
	out := make([]console.Queue, 0, len(urls))
	for _, u := range urls {
		qs, _, err := queueDepth(ctx, c, u)
		if err != nil {
			return nil, err
		}
		q := console.Queue{URL: qs.URL, Visible: qs.MessagesVisible, InFlight: qs.MessagesInFlight, Delayed: qs.MessagesDelayed}
		if qs.DLQ != nil {
			q.DLQ, q.DLQVisible = qs.DLQ.URL, qs.DLQ.MessagesVisible
		}
		out = append(out, q)
	}
	return out, nil
}

// ServeConsole serves srv on ln, with its lag sampler, until ctx ends.
func ServeConsole(ctx context.Context, srv *console.Server, ln net.Listener) error {
	sctx, stop := context.WithCancel(ctx)
	defer stop()
	// Requests end with ctx: the overview's event streams, which never end on their own, let
	// the shutdown below finish.
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second, BaseContext: func(net.Listener) context.Context { return sctx }}
	go srv.Run(sctx)
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	shut, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := hs.Shutdown(shut); err != nil {
		return err
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// databaseLabel names a database URL's host and database, never its user or password.
func databaseLabel(u string) string {
	p, err := url.Parse(u)
	if err != nil || p.Host == "" {
		return ""
	}
	return p.Host + p.Path
}
