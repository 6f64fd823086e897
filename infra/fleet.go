package infra

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsevents"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/aws-cdk-go/awscdk/v2/awskms"
	"github.com/aws/aws-cdk-go/awscdk/v2/awslambda"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssecretsmanager"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssns"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"

	"github.com/sluicehq/sluice/pkg/fleet"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
)

// FleetTenant is a tenant database of an OutboxFleet's static registry (SLUICE_FLEET_TENANTS).
type FleetTenant struct {
	// Name identifies the tenant (fleet.Tenant.Name): 1 to 63 characters of a-z, 0-9, '-' and
	// '_', starting with a letter or digit; unique in the fleet. It is the metrics' Tenant
	// dimension and decides the tenant's shard (fleet.ShardOf). Required.
	Name string
	// Secret is the tenant database's secret in the RDS JSON shape, which its relay (and a
	// fleet consumer, ConsumerFleet) logs in with; the shards' role and the consumers' may
	// read it. Required.
	Secret awssecretsmanager.ISecret
	// Server is the Name of the FleetServer the database is on. Required.
	Server string
	// Database names the tenant's database on its server in place of the one Secret names
	// (fleet.Tenant.Database): tenants of one server can then share one Secret, the server's
	// credentials, one secret a server instead of one a tenant. Defaults to Secret's dbname.
	Database string
	// Weight bounds the tenant's share of its server's connections and turns, 1 to
	// fleet.MaxWeight. Defaults to 1.
	Weight int
}

// FleetServer is a PostgreSQL server holding tenant databases: the relays of the fleet share
// its max_connections, and synthesis checks that they stay within it.
type FleetServer struct {
	// Name names the server, as FleetTenant.Server and the control table's server column do.
	// Required.
	Name string
	// MaxConnections is the server's max_connections. The shards that may serve a tenant of the
	// server book RelayReservedConcurrency × RelayConnections each, and the consumers applying
	// into the fleet's tenants (ConsumerFleet) book theirs; synthesis fails, showing the
	// arithmetic, once the bookings reach MaxConnections − ReservedConnections. Required unless
	// Budget.
	MaxConnections int
	// ReservedConnections is what MaxConnections keeps for others (superusers, operators, other
	// applications). Defaults to DefaultReservedConnections.
	ReservedConnections int
	// Budget books the fleet's connections on an existing budget of this server instead of
	// MaxConnections: the Migrations of a database on it, so that the fleet and that database's
	// own functions are checked against one max_connections. Not with MaxConnections. Defaults
	// to a budget of the server's own.
	Budget ConnectionBudget
	// RelayConnections is the most connections one relay instance holds on the server at once,
	// its activity poll included (SLUICE_FLEET_SERVER_CONNECTIONS). At least Relay.Pipelines
	// (1 when unset) + 1. Defaults to fleet.DefaultServerConnections.
	RelayConnections int
	// IAMAuth, when set, makes the fleet's functions log in to this server's tenant databases
	// with IAM database authentication (lambdaenv.FleetIAMServers): a token per connection
	// instead of a password, and rds-db:connect granted to the relays' role and to every fleet
	// consumer's. Defaults to nil: passwords, from the tenants' secrets or URLs.
	IAMAuth *FleetIAMAuth
	// Connections, when set, gets an ingress rule on its default port from the relays'
	// security group, e.g. an awsrds.DatabaseInstance or an imported one. Leave nil when you
	// manage the server's security group yourself.
	Connections awsec2.IConnectable
}

// FleetIAMAuth is a FleetServer's IAM database authentication: the functions log in as User
// with a token signed by their role, which may rds-db:connect as that user on that server only.
// The tenants still say where their databases are (a static tenant's Secret gives the host,
// port, user and database name, and one secret for all the server's tenants is enough, each
// naming its Database: its password is not used, so it needs no rotation; a control-table
// tenant may give a databaseUrl without a password instead of a secret).
type FleetIAMAuth struct {
	// ResourceID is the server's resource id (an RDS instance's DbiResourceId, "db-…", e.g.
	// awsrds.DatabaseInstance's InstanceResourceId(); an Aurora cluster's "cluster-…"), the
	// rds-db:connect ARN's resource. Required.
	ResourceID *string
	// User is the database user the functions log in as, which has the rds_iam role in the
	// database (GRANT rds_iam TO user). Required.
	User string
}

