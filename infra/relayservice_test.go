package infra_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/jsii-runtime-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/infra"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
)

// imageDir returns a directory with the repository's relay Dockerfile, standing in for
// bin/relay-service (synthesis stages it; nothing builds the image).
func imageDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "relay-service")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	dockerfile, err := os.ReadFile("../examples/relay/Dockerfile")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "Dockerfile"), dockerfile, 0o644))
	return dir
}

// The relay as a Fargate service (one construct option): no relay Lambda and no schedule; the
// tasks get what the Lambda got (the topic, its Deny naming their role, the database secret and
// network path, the settings), the connection budget books them, an alarm watches their count,
// and cdk-nag finds nothing unsuppressed (cfn-lint runs over the same stack in
// TestEveryVariantPassesCfnLintAndNag).
func TestRelayAsAFargateService(t *testing.T) {
	app := awscdk.NewApp(nil)
	st := infra.NewSluiceStack(app, "SluiceFargate", &infra.SluiceStackProps{NoAlarmDestination: true, RelayImageDir: imageDir(t),
		RelayCodeDir: assetDir(t, "relay"), ConsumerCodeDir: assetDir(t, "consumer"), MigrateCodeDir: assetDir(t, "migrate"), CABundle: caBundle(t)})
	require.Nil(t, st.Outbox().Relay(), "no relay Lambda")
	require.Nil(t, st.Outbox().Schedule(), "no relay schedule")
	require.NotNil(t, st.Outbox().RelayService())
	require.Contains(t, st.Monitoring().Alarms(), "RelayServiceTasksMissing")
	stack := awscdk.Stack_Of(st)
	withNag(stack)
	tmpl := assertions.Template_FromStack(stack, nil)

	t.Run("cdk-nag AwsSolutions: no unsuppressed errors", func(t *testing.T) {
		requireNoNagErrors(t, stack)
	})
	t.Run("service: two ARM tasks, replaced one at a time, never more", func(t *testing.T) {
		tmpl.HasResourceProperties(jsii.String("AWS::ECS::Service"), map[string]any{
			"LaunchType":   "FARGATE",
			"DesiredCount": 2.0,
			"DeploymentConfiguration": assertions.Match_ObjectLike(&map[string]any{
				"MaximumPercent": 100.0, "MinimumHealthyPercent": 50.0,
			}),
		})
		tmpl.HasResourceProperties(jsii.String("AWS::ECS::TaskDefinition"), map[string]any{
			"RuntimePlatform": map[string]any{"CpuArchitecture": "ARM64", "OperatingSystemFamily": "LINUX"},
		})
		tmpl.HasResourceProperties(jsii.String("AWS::ECS::Cluster"), map[string]any{
			"ClusterSettings": []any{map[string]any{"Name": "containerInsights", "Value": "enabled"}},
		})
	})
	t.Run("the container reads the relay Lambda's configuration", func(t *testing.T) {
		var env map[string]any
		for _, td := range resources(tmpl, "AWS::ECS::TaskDefinition") {
			for _, c := range props(td)["ContainerDefinitions"].([]any) {
				env = map[string]any{}
				for _, kv := range c.(map[string]any)["Environment"].([]any) {
					env[kv.(map[string]any)["Name"].(string)] = kv.(map[string]any)["Value"]
				}
			}
		}
		for _, k := range []string{lambdaenv.TopicARNs, lambdaenv.DefaultTopicARN, lambdaenv.DatabaseSecretARN, lambdaenv.DatabaseMaxConns, "GOMEMLIMIT"} {
			require.Contains(t, env, k)
		}
		require.Equal(t, infra.DefaultRelayServiceCABundlePath, env[lambdaenv.DatabaseSSLRootCert])
	})
	t.Run("only the tasks' role may publish to the topic", func(t *testing.T) {
		var denied string
		for _, pol := range resources(tmpl, "AWS::SNS::TopicPolicy") {
			for _, s := range props(pol)["PolicyDocument"].(map[string]any)["Statement"].([]any) {
				st := s.(map[string]any)
				if st["Sid"] == "OnlyTheRelayPublishes" {
					arns := st["Condition"].(map[string]any)["ArnNotEquals"].(map[string]any)["aws:PrincipalArn"]
					denied = strings.Join(flatten(arns), " ")
				}
			}
		}
		require.Contains(t, denied, "RelayTaskTaskRole", "the Deny exempts the task role")
		found := false
		for id, pol := range resources(tmpl, "AWS::IAM::Policy") {
			if !strings.Contains(id, "RelayTaskTaskRole") {
				continue
			}
			for _, s := range props(pol)["PolicyDocument"].(map[string]any)["Statement"].([]any) {
				if strings.Contains(strings.Join(flatten(s.(map[string]any)["Action"]), " "), "sns:Publish") {
					found = true
				}
			}
		}
		require.True(t, found, "the task role may publish")
	})
}

// flatten lists the strings in a template value (a string, a list, an intrinsic function).
func flatten(v any) []string {
	switch x := v.(type) {
	case string:
		return []string{x}
	case []any:
		var out []string
		for _, e := range x {
			out = append(out, flatten(e)...)
		}
		return out
	case map[string]any:
		var out []string
		for _, e := range x {
			out = append(out, flatten(e)...)
		}
		return out
	}
	return nil
}
