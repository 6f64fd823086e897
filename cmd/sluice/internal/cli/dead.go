package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// deadLimit bounds how many rows retry reads to choose from; quarantine is meant to be small.
const deadLimit = 10000

// Querier is what the database commands need: a *pgxpool.Pool, *pgx.Conn or pgx.Tx.
type Querier interface {
	outbox.Querier
	inbox.Querier
}

// DeadListOptions configure ListDead.
type DeadListOptions struct {
	// Consumer narrows the list to this inbox consumer's parked rows (and no outbox rows).
	// Defaults to every quarantined outbox row and every consumer's parked rows.
	Consumer string
	// Limit is the most rows of each kind. Required: at least 1.
	Limit int
}

// DeadList is what `sluice dead list` shows.
type DeadList struct {
	// Quarantined are the quarantined outbox rows (none when a Consumer was given).
	Quarantined []outbox.QuarantinedRow
	// Parked are the parked inbox rows.
	Parked []inbox.ParkedEvent
}

// ListDead reads quarantined outbox rows and parked inbox rows with their last errors.
func ListDead(ctx context.Context, db Querier, opts DeadListOptions) (DeadList, error) {
	if opts.Limit < 1 {
		return DeadList{}, usagef("--limit must be positive, got %d", opts.Limit)
	}
	var out DeadList
	var err error
	if opts.Consumer == "" {
		if out.Quarantined, err = outbox.ListQuarantined(ctx, db, opts.Limit); err != nil {
			return DeadList{}, err
		}
	}
	if out.Parked, err = inbox.ListParked(ctx, db, opts.Consumer, opts.Limit); err != nil {
		return DeadList{}, err
	}
	return out, nil
}

// DeadRetryOptions configure RetryDead. Give either All or ids, not both.
type DeadRetryOptions struct {
	// Consumer retries parked inbox rows of this consumer: IDs are then message ids. Without
	// it, IDs are outbox row ids, and All retries every quarantined and parked row.
	Consumer string
	// All retries every quarantined outbox row and parked inbox row (narrowed by Consumer).
	All bool
	// IDs are the rows to retry: outbox row ids (decimal), or message ids with Consumer.
	IDs []string
	// DryRun chooses the rows and changes nothing.
	DryRun bool
}

// DeadRetryResult is what RetryDead chose and released.
type DeadRetryResult struct {
	// Outbox and Inbox are the rows chosen, in the order they were listed.
	Outbox []outbox.QuarantinedRow
	Inbox  []inbox.ParkedEvent
	// OutboxReleased and InboxReleased count the rows released (zero on a dry run).
	OutboxReleased, InboxReleased int64
	// OutboxChosen and InboxChosen report whether each kind was chosen from, so that a report
	// says "none to retry" only for the kinds asked for.
	OutboxChosen, InboxChosen bool
}

// RetryDead releases quarantined outbox rows and parked inbox rows for another attempt with a
// fresh attempt count. Every id given must be quarantined (or parked): otherwise it changes
// nothing and says which are not.
func RetryDead(ctx context.Context, db Querier, opts DeadRetryOptions) (DeadRetryResult, error) {
	if opts.All == (len(opts.IDs) > 0) {
		return DeadRetryResult{}, usagef("give either --all or the ids to retry, not both and not neither")
	}
	var res DeadRetryResult
	if opts.Consumer == "" {
		ids, err := outboxIDs(opts.IDs)
		if err != nil {
			return DeadRetryResult{}, err
		}
		if res.Outbox, err = chooseQuarantined(ctx, db, opts.All, ids); err != nil {
			return DeadRetryResult{}, err
		}
		res.OutboxChosen = true
		if !opts.DryRun && len(res.Outbox) > 0 {
			sel := make([]int64, len(res.Outbox))
			for i, r := range res.Outbox {
				sel[i] = r.ID
			}
			if res.OutboxReleased, err = outbox.RetryQuarantined(ctx, db, sel); err != nil {
				return res, err
			}
		}
		if !opts.All {
			return res, nil
		}
	}
	var err error
	if res.Inbox, err = chooseParked(ctx, db, opts.Consumer, opts.All, opts.IDs); err != nil {
		return res, err
	}
	res.InboxChosen = true
	if !opts.DryRun {
		res.InboxReleased, err = retryParked(ctx, db, res.Inbox)
	}
	return res, err
}

// outboxIDs parses outbox row ids.
func outboxIDs(args []string) ([]int64, error) {
	ids := make([]int64, 0, len(args))
	for _, s := range args {
		id, err := strconv.ParseInt(s, 10, 64)
		if err != nil || id < 1 {
			return nil, usagef("%q is not an outbox row id (to retry inbox rows, pass --consumer NAME)", s)
		}
		ids = append(ids, id)
	}
	return ids, nil
}