// FleetRegistry is an OutboxFleet's dynamic registry: the control database's
// sluice_fleet_tenant table (fleet.Table), read every refresh, so that a tenant is added or
// disabled without a deploy.
type FleetRegistry struct {
	// Secret is the control database's secret in the RDS JSON shape
	// (SLUICE_FLEET_REGISTRY_SECRET_ARN); the shards' role and the fleet consumers' may read
	// it. Required.
	Secret awssecretsmanager.ISecret
	// Server is the Name of the FleetServer the control database is on: each relay instance,
	// and each fleet consumer instance, holds one connection to it, booked on that server's
	// budget. Required.
	Server string
	// TenantSecretsPrefix is the name prefix of the secrets the table's secret_arn column
	// names, e.g. "sluice/tenants/": the shards' role (and a fleet consumer's) may read every
	// secret whose name starts with it (secretsmanager:GetSecretValue on
	// arn:…:secret:PREFIX*). It must end in '/' or '-', so that it names a family of secrets,
	// not any secret sharing its first letters.
	// Defaults to "": the table lists tenants by database_url only, and no further secret is
	// readable.
	TenantSecretsPrefix string
}

// OutboxFleetProps configure an OutboxFleet.
type OutboxFleetProps struct {
	// OutboxProps configure the topic, the destinations and each shard's relay Lambda as they
	// do an Outbox's: RelayCodeDir and Network are required; the topic, LogicalTopics,
	// ExtraTopics, Destinations, DefaultDestination, Publishers, Subscribers, ClaimCheck,
	// RelayTimeout (for a fleet, by default RelaySchedule + lambdaenv.FleetShardOverlap +
	// RelayStopBefore, 1m15s: each invocation is still serving when the next one starts),
	// RelayStopBefore, RelayReservedConcurrency (per shard; 2 by default for a fleet, the two
	// invocations of an overlap), RelayMemoryMB,
	// Relay and LogRetention apply. Database gives only the TLS settings every tenant
	// database is reached with (SSLMode, CABundle). Database.Secret, Database.Connections,
	// Database.MaxConns, Migrations, UseDatabaseSecret, DatabaseRole, RelayService,
	// OutboxRetention and OutboxPartitionInterval must be unset: each tenant's relay logs in
	// with the tenant's secret, and a tenant database's schema, roles and partitions are
	// maintained with it (sluice migrate), not by this construct.
	OutboxProps
	// Tenants are the static registry (SLUICE_FLEET_TENANTS): each shard's function gets the
	// tenants of its shard. Required unless Registry.
	Tenants []FleetTenant
	// Servers are the database servers of the tenants and of the control database, each with
	// its connection budget. Required.
	Servers []FleetServer
	// Registry adds the dynamic registry. Defaults to none: Tenants only.
	Registry *FleetRegistry
	// DefaultServerConnections is the most connections one relay instance holds on a server
	// Servers does not name, where the control table may put a tenant
	// (SLUICE_FLEET_DEFAULT_SERVER_CONNECTIONS); such connections are not checked at synth.
	// Defaults to the relay's own default (fleet.DefaultServerConnections).
	DefaultServerConnections int
	// Shards is how many relay Lambdas split the fleet, each started every minute by its own
	// schedule and serving the tenants whose fleet.ShardOf(name, Shards) is its index
	// (SLUICE_FLEET_SHARD=I/N). Between 1 and MaxFleetShards. Defaults to 1.
	Shards int
}

// MaxFleetShards is the largest OutboxFleetProps.Shards.
const MaxFleetShards = 64

// OutboxFleet is an outbox topic (and destinations) plus the relay Lambdas that publish the
// committed outbox rows of a fleet of tenant databases (pkg/fleet): OutboxFleetProps.Shards
// functions, each started every minute by its own EventBridge schedule, like an Outbox's relay.
// A Consumer applies its messages into the same tenant databases with ConsumerProps.Fleet.
type OutboxFleet interface {
	constructs.IConstruct
	// Topic is the topic the relays publish to; nil when no row can go to it.
	Topic() awssns.ITopic
	// TopicKey is the KMS key encrypting Topic (nil without Topic).
	TopicKey() awskms.IKey
	// Relays are the shards' relay Lambdas, shard I at index I.
	Relays() []awslambda.IFunction
	// Schedules are the EventBridge rules starting the shards' relays, shard I at index I.
	Schedules() []awsevents.Rule
	// Role is the execution role every shard's relay shares: the topic's and the
	// destinations' policies name it as the one publisher.
	Role() awsiam.IRole
	// Fifo reports whether Topic is a FIFO topic.
	Fifo() bool
}

type outboxFleet struct {
	constructs.Construct
	topic     awssns.ITopic
	key       awskms.IKey
	relays    []awslambda.IFunction
	schedules []awsevents.Rule
	role      awsiam.Role
	fifo      bool
	// tenancy is what the fleet's consumers (ConsumerFleet) reach the tenants with.
	tenancy *fleetTenancy
}

