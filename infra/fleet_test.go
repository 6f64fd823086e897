package infra_test

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssecretsmanager"
	"github.com/aws/jsii-runtime-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/infra"
	"github.com/sluicehq/sluice/pkg/fleet"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
	"github.com/sluicehq/sluice/pkg/metrics"
)

// fleetBundle is a stack with an imported VPC, two servers (one with the migrations of a
// database on it, one of its own) and a fleet's tenant secrets (imported, complete ARNs).
type fleetBundle struct {
	stack   awscdk.Stack
	network infra.Network
	mig     infra.Migrations
	secrets map[string]awssecretsmanager.ISecret
	control awssecretsmanager.ISecret
	relay   string
	ca      string
}

func fleetSetup(t *testing.T, tenants ...string) *fleetBundle {
	t.Helper()
	app := awscdk.NewApp(nil)
	stack := awscdk.NewStack(app, jsii.String("Fleet"), nil)
	vpc := awsec2.Vpc_FromVpcAttributes(stack, jsii.String("Vpc"), &awsec2.VpcAttributes{
		VpcId: jsii.String("vpc-0123456789abcdef0"), AvailabilityZones: jsii.Strings("eu-west-1a"), PrivateSubnetIds: jsii.Strings("subnet-a"),
	})
	b := &fleetBundle{stack: stack, network: infra.Network{Vpc: vpc}, secrets: map[string]awssecretsmanager.ISecret{}, relay: assetDir(t, "relay"), ca: caBundle(t)}
	imported := func(id, name string) awssecretsmanager.ISecret {
		return awssecretsmanager.Secret_FromSecretCompleteArn(stack, jsii.String(id),
			jsii.String("arn:aws:secretsmanager:eu-west-1:111111111111:secret:"+name+"-AbCdEf"))
	}
	main := imported("MainSecret", "main")
	b.mig = infra.NewMigrations(stack, "Migrations", &infra.MigrationsProps{CodeDir: assetDir(t, "migrate"), Network: b.network,
		Database: infra.Database{Secret: main, CABundle: b.ca}, MaxConnections: 200, ReservedConnections: 10})
	for _, n := range tenants {
		b.secrets[n] = imported("Tenant-"+n, "tenants/"+n)
	}
	b.control = imported("Control", "control")
	return b
}

// fleetProps is a fleet of b's tenants: those named "big-*" on server big (its own budget of
// 300), the rest on server main (the migrations' budget), with the control table on main.
func (b *fleetBundle) fleetProps(shards int) *infra.OutboxFleetProps {
	var tenants []infra.FleetTenant
	names := make([]string, 0, len(b.secrets))
	for n := range b.secrets {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		server := "main"
		if strings.HasPrefix(n, "big-") {
			server = "big"
		}
		tenants = append(tenants, infra.FleetTenant{Name: n, Secret: b.secrets[n], Server: server})
	}
	return &infra.OutboxFleetProps{
		// A 5-minute timeout (a fleet's default is 1): 6 overlapping instances per shard make the
		// budget's arithmetic below.
		OutboxProps: infra.OutboxProps{RelayCodeDir: b.relay, Network: b.network, Database: infra.Database{CABundle: b.ca}, RelayTimeout: 5 * time.Minute},
		Tenants:     tenants,
		Servers: []infra.FleetServer{
			{Name: "main", Budget: b.mig, RelayConnections: 5},
			{Name: "big", MaxConnections: 300, RelayConnections: 8},
		},
		Registry: &infra.FleetRegistry{Secret: b.control, Server: "main", TenantSecretsPrefix: "tenants/"},
		Shards:   shards,
	}
}

