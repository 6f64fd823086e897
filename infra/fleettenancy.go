package infra

import (
	"encoding/json"
	"fmt"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsiam"
	"github.com/aws/constructs-go/constructs/v10"
	"github.com/aws/jsii-runtime-go"

	"github.com/sluicehq/sluice/pkg/lambdaenv"
)

// fleetTenancy is what an OutboxFleet's relays and the consumers applying into its tenant
// databases (ConsumerFleet) share: the tenants, their servers with one ConnectionBudget each,
// the control table and the TLS settings. It is the one place that turns them into a
// function's environment, secret grants, network rules and connection bookings, so that a
// fleet's relays and its consumers cannot disagree on where a tenant lives or what a server
// can take.
type fleetTenancy struct {
	// fleet is the OutboxFleet's construct id, which the bookings name.
	fleet string
	// tenants are the static registry, Weight defaulted.
	tenants []FleetTenant
	// servers are the tenants' servers, RelayConnections defaulted.
	servers  []FleetServer
	registry *FleetRegistry
	// budgets are the servers' connection budgets by name: FleetServer.Budget, or one of the
	// server's own. Every booking of the fleet and of its consumers goes to the same one.
	budgets map[string]ConnectionBudget
	// tls is how every tenant database is reached: SSLMode and CABundle only.
	tls Database
}

// newFleetTenancy returns the tenancy of an OutboxFleet's validated, defaulted props.
func newFleetTenancy(id string, p *OutboxFleetProps) *fleetTenancy {
	t := &fleetTenancy{fleet: id, tenants: p.Tenants, servers: p.Servers, registry: p.Registry, budgets: map[string]ConnectionBudget{}}
	t.tls.SSLMode, t.tls.CABundle = p.Database.SSLMode, p.Database.CABundle
	for _, s := range p.Servers {
		budget := s.Budget
		if budget == nil {
			budget = &connectionBudget{server: s.Name, max: s.MaxConnections, reserved: s.ReservedConnections,
				remedy: "Lower the shards' RelayReservedConcurrency or the server's RelayConnections, a fleet consumer's MaxConcurrency or " +
					"ConsumerFleet.MaxConns, or raise max_connections (FleetServer.MaxConnections, a larger instance)"}
		}
		t.budgets[s.Name] = budget
	}
	return t
}

// environment sets the registry a function reads in env: tenants as SLUICE_FLEET_TENANTS
// (the static tenants the function serves: a shard's, or every one for a consumer; [] when
// the fleet has static tenants but none of them is the function's) and the control
// database's secret as SLUICE_FLEET_REGISTRY_SECRET_ARN. It panics, naming who and what to
// do (remedy), when the tenants would not fit Lambda's environment.
func (t *fleetTenancy) environment(scope constructs.Construct, env map[string]*string, tenants []FleetTenant, who, remedy string) {
	if r := t.registry; r != nil {
		env[lambdaenv.FleetRegistrySecretARN] = r.Secret.SecretArn()
	}
	if iam := t.iamServers(); len(iam) > 0 {
		names := make([]string, len(iam))
		for i, s := range iam {
			names[i] = s.Name
		}
		b, _ := json.Marshal(names)
		env[lambdaenv.FleetIAMServers] = jsii.String(string(b))
	}
	if len(t.tenants) == 0 {
		return
	}
	checkEnvironmentSize(env, tenants, who, remedy)
	list := make([]any, 0, len(tenants))
	for _, tn := range tenants {
		entry := map[string]any{"name": tn.Name, "secretArn": tn.Secret.SecretArn(), "server": tn.Server, "weight": tn.Weight}
		if tn.Database != "" {
			entry["database"] = tn.Database
		}
		list = append(list, entry)
	}
	env[lambdaenv.FleetTenants] = awscdk.Stack_Of(scope).ToJsonString(list, nil)
}