func (f *outboxFleet) Topic() awssns.ITopic          { return f.topic }
func (f *outboxFleet) TopicKey() awskms.IKey         { return f.key }
func (f *outboxFleet) Relays() []awslambda.IFunction { return f.relays }
func (f *outboxFleet) Schedules() []awsevents.Rule   { return f.schedules }
func (f *outboxFleet) Role() awsiam.IRole            { return f.role }
func (f *outboxFleet) Fifo() bool                    { return f.fifo }

// fleetRelayTimeout is a shard's default function timeout: the schedule's period, plus
// lambdaenv.FleetShardOverlap, plus the stop-before margin (stopBefore, or the relay's default
// when 0). Each invocation serves until the margin ahead of its deadline, so it is still serving
// FleetShardOverlap after the next invocation's scheduled start: the next one has started and
// warmed up (a cold start in a second execution environment the first time) before the last
// one stops, and the shard's tenants are served every second. With a timeout of one period,
// each invocation served the period less the margin and the rows committed in the last seconds
// waited for the next one (measured through the real binaries:
// e2e.TestFleetShardInvocationsHandOver). Two invocations serve at once for the overlap, each
// with its own fleet and connection budget: a reserved concurrency of 2, which the connection
// check books, covers them.
func fleetRelayTimeout(stopBefore time.Duration) time.Duration {
	if stopBefore == 0 {
		stopBefore = lambdaenv.DefaultRelayStopBefore
	}
	return RelaySchedule + lambdaenv.FleetShardOverlap + stopBefore
}

// lambdaEnvironmentLimit is Lambda's limit on a function's environment (keys and values).
const lambdaEnvironmentLimit = 4096

func (p *OutboxFleetProps) withDefaults() OutboxFleetProps {
	out := *p
	if out.RelayTimeout == 0 {
		out.RelayTimeout = fleetRelayTimeout(out.RelayStopBefore)
		// Each invocation ends within two periods of its start: two at once, never three.
		out.RelayReservedConcurrency = orDefault(out.RelayReservedConcurrency, 2)
	}
	out.OutboxProps = out.OutboxProps.withDefaults()
	out.DatabaseRole = "" // an Outbox's default; a fleet's relays have no role of their own
	out.Shards = orDefault(out.Shards, 1)
	out.Tenants = append([]FleetTenant(nil), p.Tenants...)
	for i := range out.Tenants {
		out.Tenants[i].Weight = orDefault(out.Tenants[i].Weight, 1)
	}
	out.Servers = append([]FleetServer(nil), p.Servers...)
	for i := range out.Servers {
		s := &out.Servers[i]
		s.RelayConnections = orDefault(s.RelayConnections, fleet.DefaultServerConnections)
		if s.Budget == nil {
			s.ReservedConnections = orDefault(s.ReservedConnections, DefaultReservedConnections)
		}
	}
	return out
}

