package inbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// TenantProcessor is the Processor of a fleet consumer: it applies the stored rows (the Async
// mode's messages, retried dead letters) of every tenant, each in its own database, one tenant
// after the other, with a Processor per tenant on the tenant's pool. A failing tenant
// (unreachable, broken schema) costs only its own turn: the others are drained all the same.
type TenantProcessor struct {
	pools   *TenantPools
	tenants func(ctx context.Context) ([]string, error)
	cfg     ProcessorConfig
}

// NewTenantProcessor returns a TenantProcessor over pools: tenants lists the tenants to drain
// (the fleet's registry), read again at every Drain; cfg configures each tenant's Processor.
func NewTenantProcessor(pools *TenantPools, tenants func(ctx context.Context) ([]string, error), cfg ProcessorConfig) (*TenantProcessor, error) {
	if pools == nil || tenants == nil {
		return nil, fmt.Errorf("%w: TenantProcessor needs the tenant pools and the tenants' list", ErrInvalidConfig)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &TenantProcessor{pools: pools, tenants: tenants, cfg: cfg}, nil
}

// Drain drains every tenant's stored rows once (Processor.Drain on each) and returns the sum
// of their stats; its error joins the tenants' errors, each naming its tenant.
func (p *TenantProcessor) Drain(ctx context.Context) (ProcessStats, error) {
	var total ProcessStats
	names, err := p.tenants(ctx)
	if err != nil {
		return total, fmt.Errorf("list the fleet's tenants: %w", err)
	}
	var errs []error
	for _, name := range names {
		if ctx.Err() != nil {
			break
		}
		err := p.pools.WithTenant(ctx, name, func(db *pgxpool.Pool) error {
			proc, err := NewProcessor(db, p.cfg)
			if err != nil {
				return err
			}
			proc.log = proc.log.With("tenant", name)
			st, err := proc.Drain(ctx)
			total.Applied, total.Skipped, total.Failed, total.Parked = total.Applied+st.Applied, total.Skipped+st.Skipped,
				total.Failed+st.Failed, total.Parked+st.Parked
			return err
		})
		if err != nil {
			errs = append(errs, fmt.Errorf("tenant %s: %w", name, err))
		}
	}
	return total, errors.Join(errs...)
}

// Run drains every tenant, then polls every PollInterval, until ctx is done, and returns ctx's
// error. A tenant's failure is logged and does not stop the others.
func (p *TenantProcessor) Run(ctx context.Context) error {
	for {
		if _, err := p.Drain(ctx); err != nil && ctx.Err() == nil {
			p.cfg.Logger.WarnContext(ctx, "inbox: fleet processor: some tenants failed; they are retried at the next poll", "error", err.Error())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(p.cfg.PollInterval):
		}
	}
}
