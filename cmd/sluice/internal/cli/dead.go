package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
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
	// Applied lists consumer dead letters the inbox applied since too.
	Applied bool
}

// DeadList is what `sluice dead list` shows.
type DeadList struct {
	// Quarantined are the quarantined outbox rows (none when a Consumer was given).
	Quarantined []outbox.QuarantinedRow
	// Parked are the parked inbox rows.
	Parked []inbox.ParkedEvent
	// DeadLetters are the consumers' dead letters (not those applied since, unless asked).
	DeadLetters []inbox.DeadLetter
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
	out.DeadLetters, err = inbox.ListDeadLetters(ctx, db, inbox.DeadLetterFilter{Consumer: opts.Consumer, IncludeApplied: opts.Applied, Limit: opts.Limit})
	if err != nil {
		return DeadList{}, err
	}
	return out, nil
}

// DeadRetryOptions configure RetryDead. Give either All or ids, not both.
type DeadRetryOptions struct {
	// Consumer retries parked inbox rows and dead letters of this consumer: IDs are then
	// message ids (a dead letter's key). Without it, IDs are outbox row ids, and All retries
	// every quarantined row, parked row and dead letter.
	Consumer string
	// All retries every quarantined outbox row, parked inbox row and dead letter in the dead
	// state that can be retried (narrowed by Consumer).
	All bool
	// IDs are the rows to retry: outbox row ids (decimal), or message ids with Consumer.
	IDs []string
	// DryRun chooses the rows and changes nothing.
	DryRun bool
	// Confirm is given the chosen rows before any is released (not on a dry run, nor when none
	// was chosen); an error stops it, nothing released. Defaults to nil: no confirmation.
	Confirm func(DeadRetryResult) error
}

// DeadRetryResult is what RetryDead chose and released.
type DeadRetryResult struct {
	// Outbox and Inbox are the rows chosen, in the order they were listed.
	Outbox []outbox.QuarantinedRow
	Inbox  []inbox.ParkedEvent
	// DeadLetters are the consumers' dead letters chosen, and Unretryable those --all passed
	// over because they cannot be retried through the inbox (redrive their source's copy).
	DeadLetters, Unretryable []inbox.DeadLetter
	// OutboxReleased and InboxReleased count the rows released (zero on a dry run).
	OutboxReleased, InboxReleased int64
	// Stored are the dead letters stored for the processor, InInbox those the inbox already
	// held (nothing changed: they are applied or waiting already), as consumer/key.
	Stored, InInbox []string
	// OutboxChosen and InboxChosen report whether each kind was chosen from, so that a report
	// says "none to retry" only for the kinds asked for.
	OutboxChosen, InboxChosen bool
}

// Chosen is the number of rows chosen: outbox rows, parked inbox rows and dead letters.
func (r DeadRetryResult) Chosen() int {
	return len(r.Outbox) + len(r.Inbox) + len(r.DeadLetters)
}

// RetryDead releases quarantined outbox rows and parked inbox rows for another attempt with a
// fresh attempt count. Every id given must be quarantined (or parked): otherwise it changes
// nothing and says which are not. It chooses every row first, asks opts.Confirm with them, and
// then releases exactly those.
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
	}
	if opts.Consumer != "" || opts.All {
		var err error
		if res.Inbox, res.DeadLetters, res.Unretryable, err = chooseInbox(ctx, db, opts.Consumer, opts.All, opts.IDs); err != nil {
			return res, err
		}
		res.InboxChosen = true
	}
	if opts.DryRun || res.Chosen() == 0 {
		return res, nil
	}
	if opts.Confirm != nil {
		if err := opts.Confirm(res); err != nil {
			return res, err
		}
	}
	if len(res.Outbox) > 0 {
		sel := make([]int64, len(res.Outbox))
		for i, r := range res.Outbox {
			sel[i] = r.ID
		}
		var err error
		if res.OutboxReleased, err = outbox.RetryQuarantined(ctx, db, sel); err != nil {
			return res, err
		}
	}
	if !res.InboxChosen {
		return res, nil
	}
	var err error
	if res.InboxReleased, err = retryParked(ctx, db, res.Inbox); err != nil {
		return res, err
	}
	err = retryDeadLetters(ctx, db, res.DeadLetters, &res)
	return res, err
}

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