// grantRead lets role read what the fleet's functions log in with (and connect as the user of
// each server with IAMAuth): every static tenant's
// secret (each by its ARN), the control database's secret and, with
// Registry.TenantSecretsPrefix, every secret under that prefix (the control table's tenants,
// unknown at synth; the one wildcard, explained to cdk-nag on role). who names the role's
// functions in that explanation.
func (t *fleetTenancy) grantRead(role awsiam.IRole, who string) {
	for _, tn := range t.tenants {
		tn.Secret.GrantRead(role, nil)
	}
	// A server with IAMAuth: rds-db:connect as its one user, on it alone.
	for _, s := range t.iamServers() {
		role.AddToPrincipalPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
			Actions: jsii.Strings("rds-db:connect"),
			Resources: &[]*string{awscdk.Stack_Of(role).FormatArn(&awscdk.ArnComponents{
				Service: jsii.String("rds-db"), Resource: jsii.String("dbuser"),
				ResourceName: awscdk.Fn_Join(jsii.String("/"), &[]*string{s.IAMAuth.ResourceID, jsii.String(s.IAMAuth.User)}),
				ArnFormat:    awscdk.ArnFormat_COLON_RESOURCE_NAME,
			})},
		}))
	}
	r := t.registry
	if r == nil {
		return
	}
	r.Secret.GrantRead(role, nil)
	if r.TenantSecretsPrefix == "" {
		return
	}
	role.AddToPrincipalPolicy(awsiam.NewPolicyStatement(&awsiam.PolicyStatementProps{
		Sid:     jsii.String("ReadTheControlTablesTenantSecrets"),
		Actions: jsii.Strings("secretsmanager:GetSecretValue", "secretsmanager:DescribeSecret"),
		Resources: &[]*string{awscdk.Stack_Of(role).FormatArn(&awscdk.ArnComponents{
			Service: jsii.String("secretsmanager"), Resource: jsii.String("secret"), ResourceName: jsii.String(r.TenantSecretsPrefix + "*"),
			ArnFormat: awscdk.ArnFormat_COLON_RESOURCE_NAME,
		})},
	}))
	suppress(role, "AwsSolutions-IAM5",
		"The control table adds tenants without a deploy, so their secrets are not known at synth: "+who+" may read "+
			"the secrets under the one prefix the stack names for them (FleetRegistry.TenantSecretsPrefix), no other.",
		fmt.Sprintf("Resource::arn:<AWS::Partition>:secretsmanager:<AWS::Region>:<AWS::AccountId>:secret:%s*", r.TenantSecretsPrefix))
}

// iamServers returns the servers with IAMAuth, in the order Servers lists them.
func (t *fleetTenancy) iamServers() []FleetServer {
	var out []FleetServer
	for _, s := range t.servers {
		if s.IAMAuth != nil {
			out = append(out, s)
		}
	}
	return out
}

// allowFrom lets c reach every server whose FleetServer.Connections is set, on its default
// port; description names c in the rules.
func (t *fleetTenancy) allowFrom(c awsec2.IConnectable, description string) {
	for _, s := range t.servers {
		if s.Connections != nil {
			s.Connections.Connections().AllowDefaultPortFrom(c, jsii.String("sluice "+description+" to PostgreSQL (server "+s.Name+")"))
		}
	}
}

// tenantsOn counts the static tenants of server, among tenants.
func tenantsOn(server string, tenants []FleetTenant) int {
	n := 0
	for _, t := range tenants {
		if t.Server == server {
			n++
		}
	}
	return n
}

// bookRelays books, on each server's budget, the connections of the shards that may serve one
// of its tenants: with the control table every shard may (and each instance holds a
// connection to the control database), without it the shards of its static tenants.
func (t *fleetTenancy) bookRelays(concurrency, shards int, shardTenants [][]FleetTenant) {
	for _, s := range t.servers {
		serving := shards
		if t.registry == nil {
			serving = 0
			for _, ts := range shardTenants {
				if tenantsOn(s.Name, ts) > 0 {
					serving++
				}
			}
		}
		if serving > 0 {
			t.budgets[s.Name].UseConnections(fmt.Sprintf("fleet %s relays %d (shards serving server %s) × %d (reserved concurrency) × %d (connections per instance)",
				t.fleet, serving, s.Name, concurrency, s.RelayConnections), serving*concurrency*s.RelayConnections)
		}
		if r := t.registry; r != nil && r.Server == s.Name {
			t.budgets[s.Name].UseConnections(fmt.Sprintf("fleet %s control table %d (shards) × %d (reserved concurrency) × 1 (connection)", t.fleet, shards, concurrency),
				shards*concurrency)
		}
	}
}

