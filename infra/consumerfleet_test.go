package infra_test

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/jsii-runtime-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/infra"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
)

// fleetConsumerProps is a consumer "billing" of fleet f's topic applying into its tenants.
func (b *fleetBundle) fleetConsumerProps(t *testing.T, f infra.OutboxFleet, cf infra.ConsumerFleet) *infra.ConsumerProps {
	t.Helper()
	cf.Fleet = f
	return &infra.ConsumerProps{Name: "billing", CodeDir: assetDir(t, "consumer"), Topic: f.Topic(), Network: b.network, Fleet: &cf}
}

// build runs fn, returning the error it panicked with (how a construct fails synthesis).
func build(fn func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err, _ = r.(error)
			if err == nil {
				err = fmt.Errorf("%v", r)
			}
		}
	}()
	fn()
	return nil
}

// functionByDescription returns the one function whose description contains what.
func functionByDescription(t *testing.T, tmpl assertions.Template, what string) map[string]any {
	t.Helper()
	var found []map[string]any
	for _, fn := range resources(tmpl, "AWS::Lambda::Function") {
		if strings.Contains(fmt.Sprint(props(fn)["Description"]), what) {
			found = append(found, fn)
		}
	}
	require.Len(t, found, 1, "functions described %q", what)
	return found[0]
}

// A fleet consumer reaches the tenants as the fleet's relays do, from the fleet's settings:
// every static tenant (not a shard's) and the control table in its environment with its pool
// bounds and the fleet's TLS settings, no database secret of its own; read access to every
// tenant's secret by its ARN, the control database's and the control table's tenants' under
// their prefix; ingress on the servers the fleet names with Connections. cdk-nag finds
// nothing unexplained.
func TestFleetConsumerTemplate(t *testing.T) {
	names := []string{"acme", "globex", "big-hooli", "big-soylent"}
	b := fleetSetup(t, names...)
	withNag(b.stack)
	fp := b.fleetProps(2)
	bigSG := awsec2.SecurityGroup_FromSecurityGroupId(b.stack, jsii.String("BigSG"), jsii.String("sg-0bbbbbbbbbbbbbbbb"), nil)
	fp.Servers[1].Connections = awsec2.NewConnections(&awsec2.ConnectionsProps{
		SecurityGroups: &[]awsec2.ISecurityGroup{bigSG}, DefaultPort: awsec2.Port_Tcp(jsii.Number(5432)),
	})
	f := infra.NewOutboxFleet(b.stack, "Fleet", fp)
	c := infra.NewConsumer(b.stack, "Billing", b.fleetConsumerProps(t, f, infra.ConsumerFleet{TenantMaxConns: 3, MaxConns: 12}))
	infra.NewMonitoring(b.stack, "Monitoring", &infra.MonitoringProps{Fleet: f, Consumers: []infra.Consumer{c}, NoAlarmDestination: true})

	tmpl := assertions.Template_FromStack(b.stack, nil)
	fn := functionByDescription(t, tmpl, "inbox consumer billing")
	e := env(fn)
	require.NotContains(t, e, lambdaenv.DatabaseSecretARN, "a fleet consumer logs in with each tenant's secret")
	require.NotContains(t, e, lambdaenv.FleetShard, "a consumer serves every tenant")
	require.NotContains(t, e, lambdaenv.FleetServerConnections, "the relay's budget, not the consumer's")
	require.Equal(t, "3", e[lambdaenv.ConsumerTenantMaxConns])
	require.Equal(t, "12", e[lambdaenv.ConsumerFleetMaxConns])
	require.Equal(t, "verify-full", e[lambdaenv.DatabaseSSLMode])
	require.Equal(t, infra.CABundleLambdaPath, e[lambdaenv.DatabaseSSLRootCert])
	require.Equal(t, "Control", refIDOrArn(e[lambdaenv.FleetRegistrySecretARN]))
	var served []string
	for _, tn := range tenantsOf(t, b.stack, e[lambdaenv.FleetTenants]) {
		require.Contains(t, tn.SecretARN, "secret:tenants/"+tn.Name+"-")
		require.Equal(t, strings.HasPrefix(tn.Name, "big-"), tn.Server == "big", "tenant %s's server", tn.Name)
		require.Equal(t, 1, tn.Weight)
		served = append(served, tn.Name)
	}
	sort.Strings(served)
	sorted := append([]string(nil), names...)
	sort.Strings(sorted)
	require.Equal(t, sorted, served, "the consumer has every tenant, whatever its shard")

	// The read grants, on the consumer's own role.
	grants := statements(tmpl, refID(props(fn)["Role"]))
	var readable []string
	for _, st := range grants["secretsmanager:GetSecretValue"] {
		for _, r := range asList(st["Resource"]) {
			readable = append(readable, resolveJoin(r))
		}
	}
	for _, n := range names {
		require.Contains(t, readable, "arn:aws:secretsmanager:eu-west-1:111111111111:secret:tenants/"+n+"-AbCdEf")
	}
	require.Contains(t, readable, "arn:aws:secretsmanager:eu-west-1:111111111111:secret:control-AbCdEf")
	prefix := false
	for _, r := range readable {
		prefix = prefix || strings.HasSuffix(r, ":secret:tenants/*")
	}
	require.True(t, prefix, "the control table's tenants' secrets, by their prefix: %v", readable)
	requireNoWildcardGrants(t, tmpl)

	// Ingress on the server the fleet gave Connections, from the consumer's security group.
	sgs := props(fn)["VpcConfig"].(map[string]any)["SecurityGroupIds"].([]any)
	require.Len(t, sgs, 1)
	tmpl.HasResourceProperties(jsii.String("AWS::EC2::SecurityGroupIngress"), map[string]any{
		"GroupId": "sg-0bbbbbbbbbbbbbbbb", "FromPort": 5432.0, "SourceSecurityGroupId": sgs[0],
		"Description": "sluice inbox consumer billing to PostgreSQL (server big)",
	})
	requireNoNagErrors(t, b.stack)
}

