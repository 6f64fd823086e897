package fleet

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/pkg/metrics"
	"github.com/sluicehq/sluice/pkg/outbox"
)

// Defaults of Config.
const (
	// DefaultServerConnections is a server's connection budget when Config names none.
	DefaultServerConnections = 20
	// DefaultRegistryRefresh is how often the registry is read: a tenant added or removed takes
	// effect within it.
	DefaultRegistryRefresh = 30 * time.Second
	// DefaultSweepInterval is the longest an idle tenant goes without its database being
	// looked at directly.
	DefaultSweepInterval = 30 * time.Second
	// DefaultDetectInterval is how often a server's activity counters are read.
	DefaultDetectInterval = 250 * time.Millisecond
	// DefaultIdleClose is how long a tenant keeps its connections parked after a turn that
	// published, while no other tenant needs them.
	DefaultIdleClose = 5 * time.Second
	// DefaultTurn is a tenant's (of weight 1) share of time: see Config.Turn.
	DefaultTurn = time.Second
	// DefaultBusyShare is the share of a server's budget that tenants past their turn keep
	// while another tenant waits.
	DefaultBusyShare = 0.5
	// DefaultTopTenants is how many tenants get metrics of their own (the rest are summed
	// under the tenant "_other").
	DefaultTopTenants = 20
)

// OtherTenants is the tenant dimension of the metrics of the tenants outside the top
// Config.TopTenants.
const OtherTenants = "_other"

// Config configures a Fleet. Zero fields take the defaults stated on each.
type Config struct {
	// Registry lists the tenant databases. Required.
	Registry Registry
	// Relay is the configuration of every tenant's relay: Publisher, Topics and the relay's
	// settings; Tenant is set per tenant, Metrics and MetricsRecorder are the fleet's (per
	// tenant, see TopTenants). IdleStop is ignored: IdleClose and Turn decide how long a
	// tenant's relay runs. Pipelines is per unit of weight and defaults to 1: a tenant's turn
	// starts with Weight × Pipelines pipelines (at most 16) on a pool of as many connections.
	// RoundMemory is shared by every tenant's relay, so that the payloads all the busy
	// tenants' rounds hold at once stay within one process budget (MaxRoundBytes bounds one
	// round); it defaults to BurstPipelines × MaxRoundBytes, one relay at its largest (the
	// relay Lambda sets it to its memory ÷ 8, lambdaenv.RoundMemory).
	Relay outbox.RelayConfig
	// BurstPipelines is, per unit of weight, the pipelines a turn grows to while its tenant has
	// a backlog (still publishing growAfter into its turn, with a full batch per pipeline
	// claimed) and connections of its server's budget are free with no tenant waiting: a
	// tenant alone with a backlog drains as fast as a single-database relay. The extra connections go back as soon as another tenant of the
	// server waits. Defaults to the relay's default Pipelines (2), or Relay.Pipelines when that
	// is larger; Relay.Pipelines turns growing off.
	BurstPipelines int
	// Connect returns the pool configuration of a tenant's database; the fleet sets MaxConns
	// and MinConns, and executes statements without preparing them first
	// (pgx.QueryExecModeExec) unless it names another mode than pgx's default. Defaults to
	// parsing Tenant.DatabaseURL; required for tenants given by SecretARN (the relay Lambda's
	// resolves the secret, see pkg/lambdaenv).
	Connect func(ctx context.Context, t Tenant) (*pgxpool.Config, error)
	// ServerConnections maps a server (Tenant.Server) to the most connections the fleet holds
	// on it at once, its activity poll's included. Servers it does not name get
	// DefaultConnections.
	ServerConnections map[string]int
	// DefaultConnections is the budget of a server ServerConnections does not name. Defaults
	// to DefaultServerConnections. A budget is at least Relay.Pipelines + 1: one tenant's
	// pool and the server's activity poll.
	DefaultConnections int
	// RegistryRefresh is how often Registry is read. Defaults to DefaultRegistryRefresh.
	RegistryRefresh time.Duration
	// SweepInterval is the longest a registered tenant goes without a turn. Defaults to
	// DefaultSweepInterval.
	SweepInterval time.Duration
	// DetectInterval is how often each server's activity is read (pg_stat_database and
	// pg_stat_activity) to find tenant databases with new writes; a write transaction a poll
	// saw in flight is asked about sooner (pg_xact_status), so that its commit is seen a moment
	// after it. Defaults to DefaultDetectInterval.
	DetectInterval time.Duration
	// IdleClose is how long a tenant keeps its connections parked after a turn that
	// published: its next turn runs on them, found by a look at its own outbox every
	// DetectInterval. The budget asks parked connections back sooner when another tenant of
	// the server needs them. Defaults to DefaultIdleClose.
	IdleClose time.Duration
	// Turn is a tenant's share of time: a tenant of weight 1 that still has work after Turn
	// (Weight × Turn for heavier ones) gives its connections back when another tenant of its
	// server has waited Turn for connections and the busy tenants hold more than BusyShare of
	// the budget: a waiting tenant is let in within about two Turns however busy the others.
	// A turn's time counts from when its first session is open (its connect is not part of
	// its share). Defaults to DefaultTurn.
	Turn time.Duration
	// BusyShare bounds what busy tenants hold while others wait: once tenants past their
	// Weight × Turn hold more than this fraction of a server's connection budget and another
	// tenant has waited a Turn, the one that has run longest gives its connections back.
	// Between 0 and 1 (exclusive); defaults to DefaultBusyShare.
	BusyShare float64
	// Shard and Shards split a fleet between Shards deployments: this one serves the tenants
	// whose ShardOf(name, Shards) is Shard. Defaults to 0 of 1 (every tenant).
	Shard, Shards int
	// MetricsRecorder receives the fleet's metrics: each tenant's relay metrics with a Tenant
	// dimension (TopTenants by backlog named, the rest as OtherTenants) and the fleet's
	// FleetTenants/FleetTenantsFailing. Defaults to the relay's (Relay.Metrics or
	// Relay.MetricsRecorder), or none.
	MetricsRecorder metrics.Recorder
	// TopTenants is how many tenants are metric dimensions of their own. Defaults to
	// DefaultTopTenants.
	TopTenants int
	// Logger receives operational logs. Defaults to Relay.Logger, or slog.Default().
	Logger *slog.Logger
	// TurnState, when set, is the control database where each tenant's turns are recorded in
	// TurnStateTable for operators (`sluice fleet status`, the console's fleet page): at most
	// one statement per turn, and none for an idle tenant's turn that found nothing new. The
	// relay Lambda sets it to its registry's control database. Defaults to nil: not recorded.
	TurnState Execer
}