// bookConsumer books a fleet consumer's connections on each server's budget by the rule a
// consumer on one database books its own: its instances × the most connections one instance
// holds. The instances are the event source's concurrency (the SQS mapping's maximum, a
// stream's reserved concurrency) plus the processor schedule's overlapping invocations
// (overlap). One instance holds at most f.MaxConns connections on all tenant databases
// together and f.TenantMaxConns on each (inbox.TenantPools), so on a server with k of the
// fleet's static tenants at most min(MaxConns, k × TenantMaxConns); with the control table any
// tenant may be on any server, so MaxConns on each. A server with no static tenant, without
// the control table, books nothing. Each instance also holds one connection to the control
// database (lambdaenv.FleetRegistry), booked on its server.
func (t *fleetTenancy) bookConsumer(name string, f *ConsumerFleet, concurrency, overlap int) {
	for _, s := range t.servers {
		perInstance := fmt.Sprintf("%d (ConsumerFleet.MaxConns: any tenant of the control table may be on it)", f.MaxConns)
		conns := f.MaxConns
		if t.registry == nil {
			k := tenantsOn(s.Name, t.tenants)
			if k == 0 {
				continue
			}
			if k*f.TenantMaxConns < f.MaxConns {
				conns = k * f.TenantMaxConns
				perInstance = fmt.Sprintf("%d (%d tenants on server %s × %d, ConsumerFleet.TenantMaxConns)", conns, k, s.Name, f.TenantMaxConns)
			} else {
				perInstance = fmt.Sprintf("%d (ConsumerFleet.MaxConns, below its %d tenants × %d per tenant)", conns, k, f.TenantMaxConns)
			}
		}
		budget := t.budgets[s.Name]
		budget.UseConnections(fmt.Sprintf("fleet consumer %s %d (maximum concurrency) × %s", name, concurrency, perInstance), concurrency*conns)
		budget.UseConnections(fmt.Sprintf("fleet consumer %s processor %d (overlapping scheduled invocations) × %d", name, overlap, conns), overlap*conns)
		if r := t.registry; r != nil && r.Server == s.Name {
			budget.UseConnections(fmt.Sprintf("fleet consumer %s control table %d (instances: %d + %d processor) × 1 (connection)", name, concurrency+overlap, concurrency, overlap),
				concurrency+overlap)
		}
	}
}

// processEnvironmentBytes is about what newGoFunction adds to a function's environment beyond
// the variables its constructs give it (DATABASE_SSLMODE, DATABASE_SSLROOTCERT, GOMEMLIMIT).
const processEnvironmentBytes = 100

// checkEnvironmentSize panics when tenants would not fit Lambda's 4 KB environment beside env,
// counting a secret ARN synthesis cannot see as 100 characters; who names the function and
// remedy says what to do.
func checkEnvironmentSize(env map[string]*string, tenants []FleetTenant, who, remedy string) {
	size := len(lambdaenv.FleetTenants) + 2 + processEnvironmentBytes
	for k, v := range env {
		size += len(k) + 100 // the values not yet known (tokens) count as ARNs
		if v != nil && !*awscdk.Token_IsUnresolved(v) {
			size += len(*v) - 100
		}
	}
	for _, t := range tenants {
		arn := t.Secret.SecretArn()
		n := 100
		if !*awscdk.Token_IsUnresolved(arn) {
			n = len(*arn)
		}
		size += len(`{"name":"","secretArn":"","server":"","weight":100},`) + len(t.Name) + len(t.Server) + n
		if t.Database != "" {
			size += len(`"database":"",`) + len(t.Database)
		}
	}
	if size > lambdaEnvironmentLimit {
		panic(fmt.Errorf("sluice %s: its static tenants (%d) make its environment about %d bytes, above Lambda's %d: %s",
			who, len(tenants), size, lambdaEnvironmentLimit, remedy))
	}
}