// chooseInbox returns, for consumer ("" for all consumers), every parked row and every dead
// letter in the dead state when all (setting aside those that cannot be retried through the
// inbox), or the parked rows and dead letters of messageIDs, failing when one of them is
// neither. A message id parked and also a dead letter (a retried dead letter the processor
// parked) is retried as the parked row it is now.
func chooseInbox(ctx context.Context, db Querier, consumer string, all bool, messageIDs []string) (
	parked []inbox.ParkedEvent, letters, unretryable []inbox.DeadLetter, err error) {
	if parked, err = inbox.ListParked(ctx, db, consumer, deadLimit); err != nil {
		return nil, nil, nil, err
	}
	if all {
		dead, err := inbox.ListDeadLetters(ctx, db, inbox.DeadLetterFilter{Consumer: consumer, Limit: deadLimit})
		if err != nil {
			return nil, nil, nil, err
		}
		for _, d := range dead {
			switch {
			case d.State != inbox.DeadDead:
			case d.MessageID == "" || d.ErrorClass == inbox.ClassClaimCheck:
				unretryable = append(unretryable, d)
			default:
				letters = append(letters, d)
			}
		}
		return parked, letters, unretryable, nil
	}
	byID := make(map[string]inbox.ParkedEvent, len(parked))
	for _, p := range parked {
		byID[p.MessageID] = p
	}
	var rest []string
	parked = parked[:0:0]
	for _, id := range messageIDs {
		if p, ok := byID[id]; ok {
			parked = append(parked, p)
		} else {
			rest = append(rest, id)
		}
	}
	if len(rest) > 0 {
		found, err := inbox.ListDeadLetters(ctx, db, inbox.DeadLetterFilter{Consumer: consumer, Keys: rest, IncludeApplied: true, Limit: deadLimit})
		if err != nil {
			return nil, nil, nil, err
		}
		have := map[string]bool{}
		for _, d := range found {
			have[d.Key] = true
		}
		var missing []string
		for _, id := range rest {
			if !have[id] {
				missing = append(missing, id)
			}
		}
		if len(missing) > 0 {
			return nil, nil, nil, fmt.Errorf("inbox rows %s of consumer %q are not parked or dead letters; nothing retried", strings.Join(missing, ", "), consumer)
		}
		for _, d := range found {
			// Said before the plan: what RetryDeadLetters would refuse once confirmed.
			if d.MessageID == "" || d.ErrorClass == inbox.ClassClaimCheck {
				return nil, nil, nil, fmt.Errorf("%w: %s/%s (%s); redrive its source's copy once the cause is fixed; nothing retried", inbox.ErrNotRetryable, d.Consumer, d.Key, d.ErrorClass)
			}
		}
		letters = found
	}
	return parked, letters, nil, nil
}

// retryDeadLetters stores dead letters for their consumers' processors, consumer by consumer
// (in name order), recording what happened to each in res.
func retryDeadLetters(ctx context.Context, db Querier, letters []inbox.DeadLetter, res *DeadRetryResult) error {
	beginner, ok := db.(inbox.Beginner)
	if !ok && len(letters) > 0 {
		return fmt.Errorf("retry dead letters: %T cannot begin a transaction", db)
	}
	byConsumer := map[string][]string{}
	for _, d := range letters {
		byConsumer[d.Consumer] = append(byConsumer[d.Consumer], d.Key)
	}
	consumers := slices.Sorted(maps.Keys(byConsumer))
	for _, c := range consumers {
		r, err := inbox.RetryDeadLetters(ctx, beginner, c, byConsumer[c])
		if err != nil {
			return err
		}
		for _, k := range r.Stored {
			res.Stored = append(res.Stored, c+"/"+k)
		}
		for _, k := range r.AlreadyInInbox {
			res.InInbox = append(res.InInbox, c+"/"+k)
		}
	}
	return nil
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
		Short: "List, show and retry quarantined outbox rows, parked inbox rows and consumer dead letters",
		Long: `Rows that need an operator: outbox rows the relay quarantined (they block only their own
partition key), inbox rows the asynchronous processor parked after its attempts ran out, and
consumer dead letters: records a consumer failed on, kept with their error class and chain,
payload and source coordinates (the last attempt before the DLQ, a stream mapping's last retry,
ConsumeKafka's give-up). Fix the cause (the last error says what it was), then retry them: a
retried dead letter is stored in the inbox for the consumer's processor, so it is applied once,
even if its DLQ copy is redriven too.`,
		Example: `  sluice dead list
  sluice dead show --consumer billing 6f1c9a1e-0c1e-4c53-9f5b-2a4b8f0d1e77
  sluice dead retry --dry-run --all
  sluice dead retry 1042 1043
  sluice dead retry --consumer billing 6f1c9a1e-0c1e-4c53-9f5b-2a4b8f0d1e77`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usagef("missing subcommand: list or retry (see 'sluice dead --help')")
		},
	}
	cmd.AddCommand(a.deadListCommand(), a.deadShowCommand(), a.deadRetryCommand())
	readsOnly(cmd)
	return cmd
}