// The fleet's template: one relay function per shard, each with its own schedule, the shared
// role, its shard and its own tenants only, the servers' per-instance connections and the
// control table; every tenant's secret readable, the control table's tenants' secrets by
// their prefix only; no database secret of its own. The alarms watch the fleet as a whole.
// cdk-nag finds nothing unexplained.
func TestFleetShardsTemplate(t *testing.T) {
	names := []string{"acme", "globex", "initech", "umbrella", "big-hooli", "big-soylent", "stark", "wayne"}
	b := fleetSetup(t, names...)
	withNag(b.stack)
	f := infra.NewOutboxFleet(b.stack, "Fleet", b.fleetProps(3))
	mon := infra.NewMonitoring(b.stack, "Monitoring", &infra.MonitoringProps{Fleet: f, NoAlarmDestination: true})
	require.Len(t, f.Relays(), 3)
	require.Len(t, f.Schedules(), 3)

	tmpl := assertions.Template_FromStack(b.stack, nil)
	fns := resources(tmpl, "AWS::Lambda::Function")
	shards := map[string]map[string]any{}
	for _, fn := range fns {
		if e := env(fn); e[lambdaenv.FleetShard] != nil {
			shards[e[lambdaenv.FleetShard].(string)] = fn
		}
	}
	require.Len(t, shards, 3)
	roles := map[string]bool{}
	served := map[string]int{}
	for i := range 3 {
		fn := shards[fmt.Sprintf("%d/3", i)]
		require.NotNil(t, fn, "shard %d/3", i)
		e := env(fn)
		roles[refID(props(fn)["Role"])] = true
		require.NotContains(t, e, lambdaenv.DatabaseSecretARN, "a fleet relay logs in with each tenant's secret")
		require.JSONEq(t, `{"big":8,"main":5}`, e[lambdaenv.FleetServerConnections].(string))
		require.Equal(t, "Control", refIDOrArn(e[lambdaenv.FleetRegistrySecretARN]))
		for _, tn := range tenantsOf(t, b.stack, e[lambdaenv.FleetTenants]) {
			require.Equal(t, i, fleet.ShardOf(tn.Name, 3), "tenant %s is in shard %d's list", tn.Name, i)
			require.Equal(t, 1, tn.Weight)
			require.Contains(t, tn.SecretARN, "secret:tenants/"+tn.Name+"-")
			served[tn.Name]++
		}
	}
	require.Len(t, roles, 1, "the shards share one role")
	for _, n := range names {
		require.Equal(t, 1, served[n], "tenant %s is served by exactly one shard", n)
	}
	// A schedule per shard, each starting its own function.
	rules := resources(tmpl, "AWS::Events::Rule")
	targets := map[string]bool{}
	for _, r := range rules {
		if props(r)["ScheduleExpression"] == "rate(1 minute)" {
			targets[refID(props(r)["Targets"].([]any)[0].(map[string]any)["Arn"])] = true
		}
	}
	for _, fn := range shards {
		found := false
		for id, f := range fns {
			if fmt.Sprint(f) == fmt.Sprint(fn) && targets[id] {
				found = true
			}
		}
		require.True(t, found, "a schedule starts each shard")
	}

	// The role reads every tenant's secret, each by its ARN, and the control table's tenants'
	// secrets by their prefix.
	policy, _ := json.Marshal(resources(tmpl, "AWS::IAM::Policy"))
	for _, n := range names {
		require.Contains(t, string(policy), "secret:tenants/"+n+"-AbCdEf")
	}
	require.Contains(t, string(policy), ":secret:tenants/*")
	requireNoWildcardGrants(t, tmpl)

	// The fleet's alarms: the relay's over the aggregate of the tenants, the failing tenants,
	// the heartbeat, each shard's errors.
	for _, key := range []string{"FleetOutboxOldestPendingAge", "FleetTenantsFailing", "FleetHeartbeatMissing", "FleetShard2RelayErrors"} {
		require.Contains(t, mon.Alarms(), key)
	}
	alarms, _ := json.Marshal(resources(tmpl, "AWS::CloudWatch::Alarm"))
	require.Contains(t, string(alarms), `SELECT MAX(TenantOldestPendingAgeSeconds) FROM SCHEMA(\"Sluice\", Service, Tenant) WHERE Service = 'relay'`)
	require.Contains(t, string(alarms), `"MetricName":"FleetTenantsFailing"`)
	requireNoNagErrors(t, b.stack)
}

// Synthesis fails when the shards' connections exceed a server's budget, naming the server
// and the arithmetic, whether the server's budget is its own or the migrations' of a
// database on it.
func TestFleetConnectionBudgetNamesTheServer(t *testing.T) {
	build := func(shards, bigConns, mainConns int) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err, _ = r.(error)
			}
		}()
		b := fleetSetup(t, "acme", "globex", "big-hooli", "big-soylent", "big-stark", "big-wayne")
		p := b.fleetProps(shards)
		p.Servers[0].RelayConnections, p.Servers[1].RelayConnections = mainConns, bigConns
		infra.NewOutboxFleet(b.stack, "Fleet", p)
		return nil
	}
	// big: 2 shards × 6 (reserved concurrency) × 20 = 240 < 300 − 15; main: 2 + 2 × 6 × 5 + 2 × 6 × 1 = 74 < 190.
	require.NoError(t, build(2, 20, 5))
	// big: 3 × 6 × 20 = 360 ≥ 285.
	err := build(3, 20, 5)
	require.Error(t, err)
	require.ErrorContains(t, err, "than the server big allows")
	require.ErrorContains(t, err, "fleet Fleet relays 3 (shards serving server big) × 6 (reserved concurrency) × 20 (connections per instance) = 360")
	require.ErrorContains(t, err, "total 360, but max_connections 300 − 15 reserved = 285")
	// main, the migrations' server: 2 + 2 × 6 × 15 = 182, + the control table's 2 × 6 = 194 ≥ 190.
	err = build(2, 8, 15)
	require.Error(t, err)
	require.ErrorContains(t, err, "migrations 2 (a deploy and a scheduled partition maintenance) × 1 = 2")
	require.ErrorContains(t, err, "fleet Fleet relays 2 (shards serving server main) × 6 (reserved concurrency) × 15 (connections per instance) = 180")
	require.ErrorContains(t, err, "fleet Fleet control table 2 (shards) × 6 (reserved concurrency) × 1 (connection) = 12")
	require.ErrorContains(t, err, "total 194, but max_connections 200 − 10 reserved = 190")
}