// chooseQuarantined returns every quarantined row (all), or the rows of ids, failing when one
// of them is not quarantined.
func chooseQuarantined(ctx context.Context, db Querier, all bool, ids []int64) ([]outbox.QuarantinedRow, error) {
	rows, err := outbox.ListQuarantined(ctx, db, deadLimit)
	if err != nil || all {
		return rows, err
	}
	byID := make(map[int64]outbox.QuarantinedRow, len(rows))
	for _, r := range rows {
		byID[r.ID] = r
	}
	var chosen []outbox.QuarantinedRow
	var missing []string
	for _, id := range ids {
		if r, ok := byID[id]; ok {
			chosen = append(chosen, r)
		} else {
			missing = append(missing, strconv.FormatInt(id, 10))
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("outbox rows %s are not quarantined; nothing retried", strings.Join(missing, ", "))
	}
	return chosen, nil
}

// chooseParked returns every parked row of consumer ("" for all consumers) when all, or the
// rows of messageIDs, failing when one of them is not parked.
func chooseParked(ctx context.Context, db Querier, consumer string, all bool, messageIDs []string) ([]inbox.ParkedEvent, error) {
	parked, err := inbox.ListParked(ctx, db, consumer, deadLimit)
	if err != nil || all {
		return parked, err
	}
	byID := make(map[string]inbox.ParkedEvent, len(parked))
	for _, p := range parked {
		byID[p.MessageID] = p
	}
	var chosen []inbox.ParkedEvent
	var missing []string
	for _, id := range messageIDs {
		if p, ok := byID[id]; ok {
			chosen = append(chosen, p)
		} else {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("inbox rows %s of consumer %q are not parked; nothing retried", strings.Join(missing, ", "), consumer)
	}
	return chosen, nil
}

// retryParked releases rows consumer by consumer (in name order) and returns how many.
func retryParked(ctx context.Context, db Querier, rows []inbox.ParkedEvent) (int64, error) {
	byConsumer := map[string][]string{}
	for _, p := range rows {
		byConsumer[p.Consumer] = append(byConsumer[p.Consumer], p.MessageID)
	}
	consumers := make([]string, 0, len(byConsumer))
	for c := range byConsumer {
		consumers = append(consumers, c)
	}
	slices.Sort(consumers)
	var total int64
	for _, c := range consumers {
		n, err := inbox.RetryParked(ctx, db, c, byConsumer[c])
		if err != nil {
			return total, err
		}
		total += n
	}
	return total, nil
}

func (a *app) deadCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "dead",
		Short: "List and retry quarantined outbox rows and parked inbox rows",
		Long: `Rows that need an operator: outbox rows the relay quarantined (they block only their own
partition key) and inbox rows the asynchronous processor parked after its attempts ran out.
Fix the cause (the last error says what it was), then retry them.`,
		Example: `  sluice dead list
  sluice dead retry --dry-run --all
  sluice dead retry 1042 1043
  sluice dead retry --consumer billing 6f1c9a1e-0c1e-4c53-9f5b-2a4b8f0d1e77`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usagef("missing subcommand: list or retry (see 'sluice dead --help')")
		},
	}
	cmd.AddCommand(a.deadListCommand(), a.deadRetryCommand())
	return cmd
}