func (a *app) deadListCommand() *cobra.Command {
	var (
		opts   DeadListOptions
		asJSON bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "Show quarantined outbox rows, parked inbox rows and consumer dead letters with their last error",
		Example: `  sluice dead list
  sluice dead list --consumer billing --limit 20
  sluice dead list --applied --json`,
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
	cmd.Flags().StringVar(&opts.Consumer, "consumer", "", "show only this inbox consumer's parked rows and dead letters (and no outbox rows)")
	cmd.Flags().IntVar(&opts.Limit, "limit", 100, "most rows of each kind to show")
	cmd.Flags().BoolVar(&opts.Applied, "applied", false, "list dead letters the inbox applied since too")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	readsOnly(cmd)
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
		Outbox      []row               `json:"outbox_quarantined"`
		Inbox       []inbox.ParkedEvent `json:"inbox_parked"`
		DeadLetters []inbox.DeadLetter  `json:"inbox_dead_letters"`
	}{Outbox: []row{}, Inbox: list.Parked, DeadLetters: list.DeadLetters}
	if doc.DeadLetters == nil {
		doc.DeadLetters = []inbox.DeadLetter{}
	}
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
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Consumer dead letters: %d\n", len(list.DeadLetters))
	if len(list.DeadLetters) > 0 {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "CONSUMER\tKEY\tTYPE\tSOURCE\tATTEMPTS\tSTATE\tLAST FAILED\tCLASS\tLAST ERROR")
		for _, d := range list.DeadLetters {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", d.Consumer, d.Key, orDash(d.EventType), d.Source, d.Attempts,
				d.State, d.LastFailedAt.UTC().Format(time.RFC3339), d.ErrorClass, clip(d.Error, 100))
		}
		_ = tw.Flush()
		fmt.Fprintln(w, "show: sluice dead show --consumer NAME KEY; retry: sluice dead retry --consumer NAME KEY... (or --all)")
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func (a *app) deadShowCommand() *cobra.Command {
	var (
		consumer string
		asJSON   bool
	)
	cmd := &cobra.Command{
		Use:   "show --consumer NAME KEY",
		Short: "Show one consumer dead letter: its error chain, payload, headers and where it came from",
		Example: `  sluice dead show --consumer billing 6f1c9a1e-0c1e-4c53-9f5b-2a4b8f0d1e77
  sluice dead show --consumer billing --json 6f1c9a1e-0c1e-4c53-9f5b-2a4b8f0d1e77`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if consumer == "" {
				return usagef("--consumer is required: the inbox consumer the dead letter belongs to")
			}
			ctx := cmd.Context()
			pool, err := a.db(ctx)
			if err != nil {
				return err
			}
			found, err := inbox.ListDeadLetters(ctx, pool, inbox.DeadLetterFilter{Consumer: consumer, Keys: args, IncludeApplied: true, Limit: 1})
			if err != nil {
				return err
			}
			if len(found) == 0 {
				return fmt.Errorf("no dead letter %q of consumer %q (sluice dead list --consumer %s --applied lists them)", args[0], consumer, consumer)
			}
			if asJSON {
				enc := json.NewEncoder(a.io.Out)
				enc.SetIndent("", "  ")
				return enc.Encode(found[0])
			}
			printDeadLetter(a.io.Out, found[0])
			return nil
		},
	}
	cmd.Flags().StringVar(&consumer, "consumer", "", "the inbox consumer (required)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	readsOnly(cmd)
	return cmd
}

// printDeadLetter prints one dead letter as `sluice dead show` does.
func printDeadLetter(w io.Writer, d inbox.DeadLetter) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	at := func(t *time.Time) string {
		if t == nil {
			return "-"
		}
		return t.UTC().Format(time.RFC3339)
	}
	receives := "-"
	if d.ReceiveCount > 0 {
		receives = fmt.Sprint(d.ReceiveCount)
	}
	for _, kv := range [][2]string{
		{"Consumer", d.Consumer}, {"Key", d.Key}, {"Message id", orDash(d.MessageID)}, {"Event type", orDash(d.EventType)},
		{"Group", orDash(d.GroupID)}, {"State", string(d.State)}, {"Source", d.Source}, {"Source name", orDash(d.SourceName)},
		{"Position", orDash(d.SourcePosition)}, {"Receive count", receives}, {"Attempts", fmt.Sprint(d.Attempts)},
		{"First failed", d.FirstFailedAt.UTC().Format(time.RFC3339)}, {"Last failed", d.LastFailedAt.UTC().Format(time.RFC3339)},
		{"Dead since", at(d.DeadAt)}, {"Retried", at(d.RetriedAt)}, {"Error class", d.ErrorClass}, {"Error", oneLine(d.Error)},
	} {
		fmt.Fprintf(tw, "%s:\t%s\n", kv[0], kv[1])
	}
	_ = tw.Flush()
	fmt.Fprintln(w, "Error chain (outermost first):")
	for i, l := range d.ErrorChain {
		fmt.Fprintf(w, "  %d. %s: %s\n", i+1, l.Type, oneLine(l.Text))
	}
	if len(d.Headers) > 0 {
		fmt.Fprintln(w, "Headers:")
		for _, k := range slices.Sorted(maps.Keys(d.Headers)) {
			fmt.Fprintf(w, "  %s: %s\n", k, d.Headers[k])
		}
	}
	fmt.Fprintln(w, "Payload:")
	fmt.Fprintln(w, d.Payload)
}

