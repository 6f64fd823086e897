package infra_test

import (
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsrds"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssecretsmanager"
	"github.com/aws/jsii-runtime-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/infra"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
)

// knownCfnLintWarnings are the cfn-lint findings the templates may keep, each with its reason.
// Anything else (every error, any other warning) fails the test.
var knownCfnLintWarnings = []struct {
	rule     string
	resource *regexp.Regexp
	reason   string
}{
	{"W3005", regexp.MustCompile(`ServiceRole`),
		"CDK makes every Lambda function DependsOn its service role (and default policy) so the policy exists before " +
			"the function may be invoked; the Role's GetAtt implies half of it. Redundant, not wrong."},
}

// requireCfnLintClean runs cfn-lint on the templates: zero errors, and only the known
// warnings. It skips the test without cfn-lint.
func requireCfnLintClean(t *testing.T, templates []string) {
	t.Helper()
	lint, err := exec.LookPath("cfn-lint")
	if err != nil {
		t.Skip("cfn-lint is not installed (pip install cfn-lint): the templates were not linted")
	}
	out, err := exec.Command(lint, append([]string{"--format", "json"}, templates...)...).Output()
	if ee, ok := err.(*exec.ExitError); ok && len(out) == 0 {
		t.Fatalf("cfn-lint failed: %v: %s", err, ee.Stderr)
	}
	var findings []struct {
		Rule     struct{ Id string } `json:"Rule"`
		Level    string              `json:"Level"`
		Message  string              `json:"Message"`
		Filename string              `json:"Filename"`
	}
	require.NoError(t, json.Unmarshal(out, &findings), "cfn-lint output: %s", out)
	for _, f := range findings {
		known := false
		for _, k := range knownCfnLintWarnings {
			if f.Level == "Warning" && f.Rule.Id == k.rule && k.resource.MatchString(f.Message) {
				known = true
			}
		}
		if !known {
			t.Errorf("cfn-lint %s %s in %s: %s", f.Level, f.Rule.Id, filepath.Base(f.Filename), f.Message)
		}
	}
	t.Logf("cfn-lint: %d findings, all explained warnings", len(findings))
}