// Without a control table only the shards of a server's static tenants book its connections.
func TestFleetStaticTenantsBookTheirShardsOnly(t *testing.T) {
	b := fleetSetup(t, "big-hooli")
	p := b.fleetProps(4)
	p.Registry = nil
	p.Servers[1].MaxConnections, p.Servers[1].RelayConnections = 100, 12 // one shard: 6 × 12 = 72 < 85; four would not fit
	require.NotPanics(t, func() { infra.NewOutboxFleet(b.stack, "Fleet", p) })
}

// Props a fleet cannot use are refused, every problem at once.
func TestFleetValidation(t *testing.T) {
	b := fleetSetup(t, "acme")
	p := b.fleetProps(0)
	p.Migrations = b.mig
	p.Database.Secret = b.control
	p.Tenants = append(p.Tenants, infra.FleetTenant{Name: "Not_A_Name", Secret: b.control, Server: "elsewhere", Weight: 101},
		infra.FleetTenant{Name: "acme", Secret: b.control, Server: "main"})
	p.Servers = append(p.Servers, infra.FleetServer{Name: "nobudget"}, infra.FleetServer{Name: "big", MaxConnections: 10})
	p.Servers[0].RelayConnections = 1
	p.Registry.TenantSecretsPrefix = "tenant"
	p.Shards = infra.MaxFleetShards + 1
	err := func() (err error) {
		defer func() { err, _ = recover().(error) }()
		infra.NewOutboxFleet(b.stack, "Fleet", p)
		return nil
	}()
	require.Error(t, err)
	for _, want := range []string{
		"Database.Secret must be unset", "Migrations must be unset", "Shards must be between 1 and 64",
		`name "Not_A_Name"`, `server "elsewhere" is not in Servers`, "Weight 101 is outside 1 to 100", "tenant acme is listed twice",
		"server nobudget: MaxConnections is required", "server big is listed twice", "server main: RelayConnections 1 is below 2",
		`TenantSecretsPrefix "tenant" must end in '/' or '-'`,
	} {
		require.ErrorContains(t, err, want)
	}
}

// The example stack with -c fleet=3: tenant secrets on its own instance, the fleet's relays
// booked on the instance's budget beside the stack's functions; cdk-nag and cfn-lint clean.
// Shards beyond what the instance's max_connections allows fail synthesis.
func TestFleetExampleStack(t *testing.T) {
	dir := t.TempDir()
	app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(dir)})
	p := &infra.SluiceStackProps{NoAlarmDestination: true, Fleet: 3, FleetShards: 2,
		RelayCodeDir: assetDir(t, "relay"), ConsumerCodeDir: assetDir(t, "consumer"), MigrateCodeDir: assetDir(t, "migrate"), CABundle: caBundle(t)}
	s := infra.NewSluiceStack(app, "SluiceFleet", p)
	withNag(s)
	require.NotNil(t, s.Fleet())
	require.Len(t, s.Fleet().Relays(), 2)
	tmpl := assertions.Template_FromStack(s, nil)
	requireNoNagErrors(t, s)
	requireNoWildcardGrants(t, tmpl)
	secrets := 0
	for _, r := range resources(tmpl, "AWS::SecretsManager::Secret") {
		gen, _ := props(r)["GenerateSecretString"].(map[string]any)
		if tpl, _ := gen["SecretStringTemplate"].(string); strings.Contains(tpl, `"username":"sluice_tenant_`) {
			require.Contains(t, tpl, `"dbname":"tenant_`)
			secrets++
		}
	}
	require.Equal(t, 3, secrets)
	require.Contains(t, s.Monitoring().Alarms(), "FleetTenantsFailing")
	app.Synth(nil)
	templates, err := filepath.Glob(filepath.Join(dir, "*.template.json"))
	require.NoError(t, err)
	requireCfnLintClean(t, templates)

	// 2 + relay 6 × 4 + consumer 5 × 4 + processor 1 × 4 = 50, and at least one shard's
	// A shard's 2 instances (a 1-minute timeout) × 10 = 20: 70 ≥ max_connections 80 − 15.
	err = func() (err error) {
		defer func() { err, _ = recover().(error) }()
		p := *p
		p.MaxConnections = 80
		infra.NewSluiceStack(awscdk.NewApp(nil), "SluiceFleetTooSmall", &p)
		return nil
	}()
	require.ErrorContains(t, err, "than the server allows")
	require.ErrorContains(t, err, "(shards serving server example)")
}

