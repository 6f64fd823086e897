package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"text/tabwriter"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch"
	cwtypes "github.com/aws/aws-sdk-go-v2/service/cloudwatch/types"
	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// Status is the document `sluice status --json` prints. Field names are part of the CLI's
// contract: outbox.pending, outbox.oldest_pending_age_seconds and outbox.quarantined at least.
type Status struct {
	// Time is when the figures were read (RFC 3339, UTC).
	Time   time.Time       `json:"time"`
	Outbox OutboxStatus    `json:"outbox"`
	Inbox  []ConsumerState `json:"inbox"`
	// Database is what holds back VACUUM.
	Database DatabaseStatus `json:"database"`
	// Queues is present when --queue was given.
	Queues []QueueStatus `json:"queues,omitempty"`
	// Notes are remarks for the operator (e.g. CloudWatch is not reachable), printed on stderr;
	// not part of the document.
	Notes []string `json:"-"`
}

// OutboxStatus is the outbox backlog.
type OutboxStatus struct {
	Pending                 int64   `json:"pending"`
	OldestPendingAgeSeconds float64 `json:"oldest_pending_age_seconds"`
	Quarantined             int64   `json:"quarantined"`
	PublishedLastMinute     int64   `json:"published_last_minute"`
	// Offload is the claim check's share of the backlog.
	Offload OffloadStatus `json:"offload"`
}

// OffloadStatus counts the pending rows whose payload is above the claim check's threshold
// (outbox.OffloadBacklogOf): a relay with a claim check stores them in S3, one without
// quarantines them as too large. The count covers a bounded sample of the pending rows
// (at most 1,000 rows); Complete says whether that was all of them. What the relays
// offloaded is in their metrics (Offloaded, OffloadedBytes).
type OffloadStatus struct {
	ThresholdBytes             int   `json:"threshold_bytes"`
	PendingAboveThreshold      int64 `json:"pending_above_threshold"`
	PendingAboveThresholdBytes int64 `json:"pending_above_threshold_bytes"`
	Examined                   int64 `json:"examined"`
	Complete                   bool  `json:"complete"`
}

// DatabaseStatus reports what holds back VACUUM (outbox.HorizonOf): the oldest open or prepared
// transaction that holds a snapshot or has written, and a replication slot holding the horizon
// further back. While they last, VACUUM cannot remove published rows' dead index entries.
type DatabaseStatus struct {
	// OldestTransactionAgeSeconds is the age of the oldest such transaction (0 when none): what
	// the OldestTransactionAge alarm watches.
	OldestTransactionAgeSeconds float64 `json:"oldest_transaction_age_seconds"`
	// OldestTransaction names it ("session 4242 (psql, idle in transaction)", "prepared
	// transaction x (owner y)"); empty when none.
	OldestTransaction string `json:"oldest_transaction"`
	// HorizonXIDAge is how many transactions old the horizon is, over transactions, replication
	// slots and standbys' feedback (0 when nothing holds it).
	HorizonXIDAge int64 `json:"horizon_xid_age"`
	// Replication names a replication slot (or a standby's feedback) holding the horizon further
	// back than every transaction; empty when none does.
	Replication string `json:"replication_hold,omitempty"`
}

// horizonWarning is the oldest-transaction age from which status warns.
const horizonWarning = 5 * time.Minute

// ConsumerState is one inbox consumer's backlog (consumers with nothing pending are omitted).
type ConsumerState struct {
	Consumer                    string  `json:"consumer"`
	Unprocessed                 int64   `json:"unprocessed"`
	OldestUnprocessedAgeSeconds float64 `json:"oldest_unprocessed_age_seconds"`
	Parked                      int64   `json:"parked"`
}

