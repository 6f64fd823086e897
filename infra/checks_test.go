package infra_test

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
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

// cfn-lint (the CloudFormation linter, installed on these machines) checks the synthesized
// templates against the resource specifications: zero errors, and only the warnings above.
func TestTemplatesPassCfnLint(t *testing.T) {
	lint, err := exec.LookPath("cfn-lint")
	if err != nil {
		t.Skip("cfn-lint is not installed (pip install cfn-lint): the templates were not linted")
	}
	dir := t.TempDir()
	app := awscdk.NewApp(&awscdk.AppProps{Outdir: jsii.String(dir)})
	for name, p := range map[string]*infra.SluiceStackProps{
		"Sluice":      {AlarmEmail: "oncall@example.com"},
		"SluiceProxy": {NoAlarmDestination: true, ConsumerProxy: true, Fifo: true, NatGateways: 1, MultiAZ: jsii.Bool(false)},
	} {
		p.RelayCodeDir, p.ConsumerCodeDir, p.MigrateCodeDir, p.CABundle = assetDir(t, "relay"), assetDir(t, "consumer"), assetDir(t, "migrate"), caBundle(t)
		infra.NewSluiceStack(app, name, p)
	}
	app.Synth(nil)
	templates, err := filepath.Glob(filepath.Join(dir, "*.template.json"))
	require.NoError(t, err)
	require.Len(t, templates, 2)

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
// says which and how many.
func TestConnectionBudgetFailsSynthWithTheArithmetic(t *testing.T) {
	build := func(maxConns, relayConcurrency int) (err error) {
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
		infra.NewConsumer(stack, "Billing", &infra.ConsumerProps{Name: "billing", CodeDir: assetDir(t, "consumer"), Topic: ob.Topic(),
			Network: network, Database: db, Migrations: mig, MaxConcurrency: 10})
		return nil
	}
	// 1 + 6×4 + 10×4 = 65 < 100 − 10.
	require.NoError(t, build(4, 6))
	// 1 + 6×8 + 10×8 = 129 ≥ 90: the consumer tips it over.
	err := build(8, 6)
	require.Error(t, err)
	for _, want := range []string{
		"migrations 1 × 1 = 1", "relay 6 (reserved concurrency) × 8 (pool) = 48", "consumer billing 10 (maximum concurrency) × 8 (pool) = 80",
		"total 129, but max_connections 100 − 10 reserved = 90",
	} {
		require.Contains(t, err.Error(), want)
	}
	// Exactly at the budget is already too much: 1 + 89 relays × 1.
	require.Error(t, build(1, 89))
}

// A consumer behind RDS Proxy connects to the proxy with pgx in exec mode, its connections are
// the proxy's, and the relay still connects to the database itself.
func TestConsumerProxy(t *testing.T) {
	app := awscdk.NewApp(nil)
	s := infra.NewSluiceStack(app, "Proxied", &infra.SluiceStackProps{
		RelayCodeDir: assetDir(t, "relay"), ConsumerCodeDir: assetDir(t, "consumer"), MigrateCodeDir: assetDir(t, "migrate"),
		CABundle: caBundle(t), NoAlarmDestination: true, ConsumerProxy: true,
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
}