// tenantsOf decodes a SLUICE_FLEET_TENANTS value (a token of the stack's JSON) with the
// stack's values resolved.
func tenantsOf(t *testing.T, stack awscdk.Stack, v any) []fleet.Tenant {
	t.Helper()
	if v == nil {
		return nil
	}
	s, ok := v.(string)
	if !ok {
		b, _ := json.Marshal(v)
		s = string(b)
	}
	var out []fleet.Tenant
	require.NoError(t, json.Unmarshal([]byte(s), &out), "SLUICE_FLEET_TENANTS %s", s)
	return out
}

// refIDOrArn returns the logical id a reference points at, or for an imported secret's literal
// ARN its name without the suffix, capitalized as the test's construct ids are.
func refIDOrArn(v any) string {
	if id := refID(v); id != "" {
		return id
	}
	s, _ := v.(string)
	if i := strings.Index(s, ":secret:"); i >= 0 {
		name := strings.TrimSuffix(s[i+len(":secret:"):], "-AbCdEf")
		return strings.ToUpper(name[:1]) + name[1:]
	}
	return s
}

// Each shard has its own heartbeat alarm: FleetShardHeartbeat with that shard's Shard
// dimension, missing data breaching, so that one shard that stops is noticed while the
// others keep reporting (the fleet-wide FleetHeartbeatMissing fires only when all stop).
func TestFleetAlarmsOnEachShardsHeartbeat(t *testing.T) {
	b := fleetSetup(t, "acme", "globex", "initech")
	f := infra.NewOutboxFleet(b.stack, "Fleet", b.fleetProps(3))
	mon := infra.NewMonitoring(b.stack, "Monitoring", &infra.MonitoringProps{Fleet: f, NoAlarmDestination: true})
	tmpl := assertions.Template_FromStack(b.stack, nil)
	byShard := map[string]map[string]any{}
	for _, a := range resources(tmpl, "AWS::CloudWatch::Alarm") {
		p := props(a)
		if p["MetricName"] != metrics.FleetShardHeartbeat.Name {
			continue
		}
		dims := map[string]string{}
		for _, d := range p["Dimensions"].([]any) {
			d := d.(map[string]any)
			dims[d["Name"].(string)] = d["Value"].(string)
		}
		require.Equal(t, metrics.ServiceRelay, dims[metrics.DimensionService])
		byShard[dims[metrics.DimensionShard]] = p
	}
	require.Len(t, byShard, 3, "one heartbeat alarm per shard")
	for i := range 3 {
		p := byShard[fmt.Sprintf("%d/3", i)]
		require.NotNil(t, p, "shard %d/3's alarm", i)
		require.Equal(t, "breaching", p["TreatMissingData"], "a shard that stops emits nothing: missing data breaches")
		require.Equal(t, "LessThanThreshold", p["ComparisonOperator"])
		require.EqualValues(t, 1, p["Threshold"])
		require.Equal(t, metrics.Namespace, p["Namespace"])
		require.Equal(t, "Sum", p["Statistic"])
		require.Contains(t, mon.Alarms(), fmt.Sprintf("FleetShard%dHeartbeatMissing", i))
	}
}