// validate reports every problem of p, whose unset fields are checked on raw (before the
// defaults).
func (p *OutboxFleetProps) validate(raw *OutboxFleetProps) error {
	errs := []error{p.validateRelay(), p.Database.validateTLS()}
	for _, u := range []struct {
		field string
		set   bool
	}{
		{"Database.Secret", raw.Database.Secret != nil}, {"Database.Connections", raw.Database.Connections != nil},
		{"Database.MaxConns", raw.Database.MaxConns != 0}, {"Migrations", raw.Migrations != nil},
		{"UseDatabaseSecret", raw.UseDatabaseSecret}, {"DatabaseRole", raw.DatabaseRole != ""},
		{"RelayService", raw.RelayService != nil}, {"OutboxRetention", raw.OutboxRetention != 0},
		{"OutboxPartitionInterval", raw.OutboxPartitionInterval != 0},
	} {
		if u.set {
			errs = append(errs, fmt.Errorf("%s must be unset: a fleet's relays log in with each tenant's secret (FleetTenant.Secret, the control table), "+
				"and a tenant database's schema, roles and partitions are maintained with it", u.field))
		}
	}
	if p.Shards < 1 || p.Shards > MaxFleetShards {
		errs = append(errs, fmt.Errorf("Shards must be between 1 and %d, got %d", MaxFleetShards, p.Shards))
	}
	if len(p.Tenants) == 0 && p.Registry == nil {
		errs = append(errs, errors.New("no tenants: set Tenants, Registry or both"))
	}
	minConns := max(p.Relay.Pipelines, 1) + 1
	servers := map[string]bool{}
	for i, s := range p.Servers {
		switch {
		case s.Name == "":
			errs = append(errs, fmt.Errorf("Servers[%d] has no Name", i))
		case servers[s.Name]:
			errs = append(errs, fmt.Errorf("server %s is listed twice", s.Name))
		}
		servers[s.Name] = true
		switch {
		case s.Budget != nil && s.MaxConnections != 0:
			errs = append(errs, fmt.Errorf("server %s: set MaxConnections or Budget, not both", s.Name))
		case s.Budget == nil && s.MaxConnections < 1:
			errs = append(errs, fmt.Errorf("server %s: MaxConnections is required (the connection budget is checked at synth), or Budget", s.Name))
		case s.Budget == nil && (s.ReservedConnections < 0 || s.ReservedConnections >= s.MaxConnections):
			errs = append(errs, fmt.Errorf("server %s: ReservedConnections %d must be between 0 and MaxConnections %d", s.Name, s.ReservedConnections, s.MaxConnections))
		}
		if a := s.IAMAuth; a != nil && (a.ResourceID == nil || a.User == "" || strings.ContainsAny(a.User, "/*?")) {
			errs = append(errs, fmt.Errorf("server %s: IAMAuth needs ResourceID and a User (no '/', '*' or '?')", s.Name))
		}
		if s.RelayConnections < minConns {
			errs = append(errs, fmt.Errorf("server %s: RelayConnections %d is below %d (a tenant's relay needs Relay.Pipelines connections, the server's activity poll 1)", s.Name, s.RelayConnections, minConns))
		}
	}
	if d := p.DefaultServerConnections; d != 0 && d < minConns {
		errs = append(errs, fmt.Errorf("DefaultServerConnections %d is below %d (a tenant's relay needs Relay.Pipelines connections, the server's activity poll 1)", d, minConns))
	}
	names := map[string]bool{}
	for i, t := range p.Tenants {
		if err := fleet.CheckName(t.Name); err != nil {
			errs = append(errs, fmt.Errorf("Tenants[%d]: %w", i, err))
		}
		if names[t.Name] {
			errs = append(errs, fmt.Errorf("tenant %s is listed twice", t.Name))
		}
		names[t.Name] = true
		if t.Secret == nil {
			errs = append(errs, fmt.Errorf("tenant %s has no Secret", t.Name))
		}
		if !servers[t.Server] {
			errs = append(errs, fmt.Errorf("tenant %s: server %q is not in Servers", t.Name, t.Server))
		}
		if t.Weight < 1 || t.Weight > fleet.MaxWeight {
			errs = append(errs, fmt.Errorf("tenant %s: Weight %d is outside 1 to %d", t.Name, t.Weight, fleet.MaxWeight))
		}
		if len(t.Database) > 63 {
			errs = append(errs, fmt.Errorf("tenant %s: Database %q is longer than PostgreSQL's 63 bytes", t.Name, t.Database))
		}
	}
	if r := p.Registry; r != nil {
		if r.Secret == nil {
			errs = append(errs, errors.New("Registry.Secret is required"))
		}
		if !servers[r.Server] {
			errs = append(errs, fmt.Errorf("Registry.Server %q is not in Servers", r.Server))
		}
		if pre := r.TenantSecretsPrefix; pre != "" && (strings.ContainsAny(pre, "*?") || !strings.HasSuffix(pre, "/") && !strings.HasSuffix(pre, "-")) {
			errs = append(errs, fmt.Errorf("Registry.TenantSecretsPrefix %q must end in '/' or '-' and hold no wildcard", pre))
		}
	}
	return errors.Join(errs...)
}

