package cli

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/sluicehq/sluice/pkg/fleet"
)

// Defaults of `sluice status --fleet`.
const (
	// DefaultFleetStatusTimeout is how long status --fleet waits for one tenant (connecting
	// and reading) before it reports the tenant as failing.
	DefaultFleetStatusTimeout = 10 * time.Second
	// DefaultFleetStatusParallel is how many tenants status --fleet reads at once.
	DefaultFleetStatusParallel = 4
)

// FleetStatus is the document `sluice status --fleet --json` prints: each tenant's status,
// worst first.
type FleetStatus struct {
	// Time is when the figures were read (RFC 3339, UTC).
	Time time.Time `json:"time"`
	// Tenants are sorted worst first: failing tenants, then by oldest pending outbox row,
	// pending rows, quarantined and parked rows.
	Tenants []TenantStatus `json:"tenants"`
	// Failing is the number of tenants whose status could not be read.
	Failing int `json:"failing"`
}

// TenantStatus is one tenant's status: the single database's Status (outbox, inbox,
// database), or the error that kept it from being read.
type TenantStatus struct {
	Tenant string `json:"tenant"`
	// Error says why the tenant's status could not be read (unreachable, wrong password,
	// missing schema, timed out); empty when it was.
	Error string `json:"error,omitempty"`
	// Status is absent when Error is set.
	*Status
}

// compareTenants orders a fleet's status worst first: a failing tenant first, then the older
// oldest pending outbox row, then more pending rows, then more rows waiting for an operator
// (quarantined outbox rows and parked inbox rows), then by name.
func compareTenants(t, u TenantStatus) int {
	if (t.Error != "") != (u.Error != "") {
		if t.Error != "" {
			return -1
		}
		return 1
	}
	if t.Status != nil && u.Status != nil {
		if c := cmp.Compare(u.Outbox.OldestPendingAgeSeconds, t.Outbox.OldestPendingAgeSeconds); c != 0 {
			return c
		}
		if c := cmp.Compare(u.Outbox.Pending, t.Outbox.Pending); c != 0 {
			return c
		}
		if c := cmp.Compare(u.stuck(), t.stuck()); c != 0 {
			return c
		}
	}
	return strings.Compare(t.Tenant, u.Tenant)
}

// stuck counts the rows that wait for an operator: quarantined outbox rows, parked inbox rows.
func (t TenantStatus) stuck() int64 {
	n := t.Outbox.Quarantined
	for _, c := range t.Inbox {
		n += c.Parked
	}
	return n
}

// FleetStatusOptions configure ReadFleetStatus.
type FleetStatusOptions struct {
	// Open opens a tenant's database; ReadFleetStatus closes the pool. Required.
	Open func(ctx context.Context, t fleet.Tenant) (*pgxpool.Pool, error)
	// Timeout bounds each tenant's connection and reads. Defaults to DefaultFleetStatusTimeout.
	Timeout time.Duration
	// Parallel is how many tenants are read at once, 1 to MaxFleetParallel. Defaults to
	// DefaultFleetStatusParallel.
	Parallel int
	// Status configures each tenant's ReadStatus (Queues must be empty: a queue is not a
	// tenant's).
	Status StatusOptions
}

// ReadFleetStatus reads each tenant's status as ReadStatus does, sorted worst first. A tenant
// whose status cannot be read within the timeout is listed with its error, first; it does not
// keep the others from being read. The error is only for bad options or an interruption.
func ReadFleetStatus(ctx context.Context, tenants []fleet.Tenant, opts FleetStatusOptions) (*FleetStatus, error) {
	if opts.Open == nil {
		return nil, errors.New("cli: FleetStatusOptions.Open is required")
	}
	if len(opts.Status.Queues) > 0 {
		return nil, usagef("--queue is not read per tenant: run sluice status --queue URL without --fleet")
	}
	if opts.Timeout == 0 {
		opts.Timeout = DefaultFleetStatusTimeout
	}
	if opts.Parallel == 0 {
		opts.Parallel = DefaultFleetStatusParallel
	}
	if opts.Timeout < 0 {
		return nil, usagef("--timeout must be positive")
	}
	if opts.Parallel < 1 || opts.Parallel > MaxFleetParallel {
		return nil, usagef("--parallel %d is not between 1 and %d", opts.Parallel, MaxFleetParallel)
	}
	fs := &FleetStatus{Time: time.Now().UTC().Truncate(time.Second), Tenants: make([]TenantStatus, 0, len(tenants))}
	started := forEachTenant(ctx, tenants, opts.Parallel,
		func(ctx context.Context, t fleet.Tenant) TenantStatus { return tenantStatus(ctx, t, opts) },
		func(_, _ int, st TenantStatus) { fs.Tenants = append(fs.Tenants, st) })
	if started < len(tenants) || ctx.Err() != nil {
		return nil, fmt.Errorf("%w: read %d of %d tenants", ErrInterrupted, started, len(tenants))
	}
	slices.SortFunc(fs.Tenants, compareTenants)
	for _, t := range fs.Tenants {
		if t.Error != "" {
			fs.Failing++
		}
	}
	return fs, nil
}