// A fleet consumer books its instances on every server of the fleet, beside the relays: with
// static tenants only, MaxConcurrency (and the processor's overlapping invocations) × the
// server's tenants × TenantMaxConns, at most MaxConns; with the control table MaxConns on
// every server, and one connection per instance on the control database's. Synthesis fails
// showing the arithmetic.
func TestFleetConsumerConnectionBudget(t *testing.T) {
	static := func(concurrency int) error {
		return build(func() {
			b := fleetSetup(t, "acme", "big-hooli", "big-soylent")
			p := b.fleetProps(1)
			p.Registry = nil
			f := infra.NewOutboxFleet(b.stack, "Fleet", p)
			cp := b.fleetConsumerProps(t, f, infra.ConsumerFleet{})
			cp.MaxConcurrency = concurrency
			infra.NewConsumer(b.stack, "Billing", cp)
		})
	}
	// big: relays 1 × 6 × 8 = 48, consumer 50 × (2 tenants × 2) = 200, processor 1 × 4: 252 < 300 − 15;
	// main: migrations 2, relays 1 × 6 × 5 = 30, consumer 50 × (1 × 2) = 100, processor 2: 134 < 190.
	require.NoError(t, static(50))
	err := static(60) // big: 48 + 60 × 4 = 288 ≥ 285
	require.ErrorContains(t, err, "than the server big allows")
	require.ErrorContains(t, err, "fleet Fleet relays 1 (shards serving server big) × 6 (reserved concurrency) × 8 (connections per instance) = 48")
	require.ErrorContains(t, err, "fleet consumer billing 60 (maximum concurrency) × 4 (2 tenants on server big × 2, ConsumerFleet.TenantMaxConns) = 240")
	require.ErrorContains(t, err, "total 288, but max_connections 300 − 15 reserved = 285")

	registry := func(maxConns int) error {
		return build(func() {
			b := fleetSetup(t, "acme")
			f := infra.NewOutboxFleet(b.stack, "Fleet", b.fleetProps(1))
			cp := b.fleetConsumerProps(t, f, infra.ConsumerFleet{MaxConns: maxConns})
			cp.MaxConcurrency = 10
			infra.NewConsumer(b.stack, "Billing", cp)
		})
	}
	// main: migrations 2, relays 30, their control table 6, consumer 10 × 12 = 120, processor
	// 12, its control table 11: 181 < 190. With 13 connections: 192.
	require.NoError(t, registry(12))
	err = registry(13)
	require.ErrorContains(t, err, "than the server allows") // main's budget is the migrations'
	require.ErrorContains(t, err, "ConsumerFleet.MaxConns")
	require.ErrorContains(t, err, "fleet consumer billing 10 (maximum concurrency) × 13 (ConsumerFleet.MaxConns: any tenant of the control table may be on it) = 130")
	require.ErrorContains(t, err, "fleet consumer billing processor 1 (overlapping scheduled invocations) × 13 = 13")
	require.ErrorContains(t, err, "fleet consumer billing control table 11 (instances: 10 + 1 processor) × 1 (connection) = 11")
	require.ErrorContains(t, err, "total 192, but max_connections 200 − 10 reserved = 190")
}