// NewOutboxFleet creates the topic, one relay Lambda per shard with its one-minute schedule,
// their shared role and security group, and books each shard's connections on the budget of
// every server it may connect to. It panics on invalid props, naming every problem, and when
// a server's budget is exceeded, showing the arithmetic.
func NewOutboxFleet(scope constructs.Construct, id string, props *OutboxFleetProps) OutboxFleet {
	p := props.withDefaults()
	invalid("OutboxFleet", id, p.validate(props))

	f := &outboxFleet{fifo: p.Fifo, tenancy: newFleetTenancy(id, &p)}
	constructs.NewConstruct_Override(f, scope, &id) // f itself is the jsii construct, so it can be passed to CDK APIs
	this := f

	f.topic, f.key = newRelayTopic(this, &p.OutboxProps)
	env := relayRouting(this, &p.OutboxProps, f.topic)
	perServer := map[string]int{}
	for _, s := range p.Servers {
		perServer[s.Name] = s.RelayConnections
	}
	serverJSON, _ := json.Marshal(perServer) // map keys sort
	env[lambdaenv.FleetServerConnections] = jsii.String(string(serverJSON))
	if p.DefaultServerConnections > 0 {
		env[lambdaenv.FleetDefaultServerConnections] = jsii.String(fmt.Sprint(p.DefaultServerConnections))
	}

	// One role and one security group for every shard: the topic's and the destinations'
	// policies deny publishing to every principal but one role, and a tenant database admits
	// one security group.
	f.role = awsiam.NewRole(this, jsii.String("RelayServiceRole"), &awsiam.RoleProps{
		Description: jsii.String("sluice outbox fleet relay (every shard)"),
		AssumedBy:   awsiam.NewServicePrincipal(jsii.String("lambda.amazonaws.com"), nil),
		ManagedPolicies: &[]awsiam.IManagedPolicy{
			awsiam.ManagedPolicy_FromAwsManagedPolicyName(jsii.String("service-role/AWSLambdaBasicExecutionRole")),
			awsiam.ManagedPolicy_FromAwsManagedPolicyName(jsii.String("service-role/AWSLambdaVPCAccessExecutionRole")),
		},
	})
	_, sgs, ownSG := placement(this, "Relay", p.Network, "outbox fleet relay")
	network := p.Network
	network.SecurityGroups = sgs
	conns := awsec2.NewConnections(&awsec2.ConnectionsProps{SecurityGroups: &sgs})
	allowDatabaseAndAPIs(conns, Database{}, nil, ownSG, p.Network, "outbox fleet relay",
		claimCheckS3(p.ClaimCheck != nil, "the claim check's payloads"), false)
	f.tenancy.allowFrom(conns, "outbox fleet relay")
	f.tenancy.grantRead(f.role, "the relays")

	// Each shard's function gets its own tenants only (Lambda's environment holds 4 KB).
	shardTenants := make([][]FleetTenant, p.Shards)
	for _, t := range p.Tenants {
		i := fleet.ShardOf(t.Name, p.Shards)
		shardTenants[i] = append(shardTenants[i], t)
	}
	var fns []awslambda.Function
	for i := range p.Shards {
		shard := constructs.NewConstruct(this, jsii.String(fmt.Sprintf("Shard%d", i)))
		shardEnv := make(map[string]*string, len(env)+3)
		for k, v := range env {
			shardEnv[k] = v
		}
		shardEnv[lambdaenv.FleetShard] = jsii.String(fmt.Sprintf("%d/%d", i, p.Shards))
		f.tenancy.environment(shard, shardEnv, shardTenants[i], fmt.Sprintf("OutboxFleet %q shard %d", id, i),
			"use more Shards, or list tenants in the control table (Registry)")
		fn, rule := newRelayFunction(shard, &p.OutboxProps, goFunctionProps{
			description: fmt.Sprintf("outbox fleet relay, shard %d/%d", i, p.Shards),
			role:        f.role,
			network:     network,
			database:    f.tenancy.tls,
			environment: shardEnv,
		})
		fns, f.relays, f.schedules = append(fns, fn), append(f.relays, fn), append(f.schedules, rule)
	}
	f.tenancy.bookRelays(p.RelayReservedConcurrency, p.Shards, shardTenants)
	if p.Registry != nil {
		awscdk.Annotations_Of(this).AddInfoV2(jsii.String("sluice:fleetUncheckedServers"), jsii.String(
			"the control table may put a tenant on a server Servers does not name: each relay instance holds up to DefaultServerConnections there, which synthesis cannot check"))
	}

	attachRelay(this, &p.OutboxProps, f.topic, fleetRelay{role: f.role, conns: conns, relays: fns, construct: this})
	suppressLambdaFindings(f.role)
	suppressTopicKeyGrant(f.role)
	return f
}

// fleetRelay is an OutboxFleet's relays as one relayHost: the role and security group they
// share, and the environment of every shard's function.
type fleetRelay struct {
	role      awsiam.Role
	conns     awsec2.Connections
	relays    []awslambda.Function
	construct constructs.IConstruct
}

func (r fleetRelay) Grantee() awsiam.IGrantable      { return r.role }
func (r fleetRelay) Connections() awsec2.Connections { return r.conns }
func (r fleetRelay) AddEnvironment(key, value *string) {
	for _, fn := range r.relays {
		fn.AddEnvironment(key, value, nil)
	}
}
func (r fleetRelay) AddToRolePolicy(s awsiam.PolicyStatement) { r.role.AddToPrincipalPolicy(s) }
func (r fleetRelay) RoleArn() *string                         { return r.role.RoleArn() }
func (r fleetRelay) Construct() constructs.IConstruct         { return r.construct }

var _ relayHost = fleetRelay{}