// QueueStatus is one SQS queue and its DLQ.
type QueueStatus struct {
	URL              string `json:"url"`
	MessagesVisible  int64  `json:"messages_visible"`
	MessagesInFlight int64  `json:"messages_in_flight"`
	MessagesDelayed  int64  `json:"messages_delayed"`
	// OldestMessageAgeSeconds is CloudWatch's ApproximateAgeOfOldestMessage (last 5 minutes'
	// maximum); null when CloudWatch has no datapoint or is not reachable (local emulators).
	OldestMessageAgeSeconds *float64 `json:"oldest_message_age_seconds"`
	RetentionSeconds        int64    `json:"retention_seconds"`
	// DLQ is null when the queue has no redrive policy.
	DLQ *DLQStatus `json:"dlq"`
}

// DLQStatus is a queue's dead-letter queue.
type DLQStatus struct {
	URL             string `json:"url"`
	MessagesVisible int64  `json:"messages_visible"`
	MaxReceiveCount int    `json:"max_receive_count"`
}

func (a *app) statusCommand() *cobra.Command {
	var (
		asJSON           bool
		queues           []string
		offloadThreshold int
		onFleet          bool
		src              fleetSource
		fleetOpts        = FleetStatusOptions{Timeout: DefaultFleetStatusTimeout, Parallel: DefaultFleetStatusParallel}
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the outbox backlog, inbox consumers and (with --queue) SQS queue depth",
		Long: `Show what the alarms watch: the outbox's pending rows, oldest pending age, quarantined rows and
rows published in the last minute; each inbox consumer's unprocessed and parked rows; and for every
--queue, its depth, the age of its oldest message (CloudWatch) and its DLQ's depth.

It also names what holds back VACUUM: the database's oldest open or prepared transaction that
holds a snapshot or has written (a forgotten BEGIN in psql, a long report, a prepared
transaction), and a replication slot holding the horizon further back. It warns when that
transaction is older than 5 minutes: while it lasts VACUUM cannot clean up behind it.

It counts the pending rows whose payload is above the claim check's threshold (--offload-threshold,
else SLUICE_CLAIM_CHECK_THRESHOLD, else the relay's default of 262144 bytes): the relay stores those in S3 with a
claim check and quarantines them without one. It measures at most 1000 pending rows, and says so.

--json prints a stable document (outbox.pending, outbox.oldest_pending_age_seconds,
outbox.quarantined, outbox.published_last_minute, outbox.offload, inbox[], database.oldest_transaction_age_seconds,
database.oldest_transaction, database.horizon_xid_age, database.replication_hold, queues[]) for
scripts and checks.

With --fleet, it reads every tenant database of the fleet (--fleet-registry and
--fleet-tenants standing in for the SLUICE_FLEET_* variables the fleet's Lambdas read),
--parallel at a time, and prints a line per tenant, worst first: failing tenants (unreachable,
wrong password, no sluice tables, no answer within --timeout) with their error, then by oldest
pending row, pending rows, quarantined and parked rows. A failing tenant does not stop the
others; the command then exits 1 naming them. --json prints {time, tenants[], failing}: each
tenant is {tenant, error} or {tenant} with the single database's document (outbox, inbox, database).`,
		Example: `  sluice status
  sluice status --json | jq .outbox.oldest_pending_age_seconds
  sluice status --queue https://sqs.eu-west-1.amazonaws.com/123456789012/billing
  sluice status --fleet --fleet-registry postgres://sluice@control/fleet
  sluice status --fleet --json | jq -r '.tenants[:5][] | [.tenant, .outbox.oldest_pending_age_seconds] | @tsv'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			opts := StatusOptions{Queues: queues, OffloadThreshold: offloadThreshold}
			if offloadThreshold < 0 {
				return usagef("--offload-threshold must be a positive number of bytes, got %d", offloadThreshold)
			}
			if offloadThreshold == 0 {
				t, err := lambdaenv.ClaimCheckThresholdOf(a.io.Getenv)
				if err != nil {
					return err
				}
				opts.OffloadThreshold = t
			}
			if onFleet {
				if len(queues) > 0 {
					return usagef("--queue is not read per tenant: run sluice status --queue URL without --fleet")
				}
				fleetOpts.Status = opts
				return a.statusFleet(cmd, src, asJSON, fleetOpts)
			}
			for _, name := range []string{"fleet-registry", "fleet-tenants", "timeout", "parallel"} {
				if cmd.Flags().Changed(name) {
					return usagef("--%s needs --fleet", name)
				}
			}
			if len(queues) > 0 {
				c, err := a.sqsClient(ctx)
				if err != nil {
					return err
				}
				cfg, err := a.awsConfig(ctx)
				if err != nil {
					return err
				}
				opts.SQS, opts.CloudWatch = c, cloudwatch.NewFromConfig(cfg)
			}
			pool, err := a.db(ctx)
			if err != nil {
				return err
			}
			st, err := ReadStatus(ctx, pool, opts)
			if err != nil {
				return err
			}
			for _, n := range st.Notes {
				fmt.Fprintln(a.io.Err, "note: "+n)
			}
			if asJSON {
				enc := json.NewEncoder(a.io.Out)
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			}
			return printStatus(a.io.Out, st)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON instead of a table")
	cmd.Flags().StringArrayVar(&queues, "queue", nil, "SQS queue URL to report on (repeatable)")
	cmd.Flags().BoolVar(&onFleet, "fleet", false, "show every tenant database of the fleet (see sluice fleet), worst first, instead of --database-url")
	src.flags(cmd.Flags())
	cmd.Flags().Var(&durationValue{d: &fleetOpts.Timeout}, "timeout",
		"with --fleet: how long to wait for one tenant before reporting it as failing")
	cmd.Flags().IntVar(&fleetOpts.Parallel, "parallel", DefaultFleetStatusParallel, fmt.Sprintf("with --fleet: tenants read at once (1 to %d)", MaxFleetParallel))
	cmd.Flags().IntVar(&offloadThreshold, "offload-threshold", 0,
		fmt.Sprintf("payload size in bytes above which the claim check stores a payload in S3 (default $%s, else %d)", lambdaenv.ClaimCheckThreshold, outbox.RelaySetting("MessageLimits.SNS").Default))
	readsOnly(cmd)
	return cmd
}

// StatusOptions configure ReadStatus.
type StatusOptions struct {
	// Queues are SQS queue URLs to report on, with their DLQs. Defaults to none.
	Queues []string
	// SQS and CloudWatch read the queues and their oldest message's age. Required with Queues.
	SQS        SQSAPI
	CloudWatch CloudWatchAPI
	// OffloadThreshold is the claim check's threshold in bytes for Outbox.Offload. Defaults
	// to SNS's default message limit (outbox.RelaySetting("MessageLimits.SNS"), the relay's default threshold).
	OffloadThreshold int
}

// ReadStatus reads what `sluice status` shows: the outbox backlog, each inbox consumer's, the
// transaction holding back VACUUM and the queues. It reads the queues first, so a wrong URL fails
// before the database is read.
func ReadStatus(ctx context.Context, db Querier, opts StatusOptions) (*Status, error) {
	var qs []QueueStatus
	var notes []string
	if len(opts.Queues) > 0 {
		if opts.SQS == nil || opts.CloudWatch == nil {
			return nil, errors.New("cli: StatusOptions.SQS and CloudWatch are required with Queues")
		}
		var err error
		if qs, notes, err = queueStatuses(ctx, opts.SQS, opts.CloudWatch, opts.Queues); err != nil {
			return nil, err
		}
	}
	lag, err := outbox.LagOf(ctx, db)
	if err != nil {
		return nil, err
	}
	consumers, err := inbox.LagOf(ctx, db)
	if err != nil {
		return nil, err
	}
	horizon, err := outbox.HorizonOf(ctx, db)
	if err != nil {
		return nil, err
	}
	threshold := opts.OffloadThreshold
	if threshold <= 0 {
		threshold = int(outbox.RelaySetting("MessageLimits.SNS").Default)
	}
	offload, err := outbox.OffloadBacklogOf(ctx, db, threshold)
	if err != nil {
		return nil, err
	}
	st := &Status{
		Time: time.Now().UTC().Truncate(time.Second),
		Outbox: OutboxStatus{
			Pending: lag.Pending, OldestPendingAgeSeconds: seconds(lag.OldestPendingAge),
			Quarantined: lag.Quarantined, PublishedLastMinute: lag.PublishedLastMinute,
			Offload: OffloadStatus{ThresholdBytes: offload.Threshold, PendingAboveThreshold: offload.Above,
				PendingAboveThresholdBytes: offload.AboveBytes, Examined: offload.Examined, Complete: offload.Complete},
		},
		Inbox: make([]ConsumerState, 0, len(consumers)),
		Database: DatabaseStatus{OldestTransactionAgeSeconds: seconds(horizon.OldestTransactionAge), OldestTransaction: horizon.HeldBy,
			HorizonXIDAge: horizon.XIDAge, Replication: horizon.Replication},
		Queues: qs,
		Notes:  notes,
	}
	for _, c := range consumers {
		st.Inbox = append(st.Inbox, ConsumerState{Consumer: c.Consumer, Unprocessed: c.Unprocessed,
			OldestUnprocessedAgeSeconds: seconds(c.OldestUnprocessedAge), Parked: c.Parked})
	}
	return st, nil
}

func seconds(d time.Duration) float64 { return math.Round(d.Seconds()*1000) / 1000 }

// queueStatuses describes each queue and its DLQ, with notes for what could not be read.
func queueStatuses(ctx context.Context, c SQSAPI, cw CloudWatchAPI, urls []string) ([]QueueStatus, []string, error) {
	var cwErr error
	out := make([]QueueStatus, 0, len(urls))
	for _, u := range urls {
		q, err := describeQueue(ctx, c, u)
		if err != nil {
			return nil, nil, err
		}
		qs := QueueStatus{URL: u, MessagesVisible: q.Visible, MessagesInFlight: q.InFlight, MessagesDelayed: q.Delayed,
			RetentionSeconds: q.RetentionSeconds}
		if cwErr == nil {
			qs.OldestMessageAgeSeconds, cwErr = oldestMessageAge(ctx, cw, q.Name)
		}
		if q.DLQARN != "" {
			dlqURL, err := urlOfARN(ctx, c, q.DLQARN)
			if err != nil {
				return nil, nil, fmt.Errorf("DLQ of %s: %w", u, err)
			}
			d, err := describeQueue(ctx, c, dlqURL)
			if err != nil {
				return nil, nil, fmt.Errorf("DLQ of %s: %w", u, err)
			}
			qs.DLQ = &DLQStatus{URL: dlqURL, MessagesVisible: d.Visible, MaxReceiveCount: q.MaxReceiveCount}
		}
		out = append(out, qs)
	}
	var notes []string
	if cwErr != nil {
		notes = append(notes, fmt.Sprintf("age of oldest message unavailable (CloudWatch: %s)", oneLine(cwErr.Error())))
	}
	return out, notes, nil
}

// CloudWatchAPI is the CloudWatch call status makes.
type CloudWatchAPI interface {
	GetMetricData(ctx context.Context, in *cloudwatch.GetMetricDataInput, opts ...func(*cloudwatch.Options)) (*cloudwatch.GetMetricDataOutput, error)
}

var _ CloudWatchAPI = (*cloudwatch.Client)(nil)

// oldestMessageAge reads ApproximateAgeOfOldestMessage's maximum over the last 5 minutes;
// nil without a datapoint. An error means CloudWatch is not usable here (stop asking).
func oldestMessageAge(ctx context.Context, cw CloudWatchAPI, queueName string) (*float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	end := time.Now()
	out, err := cw.GetMetricData(ctx, &cloudwatch.GetMetricDataInput{
		StartTime: aws.Time(end.Add(-5 * time.Minute)), EndTime: aws.Time(end),
		MetricDataQueries: []cwtypes.MetricDataQuery{{
			Id: aws.String("age"),
			MetricStat: &cwtypes.MetricStat{
				Metric: &cwtypes.Metric{Namespace: aws.String("AWS/SQS"), MetricName: aws.String("ApproximateAgeOfOldestMessage"),
					Dimensions: []cwtypes.Dimension{{Name: aws.String("QueueName"), Value: aws.String(queueName)}}},
				Period: aws.Int32(60), Stat: aws.String("Maximum"),
			},
		}},
	})
	if err != nil {
		return nil, err
	}
	for _, r := range out.MetricDataResults {
		if len(r.Values) > 0 {
			v := r.Values[0] // newest first
			return &v, nil
		}
	}
	return nil, nil
}

func printStatus(w io.Writer, st *Status) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	o := st.Outbox
	fmt.Fprintln(tw, "OUTBOX\tPENDING\tOLDEST\tQUARANTINED\tPUBLISHED/1m")
	fmt.Fprintf(tw, "\t%d\t%s\t%d\t%d\n", o.Pending, FormatDuration(dur(o.OldestPendingAgeSeconds)), o.Quarantined, o.PublishedLastMinute)
	fmt.Fprintln(tw, "INBOX\tUNPROCESSED\tOLDEST\tPARKED\t")
	if len(st.Inbox) == 0 {
		fmt.Fprintln(tw, "(no backlog)\t0\t-\t0\t")
	}
	for _, c := range st.Inbox {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t\n", c.Consumer, c.Unprocessed, FormatDuration(dur(c.OldestUnprocessedAgeSeconds)), c.Parked)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if off := o.Offload; off.PendingAboveThreshold > 0 || !off.Complete {
		of := fmt.Sprintf("of %d pending rows", off.Examined)
		if !off.Complete {
			of = fmt.Sprintf("of the first %d pending rows measured", off.Examined)
		}
		fmt.Fprintf(w, "OFFLOAD: %d pending payloads above %d bytes (%d bytes in all), %s: stored in S3 by a claim check, quarantined without one\n",
			off.PendingAboveThreshold, off.ThresholdBytes, off.PendingAboveThresholdBytes, of)
	}
	// What holds back VACUUM, in columns of its own: a session's name is wider than the counts.
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	d := st.Database
	fmt.Fprintln(tw, "DATABASE\tOLDEST TRANSACTION\tAGE\tHORIZON (XIDS)")
	held := d.OldestTransaction
	age := FormatDuration(dur(d.OldestTransactionAgeSeconds))
	if held == "" {
		held, age = "(none)", "-"
	}
	fmt.Fprintf(tw, "\t%s\t%s\t%d\n", held, age, d.HorizonXIDAge)
	if d.Replication != "" {
		fmt.Fprintf(tw, "\t%s\t-\t\n", d.Replication)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if age := dur(st.Database.OldestTransactionAgeSeconds); age >= horizonWarning {
		fmt.Fprintf(w, "WARNING: %s has held a snapshot for %s: VACUUM cannot clean up behind it (the relay's index fills with dead entries); end it if it is not needed\n",
			st.Database.OldestTransaction, FormatDuration(age))
	}
	if len(st.Queues) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "QUEUE\tVISIBLE\tIN FLIGHT\tOLDEST\tDLQ VISIBLE")
	for _, q := range st.Queues {
		age, dlq := "?", "no DLQ"
		if q.OldestMessageAgeSeconds != nil {
			age = FormatDuration(dur(*q.OldestMessageAgeSeconds))
		}
		if q.DLQ != nil {
			dlq = fmt.Sprint(q.DLQ.MessagesVisible)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%s\n", q.URL, q.MessagesVisible, q.MessagesInFlight, age, dlq)
	}
	return tw.Flush()
}

func dur(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