// fakeFleet is an OutboxFleet NewOutboxFleet did not make.
type fakeFleet struct{ infra.OutboxFleet }

// Props a fleet consumer cannot use are refused, every problem at once; pool bounds the
// consumer Lambda would refuse fail synthesis too; and a fleet whose static tenants do not
// fit the consumer's environment asks for the control table.
func TestFleetConsumerValidation(t *testing.T) {
	b := fleetSetup(t, "acme")
	f := infra.NewOutboxFleet(b.stack, "Fleet", b.fleetProps(1))
	p := b.fleetConsumerProps(t, f, infra.ConsumerFleet{TenantMaxConns: -1, MaxConns: -2})
	p.Fleet.Fleet = nil
	p.Database = infra.Database{Secret: b.control, CABundle: b.ca}
	p.Migrations = b.mig
	p.UseDatabaseSecret = true
	p.DatabaseGrants = []infra.DatabaseGrant{{Table: "invoice", Privileges: []string{"SELECT"}}}
	err := build(func() { infra.NewConsumer(b.stack, "Billing", p) })
	require.Error(t, err)
	for _, want := range []string{
		"Fleet.Fleet is required", "Fleet.TenantMaxConns (SLUICE_CONSUMER_TENANT_MAX_CONNS) must be at least 1, got -1",
		"Fleet.MaxConns (SLUICE_CONSUMER_FLEET_MAX_CONNS) must be at least 1, got -2",
		"Database.Secret must be unset with Fleet", "Database.CABundle must be unset with Fleet", "Migrations must be unset with Fleet",
		"UseDatabaseSecret must be unset with Fleet", "DatabaseGrants must be unset with Fleet",
	} {
		require.ErrorContains(t, err, want)
	}
	require.NotContains(t, err.Error(), "Migrations is not set", "a fleet consumer has no role of its own to ask for")

	fake := b.fleetConsumerProps(t, f, infra.ConsumerFleet{})
	fake.Fleet.Fleet = fakeFleet{}
	err = build(func() { infra.NewConsumer(b.stack, "Fake", fake) })
	require.ErrorContains(t, err, "Fleet.Fleet must be made by NewOutboxFleet")
	err = build(func() {
		infra.NewConsumer(b.stack, "Wide", b.fleetConsumerProps(t, f, infra.ConsumerFleet{TenantMaxConns: 20, MaxConns: 10}))
	})
	require.ErrorContains(t, err, "the consumer Lambda would refuse these settings at cold start")
	require.ErrorContains(t, err, "SLUICE_CONSUMER_TENANT_MAX_CONNS (20) must not exceed SLUICE_CONSUMER_FLEET_MAX_CONNS (10)")

	// 40 static tenants fit 4 shards' relays, but not one consumer's environment.
	var names []string
	for i := range 40 {
		names = append(names, fmt.Sprintf("t-%02d", i))
	}
	err = build(func() {
		b := fleetSetup(t, names...)
		p := b.fleetProps(4)
		p.Registry = nil
		f := infra.NewOutboxFleet(b.stack, "Fleet", p)
		infra.NewConsumer(b.stack, "Billing", b.fleetConsumerProps(t, f, infra.ConsumerFleet{}))
	})
	require.ErrorContains(t, err, `sluice Consumer "Billing": its static tenants (40) make its environment about`)
	require.ErrorContains(t, err, "above Lambda's 4096")
	require.ErrorContains(t, err, "control table (OutboxFleetProps.Registry)")
}