// Tenants of one server can share its secret, each naming only its database: the shard's
// environment carries each tenant's database beside the one secret's ARN, and the role may
// read that secret.
func TestFleetTenantsShareTheirServersSecret(t *testing.T) {
	b := fleetSetup(t)
	server := b.control // any imported secret: the server's credentials
	p := b.fleetProps(1)
	p.Registry = nil
	p.Tenants = []infra.FleetTenant{
		{Name: "acme", Secret: server, Server: "main", Database: "acme_db"},
		{Name: "globex", Secret: server, Server: "main", Database: "globex_db"},
	}
	infra.NewOutboxFleet(b.stack, "Fleet", p)
	tmpl := assertions.Template_FromStack(b.stack, nil)
	var tenants []fleet.Tenant
	for _, fn := range resources(tmpl, "AWS::Lambda::Function") {
		if e := env(fn); e[lambdaenv.FleetShard] != nil {
			tenants = tenantsOf(t, b.stack, e[lambdaenv.FleetTenants])
		}
	}
	require.Len(t, tenants, 2)
	for _, tn := range tenants {
		require.Equal(t, tn.Name+"_db", tn.Database)
		require.Contains(t, tn.SecretARN, "secret:control-")
	}
	policy, _ := json.Marshal(resources(tmpl, "AWS::IAM::Policy"))
	require.Contains(t, string(policy), "secret:control-AbCdEf")
}

// Each shard's invocation is still serving when the next one starts: its timeout is the
// schedule's period plus lambdaenv.FleetShardOverlap plus the stop-before margin, and its
// reserved concurrency (which the connection check books) covers the two invocations of an
// overlap. e2e.TestFleetShardInvocationsHandOver runs this shape through the real binaries.
func TestFleetShardInvocationsOverlap(t *testing.T) {
	b := fleetSetup(t, "acme", "globex")
	p := b.fleetProps(2)
	p.RelayTimeout = 0 // the default
	infra.NewOutboxFleet(b.stack, "Fleet", p)
	tmpl := assertions.Template_FromStack(b.stack, nil)
	var shards int
	for _, fn := range resources(tmpl, "AWS::Lambda::Function") {
		if env(fn)[lambdaenv.FleetShard] == nil {
			continue
		}
		shards++
		p := props(fn)
		timeout := time.Duration(p["Timeout"].(float64)) * time.Second
		require.Equal(t, infra.RelaySchedule+lambdaenv.FleetShardOverlap+lambdaenv.DefaultRelayStopBefore, timeout)
		require.Greater(t, timeout-lambdaenv.DefaultRelayStopBefore, infra.RelaySchedule, "an invocation serves past the next one's start")
		require.EqualValues(t, 2, p["ReservedConcurrentExecutions"])
	}
	require.Equal(t, 2, shards)
}

// A server with IAMAuth: the relays and a fleet consumer are told to log in to its tenants
// with IAM tokens (SLUICE_FLEET_IAM_SERVERS names it, not the other server), and their roles
// may rds-db:connect as its user on it alone; a server without IAMAuth grants nothing of the
// kind. Bad IAMAuth settings fail synthesis.
func TestFleetIAMServerGrantsConnectAsItsUser(t *testing.T) {
	b := fleetSetup(t, "acme", "big-hooli")
	p := b.fleetProps(1)
	p.Servers[1].IAMAuth = &infra.FleetIAMAuth{ResourceID: jsii.String("db-ABCDEFGHIJKL"), User: "sluice_relay"}
	f := infra.NewOutboxFleet(b.stack, "Fleet", p)
	infra.NewConsumer(b.stack, "Billing", b.fleetConsumerProps(t, f, infra.ConsumerFleet{TenantMaxConns: 2, MaxConns: 4}))
	tmpl := assertions.Template_FromStack(b.stack, nil)

	var withIAM int
	for _, fn := range resources(tmpl, "AWS::Lambda::Function") {
		if v, ok := env(fn)[lambdaenv.FleetIAMServers]; ok {
			require.JSONEq(t, `["big"]`, v.(string))
			withIAM++
		}
	}
	require.Equal(t, 2, withIAM, "the shard's relay and the fleet consumer")

	policies, _ := json.Marshal(resources(tmpl, "AWS::IAM::Policy"))
	want := `"Action":"rds-db:connect","Effect":"Allow","Resource":{"Fn::Join":["",["arn:",{"Ref":"AWS::Partition"},":rds-db:",{"Ref":"AWS::Region"},":",{"Ref":"AWS::AccountId"},":dbuser:db-ABCDEFGHIJKL/sluice_relay"]]}`
	require.Equal(t, 2, strings.Count(string(policies), want), "the relays' role and the consumer's: %s", policies)
	require.Equal(t, 2, strings.Count(string(policies), "rds-db:connect"), "no grant for the server without IAMAuth")

	bad := fleetSetup(t, "acme")
	bp := bad.fleetProps(1)
	bp.Servers[0].IAMAuth = &infra.FleetIAMAuth{User: "a/b"}
	err := build(func() { infra.NewOutboxFleet(bad.stack, "Fleet", bp) })
	require.ErrorContains(t, err, "server main: IAMAuth needs ResourceID and a User")
}
