package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/aws/aws-lambda-go/cfn"
	"github.com/aws/aws-lambda-go/events"
	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/internal/audit"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
	"github.com/sluicehq/sluice/pkg/metrics"
	"github.com/sluicehq/sluice/pkg/partition"
)

// The migrate function is the stack's one function that logs in as the tables' owner, so it is
// also the one that may create and drop their partitions: an EventBridge schedule (hourly in
// the CDK constructs) invokes it with a scheduled event, and it runs partition.Maintain on each
// table. On plain tables each costs one catalog read.

// Invoke answers both kinds of event the function receives: a CloudFormation custom resource
// request (Handle, its response PUT to the event's ResponseURL) and an EventBridge scheduled
// event (Maintain). Anything else is an error.
func (h *handler) Invoke(ctx context.Context, payload json.RawMessage) (any, error) {
	var probe struct {
		RequestType string `json:"RequestType"`
		ResponseURL string `json:"ResponseURL"`
		Source      string `json:"source"`
		DetailType  string `json:"detail-type"`
	}
	if err := json.Unmarshal(payload, &probe); err != nil {
		return nil, fmt.Errorf("read the event: %w", err)
	}
	switch {
	case probe.RequestType != "" && probe.ResponseURL != "":
		var ev cfn.Event
		if err := json.Unmarshal(payload, &ev); err != nil {
			return nil, fmt.Errorf("read the CloudFormation event: %w", err)
		}
		// The wrapper reports Handle's error to CloudFormation and returns an error only when
		// that report fails: a failed migration fails the deploy, not the function.
		reason, err := cfn.LambdaWrap(h.Handle)(ctx, ev)
		return reason, err
	case probe.Source == "aws.events" && probe.DetailType == "Scheduled Event":
		var ev events.EventBridgeEvent
		if err := json.Unmarshal(payload, &ev); err != nil {
			return nil, fmt.Errorf("read the scheduled event: %w", err)
		}
		return h.Maintain(ctx, ev)
	}
	return nil, fmt.Errorf("unknown event (source %q, detail-type %q): neither a CloudFormation custom resource request nor an EventBridge scheduled event", probe.Source, probe.DetailType)
}

// MaintenanceResult is a scheduled invocation's response: what the maintenance did to each table.
type MaintenanceResult struct {
	Outbox TableMaintenance `json:"outbox"`
	Inbox  TableMaintenance `json:"inbox"`
	// Audit is each audited consumer's outcome (SLUICE_AUDIT_CONSUMERS).
	Audit []ConsumerAudit `json:"audit,omitempty"`
}

// ConsumerAudit is one consumer's scheduled audit.
type ConsumerAudit struct {
	Consumer string `json:"consumer"`
	// Missing counts published events not applied past the alarm threshold; Unpublished,
	// applied events the outbox did not publish.
	Missing     int    `json:"missing"`
	Unpublished int    `json:"unpublished"`
	Error       string `json:"error,omitempty"`
}

// of returns the result of table t.
func (r *MaintenanceResult) of(t *partition.Table) *TableMaintenance {
	if t == partition.Inbox {
		return &r.Inbox
	}
	return &r.Outbox
}

// TableMaintenance is what the maintenance did to one table.
type TableMaintenance struct {
	// Partitioned is false for a plain table, which is left alone.
	Partitioned bool `json:"partitioned"`
	// Created and Dropped name the partitions created ahead and dropped as expired.
	Created []string `json:"created,omitempty"`
	Dropped []string `json:"dropped,omitempty"`
	// Purged counts expired rows deleted from the default partition.
	Purged int64 `json:"purged,omitempty"`
	// Error is set when this table's maintenance failed.
	Error string `json:"error,omitempty"`
}