func (a *app) deadRetryCommand() *cobra.Command {
	var (
		opts DeadRetryOptions
		g    guard
	)
	cmd := &cobra.Command{
		Use:   "retry [--all | ID... | --consumer NAME KEY...]",
		Short: "Release quarantined outbox rows, parked inbox rows or dead letters for another attempt",
		Long: `Release rows for another attempt with a fresh attempt count.

  sluice dead retry ID...                        outbox rows, by id (see sluice dead list)
  sluice dead retry --consumer NAME KEY...       parked inbox rows or dead letters of one consumer
  sluice dead retry --all                        every quarantined outbox row, parked inbox row and dead letter
  sluice dead retry --all --consumer NAME        every parked row and dead letter of one consumer

Every id given must be quarantined (or parked, or a dead letter); otherwise nothing is changed.
A dead letter is stored in the inbox for the consumer's processor (its schedule in the CDK
stack, or the inbox.Processor you run), which applies it once with the consumer's handlers: its
inbox key is taken, so a copy redriven from the DLQ is a duplicate. --all passes over dead
letters that are still being retried by their source, and those that cannot go through the
inbox (a record that could not be parsed, a payload never fetched from S3).

It first prints the rows it chose, and releases exactly those. --dry-run stops there. On a
terminal it asks for confirmation; --yes confirms for scripts; without a terminal and without
--yes it refuses and changes nothing.`,
		Example: `  sluice dead retry --dry-run --all
  sluice dead retry 1042 1043 --yes
  sluice dead retry --consumer billing 6f1c9a1e-0c1e-4c53-9f5b-2a4b8f0d1e77 --yes
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
			opts.DryRun = g.dryRun
			opts.Confirm = func(plan DeadRetryResult) error {
				a.printPlan(g, "dead retry", plan, func(w io.Writer) { printDeadRetry(w, plan, true, false) })
				return a.proceedOrStop(g, fmt.Sprintf("Retry these %d rows?", plan.Chosen()), "retry dead rows")
			}
			res, err := RetryDead(ctx, pool, opts)
			if errors.Is(err, errDryRun) {
				return nil
			}
			if opts.DryRun {
				a.printPlan(g, "dead retry", res, func(w io.Writer) { printDeadRetry(w, res, true, false) })
				return err
			}
			if g.json {
				emitJSON(a.io.Out, map[string]any{"event": "result", "op": "dead retry", "outbox_released": res.OutboxReleased,
					"inbox_released": res.InboxReleased, "dead_letters_stored": len(res.Stored), "already_in_inbox": len(res.InInbox)})
				return err
			}
			printDeadRetry(a.io.Out, res, false, err == nil)
			return err
		},
	}
	cmd.Flags().StringVar(&opts.Consumer, "consumer", "", "retry parked inbox rows and dead letters of this consumer (ids are then message ids)")
	cmd.Flags().BoolVar(&opts.All, "all", false, "retry every quarantined/parked row (narrowed by --consumer)")
	g.flags(cmd, "be retried")
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
		if len(res.Inbox) == 0 && len(res.DeadLetters) == 0 {
			fmt.Fprintln(w, "no parked inbox rows or dead letters to retry")
		}
		for _, p := range res.Inbox {
			fmt.Fprintf(w, "%s inbox row %s/%s (%s)\n", verb, p.Consumer, p.MessageID, p.EventType)
		}
		if released && len(res.Inbox) > 0 {
			fmt.Fprintf(w, "released %d parked inbox rows for the processor\n", res.InboxReleased)
		}
		for _, d := range res.DeadLetters {
			fmt.Fprintf(w, "%s dead letter %s/%s (%s)\n", verb, d.Consumer, d.Key, orDash(d.EventType))
		}
		for _, d := range res.Unretryable {
			fmt.Fprintf(w, "cannot retry dead letter %s/%s through the inbox (%s): redrive its source's copy once the cause is fixed\n", d.Consumer, d.Key, d.ErrorClass)
		}
		if released && len(res.Stored) > 0 {
			fmt.Fprintf(w, "stored %d dead letters for the consumer's processor: %s\n", len(res.Stored), strings.Join(res.Stored, ", "))
		}
		if len(res.InInbox) > 0 {
			fmt.Fprintf(w, "already in the inbox, nothing to do (applied or waiting): %s\n", strings.Join(res.InInbox, ", "))
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