// withDefaults returns c with its zero fields set, or every problem at once.
func (c Config) withDefaults() (Config, error) {
	var errs []error
	if c.Registry == nil {
		errs = append(errs, errors.New("fleet: Registry is required"))
	}
	if c.Relay.Pipelines == 0 {
		c.Relay.Pipelines = 1
	}
	c.Relay = c.Relay.WithDefaults()
	if c.BurstPipelines == 0 {
		c.BurstPipelines = max(c.Relay.Pipelines, int(outbox.RelaySetting("Pipelines").Default))
	}
	if c.Relay.RoundMemory == nil {
		// One budget for every tenant's relay of this fleet: what one relay at its largest
		// holds, whatever the number of busy tenants.
		c.Relay.RoundMemory = outbox.NewRoundMemory(c.BurstPipelines * c.Relay.MaxRoundBytes)
	}
	if c.BurstPipelines < c.Relay.Pipelines {
		errs = append(errs, fmt.Errorf("fleet: BurstPipelines %d is below Relay.Pipelines %d", c.BurstPipelines, c.Relay.Pipelines))
	}
	if c.DefaultConnections == 0 {
		c.DefaultConnections = DefaultServerConnections
	}
	least := c.Relay.Pipelines + 1
	if c.DefaultConnections < least {
		errs = append(errs, fmt.Errorf("fleet: DefaultConnections %d is below Relay.Pipelines + 1 = %d (a tenant's pool and the server's activity poll)", c.DefaultConnections, least))
	}
	for s, n := range c.ServerConnections {
		if n < least {
			errs = append(errs, fmt.Errorf("fleet: ServerConnections[%s] %d is below Relay.Pipelines + 1 = %d", s, n, least))
		}
	}
	setDur := func(d *time.Duration, def time.Duration, name string) {
		if *d == 0 {
			*d = def
		}
		if *d < 0 {
			errs = append(errs, fmt.Errorf("fleet: %s %v is negative", name, *d))
		}
	}
	setDur(&c.RegistryRefresh, DefaultRegistryRefresh, "RegistryRefresh")
	setDur(&c.SweepInterval, DefaultSweepInterval, "SweepInterval")
	setDur(&c.DetectInterval, DefaultDetectInterval, "DetectInterval")
	setDur(&c.IdleClose, DefaultIdleClose, "IdleClose")
	setDur(&c.Turn, DefaultTurn, "Turn")
	if c.BusyShare == 0 {
		c.BusyShare = DefaultBusyShare
	}
	if c.BusyShare <= 0 || c.BusyShare >= 1 {
		errs = append(errs, fmt.Errorf("fleet: BusyShare %v is outside (0, 1)", c.BusyShare))
	}
	if c.Shards == 0 {
		c.Shards = 1
	}
	if c.Shards < 1 || c.Shard < 0 || c.Shard >= c.Shards {
		errs = append(errs, fmt.Errorf("fleet: shard %d of %d: want 0 ≤ Shard < Shards", c.Shard, c.Shards))
	}
	if c.TopTenants == 0 {
		c.TopTenants = DefaultTopTenants
	}
	if c.Logger == nil {
		c.Logger = c.Relay.Logger
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.MetricsRecorder == nil {
		switch {
		case c.Relay.MetricsRecorder != nil && c.Relay.Metrics != nil:
			c.MetricsRecorder = metrics.Tee(c.Relay.MetricsRecorder, metrics.NewEMF(c.Relay.Metrics))
		case c.Relay.MetricsRecorder != nil:
			c.MetricsRecorder = c.Relay.MetricsRecorder
		case c.Relay.Metrics != nil:
			c.MetricsRecorder = metrics.NewEMF(c.Relay.Metrics)
		}
	}
	c.Relay.Metrics, c.Relay.MetricsRecorder, c.Relay.IdleStop = nil, nil, 0
	if c.Connect == nil {
		c.Connect = func(_ context.Context, t Tenant) (*pgxpool.Config, error) {
			if t.DatabaseURL == "" {
				return nil, fmt.Errorf("tenant %s: no DatabaseURL, and Config.Connect is not set to resolve its secret", t.Name)
			}
			cfg, err := pgxpool.ParseConfig(t.DatabaseURL)
			if err != nil {
				return nil, err
			}
			return t.Aim(cfg), nil
		}
	}
	return c, errors.Join(errs...)
}

// budgetOf is server's connection budget.
func (c Config) budgetOf(server string) int {
	if n, ok := c.ServerConnections[server]; ok {
		return n
	}
	return c.DefaultConnections
}

// pipelinesOf is how many pipelines t's relay starts a turn with on server budget size:
// Weight × Pipelines, at most 16 (the relay's bound) and at most what the budget leaves beside
// the activity poll. A turn takes and opens one connection per pipeline.
func (c Config) pipelinesOf(t Tenant, size int) int {
	return max(1, min(t.Weight*c.Relay.Pipelines, 16, size-1))
}

// burstOf is the most pipelines t's turn grows to on server budget size (BurstPipelines):
// Weight × BurstPipelines, bounded as pipelinesOf.
func (c Config) burstOf(t Tenant, size int) int {
	return max(1, min(t.Weight*c.BurstPipelines, 16, size-1))
}

// ShardOf is the shard of n a tenant name belongs to (FNV-1a of the name, modulo n): a
// fleet split into n deployments serves each tenant from exactly one.
func ShardOf(name string, n int) int {
	if n <= 1 {
		return 0
	}
	h := fnv.New32a()
	h.Write([]byte(name))
	return int(h.Sum32() % uint32(n))
}