// Synthesis fails when the functions may open more connections than the server allows, and
// says which and how many. A consumer behind an RDS Proxy books the proxy's share, once per
// proxy, instead of its own connections.
func TestConnectionBudgetFailsSynthWithTheArithmetic(t *testing.T) {
	build := func(maxConns, relayConcurrency, proxyPercent int) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err, _ = r.(error)
			}
		}()
		app := awscdk.NewApp(nil)
		stack := awscdk.NewStack(app, jsii.String("Budget"), nil)
		vpc := awsec2.Vpc_FromVpcAttributes(stack, jsii.String("Vpc"), &awsec2.VpcAttributes{
			VpcId: jsii.String("vpc-0123456789abcdef0"), AvailabilityZones: jsii.Strings("eu-west-1a"), PrivateSubnetIds: jsii.Strings("subnet-a"),
		})
		secret := awssecretsmanager.Secret_FromSecretCompleteArn(stack, jsii.String("Secret"), jsii.String("arn:aws:secretsmanager:eu-west-1:111111111111:secret:db-AbCdEf"))
		network, db := infra.Network{Vpc: vpc}, infra.Database{Secret: secret, CABundle: caBundle(t), MaxConns: maxConns}
		mig := infra.NewMigrations(stack, "Migrations", &infra.MigrationsProps{CodeDir: assetDir(t, "migrate"), Network: network, Database: db,
			MaxConnections: 100, ReservedConnections: 10})
		ob := infra.NewOutbox(stack, "Outbox", &infra.OutboxProps{RelayCodeDir: assetDir(t, "relay"), Network: network, Database: db,
			Migrations: mig, RelayReservedConcurrency: relayConcurrency})
		consumer := func(name string, proxy awsrds.DatabaseProxy, role infra.DatabaseRole) {
			infra.NewConsumer(stack, name, &infra.ConsumerProps{Name: name, CodeDir: assetDir(t, "consumer"), Topic: ob.Topic(),
				Network: network, Database: db, Migrations: mig, MaxConcurrency: 10, Proxy: proxy, DatabaseRole: role, ProxyMaxConnectionsPercent: proxyPercent})
		}
		if proxyPercent == 0 {
			consumer("billing", nil, nil)
			return nil
		}
		instance := awsrds.DatabaseInstance_FromDatabaseInstanceAttributes(stack, jsii.String("Db"), &awsrds.DatabaseInstanceAttributes{
			InstanceIdentifier: jsii.String("db"), InstanceEndpointAddress: jsii.String("db.example"), Port: jsii.Number(5432),
			SecurityGroups: &[]awsec2.ISecurityGroup{}, Engine: awsrds.DatabaseInstanceEngine_POSTGRES(),
		})
		var roles []infra.DatabaseRole
		var secrets []awssecretsmanager.ISecret
		for _, name := range []string{"billing", "audit"} {
			r := infra.NewDatabaseRole(stack, name+"Role", &infra.DatabaseRoleProps{Migrations: mig, Name: "sluice_consumer_" + name,
				Kind: infra.RoleConsumer, Consumer: name, Network: network, Database: db})
			roles, secrets = append(roles, r), append(secrets, r.Secret())
		}
		proxy := awsrds.NewDatabaseProxy(stack, jsii.String("Proxy"), &awsrds.DatabaseProxyProps{
			ProxyTarget: awsrds.ProxyTarget_FromInstance(instance), Secrets: &secrets, Vpc: vpc, RequireTLS: jsii.Bool(true),
			MaxConnectionsPercent: jsii.Number(float64(proxyPercent)),
		})
		consumer("billing", proxy, roles[0])
		consumer("audit", proxy, roles[1]) // the same proxy: its share is booked once
		return nil
	}
	// 2 + 6×4 + 10×4 + 1×4 (the processor schedule) = 70 < 100 − 10.
	require.NoError(t, build(4, 6, 0))
	// 2 + 6×8 + 10×8 = 130 ≥ 90: the consumer tips it over.
	err := build(8, 6, 0)
	require.Error(t, err)
	for _, want := range []string{
		"migrations 2 (a deploy and a scheduled partition maintenance) × 1 = 2", "relay 6 (reserved concurrency) × 8 (pool) = 48",
		"consumer billing 10 (maximum concurrency) × 8 (pool) = 80", "total 130, but max_connections 100 − 10 reserved = 90",
	} {
		require.Contains(t, err.Error(), want)
	}
	// Every consumer's processor schedule is booked, whatever its commit mode (this one is
	// per-record): 2 + 11×4 + 10×4 = 86 fits, its 1 × 4 makes 90.
	err = build(4, 11, 0)
	require.Error(t, err)
	require.Contains(t, err.Error(), "consumer billing processor 1 (overlapping scheduled invocations) × 4 (pool) = 4")
	require.Contains(t, err.Error(), "total 90, but max_connections 100 − 10 reserved = 90")
	// Exactly at the budget is already too much: 2 + 88 relays × 1.
	err = build(1, 88, 0)
	require.ErrorContains(t, err, "total 90, but max_connections 100 − 10 reserved = 90")

	// Two consumers behind one proxy with 25%: 2 + 24 + 25 = 51.
	require.NoError(t, build(4, 6, 25))
	// With RDS Proxy's default 100%: 2 + 24 + 100 = 126 ≥ 90, and the error says why.
	err = build(4, 6, 100)
	require.Error(t, err)
	require.Contains(t, err.Error(), "RDS Proxy Budget/Proxy 100% of max_connections 100 = 100")
	require.Contains(t, err.Error(), "total 126, but max_connections 100 − 10 reserved = 90")
	require.NotContains(t, err.Error(), "consumer billing 10 (maximum concurrency)", "the consumers' connections end at the proxy")
}