// The example stack with -c fleet=3: a second consumer on the fleet's topic applies into the
// tenants' databases, is alarmed like the example consumer, and has its outputs; cdk-nag and
// cfn-lint stay clean (TestFleetExampleStack). MaxExampleFleet tenants fit its environment.
func TestFleetExampleStackConsumer(t *testing.T) {
	p := &infra.SluiceStackProps{NoAlarmDestination: true, Fleet: 3, FleetShards: 2,
		RelayCodeDir: assetDir(t, "relay"), ConsumerCodeDir: assetDir(t, "consumer"), MigrateCodeDir: assetDir(t, "migrate"), CABundle: caBundle(t)}
	s := infra.NewSluiceStack(awscdk.NewApp(nil), "SluiceFleet", p)
	c := s.FleetConsumer()
	require.NotNil(t, c)
	require.Equal(t, "example-fleet", c.Name())
	tmpl := assertions.Template_FromStack(s, nil)
	fn := functionByDescription(t, tmpl, "inbox consumer example-fleet")
	e := env(fn)
	tenants, _ := json.Marshal(e[lambdaenv.FleetTenants]) // a join: the secrets' ARNs are references
	require.Equal(t, 3, strings.Count(string(tenants), `name\":\"tenant-`), "every tenant: %s", tenants)
	require.NotContains(t, e, lambdaenv.DatabaseSecretARN)
	require.Equal(t, fmt.Sprint(lambdaenv.DefaultConsumerFleetMaxConns), e[lambdaenv.ConsumerFleetMaxConns])
	// The fleet consumer subscribes to the fleet's topic, not the outbox's.
	tmpl.HasResourceProperties(jsii.String("AWS::SNS::Subscription"), map[string]any{
		"TopicArn": map[string]any{"Ref": *s.GetLogicalId(s.Fleet().Topic().Node().DefaultChild().(awscdk.CfnElement))},
		"Protocol": "sqs",
	})
	for _, a := range []string{"example-fleet/InboxParked", "example-fleet/DeadLetterQueueNotEmpty"} {
		require.Contains(t, s.Monitoring().Alarms(), a)
	}
	outputs := (*tmpl.ToJSON())["Outputs"].(map[string]any)
	for _, o := range []string{"FleetConsumerQueueUrl", "FleetConsumerDeadLetterQueueUrl", "FleetConsumerFunctionName"} {
		require.Contains(t, outputs, o)
	}

	p2 := *p
	p2.Fleet, p2.FleetShards = infra.MaxExampleFleet, 3
	require.NoError(t, build(func() { infra.NewSluiceStack(awscdk.NewApp(nil), "SluiceFleetMax", &p2) }))
	p2.Fleet = infra.MaxExampleFleet + 1
	require.ErrorContains(t, build(func() { infra.NewSluiceStack(awscdk.NewApp(nil), "SluiceFleetTooMany", &p2) }), "Fleet must be between 0 and 20")
}