// tenantStatus reads one tenant's status within opts.Timeout.
func tenantStatus(ctx context.Context, t fleet.Tenant, opts FleetStatusOptions) TenantStatus {
	ctx, cancel := context.WithTimeout(ctx, opts.Timeout)
	defer cancel()
	st, err := func() (*Status, error) {
		pool, err := opts.Open(ctx, t)
		if err != nil {
			return nil, err
		}
		defer pool.Close()
		return ReadStatus(ctx, pool, opts.Status)
	}()
	if err != nil {
		msg := err.Error()
		var pg *pgconn.PgError
		if errors.As(err, &pg) && pg.Code == "42P01" {
			msg += fmt.Sprintf(" (is the database migrated? run `sluice migrate --fleet --from %s`)", t.Name)
		}
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			msg = fmt.Sprintf("no answer within %s (--timeout): %s", FormatDuration(opts.Timeout), msg)
		}
		return TenantStatus{Tenant: t.Name, Error: oneLine(msg)}
	}
	return TenantStatus{Tenant: t.Name, Status: st}
}

// printFleetStatus prints one line per tenant, worst first; a failing tenant's line is its error.
func printFleetStatus(w io.Writer, fs *FleetStatus) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TENANT\tPENDING\tOLDEST\tQUARANTINED\tPUBLISHED/1m\tUNPROCESSED\tINBOX OLDEST\tPARKED")
	for _, t := range fs.Tenants {
		if t.Error != "" {
			// The error is the line's last cell, which tabwriter leaves out of the columns' widths.
			fmt.Fprintf(tw, "%s\tFAILING: %s\n", t.Tenant, t.Error)
			continue
		}
		var unprocessed, parked int64
		var inboxOldest float64
		for _, c := range t.Inbox {
			unprocessed += c.Unprocessed
			parked += c.Parked
			inboxOldest = max(inboxOldest, c.OldestUnprocessedAgeSeconds)
		}
		o := t.Outbox
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%d\t%d\t%s\t%d\n", t.Tenant, o.Pending, FormatDuration(dur(o.OldestPendingAgeSeconds)),
			o.Quarantined, o.PublishedLastMinute, unprocessed, FormatDuration(dur(inboxOldest)), parked)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "%d tenants, %d failing\n", len(fs.Tenants), fs.Failing)
	return nil
}

// statusFleet runs `sluice status --fleet`.
func (a *app) statusFleet(cmd *cobra.Command, src fleetSource, asJSON bool, opts FleetStatusOptions) error {
	if err := noDatabaseURL(cmd, "--fleet reads the fleet's tenant databases"); err != nil {
		return err
	}
	ctx := cmd.Context()
	tenants, err := a.fleetTenants(ctx, src)
	if err != nil {
		return err
	}
	open, err := a.tenantOpener(ctx, tenants)
	if err != nil {
		return err
	}
	opts.Open = open.open
	fs, err := ReadFleetStatus(ctx, tenants, opts)
	if err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(a.io.Out)
		enc.SetIndent("", "  ")
		if err := enc.Encode(fs); err != nil {
			return err
		}
	} else if err := printFleetStatus(a.io.Out, fs); err != nil {
		return err
	}
	if fs.Failing > 0 {
		var names []string
		for _, t := range fs.Tenants {
			if t.Error != "" {
				names = append(names, t.Tenant)
			}
		}
		return fmt.Errorf("status --fleet: %d of %d tenants failing: %s", fs.Failing, len(fs.Tenants), strings.Join(names, ", "))
	}
	return nil
}