// A consumer behind RDS Proxy connects to the proxy with pgx in exec mode, its connections are
// the proxy's, and the relay still connects to the database itself. With NAT gateways the
// consumer's handler code may call HTTPS anywhere; the relay still only what it calls.
func TestConsumerProxy(t *testing.T) {
	app := awscdk.NewApp(nil)
	s := infra.NewSluiceStack(app, "Proxied", &infra.SluiceStackProps{
		RelayCodeDir: assetDir(t, "relay"), ConsumerCodeDir: assetDir(t, "consumer"), MigrateCodeDir: assetDir(t, "migrate"),
		CABundle: caBundle(t), NoAlarmDestination: true, ConsumerProxy: true, NatGateways: 1,
	})
	withNag(s)
	tmpl := assertions.Template_FromStack(s, nil)
	requireNoNagErrors(t, s)

	proxySecrets := assertions.NewCapture(nil)
	tmpl.HasResourceProperties(jsii.String("AWS::RDS::DBProxy"), map[string]any{
		"EngineFamily": "POSTGRESQL", "RequireTLS": true, "Auth": proxySecrets,
	})
	require.Len(t, *proxySecrets.AsArray(), 1, "only the consumer's role authenticates at the proxy")
	tmpl.HasResourceProperties(jsii.String("AWS::RDS::DBProxyTargetGroup"), map[string]any{
		"ConnectionPoolConfigurationInfo": map[string]any{"MaxConnectionsPercent": 25.0, "ConnectionBorrowTimeout": 30.0},
	})
	proxyID := firstKey(resources(tmpl, "AWS::RDS::DBProxy"))
	consumerFn := resources(tmpl, "AWS::Lambda::Function")[*s.GetLogicalId(s.Consumer().Function().Node().DefaultChild().(awscdk.CfnElement))]
	e := env(consumerFn)
	require.Equal(t, map[string]any{"Fn::GetAtt": []any{proxyID, "Endpoint"}}, e[lambdaenv.DatabaseHost])
	require.Equal(t, "exec", e[lambdaenv.DatabaseQueryExecMode])
	relayFn := resources(tmpl, "AWS::Lambda::Function")[*s.GetLogicalId(s.Outbox().Relay().Node().DefaultChild().(awscdk.CfnElement))]
	require.NotContains(t, env(relayFn), lambdaenv.DatabaseHost, "the relay stays off the proxy")
	require.NotContains(t, env(relayFn), lambdaenv.DatabaseQueryExecMode)

	tmpl.ResourceCountIs(jsii.String("AWS::EC2::NatGateway"), jsii.Number(1))
	egress := func(fn awscdk.CfnElement) []string {
		var out []string
		f := resources(tmpl, "AWS::Lambda::Function")[*s.GetLogicalId(fn)]
		for _, sg := range props(f)["VpcConfig"].(map[string]any)["SecurityGroupIds"].([]any) {
			for _, e := range asList(props(resources(tmpl, "AWS::EC2::SecurityGroup")[refID(sg)])["SecurityGroupEgress"]) {
				if rule, ok := e.(map[string]any); ok {
					out = append(out, fmt.Sprintf("%v:%v", rule["CidrIp"], rule["FromPort"]))
				}
			}
		}
		return out
	}
	require.Contains(t, egress(s.Consumer().Function().Node().DefaultChild().(awscdk.CfnElement)), "0.0.0.0/0:443", "handler code calls other services through NAT")
	require.NotContains(t, egress(s.Outbox().Relay().Node().DefaultChild().(awscdk.CfnElement)), "0.0.0.0/0:443", "the relay calls only SNS and Secrets Manager, through the endpoints")
}

// An imported database with its max_connections and instance identifier gets the connection
// budget and the database alarms, like the stack's own.
func TestImportedDatabase(t *testing.T) {
	build := func(maxConnections int) (tmpl assertions.Template, err error) {
		defer func() {
			if r := recover(); r != nil {
				err, _ = r.(error)
			}
		}()
		app := awscdk.NewApp(nil)
		s := infra.NewSluiceStack(app, "Imported", &infra.SluiceStackProps{
			RelayCodeDir: assetDir(t, "relay"), ConsumerCodeDir: assetDir(t, "consumer"), MigrateCodeDir: assetDir(t, "migrate"),
			CABundle: caBundle(t), NoAlarmDestination: true,
			Database: &infra.ExistingDatabase{SecretARN: "arn:aws:secretsmanager:eu-west-1:111111111111:secret:db-AbCdEf",
				SecurityGroupID: "sg-0123456789abcdef0", MaxConnections: maxConnections, InstanceIdentifier: "orders-db"},
		})
		return assertions.Template_FromStack(s, nil), nil
	}
	// 2 + 6×4 + 5×4 = 46 ≥ 50 − 15 = 35.
	_, err := build(50)
	require.Error(t, err)
	require.Contains(t, err.Error(), "total 46, but max_connections 50 − 15 reserved = 35")

	tmpl, err := build(400)
	require.NoError(t, err)
	tmpl.ResourceCountIs(jsii.String("AWS::RDS::DBInstance"), jsii.Number(0))
	tmpl.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), map[string]any{
		"Namespace": "AWS/RDS", "MetricName": "DatabaseConnections", "Threshold": 320.0, // 80% of 400
		"Dimensions": []any{map[string]any{"Name": "DBInstanceIdentifier", "Value": "orders-db"}},
	})
	n := 0
	for _, a := range resources(tmpl, "AWS::CloudWatch::Alarm") {
		if props(a)["Namespace"] == "AWS/RDS" {
			n++
		}
	}
	require.Equal(t, 5, n, "CPU, memory, storage, connections, transaction IDs")
}