func (a *app) deadListCommand() *cobra.Command {
	var (
		opts   DeadListOptions
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "Show quarantined outbox rows and parked inbox rows with their last error",
		Example: `  sluice dead list
  sluice dead list --consumer billing --limit 20
  sluice dead list --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opts.Limit < 1 {
				return usagef("--limit must be positive, got %d", opts.Limit)
			}
			ctx := cmd.Context()
			pool, err := a.db(ctx)
			if err != nil {
				return err
			}
			list, err := ListDead(ctx, pool, opts)
			if err != nil {
				return err
			}
			if asJSON {
				return printDeadListJSON(a.io.Out, list)
			}
			printDeadList(a.io.Out, list, opts.Consumer == "")
			return nil
		},
	}
	cmd.Flags().StringVar(&opts.Consumer, "consumer", "", "show only this inbox consumer's parked rows (and no outbox rows)")
	cmd.Flags().IntVar(&opts.Limit, "limit", 100, "most rows of each kind to show")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

// printDeadListJSON prints the list as `sluice dead list --json` does.
func printDeadListJSON(w io.Writer, list DeadList) error {
	type row struct {
		ID            int64     `json:"id"`
		EventID       string    `json:"event_id"`
		Topic         string    `json:"topic"`
		EventType     string    `json:"event_type"`
		PartitionKey  string    `json:"partition_key"`
		Attempts      int       `json:"attempts"`
		LastError     string    `json:"last_error"`
		CreatedAt     time.Time `json:"created_at"`
		QuarantinedAt time.Time `json:"quarantined_at"`
		BlockedBehind int64     `json:"blocked_behind"`
	}
	doc := struct {
		Outbox []row               `json:"outbox_quarantined"`
		Inbox  []inbox.ParkedEvent `json:"inbox_parked"`
	}{Outbox: []row{}, Inbox: list.Parked}
	for _, q := range list.Quarantined {
		doc.Outbox = append(doc.Outbox, row{q.ID, q.EventID.String(), q.Topic, q.EventType, q.PartitionKey, q.Attempts,
			q.LastError, q.CreatedAt, q.QuarantinedAt, q.BlockedBehind})
	}
	if doc.Inbox == nil {
		doc.Inbox = []inbox.ParkedEvent{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(doc)
}

// printDeadList prints the list as tables; withOutbox adds the outbox table.
func printDeadList(w io.Writer, list DeadList, withOutbox bool) {
	if withOutbox {
		fmt.Fprintf(w, "Quarantined outbox rows: %d\n", len(list.Quarantined))
		if len(list.Quarantined) > 0 {
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tEVENT ID\tTOPIC\tTYPE\tKEY\tATTEMPTS\tBLOCKING\tQUARANTINED\tLAST ERROR")
			for _, q := range list.Quarantined {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", q.ID, q.EventID, q.Topic, q.EventType, q.PartitionKey,
					q.Attempts, q.BlockedBehind, q.QuarantinedAt.UTC().Format(time.RFC3339), clip(q.LastError, 100))
			}
			_ = tw.Flush()
			fmt.Fprintln(w, "retry: sluice dead retry ID... (or --all)")
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "Parked inbox rows: %d\n", len(list.Parked))
	if len(list.Parked) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "CONSUMER\tMESSAGE ID\tTYPE\tATTEMPTS\tPARKED\tLAST ERROR")
		for _, p := range list.Parked {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", p.Consumer, p.MessageID, p.EventType, p.Attempts,
				p.ParkedAt.UTC().Format(time.RFC3339), clip(p.LastError, 100))
		}
		_ = tw.Flush()
		fmt.Fprintln(w, "retry: sluice dead retry --consumer NAME MESSAGE_ID... (or --all)")
	}
}

func (a *app) deadRetryCommand() *cobra.Command {
	var opts DeadRetryOptions
	cmd := &cobra.Command{
		Use:   "retry [--all | ID... | --consumer NAME MESSAGE_ID...]",
		Short: "Release quarantined outbox rows or parked inbox rows for another attempt",
		Long: `Release rows for another attempt with a fresh attempt count.

  sluice dead retry ID...                        outbox rows, by id (see sluice dead list)
  sluice dead retry --consumer NAME MESSAGE_ID... parked inbox rows of one consumer
  sluice dead retry --all                        every quarantined outbox row and parked inbox row
  sluice dead retry --all --consumer NAME        every parked row of one consumer

Every id given must be quarantined (or parked); otherwise nothing is changed. --dry-run shows what
would be retried and changes nothing.`,
		Example: `  sluice dead retry --dry-run --all
  sluice dead retry 1042 1043
  sluice dead retry --consumer billing 6f1c9a1e-0c1e-4c53-9f5b-2a4b8f0d1e77
  sluice dead retry --all --consumer billing`,
		Args: cobra.ArbitraryArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			opts.IDs = args
			// Usage first: a bad id must not need a database to be reported.
			if opts.All == (len(args) > 0) {
				return usagef("give either --all or the ids to retry, not both and not neither")
			}
			if opts.Consumer == "" {
				if _, err := outboxIDs(args); err != nil {
					return err
				}
			}
			pool, err := a.db(ctx)
			if err != nil {
				return err
			}
			res, err := RetryDead(ctx, pool, opts)
			printDeadRetry(a.io.Out, res, opts.DryRun, err == nil)
			return err
		},
	}
	cmd.Flags().StringVar(&opts.Consumer, "consumer", "", "retry parked inbox rows of this consumer (ids are then message ids)")
	cmd.Flags().BoolVar(&opts.All, "all", false, "retry every quarantined/parked row (narrowed by --consumer)")
	cmd.Flags().BoolVar(&opts.DryRun, "dry-run", false, "show what would be retried; change nothing")
	return cmd
}

// printDeadRetry reports what RetryDead chose and, when it completed, released.
func printDeadRetry(w io.Writer, res DeadRetryResult, dryRun, completed bool) {
	released := !dryRun && completed
	verb := "retried"
	if dryRun {
		verb = "would retry"
	}
	if res.OutboxChosen {
		if len(res.Outbox) == 0 {
			fmt.Fprintln(w, "no quarantined outbox rows to retry")
		}
		for _, r := range res.Outbox {
			fmt.Fprintf(w, "%s outbox row %d (%s %s, key %s)\n", verb, r.ID, r.Topic, r.EventType, r.PartitionKey)
		}
		if len(res.Outbox) > 0 && (released || res.OutboxReleased > 0) {
			fmt.Fprintf(w, "released %d outbox rows for the relay\n", res.OutboxReleased)
		}
	}
	if res.InboxChosen {
		if len(res.Inbox) == 0 {
			fmt.Fprintln(w, "no parked inbox rows to retry")
		}
		for _, p := range res.Inbox {
			fmt.Fprintf(w, "%s inbox row %s/%s (%s)\n", verb, p.Consumer, p.MessageID, p.EventType)
		}
		if released && len(res.Inbox) > 0 {
			fmt.Fprintf(w, "released %d parked inbox rows for the processor\n", res.InboxReleased)
		}
	}
}

func clip(s string, n int) string {
	s = oneLine(s)
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}