// Maintain creates partitions ahead on a partitioned outbox_event and inbox_event and, with a
// retention (SLUICE_OUTBOX_RETENTION, SLUICE_INBOX_RETENTION), drops the expired ones, logged
// in as the owner. Both tables are maintained even when one fails; it returns an error when
// either failed, so that the function's Errors metric (and its alarm) tells an operator. A
// partition whose lock was busy is kept and tried again at the next run, which is no error.
func (h *handler) Maintain(ctx context.Context, ev events.EventBridgeEvent) (MaintenanceResult, error) {
	h.log.InfoContext(ctx, "partition maintenance", "event_id", ev.ID, "scheduled_at", ev.Time)
	var res MaintenanceResult
	url, err := lambdaenv.DatabaseURLFrom(ctx, h.getenv, h.secrets)
	if err != nil {
		return res, err
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return res, fmt.Errorf("partition maintenance: connect to the database: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))

	var errs []error
	for _, t := range partition.Tables() {
		rep, err := partition.Maintain(ctx, conn, t, h.partitions[t])
		m := res.of(t)
		*m = TableMaintenance{Partitioned: rep.Partitioned, Purged: rep.Purged}
		for _, p := range rep.Created {
			m.Created = append(m.Created, p.Name)
			h.log.InfoContext(ctx, "partition created", "table", t.Name(), "partition", p.String())
		}
		for _, p := range rep.Dropped {
			m.Dropped = append(m.Dropped, p.Name)
			h.log.InfoContext(ctx, "partition dropped", "table", t.Name(), "partition", p.String(), "rows_estimate", p.Rows)
		}
		for _, k := range rep.Kept {
			h.log.DebugContext(ctx, "partition kept", "table", t.Name(), "partition", k.String(), "reason", k.Reason)
		}
		for _, w := range rep.Warnings {
			h.log.WarnContext(ctx, t.Name()+" partitions: "+w)
		}
		if err != nil {
			m.Error = err.Error()
			errs = append(errs, err)
		}
	}
	res.Audit = h.runAudits(ctx, conn)
	for _, a := range res.Audit {
		if a.Error != "" {
			errs = append(errs, fmt.Errorf("audit of %s: %s", a.Consumer, a.Error))
		}
	}
	if err := errors.Join(errs...); err != nil {
		h.log.ErrorContext(ctx, "partition maintenance or audit failed; the next scheduled run tries again", "error", err)
		return res, err
	}
	h.log.InfoContext(ctx, "partition maintenance done", "outbox_partitioned", res.Outbox.Partitioned, "inbox_partitioned", res.Inbox.Partitioned,
		"created", len(res.Outbox.Created)+len(res.Inbox.Created), "dropped", len(res.Outbox.Dropped)+len(res.Inbox.Dropped))
	return res, nil
}

// runAudits audits each configured consumer over the window and records the counts as metrics.
// Outbox and inbox are the one database the function maintains.
func (h *handler) runAudits(ctx context.Context, db audit.Querier) []ConsumerAudit {
	var out []ConsumerAudit
	rec := metrics.NewEMF(h.metrics)
	for _, c := range h.audit.Consumers {
		r, err := audit.Run(ctx, db, db, audit.Options{Consumer: c, Since: time.Now().Add(-h.audit.Window), AlarmAfter: h.audit.AlarmAfter})
		a := ConsumerAudit{Consumer: c}
		if err != nil {
			a.Error = err.Error()
			out = append(out, a)
			continue
		}
		a.Missing, a.Unpublished = r.Overdue(), len(r.Unpublished)
		rec.Record(ctx, metrics.Dimensions{metrics.DimensionService: metrics.ServiceAudit, metrics.DimensionConsumer: c},
			metrics.AuditMissingEvents.Measure(float64(a.Missing)), metrics.AuditUnpublishedEvents.Measure(float64(a.Unpublished)))
		level := slog.LevelInfo
		if a.Missing > 0 || a.Unpublished > 0 {
			level = slog.LevelError
		}
		var missing []string
		for _, g := range r.Missing {
			if g.Overdue && len(missing) < 20 {
				missing = append(missing, g.EventID+" ("+g.InboxState+")")
			}
		}
		h.log.Log(ctx, level, "audit", "consumer", c, "published", r.Cost.OutboxEvents, "applied", r.Cost.InboxEvents,
			"missing", a.Missing, "unpublished", a.Unpublished, "missing_first", missing, "lag_p99", r.Lag.P99.String(),
			"queries", r.Cost.Queries, "ids_compared", r.Cost.IDsRead)
		out = append(out, a)
	}
	return out
}
