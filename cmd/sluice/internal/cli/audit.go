package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/internal/audit"
)

// EnvInboxDatabaseURL names the inbox's database when it is not the outbox's (`sluice audit`).
const EnvInboxDatabaseURL = "SLUICE_INBOX_DATABASE_URL"

func (a *app) auditCommand() *cobra.Command {
	var (
		consumers  []string
		opts       audit.Options
		since      string
		inboxURL   string
		jsonOutput bool
	)
	cmd := &cobra.Command{
		Use:   "audit [--consumer NAME...] --since T [--until T] [--event-type TYPE...] [--inbox-database-url URL]",
		Short: "Check end to end that each consumer applied what the relay published",
		Long: `Compare what the relay published (outbox_event) with what each consumer applied
(inbox_event), for the events created in [--since, --until), and report per consumer:
  - events published and not applied, with their age and what the inbox holds (absent, pending
    in the asynchronous inbox, or parked: see 'sluice dead');
  - applied events the outbox never published (there should be none);
  - the commit-to-apply lag (p50, p90, p99, max).

The outbox and the inbox may be in different databases (--inbox-database-url, else
$` + EnvInboxDatabaseURL + `, else the outbox's). The audit does not copy every id across: both
sides summarise the events by id prefix as a count and a hash, and only the prefixes that differ
are split further and finally compared id by id. The cost is printed with the report.

Events are matched on their creation time, which the relay publishes as createdAt and the inbox
stores; an event in neither window is in neither set. Without --event-type the audit takes the
event types the consumer recorded in the window (it says so): name them when a type may have
gone missing entirely. Without --consumer it audits every consumer that recorded an event in
the window.

A published event not applied --alarm-after (default 15m) after its publication is missing; a
younger one is in flight. The command exits 1 when an event is missing or an applied event was
never published, 0 otherwise; --json prints the reports as a JSON array.

--since and --until take a time (RFC 3339, a date, "now", -2h) or a duration back from now (1h, 7d).`,
		Example: `  sluice audit --consumer billing --since 1h
  sluice audit --since 2026-11-28 --until 2026-11-29 --event-type OrderCreated --event-type OrderPaid
  sluice audit --consumer billing --since 24h --inbox-database-url postgres://billing-db/app --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if since == "" {
				return usagef("--since is required (e.g. --since 1h or --since 2026-11-28T00:00:00Z)")
			}
			t, err := pastTime(since, time.Now())
			if err != nil {
				return usagef("--since: %v", err)
			}
			opts.Since = t
			if opts.AlarmAfter < 0 {
				return usagef("--alarm-after must not be negative")
			}
			outboxDB, err := a.db(ctx)
			if err != nil {
				return err
			}
			inboxDB := outboxDB
			if inboxURL == "" {
				inboxURL = a.io.Getenv(EnvInboxDatabaseURL)
			}
			if inboxURL != "" {
				if inboxDB, err = a.openPool(ctx, inboxURL); err != nil {
					return err
				}
				defer inboxDB.Close()
			}
			reports, err := runAudits(ctx, outboxDB, inboxDB, consumers, opts)
			if err != nil {
				return err
			}
			if jsonOutput {
				enc := json.NewEncoder(a.io.Out)
				enc.SetIndent("", "  ")
				if err := enc.Encode(auditDocuments(reports)); err != nil {
					return err
				}
			} else {
				printAudits(a, reports, opts)
			}
			return auditVerdict(reports, opts)
		},
	}
	fl := cmd.Flags()
	fl.StringArrayVar(&consumers, "consumer", nil, "inbox consumer to audit (repeatable; default every consumer that recorded an event in the window)")
	fl.StringVar(&since, "since", "", "audit events created at or after this time, or this long ago (required)")
	fl.Var(&timeValue{t: &opts.Until, now: time.Now}, "until", "audit events created before this time (default now)")
	fl.StringArrayVar(&opts.EventTypes, "event-type", nil, "event type the consumer subscribes to (repeatable; default the types it recorded in the window)")
	fl.Var(&durationValue{d: &opts.AlarmAfter}, "alarm-after", "a published event not applied this long after its publication is missing (default 15m)")
	fl.StringVar(&inboxURL, "inbox-database-url", "", "the inbox's database when it is not the outbox's (default $"+EnvInboxDatabaseURL+", else --database-url)")
	fl.BoolVar(&jsonOutput, "json", false, "print the reports as JSON")
	readsOnly(cmd)
	return cmd
}

// pastTime reads --since: a duration back from now (1h, 7d) or any time ParseTime accepts.
func pastTime(s string, now time.Time) (time.Time, error) {
	if d, err := ParseDuration(s); err == nil && !strings.HasPrefix(s, "-") {
		return now.Add(-d), nil
	}
	return ParseTime(s, now)
}

// runAudits audits each consumer, or every consumer that recorded an event in the window.
func runAudits(ctx context.Context, outboxDB, inboxDB *pgxpool.Pool, consumers []string, opts audit.Options) ([]audit.Report, error) {
	if opts.Until.IsZero() {
		opts.Until = time.Now()
	}
	if len(consumers) == 0 {
		rows, err := inboxDB.Query(ctx, `SELECT DISTINCT consumer FROM inbox_event WHERE created_at >= $1 AND created_at < $2 ORDER BY 1`,
			opts.Since, opts.Until)
		if err != nil {
			return nil, fmt.Errorf("list the inbox's consumers: %w", err)
		}
		for rows.Next() {
			var c string
			if err := rows.Scan(&c); err != nil {
				rows.Close()
				return nil, err
			}
			consumers = append(consumers, c)
		}
		if err := rows.Err(); err != nil {
			return nil, fmt.Errorf("list the inbox's consumers: %w", err)
		}
		if len(consumers) == 0 {
			return nil, fmt.Errorf("no consumer recorded an event created in the window: name one with --consumer")
		}
	}
	reports := make([]audit.Report, 0, len(consumers))
	for _, c := range consumers {
		o := opts
		o.Consumer = c
		r, err := audit.Run(ctx, outboxDB, inboxDB, o)
		if err != nil {
			return nil, usageIfInvalid(err)
		}
		reports = append(reports, r)
	}
	return reports, nil
}

func usageIfInvalid(err error) error {
	if errors.Is(err, audit.ErrInvalidOptions) {
		return usagef("%v", err)
	}
	return err
}

// auditVerdict fails when a report holds an overdue gap or an unpublished event.
func auditVerdict(reports []audit.Report, opts audit.Options) error {
	var problems []string
	for _, r := range reports {
		if n := r.Overdue(); n > 0 {
			problems = append(problems, fmt.Sprintf("%s is missing %d published events", r.Consumer, n))
		}
		if n := len(r.Unpublished); n > 0 {
			problems = append(problems, fmt.Sprintf("%s applied %d events the outbox never published", r.Consumer, n))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("audit: %s", strings.Join(problems, "; "))
	}
	return nil
}

func printAudits(a *app, reports []audit.Report, opts audit.Options) {
	out := a.io.Out
	for i, r := range reports {
		if i > 0 {
			fmt.Fprintln(out)
		}
		inferred := ""
		if r.EventTypesInferred {
			inferred = " (the types it recorded; name others with --event-type)"
		}
		types := strings.Join(r.EventTypes, ", ")
		if types == "" {
			types = "none"
		}
		fmt.Fprintf(out, "consumer %s: events created in [%s, %s), types %s%s\n", r.Consumer,
			r.Since.UTC().Format(time.RFC3339), r.Until.UTC().Format(time.RFC3339), types, inferred)
		fmt.Fprintf(out, "  published %d, applied %d\n", r.Cost.OutboxEvents, r.Cost.InboxEvents)
		fmt.Fprintf(out, "  missing %d (%d older than %s, the rest in flight)\n", len(r.Missing), r.Overdue(), FormatDuration(alarmAfter(opts)))
		if len(r.Missing) > 0 {
			tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "    EVENT ID\tTYPE\tPUBLISHED\tAGE\tINBOX")
			for _, g := range r.Missing {
				fmt.Fprintf(tw, "    %s\t%s\t%s\t%s\t%s\n", g.EventID, g.EventType, g.PublishedAt.UTC().Format(time.RFC3339), FormatDuration(g.Age.Truncate(time.Second)), g.InboxState)
			}
			tw.Flush()
		}
		fmt.Fprintf(out, "  applied, never published by this outbox: %d\n", len(r.Unpublished))
		for _, id := range r.Unpublished {
			fmt.Fprintf(out, "    %s\n", id)
		}
		fmt.Fprintf(out, "  lag p50 %s, p90 %s, p99 %s, max %s\n", r.Lag.P50, r.Lag.P90, r.Lag.P99, r.Lag.Max)
		fmt.Fprintf(out, "  cost: %d queries, %d bucket summaries, %d ids compared, %s\n",
			r.Cost.Queries, r.Cost.BucketsRead, r.Cost.IDsRead, r.Cost.Duration.Round(time.Millisecond))
	}
}

func alarmAfter(opts audit.Options) time.Duration {
	if opts.AlarmAfter == 0 {
		return audit.DefaultAlarmAfter
	}
	return opts.AlarmAfter
}

// AuditDocument is one consumer's report in `sluice audit --json`. Field names are part of the
// CLI's contract.
type AuditDocument struct {
	Consumer           string             `json:"consumer"`
	Since              time.Time          `json:"since"`
	Until              time.Time          `json:"until"`
	EventTypes         []string           `json:"event_types"`
	EventTypesInferred bool               `json:"event_types_inferred"`
	Published          int64              `json:"published"`
	Applied            int64              `json:"applied"`
	Missing            []AuditGap         `json:"missing"`
	Overdue            int                `json:"overdue"`
	Unpublished        []string           `json:"unpublished"`
	LagSeconds         map[string]float64 `json:"lag_seconds"`
	Cost               map[string]any     `json:"cost"`
}

// AuditGap is one published event a consumer has not applied.
type AuditGap struct {
	EventID     string    `json:"event_id"`
	EventType   string    `json:"event_type"`
	PublishedAt time.Time `json:"published_at"`
	AgeSeconds  float64   `json:"age_seconds"`
	Inbox       string    `json:"inbox"`
	Overdue     bool      `json:"overdue"`
}

func auditDocuments(reports []audit.Report) []AuditDocument {
	docs := make([]AuditDocument, 0, len(reports))
	for _, r := range reports {
		d := AuditDocument{
			Consumer: r.Consumer, Since: r.Since.UTC(), Until: r.Until.UTC(),
			EventTypes: r.EventTypes, EventTypesInferred: r.EventTypesInferred,
			Published: r.Cost.OutboxEvents, Applied: r.Cost.InboxEvents,
			Missing: []AuditGap{}, Overdue: r.Overdue(), Unpublished: r.Unpublished,
			LagSeconds: map[string]float64{"p50": r.Lag.P50.Seconds(), "p90": r.Lag.P90.Seconds(), "p99": r.Lag.P99.Seconds(), "max": r.Lag.Max.Seconds()},
			Cost: map[string]any{"queries": r.Cost.Queries, "buckets": r.Cost.BucketsRead, "ids": r.Cost.IDsRead,
				"levels": r.Cost.Levels, "seconds": r.Cost.Duration.Seconds()},
		}
		if d.Unpublished == nil {
			d.Unpublished = []string{}
		}
		for _, g := range r.Missing {
			d.Missing = append(d.Missing, AuditGap{EventID: g.EventID, EventType: g.EventType, PublishedAt: g.PublishedAt.UTC(),
				AgeSeconds: g.Age.Seconds(), Inbox: g.InboxState, Overdue: g.Overdue})
		}
		docs = append(docs, d)
	}
	return docs
}
