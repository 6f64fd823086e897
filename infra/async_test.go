package infra_test

import (
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/jsii-runtime-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/infra"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
	"github.com/sluicehq/sluice/pkg/metrics"
)

// An async consumer deploys with its processor (as every consumer does, TestSluiceStack): the
// consumer function in async mode, a schedule invoking that same function every minute (it runs
// the inbox Processor on scheduled events), and an alarm on parked rows;
// cdk-nag finds nothing unsuppressed (cfn-lint runs over the same stack in TestEveryVariantPassesCfnLintAndNag).
func TestAsyncConsumerDeploysWithItsProcessor(t *testing.T) {
	app := awscdk.NewApp(nil)
	st := infra.NewSluiceStack(app, "SluiceAsync", &infra.SluiceStackProps{NoAlarmDestination: true, ConsumerCommitMode: infra.CommitAsync,
		RelayCodeDir: assetDir(t, "relay"), ConsumerCodeDir: assetDir(t, "consumer"), MigrateCodeDir: assetDir(t, "migrate"), CABundle: caBundle(t)})
	stack := awscdk.Stack_Of(st)
	require.NotNil(t, st.Consumer().ProcessorSchedule())
	require.Contains(t, st.Monitoring().Alarms(), st.Consumer().Name()+"/InboxParked")
	// Every consumer built with the migrations is audited on their schedule, and alarmed on.
	require.Equal(t, []string{st.Consumer().Name()}, st.Migrations().Audited())
	require.Contains(t, st.Monitoring().Alarms(), st.Consumer().Name()+"/AuditMissingEvents")
	withNag(stack)
	tmpl := assertions.Template_FromStack(stack, nil)

	t.Run("cdk-nag AwsSolutions: no unsuppressed errors", func(t *testing.T) {
		requireNoNagErrors(t, stack)
	})
	var consumerFn string
	for id, fn := range resources(tmpl, "AWS::Lambda::Function") {
		env, _ := props(fn)["Environment"].(map[string]any)
		vars, _ := env["Variables"].(map[string]any)
		if vars[lambdaenv.ConsumerCommitMode] == "async" {
			consumerFn = id
		}
	}
	require.NotEmpty(t, consumerFn, "the consumer function runs in async mode")

	t.Run("a schedule invokes the consumer function every minute", func(t *testing.T) {
		requireProcessorSchedule(t, tmpl, consumerFn)
	})
	t.Run("the migrations' schedule audits the consumer", func(t *testing.T) {
		tmpl.HasResourceProperties(jsii.String("AWS::Lambda::Function"), map[string]any{
			"Environment": map[string]any{"Variables": assertions.Match_ObjectLike(&map[string]any{lambdaenv.AuditConsumers: st.Consumer().Name()})},
		})
		tmpl.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), map[string]any{
			"MetricName": metrics.AuditMissingEvents.Name,
			"Dimensions": assertions.Match_ArrayWith(&[]any{map[string]any{"Name": metrics.DimensionService, "Value": metrics.ServiceAudit}}),
			"Period":     3600.0,
		})
	})
	t.Run("an alarm on rows the processor parked", func(t *testing.T) {
		requireProcessorAlarms(t, tmpl)
	})
}

// requireProcessorSchedule asserts that a rate(1 minute) rule invokes the function fnID (the
// consumer, which runs its inbox processor on the scheduled event), once, without retries.
func requireProcessorSchedule(t *testing.T, tmpl assertions.Template, fnID string) {
	t.Helper()
	found := 0
	for _, r := range resources(tmpl, "AWS::Events::Rule") {
		p := props(r)
		if p["ScheduleExpression"] != "rate(1 minute)" {
			continue
		}
		for _, target := range p["Targets"].([]any) {
			arn := target.(map[string]any)["Arn"].(map[string]any)["Fn::GetAtt"].([]any)
			if arn[0] == fnID {
				found++
				require.Equal(t, map[string]any{"MaximumEventAgeInSeconds": 60.0, "MaximumRetryAttempts": 0.0}, target.(map[string]any)["RetryPolicy"])
			}
		}
	}
	require.Equal(t, 1, found, "one rate(1 minute) rule targets %s", fnID)
	tmpl.HasResourceProperties(jsii.String("AWS::Lambda::Permission"), map[string]any{
		"Action": "lambda:InvokeFunction", "Principal": "events.amazonaws.com",
		"FunctionName": map[string]any{"Fn::GetAtt": []any{fnID, "Arn"}},
	})
}

// requireProcessorAlarms asserts the alarms every consumer gets for what it gave up on: rows its
// processor parked and records that failed their source's last attempt (dead letters), each on
// any one in a minute, missing data not breaching.
func requireProcessorAlarms(t *testing.T, tmpl assertions.Template) {
	t.Helper()
	for m, service := range map[string]string{metrics.InboxParked.Name: metrics.ServiceInboxProcessor, metrics.InboxDeadLetters.Name: metrics.ServiceConsumer} {
		tmpl.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), map[string]any{
			"MetricName": m,
			"Namespace":  metrics.Namespace,
			"Dimensions": assertions.Match_ArrayWith(&[]any{map[string]any{"Name": metrics.DimensionService, "Value": service}}),
			"Statistic":  "Sum", "Period": 60.0, "EvaluationPeriods": 1.0,
			"ComparisonOperator": "GreaterThanThreshold", "Threshold": 0.0, "TreatMissingData": "notBreaching",
		})
	}
}
