package cli

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/pkg/inbox"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// deadLimit bounds how many rows list and retry --dry-run read; quarantine is meant to be small.
const deadLimit = 10000

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
		consumer string
		limit    int
		asJSON   bool
	)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "Show quarantined outbox rows and parked inbox rows with their last error",
		Example: `  sluice dead list
  sluice dead list --consumer billing --limit 20
  sluice dead list --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit < 1 {
				return usagef("--limit must be positive, got %d", limit)
			}
			ctx := cmd.Context()
			pool, err := a.db(ctx)
			if err != nil {
				return err
			}
			var quarantined []outbox.QuarantinedRow
			if consumer == "" {
				if quarantined, err = outbox.ListQuarantined(ctx, pool, limit); err != nil {
					return err
				}
			}
			parked, err := inbox.ListParked(ctx, pool, consumer, limit)
			if err != nil {
				return err
			}
			if asJSON {
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
				}{Outbox: []row{}, Inbox: parked}
				for _, q := range quarantined {
					doc.Outbox = append(doc.Outbox, row{q.ID, q.EventID.String(), q.Topic, q.EventType, q.PartitionKey, q.Attempts,
						q.LastError, q.CreatedAt, q.QuarantinedAt, q.BlockedBehind})
				}
				if doc.Inbox == nil {
					doc.Inbox = []inbox.ParkedEvent{}
				}
				enc := json.NewEncoder(a.io.Out)
				enc.SetIndent("", "  ")
				return enc.Encode(doc)
			}
			w := a.io.Out
			if consumer == "" {
				fmt.Fprintf(w, "Quarantined outbox rows: %d\n", len(quarantined))
				if len(quarantined) > 0 {
					tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
					fmt.Fprintln(tw, "ID\tEVENT ID\tTOPIC\tTYPE\tKEY\tATTEMPTS\tBLOCKING\tQUARANTINED\tLAST ERROR")
					for _, q := range quarantined {
						fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", q.ID, q.EventID, q.Topic, q.EventType, q.PartitionKey,
							q.Attempts, q.BlockedBehind, q.QuarantinedAt.UTC().Format(time.RFC3339), clip(q.LastError, 100))
					}
					_ = tw.Flush()
					fmt.Fprintln(w, "retry: sluice dead retry ID... (or --all)")
				}
				fmt.Fprintln(w)
			}
			fmt.Fprintf(w, "Parked inbox rows: %d\n", len(parked))
			if len(parked) > 0 {
				tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
				fmt.Fprintln(tw, "CONSUMER\tMESSAGE ID\tTYPE\tATTEMPTS\tPARKED\tLAST ERROR")
				for _, p := range parked {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%s\t%s\n", p.Consumer, p.MessageID, p.EventType, p.Attempts,
						p.ParkedAt.UTC().Format(time.RFC3339), clip(p.LastError, 100))
				}
				_ = tw.Flush()
				fmt.Fprintln(w, "retry: sluice dead retry --consumer NAME MESSAGE_ID... (or --all)")
			}
			return nil
		},
	}
	cmd.Flags().StringVar(&consumer, "consumer", "", "show only this inbox consumer's parked rows (and no outbox rows)")
	cmd.Flags().IntVar(&limit, "limit", 100, "most rows of each kind to show")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func (a *app) deadRetryCommand() *cobra.Command {
	var (
		consumer string
		all      bool
		dryRun   bool
	)
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
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			if all == (len(args) > 0) {
				return usagef("give either --all or the ids to retry, not both and not neither")
			}
			var ids []int64
			if consumer == "" && !all {
				for _, s := range args {
					id, err := strconv.ParseInt(s, 10, 64)
					if err != nil || id < 1 {
						return usagef("%q is not an outbox row id (to retry inbox rows, pass --consumer NAME)", s)
					}
					ids = append(ids, id)
				}
			}
			pool, err := a.db(ctx)
			if err != nil {
				return err
			}
			verb := "retried"
			if dryRun {
				verb = "would retry"
			}
			// Outbox rows: explicit ids, or all (unless --consumer narrows to the inbox).
			if consumer == "" {
				rows, err := outbox.ListQuarantined(ctx, pool, deadLimit)
				if err != nil {
					return err
				}
				var chosen []outbox.QuarantinedRow
				if all {
					chosen = rows
				} else {
					byID := map[int64]outbox.QuarantinedRow{}
					for _, r := range rows {
						byID[r.ID] = r
					}
					var missing []string
					for _, id := range ids {
						if r, ok := byID[id]; ok {
							chosen = append(chosen, r)
						} else {
							missing = append(missing, strconv.FormatInt(id, 10))
						}
					}
					if len(missing) > 0 {
						return fmt.Errorf("outbox rows %s are not quarantined; nothing retried", strings.Join(missing, ", "))
					}
				}
				if len(chosen) == 0 {
					fmt.Fprintln(a.io.Out, "no quarantined outbox rows to retry")
				}
				for _, r := range chosen {
					fmt.Fprintf(a.io.Out, "%s outbox row %d (%s %s, key %s)\n", verb, r.ID, r.Topic, r.EventType, r.PartitionKey)
				}
				if !dryRun && len(chosen) > 0 {
					sel := ids
					if all {
						for _, r := range chosen {
							sel = append(sel, r.ID)
						}
					}
					n, err := outbox.RetryQuarantined(ctx, pool, sel)
					if err != nil {
						return err
					}
					fmt.Fprintf(a.io.Out, "released %d outbox rows for the relay\n", n)
				}
				if !all {
					return nil
				}
			}
			// Inbox rows.
			parked, err := inbox.ListParked(ctx, pool, consumer, deadLimit)
			if err != nil {
				return err
			}
			chosen := map[string][]string{} // consumer -> message ids
			var order []string
			add := func(p inbox.ParkedEvent) {
				if _, ok := chosen[p.Consumer]; !ok {
					order = append(order, p.Consumer)
				}
				chosen[p.Consumer] = append(chosen[p.Consumer], p.MessageID)
				fmt.Fprintf(a.io.Out, "%s inbox row %s/%s (%s)\n", verb, p.Consumer, p.MessageID, p.EventType)
			}
			if all {
				for _, p := range parked {
					add(p)
				}
			} else {
				byID := map[string]inbox.ParkedEvent{}
				for _, p := range parked {
					byID[p.MessageID] = p
				}
				var missing []string
				for _, id := range args {
					if _, ok := byID[id]; !ok {
						missing = append(missing, id)
					}
				}
				if len(missing) > 0 {
					return fmt.Errorf("inbox rows %s of consumer %q are not parked; nothing retried", strings.Join(missing, ", "), consumer)
				}
				for _, id := range args {
					add(byID[id])
				}
			}
			if len(chosen) == 0 {
				fmt.Fprintln(a.io.Out, "no parked inbox rows to retry")
				return nil
			}
			if dryRun {
				return nil
			}
			slices.Sort(order)
			var total int64
			for _, c := range order {
				n, err := inbox.RetryParked(ctx, pool, c, chosen[c]...)
				if err != nil {
					return err
				}
				total += n
			}
			fmt.Fprintf(a.io.Out, "released %d parked inbox rows for the processor\n", total)
			return nil
		},
	}
	cmd.Flags().StringVar(&consumer, "consumer", "", "retry parked inbox rows of this consumer (ids are then message ids)")
	cmd.Flags().BoolVar(&all, "all", false, "retry every quarantined/parked row (narrowed by --consumer)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "show what would be retried; change nothing")
	return cmd
}

func clip(s string, n int) string {
	s = oneLine(s)
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}
