package infra_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssecretsmanager"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssns"
	"github.com/aws/jsii-runtime-go"
	"github.com/cdklabs/cdk-nag-go/cdknag/v2"
	"github.com/sluicehq/sluice/infra"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
	"github.com/sluicehq/sluice/pkg/metrics"

	"github.com/sluicehq/sluice/pkg/outbox"
	"github.com/stretchr/testify/require"
)

// These tests do not call t.Parallel: every CDK call goes through the one jsii kernel process,
// whose initialization is not safe for concurrent use, so running them in parallel gains nothing.

// assetDir returns a directory holding a dummy bootstrap, standing in for bin/<fn>.
func assetDir(t *testing.T, fn string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), fn)
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "bootstrap"), []byte("#!/bin/sh\n# "+fn+"\n"), 0o755))
	return dir
}

// caBundle writes a PEM file with one self-signed CA certificate, standing in for the RDS bundle.
func caBundle(t *testing.T) string {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test RDS CA"}, NotBefore: time.Now(),
		NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	file := filepath.Join(t.TempDir(), "rds-ca-bundle.pem")
	require.NoError(t, os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644))
	return file
}

// env returns a function's environment variables.
func env(fn map[string]any) map[string]any {
	e, _ := props(fn)["Environment"].(map[string]any) // none: CDK's AwsCustomResource provider
	v, _ := e["Variables"].(map[string]any)
	return v
}

// refID returns the logical id an Fn::GetAtt or Ref value points at.
func refID(v any) string {
	if p, ok := v.(*map[string]any); ok && p != nil {
		v = *p
	}
	m, ok := v.(map[string]any)
	if !ok {
		return ""
	}
	if r, ok := m["Ref"].(string); ok {
		return r
	}
	if g, ok := m["Fn::GetAtt"].([]any); ok {
		return g[0].(string)
	}
	return ""
}

// withNag applies the AwsSolutions pack to the stack; it runs when the template is synthesized.
func withNag(stack awscdk.Stack) {
	awscdk.Aspects_Of(stack).Add(cdknag.NewAwsSolutionsChecks(&cdknag.NagPackProps{Verbose: jsii.Bool(true)}), nil)
}

// requireNoNagErrors fails the test with every unsuppressed AwsSolutions error.
func requireNoNagErrors(t *testing.T, stack awscdk.Stack) {
	t.Helper()
	found := assertions.Annotations_FromStack(stack).FindError(jsii.String("*"), assertions.Match_StringLikeRegexp(jsii.String("AwsSolutions-.*")))
	// The messages as JSON (construct path and finding): their Go fields are deprecated.
	report, _ := json.MarshalIndent(*found, "", "  ")
	require.Empty(t, *found, "unsuppressed cdk-nag AwsSolutions errors:\n%s", report)
}

// resources returns the template's resources of one type, by logical id.
func resources(tmpl assertions.Template, typ string) map[string]map[string]any {
	out := map[string]map[string]any{}
	for id, r := range (*tmpl.ToJSON())["Resources"].(map[string]any) {
		res := r.(map[string]any)
		if res["Type"] == typ {
			out[id] = res
		}
	}
	return out
}

func props(r map[string]any) map[string]any { return r["Properties"].(map[string]any) }

func firstKey[V any](m map[string]V) string { return firstKeyWithPrefix(m, "") }

// firstKeyWithPrefix returns the smallest key with the prefix: the resource when there is one.
func firstKeyWithPrefix[V any](m map[string]V, prefix string) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		if strings.HasPrefix(k, prefix) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	if len(keys) == 0 {
		return ""
	}
	return keys[0]
}

func asList(v any) []any {
	if l, ok := v.([]any); ok {
		return l
	}
	return []any{v}
}

// requireNoWildcardGrants checks that no identity policy statement allows a wildcard action
// ("*" or "svc:*") on the "*" resource.
func requireNoWildcardGrants(t *testing.T, tmpl assertions.Template) {
	t.Helper()
	var docs []any
	for _, r := range resources(tmpl, "AWS::IAM::Policy") {
		docs = append(docs, props(r)["PolicyDocument"])
	}
	for _, r := range resources(tmpl, "AWS::IAM::Role") {
		if ps, ok := props(r)["Policies"]; ok {
			for _, p := range ps.([]any) {
				docs = append(docs, p.(map[string]any)["PolicyDocument"])
			}
		}
	}
	require.NotEmpty(t, docs)
	for _, d := range docs {
		for _, s := range d.(map[string]any)["Statement"].([]any) {
			st := s.(map[string]any)
			starResource := false
			for _, r := range asList(st["Resource"]) {
				if r == "*" {
					starResource = true
				}
			}
			for _, a := range asList(st["Action"]) {
				action, _ := a.(string)
				wild := action == "*" || strings.HasSuffix(action, ":*")
				require.False(t, wild && starResource, "statement allows %s on *: %v", action, st)
			}
		}
	}
}

func TestSluiceStack(t *testing.T) {
	app := awscdk.NewApp(nil)
	s := infra.NewSluiceStack(app, "Sluice", &infra.SluiceStackProps{
		RelayCodeDir:    assetDir(t, "relay"),
		ConsumerCodeDir: assetDir(t, "consumer"),
		MigrateCodeDir:  assetDir(t, "migrate"),
		ConsumerName:    "orders",
		AlarmEmail:      "oncall@example.com",
		CABundle:        caBundle(t),
	})
	withNag(s)
	tmpl := assertions.Template_FromStack(s, nil)
	var stack awscdk.Stack = s

	t.Run("cdk-nag AwsSolutions: no unsuppressed errors", func(t *testing.T) {
		requireNoNagErrors(t, stack)
	})

	t.Run("resource counts", func(t *testing.T) {
		for typ, n := range map[string]float64{
			"AWS::Lambda::Function":                 4, // relay, consumer, migrations; CDK's AwsCustomResource provider (the S3 prefix list lookup, outside the VPC)
			"AWS::SNS::Topic":                       2, // outbox topic, alarm topic
			"AWS::SQS::Queue":                       3, // queue, DLQ, subscription DLQ
			"AWS::SNS::Subscription":                2, // queue, alarm e-mail
			"AWS::Lambda::EventSourceMapping":       1,
			"AWS::Events::Rule":                     3, // relay, partition maintenance, consumer's processor
			"AWS::RDS::DBInstance":                  1,
			infra.MigrationsResourceType:            1,
			"AWS::CloudWatch::Alarm":                22,
			"AWS::CloudWatch::Dashboard":            1,
			"AWS::SecretsManager::Secret":           3, // master (migrations only), relay role, consumer role
			"AWS::SecretsManager::RotationSchedule": 3,
			"AWS::EC2::VPCEndpoint":                 3, // Secrets Manager, SNS, S3 gateway
			"AWS::EC2::NatGateway":                  0,
			"AWS::Lambda::LayerVersion":             1, // the CA bundle
		} {
			tmpl.ResourceCountIs(jsii.String(typ), jsii.Number(n))
		}
	})

	t.Run("database: encrypted, private, gp3, pinned engine, TLS forced, max_connections fixed, secret retained and rotated", func(t *testing.T) {
		tmpl.HasResourceProperties(jsii.String("AWS::RDS::DBInstance"), map[string]any{
			"Engine":             "postgres",
			"EngineVersion":      "17.9",
			"StorageType":        "gp3",
			"StorageEncrypted":   true,
			"PubliclyAccessible": false,
			"MultiAZ":            true,
			"DeletionProtection": true,
		})
		tmpl.HasResourceProperties(jsii.String("AWS::RDS::DBParameterGroup"), map[string]any{
			"Parameters": map[string]any{"rds.force_ssl": "1", "max_connections": "200"},
		})
		for id, r := range resources(tmpl, "AWS::SecretsManager::Secret") {
			require.Equal(t, "Retain", r["DeletionPolicy"], "secret %s outlives the stack", id)
		}
		attachments := resources(tmpl, "AWS::SecretsManager::SecretTargetAttachment")
		master := refID(props(attachments[firstKey(attachments)])["SecretId"])
		rotated := map[string]bool{}
		for _, r := range resources(tmpl, "AWS::SecretsManager::RotationSchedule") {
			p := props(r)
			secret := refID(p["SecretId"])
			if a, ok := attachments[secret]; ok { // the master secret is rotated through its attachment
				secret = refID(props(a)["SecretId"])
			}
			rotated[secret] = true
			require.Equal(t, "PostgreSQLSingleUser", p["HostedRotationLambda"].(map[string]any)["RotationType"])
			require.Equal(t, false, p["RotateImmediatelyOnUpdate"], "the first rotation waits for the migrations to complete the secret")
		}
		require.Len(t, rotated, 3, "every secret rotates")
		require.True(t, rotated[master], "the master secret rotates: %v %s", rotated, master)
	})

	fnSGs := map[string]string{} // security group → function
	for id, fn := range resources(tmpl, "AWS::Lambda::Function") {
		vpc, ok := props(fn)["VpcConfig"].(map[string]any)
		if !ok {
			continue // CDK's AwsCustomResource provider: outside the VPC, it calls EC2's API at deploy time
		}
		for _, sg := range vpc["SecurityGroupIds"].([]any) {
			fnSGs[refID(sg)] = id
		}
	}
	rotationSGs := map[string]bool{}
	for _, r := range resources(tmpl, "AWS::SecretsManager::RotationSchedule") {
		rotationSGs[refID(props(r)["HostedRotationLambda"].(map[string]any)["VpcSecurityGroupIds"])] = true
	}

	t.Run("database security group admits only the Lambdas and the rotation functions", func(t *testing.T) {
		require.Len(t, fnSGs, 3)
		require.Len(t, rotationSGs, 3)
		dbSG := refID(props(resources(tmpl, "AWS::RDS::DBInstance")[firstKey(resources(tmpl, "AWS::RDS::DBInstance"))])["VPCSecurityGroups"].([]any)[0])
		require.NotContains(t, props(resources(tmpl, "AWS::EC2::SecurityGroup")[dbSG]), "SecurityGroupIngress")
		n := 0
		for id, r := range resources(tmpl, "AWS::EC2::SecurityGroupIngress") {
			p := props(r)
			if refID(p["GroupId"]) != dbSG {
				continue
			}
			n++
			require.NotContains(t, p, "CidrIp", id)
			src := refID(p["SourceSecurityGroupId"])
			require.True(t, fnSGs[src] != "" || rotationSGs[src], "ingress %s from %s", id, src)
			require.Contains(t, fmt.Sprint(p["FromPort"]), "Endpoint.Port", "the database's own port")
		}
		require.Equal(t, 6, n)
	})

	t.Run("network: VPC endpoints instead of NAT, egress only to what each function calls", func(t *testing.T) {
		services := map[string]string{}
		for _, r := range resources(tmpl, "AWS::EC2::VPCEndpoint") {
			p := props(r)
			services[fmt.Sprint(p["ServiceName"])] = fmt.Sprint(p["VpcEndpointType"])
		}
		require.Len(t, services, 3)
		joined := fmt.Sprint(services)
		for _, svc := range []string{"secretsmanager", "sns", "s3"} {
			require.Contains(t, joined, svc)
		}
		tmpl.HasResourceProperties(jsii.String("AWS::EC2::VPCEndpoint"), map[string]any{"VpcEndpointType": "Interface", "PrivateDnsEnabled": true})
		tmpl.ResourceCountIs(jsii.String("AWS::EC2::InternetGateway"), jsii.Number(0))

		endpointSG := ""
		for _, r := range resources(tmpl, "AWS::EC2::VPCEndpoint") {
			if ids, ok := props(r)["SecurityGroupIds"].([]any); ok {
				endpointSG = refID(ids[0])
			}
		}
		require.NotEmpty(t, endpointSG)
		egress := map[string][]string{} // function → destinations
		for sg, fn := range fnSGs {
			sgRes := resources(tmpl, "AWS::EC2::SecurityGroup")[sg]
			for _, e := range asList(props(sgRes)["SecurityGroupEgress"]) {
				if e == nil {
					continue
				}
				rule := e.(map[string]any)
				egress[fn] = append(egress[fn], fmt.Sprintf("%v:%v", rule["CidrIp"], rule["FromPort"]))
			}
		}
		for id, r := range resources(tmpl, "AWS::EC2::SecurityGroupEgress") {
			p := props(r)
			fn := fnSGs[refID(p["GroupId"])]
			if fn == "" {
				continue
			}
			if pl, ok := p["DestinationPrefixListId"]; ok {
				// The S3 gateway endpoint's prefix list, looked up at deploy time.
				require.True(t, strings.HasPrefix(refID(pl), "S3PrefixList"), id)
				require.Equal(t, 443.0, p["FromPort"], id)
				egress[fn] = append(egress[fn], "s3:443")
				continue
			}
			dst := refID(p["DestinationSecurityGroupId"])
			require.NotEmpty(t, dst, "egress %s goes to a security group", id)
			if dst == endpointSG {
				require.Equal(t, 443.0, p["FromPort"], id)
				egress[fn] = append(egress[fn], "endpoints:443")
			} else {
				egress[fn] = append(egress[fn], "database")
			}
		}
		migrate := refID(resources(tmpl, infra.MigrationsResourceType)[firstKey(resources(tmpl, infra.MigrationsResourceType))]["Properties"].(map[string]any)["ServiceToken"])
		for fn, dests := range egress {
			sort.Strings(dests)
			if fn == migrate {
				// CloudFormation's response: a presigned S3 URL, reached through the S3 gateway
				// endpoint, named by its prefix list (no HTTPS to any address).
				require.Equal(t, []string{"database", "endpoints:443", "s3:443"}, dests, fn)
			} else {
				require.Equal(t, []string{"database", "endpoints:443"}, dests, fn)
			}
		}
		require.Len(t, egress, 3)
	})

	t.Run("relay: timeout, reserved concurrency, topic map, one-minute schedule", func(t *testing.T) {
		relayArn := assertions.NewCapture(nil)
		tmpl.HasResourceProperties(jsii.String("AWS::Events::Rule"), map[string]any{
			"ScheduleExpression": "rate(1 minute)",
			"State":              "ENABLED",
			"Targets":            []any{map[string]any{"Arn": relayArn, "RetryPolicy": map[string]any{"MaximumEventAgeInSeconds": 60.0}}},
		})
		relayID := (*relayArn.AsObject())["Fn::GetAtt"].([]any)[0].(string)
		relay := resources(tmpl, "AWS::Lambda::Function")[relayID]
		require.NotNil(t, relay, relayID)
		p := props(relay)
		require.Equal(t, 300.0, p["Timeout"])
		require.Equal(t, 6.0, p["ReservedConcurrentExecutions"])
		require.Equal(t, float64(infra.DefaultRelayMemoryMB), p["MemorySize"])
		require.Equal(t, "460MiB", env(relay)["GOMEMLIMIT"])
		env := p["Environment"].(map[string]any)["Variables"].(map[string]any)
		require.Contains(t, env, lambdaenv.TopicARNs)
		require.Equal(t, map[string]any{"Ref": *s.GetLogicalId(s.Outbox().Topic().Node().DefaultChild().(awscdk.CfnElement))}, env[lambdaenv.DefaultTopicARN])
		// Nothing touches the tables before the migrations ran.
		require.Contains(t, relay["DependsOn"], *s.GetLogicalId(s.Migrations().Resource().Node().DefaultChild().(awscdk.CfnElement)))
		tmpl.HasResourceProperties(jsii.String("AWS::Lambda::EventInvokeConfig"), map[string]any{"MaximumRetryAttempts": 0.0})
	})

	t.Run("topic and queues are KMS-encrypted and TLS-only", func(t *testing.T) {
		for id, r := range resources(tmpl, "AWS::SNS::Topic") {
			require.Contains(t, props(r), "KmsMasterKeyId", id)
		}
		for id, r := range resources(tmpl, "AWS::SQS::Queue") {
			require.Contains(t, props(r), "KmsMasterKeyId", id)
		}
		tmpl.HasResourceProperties(jsii.String("AWS::SQS::QueuePolicy"), map[string]any{
			"PolicyDocument": map[string]any{"Statement": assertions.Match_ArrayWith(&[]any{map[string]any{
				"Action": "sqs:*", "Effect": "Deny", "Condition": map[string]any{"Bool": map[string]any{"aws:SecureTransport": "false"}},
				"Principal": map[string]any{"AWS": "*"}, "Resource": assertions.Match_AnyValue(),
			}})},
		})
		tmpl.HasResourceProperties(jsii.String("AWS::KMS::Key"), map[string]any{"EnableKeyRotation": true})
		for id, r := range resources(tmpl, "AWS::SQS::Queue") {
			require.Equal(t, "Retain", r["DeletionPolicy"], "queue %s outlives the stack", id)
		}
	})

	t.Run("resource policies: only the relay publishes; SNS uses the queue key for this topic only", func(t *testing.T) {
		relayArn := assertions.NewCapture(nil)
		tmpl.HasResourceProperties(jsii.String("AWS::Events::Rule"), map[string]any{"ScheduleExpression": "rate(1 minute)",
			"Targets": []any{map[string]any{"Arn": relayArn, "RetryPolicy": assertions.Match_AnyValue()}}})
		relay := resources(tmpl, "AWS::Lambda::Function")[refID(relayArn.AsObject())]
		relayRole := refID(props(relay)["Role"])
		principals := assertions.NewCapture(nil)
		tmpl.HasResourceProperties(jsii.String("AWS::SNS::TopicPolicy"), map[string]any{
			"PolicyDocument": map[string]any{"Statement": assertions.Match_ArrayWith(&[]any{map[string]any{
				"Sid": "OnlyTheRelayPublishes", "Effect": "Deny", "Action": "sns:Publish", "Principal": map[string]any{"AWS": "*"},
				"Resource": assertions.Match_AnyValue(), "Condition": map[string]any{"ArnNotEquals": map[string]any{"aws:PrincipalArn": principals}},
			}})},
		})
		require.Len(t, *principals.AsArray(), 1)
		require.Equal(t, relayRole, refID((*principals.AsArray())[0]), "the relay's role is the one exception")

		topic := map[string]any{"Ref": firstKeyWithPrefix(resources(tmpl, "AWS::SNS::Topic"), "OutboxTopic")}
		keyStatement := assertions.NewCapture(nil)
		tmpl.HasResourceProperties(jsii.String("AWS::KMS::Key"), map[string]any{
			"KeyPolicy": map[string]any{"Statement": assertions.Match_ArrayWith(&[]any{assertions.Match_ObjectLike(&map[string]any{
				"Principal": map[string]any{"Service": "sns.amazonaws.com"}, "Condition": keyStatement,
			})})},
		})
		require.Equal(t, map[string]any{"ArnEquals": map[string]any{"aws:SourceArn": topic}}, *keyStatement.AsObject())
		for _, r := range resources(tmpl, "AWS::KMS::Key") {
			for _, st := range props(r)["KeyPolicy"].(map[string]any)["Statement"].([]any) {
				if p, ok := st.(map[string]any)["Principal"].(map[string]any); ok && p["Service"] == "sns.amazonaws.com" {
					require.Contains(t, st, "Condition", "every SNS grant on a key is scoped: %v", st)
				}
			}
		}
		for _, r := range resources(tmpl, "AWS::SQS::QueuePolicy") {
			for _, st := range props(r)["PolicyDocument"].(map[string]any)["Statement"].([]any) {
				if p, ok := st.(map[string]any)["Principal"].(map[string]any); ok && p["Service"] == "sns.amazonaws.com" {
					require.Equal(t, map[string]any{"ArnEquals": map[string]any{"aws:SourceArn": topic}}, st.(map[string]any)["Condition"])
				}
			}
		}
	})

	t.Run("consumer: queue, DLQ, subscription DLQ, event source mapping", func(t *testing.T) {
		dlq := assertions.NewCapture(nil)
		tmpl.HasResourceProperties(jsii.String("AWS::SQS::Queue"), map[string]any{
			"VisibilityTimeout": 180.0, // 6 × 30s
			"RedrivePolicy":     map[string]any{"deadLetterTargetArn": dlq, "maxReceiveCount": 5.0},
		})
		subDLQ := assertions.NewCapture(nil)
		tmpl.HasResourceProperties(jsii.String("AWS::SNS::Subscription"), map[string]any{
			"Protocol":           "sqs",
			"RawMessageDelivery": true,
			"RedrivePolicy":      map[string]any{"deadLetterTargetArn": subDLQ},
		})
		require.NotEqual(t, dlq.AsObject(), subDLQ.AsObject(), "the subscription has its own DLQ")
		tmpl.HasResourceProperties(jsii.String("AWS::Lambda::EventSourceMapping"), map[string]any{
			"FunctionResponseTypes": []any{"ReportBatchItemFailures"},
			"BatchSize":             10.0,
			"ScalingConfig":         map[string]any{"MaximumConcurrency": 5.0},
		})
		tmpl.HasResourceProperties(jsii.String("AWS::Lambda::Function"), map[string]any{
			"Timeout": 30.0,
			"Environment": map[string]any{"Variables": assertions.Match_ObjectLike(&map[string]any{
				lambdaenv.ConsumerName: "orders",
			})},
		})
	})

	t.Run("migrations custom resource", func(t *testing.T) {
		tmpl.HasResource(jsii.String(infra.MigrationsResourceType), map[string]any{
			"Properties": map[string]any{
				"ServiceToken":    map[string]any{"Fn::GetAtt": assertions.Match_AnyValue()},
				"ServiceTimeout":  "600",
				"CodeFingerprint": assertions.Match_StringLikeRegexp(jsii.String("^[0-9a-f]{64}$")),
			},
			"DependsOn": assertions.Match_ArrayWith(&[]any{assertions.Match_StringLikeRegexp(jsii.String("^Database"))}),
		})
	})

	t.Run("alarms: thresholds and missing data", func(t *testing.T) {
		alarm := func(metric string, p map[string]any) {
			t.Helper()
			p["MetricName"] = metric
			p["AlarmActions"] = assertions.Match_ArrayWith(&[]any{map[string]any{"Ref": assertions.Match_StringLikeRegexp(jsii.String("^MonitoringAlarmTopic"))}})
			tmpl.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), p)
		}
		alarm(metrics.RelayHeartbeat.Name, map[string]any{
			"Namespace": metrics.Namespace, "Dimensions": []any{map[string]any{"Name": "Service", "Value": "relay"}},
			"ComparisonOperator": "LessThanThreshold", "Threshold": 1.0, "EvaluationPeriods": 3.0, "TreatMissingData": "breaching",
		})
		alarm(metrics.OutboxOldestPendingAge.Name, map[string]any{
			"Namespace": metrics.Namespace, "ComparisonOperator": "GreaterThanThreshold", "Threshold": 300.0, "Statistic": "Maximum",
		})
		alarm(metrics.OutboxQuarantined.Name, map[string]any{"ComparisonOperator": "GreaterThanThreshold", "Threshold": 0.0})
		alarm("ApproximateAgeOfOldestMessage", map[string]any{"Namespace": "AWS/SQS", "Threshold": 300.0})
		visible := 0
		for _, a := range resources(tmpl, "AWS::CloudWatch::Alarm") {
			if p := props(a); p["MetricName"] == "ApproximateNumberOfMessagesVisible" {
				require.Equal(t, 0.0, p["Threshold"])
				require.Equal(t, "GreaterThanThreshold", p["ComparisonOperator"])
				visible++
			}
		}
		require.Equal(t, 2, visible, "DLQ and subscription DLQ alarms")
		for metric, want := range map[string]map[string]any{
			"CPUUtilization":                  {"Namespace": "AWS/RDS", "ComparisonOperator": "GreaterThanThreshold", "Threshold": 80.0},
			"FreeableMemory":                  {"Namespace": "AWS/RDS", "ComparisonOperator": "LessThanThreshold", "Threshold": 200.0 * 1024 * 1024},
			"FreeStorageSpace":                {"Namespace": "AWS/RDS", "ComparisonOperator": "LessThanThreshold", "Threshold": 2.0 * 1024 * 1024 * 1024},
			"DatabaseConnections":             {"Namespace": "AWS/RDS", "ComparisonOperator": "GreaterThanThreshold", "Threshold": 160.0}, // 80% of 200
			"MaximumUsedTransactionIDs":       {"Namespace": "AWS/RDS", "ComparisonOperator": "GreaterThanThreshold", "Threshold": 1e9},
			metrics.DestinationsDown.Name:     {"Namespace": metrics.Namespace, "ComparisonOperator": "GreaterThanThreshold", "Threshold": 0.0},
			metrics.OldestTransactionAge.Name: {"Namespace": metrics.Namespace, "ComparisonOperator": "GreaterThanThreshold", "Threshold": 600.0},
		} {
			alarm(metric, want)
		}
		for m, want := range map[string]int{"Errors": 3, "Throttles": 2} { // errors: also the partition maintenance's
			n := 0
			for _, a := range resources(tmpl, "AWS::CloudWatch::Alarm") {
				if p := props(a); p["MetricName"] == m && p["Namespace"] == "AWS/Lambda" {
					n++
				}
			}
			require.Equal(t, want, n, "%s alarms", m)
		}
		tmpl.HasResourceProperties(jsii.String("AWS::SNS::Subscription"), map[string]any{"Protocol": "email", "Endpoint": "oncall@example.com"})
		require.Len(t, s.Monitoring().Alarms(), 22)
	})

	t.Run("every consumer runs its processor: a schedule, alarms on dead letters and parked rows, the queue's receive count", func(t *testing.T) {
		fnID := *s.GetLogicalId(s.Consumer().Function().Node().DefaultChild().(awscdk.CfnElement))
		fn := resources(tmpl, "AWS::Lambda::Function")[fnID]
		require.NotContains(t, env(fn), lambdaenv.ConsumerCommitMode, "per-record, the default")
		require.NotNil(t, s.Consumer().ProcessorSchedule(), "retried dead letters are stored rows in every mode")
		requireProcessorSchedule(t, tmpl, fnID)
		requireProcessorAlarms(t, tmpl)
		for _, a := range []string{"orders/DeadLetters", "orders/InboxParked"} {
			require.Contains(t, s.Monitoring().Alarms(), a)
		}
		tmpl.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), map[string]any{
			"MetricName":       metrics.InboxDeadLetters.Name,
			"AlarmDescription": assertions.Match_StringLikeRegexp(jsii.String("sluice dead list --consumer orders")),
		})
		// The queue's maxReceiveCount, so that the consumer marks the last receive's failure dead.
		tmpl.HasResourceProperties(jsii.String("AWS::SQS::Queue"), map[string]any{
			"RedrivePolicy": map[string]any{"deadLetterTargetArn": assertions.Match_AnyValue(), "maxReceiveCount": 5.0},
		})
		require.Equal(t, "5", env(fn)[lambdaenv.ConsumerMaxReceiveCount])
		require.NotContains(t, env(fn), lambdaenv.ConsumerStreamMaxAttempts, "a queue source")
	})

	t.Run("dashboard shows the commit-to-apply latency", func(t *testing.T) {
		body := assertions.NewCapture(nil)
		tmpl.HasResourceProperties(jsii.String("AWS::CloudWatch::Dashboard"), map[string]any{"DashboardBody": body})
		require.Contains(t, fmt.Sprint(body.AsObject()), metrics.CommitToApplyLatency.Name)
		require.Contains(t, fmt.Sprint(body.AsObject()), metrics.OutboxOldestPendingAge.Name)
	})

	migrateID := refID(props(resources(tmpl, infra.MigrationsResourceType)[firstKey(resources(tmpl, infra.MigrationsResourceType))])["ServiceToken"])
	migrateRole := refID(props(resources(tmpl, "AWS::Lambda::Function")[migrateID])["Role"])

	t.Run("only the migrations function can read the master secret", func(t *testing.T) {
		master := map[string]bool{}
		for id, a := range resources(tmpl, "AWS::SecretsManager::SecretTargetAttachment") {
			master[id], master[refID(props(a)["SecretId"])] = true, true
		}
		require.Len(t, master, 2, "the generated secret and its attachment")
		refersToMaster := func(v any) bool {
			for _, r := range asList(v) {
				if master[refID(r)] {
					return true
				}
			}
			return false
		}
		fns := resources(tmpl, "AWS::Lambda::Function")
		for id, fn := range fns {
			if props(fn)["Runtime"] != "provided.al2023" {
				delete(fns, id) // CDK's AwsCustomResource provider: no database, no secret
			}
		}
		require.Len(t, fns, 3)
		for id, fn := range fns {
			arn := env(fn)[lambdaenv.DatabaseSecretARN]
			require.Equal(t, id == migrateID, master[refID(arn)], "%s logs in with %v", id, arn)
		}
		readers := map[string]bool{}
		for id, pol := range resources(tmpl, "AWS::IAM::Policy") {
			for _, st := range props(pol)["PolicyDocument"].(map[string]any)["Statement"].([]any) {
				if refersToMaster(st.(map[string]any)["Resource"]) {
					for _, r := range props(pol)["Roles"].([]any) {
						readers[refID(r)] = true
					}
					require.Equal(t, []any{map[string]any{"Ref": migrateRole}}, props(pol)["Roles"], "policy %s grants the master secret", id)
				}
			}
		}
		require.Equal(t, map[string]bool{migrateRole: true}, readers, "the migrations function reads it")
	})

	t.Run("queue policy: only the topic sends to the consumer's queue", func(t *testing.T) {
		topic := map[string]any{"Ref": firstKeyWithPrefix(resources(tmpl, "AWS::SNS::Topic"), "OutboxTopic")}
		queue := assertions.NewCapture(nil)
		tmpl.HasResourceProperties(jsii.String("AWS::SQS::QueuePolicy"), map[string]any{
			"Queues": []any{queue},
			"PolicyDocument": map[string]any{"Statement": assertions.Match_ArrayWith(&[]any{map[string]any{
				"Sid": "OnlyTheTopicAndRedriversSend", "Effect": "Deny", "Action": "sqs:SendMessage", "Principal": map[string]any{"AWS": "*"},
				"Resource": assertions.Match_AnyValue(), "Condition": map[string]any{"ArnNotEquals": map[string]any{"aws:SourceArn": topic}},
			}})},
		})
		q := resources(tmpl, "AWS::SQS::Queue")[refID(queue.AsObject())]
		require.Contains(t, props(q), "RedrivePolicy", "the consumer's queue, the one with a DLQ")
	})

	t.Run("partition maintenance: hourly, as the owner, after the migrations, alarmed", func(t *testing.T) {
		target := assertions.NewCapture(nil)
		tmpl.HasResource(jsii.String("AWS::Events::Rule"), map[string]any{
			"Properties": map[string]any{"ScheduleExpression": "rate(1 hour)", "State": "ENABLED",
				"Targets": []any{map[string]any{"Arn": target, "RetryPolicy": map[string]any{"MaximumEventAgeInSeconds": 3600.0, "MaximumRetryAttempts": 2.0}}}},
			"DependsOn": assertions.Match_ArrayWith(&[]any{*s.GetLogicalId(s.Migrations().Resource().Node().DefaultChild().(awscdk.CfnElement))}),
		})
		require.Equal(t, migrateID, refID(target.AsObject()), "the migrations function, the one that owns the tables")
		tmpl.HasResourceProperties(jsii.String("AWS::CloudWatch::Alarm"), map[string]any{
			"Namespace": "AWS/Lambda", "MetricName": "Errors", "Period": 3600.0, "Threshold": 0.0, "ComparisonOperator": "GreaterThanThreshold",
			"Dimensions":   []any{map[string]any{"Name": "FunctionName", "Value": map[string]any{"Ref": migrateID}}},
			"AlarmActions": assertions.Match_AnyValue(),
		})
		require.Contains(t, s.Monitoring().Alarms(), "PartitionMaintenanceErrors")
		fn := resources(tmpl, "AWS::Lambda::Function")[migrateID]
		require.NotContains(t, env(fn), lambdaenv.OutboxRetention, "no retention asked: partitions are created ahead, none dropped")
		for id, f := range resources(tmpl, "AWS::Lambda::Function") {
			require.NotContains(t, env(f), lambdaenv.OutboxPartitionInterval, "%s: only the migrations function maintains partitions", id)
		}
	})

	t.Run("IAM: no wildcard action on a wildcard resource", func(t *testing.T) {
		requireNoWildcardGrants(t, tmpl)
	})

	t.Run("outputs", func(t *testing.T) {
		outputs := (*tmpl.ToJSON())["Outputs"].(map[string]any)
		var names []string
		for k := range outputs {
			names = append(names, k)
		}
		sort.Strings(names)
		require.Subset(t, names, []string{"AlarmTopicArn", "ConsumerDeadLetterQueueUrl", "ConsumerQueueUrl", "DashboardName",
			"DatabaseEndpoint", "DatabaseSecretArn", "SubscriptionDeadLetterQueueUrl", "TopicArn"})
	})
}

// TestConstructsAlone uses the constructs without the example stack, on an existing VPC and
// database, with a FIFO topic and non-default settings.
func TestConstructsAlone(t *testing.T) {
	app := awscdk.NewApp(nil)
	stack := awscdk.NewStack(app, jsii.String("Existing"), nil)
	vpc := awsec2.Vpc_FromVpcAttributes(stack, jsii.String("Vpc"), &awsec2.VpcAttributes{
		VpcId:             jsii.String("vpc-0123456789abcdef0"),
		AvailabilityZones: jsii.Strings("eu-west-1a", "eu-west-1b"),
		PrivateSubnetIds:  jsii.Strings("subnet-a", "subnet-b"),
	})
	dbSG := awsec2.SecurityGroup_FromSecurityGroupId(stack, jsii.String("DbSg"), jsii.String("sg-0123456789abcdef0"), nil)
	db := infra.Database{
		Secret: awssecretsmanager.Secret_FromSecretCompleteArn(stack, jsii.String("Secret"),
			jsii.String("arn:aws:secretsmanager:eu-west-1:111111111111:secret:sluice-db-AbCdEf")),
		Connections: awsec2.NewConnections(&awsec2.ConnectionsProps{SecurityGroups: &[]awsec2.ISecurityGroup{dbSG}, DefaultPort: awsec2.Port_Tcp(jsii.Number(5433))}),
		MaxConns:    2,
		CABundle:    caBundle(t),
	}
	network := infra.Network{Vpc: vpc}

	ob := infra.NewOutbox(stack, "Outbox", &infra.OutboxProps{
		RelayCodeDir:  assetDir(t, "relay"),
		Network:       network,
		Database:      db,
		Fifo:          true,
		TopicName:     "orders",
		LogicalTopics: []string{"orders", "payments"},
		RelayTimeout:  2 * time.Minute,
		Relay: infra.RelaySettings{BatchSize: 200, MaxPerKey: 5, PublishConcurrency: 16, Pipelines: 3, MaxRoundBytes: 8 << 20,
			MaxAttempts: 7, PublishTimeout: 5 * time.Second, Lease: 20 * time.Second, BackoffBase: 500 * time.Millisecond,
			BackoffMax: 2 * time.Minute, OutageLimit: 6 * time.Hour, PollInterval: 100 * time.Millisecond, RescanInterval: 2 * time.Second},
		OutboxRetention: 30 * 24 * time.Hour, OutboxPartitionInterval: 6 * time.Hour,
		UseDatabaseSecret: true, // no Migrations: the relay maintains the partitions itself, as the owner
	})
	c := infra.NewConsumer(stack, "Billing", &infra.ConsumerProps{
		Name:              "billing",
		CodeDir:           assetDir(t, "consumer"),
		Topic:             ob.Topic(),
		Fifo:              true,
		Network:           network,
		Database:          db,
		CommitMode:        infra.CommitBatched,
		DeadlineMargin:    5 * time.Second,
		StorePayload:      true,
		Timeout:           time.Minute,
		MaxReceiveCount:   3,
		BatchSize:         5,
		MaxConcurrency:    2,
		UseDatabaseSecret: true,
		Redrivers:         []string{"arn:aws:iam::111111111111:role/operator"},
	})
	infra.NewMonitoring(stack, "Monitoring", &infra.MonitoringProps{Outbox: ob, Consumers: []infra.Consumer{c}, OldestPendingAge: time.Minute,
		NoAlarmDestination: true})
	withNag(stack)
	tmpl := assertions.Template_FromStack(stack, nil)

	t.Run("cdk-nag AwsSolutions: no unsuppressed errors", func(t *testing.T) {
		requireNoNagErrors(t, stack)
	})
	t.Run("FIFO topic and queues", func(t *testing.T) {
		tmpl.HasResourceProperties(jsii.String("AWS::SNS::Topic"), map[string]any{"FifoTopic": true, "TopicName": "orders.fifo"})
		for id, q := range resources(tmpl, "AWS::SQS::Queue") {
			require.Equal(t, true, props(q)["FifoQueue"], id)
		}
		tmpl.ResourceCountIs(jsii.String("AWS::SQS::Queue"), jsii.Number(3))
		tmpl.HasResourceProperties(jsii.String("AWS::SQS::Queue"), map[string]any{
			"VisibilityTimeout": 360.0,
			"RedrivePolicy":     map[string]any{"deadLetterTargetArn": assertions.Match_AnyValue(), "maxReceiveCount": 3.0},
		})
		esm := resources(tmpl, "AWS::Lambda::EventSourceMapping")
		require.Len(t, esm, 1)
		for _, e := range esm {
			require.NotContains(t, props(e), "MaximumBatchingWindowInSeconds")
			require.Equal(t, 5.0, props(e)["BatchSize"])
			require.Equal(t, map[string]any{"MaximumConcurrency": 2.0}, props(e)["ScalingConfig"])
		}
	})
	t.Run("relay: logical topics, no default topic, overlap-sized concurrency", func(t *testing.T) {
		topicARNs := assertions.NewCapture(nil)
		tmpl.HasResourceProperties(jsii.String("AWS::Lambda::Function"), map[string]any{
			"Timeout":                      120.0,
			"ReservedConcurrentExecutions": 3.0,
			"Environment": map[string]any{"Variables": map[string]any{
				lambdaenv.TopicARNs:           topicARNs,
				lambdaenv.DatabaseSecretARN:   "arn:aws:secretsmanager:eu-west-1:111111111111:secret:sluice-db-AbCdEf",
				lambdaenv.DatabaseSSLMode:     "verify-full",
				lambdaenv.DatabaseSSLRootCert: infra.CABundleLambdaPath,
				lambdaenv.DatabaseMaxConns:    "2",
				"GOMEMLIMIT":                  "460MiB",
			}},
		})
		js := fmt.Sprint(topicARNs.AsObject())
		require.Contains(t, js, `{"orders":"`)
		require.Contains(t, js, `,"payments":"`)
		for _, fn := range resources(tmpl, "AWS::Lambda::Function") {
			require.NotContains(t, env(fn), lambdaenv.DefaultTopicARN, "with LogicalTopics, unknown topics are quarantined") // CDK's providers have no environment
		}
	})
	t.Run("relay settings: every one reaches the relay's environment, as its reader reads it back", func(t *testing.T) {
		var relayEnv map[string]any
		for _, fn := range resources(tmpl, "AWS::Lambda::Function") {
			if e := env(fn); e[lambdaenv.TopicARNs] != nil {
				relayEnv = e
			}
		}
		require.NotNil(t, relayEnv, "the relay function")
		for k, want := range map[string]string{
			"SLUICE_RELAY_BATCH_SIZE": "200", "SLUICE_RELAY_MAX_PER_KEY": "5", "SLUICE_RELAY_PUBLISH_CONCURRENCY": "16",
			"SLUICE_RELAY_PIPELINES": "3", "SLUICE_RELAY_MAX_ROUND_BYTES": "8388608", "SLUICE_RELAY_MAX_ATTEMPTS": "7",
			"SLUICE_RELAY_PUBLISH_TIMEOUT": "5s", "SLUICE_RELAY_LEASE": "20s", "SLUICE_RELAY_BACKOFF_BASE": "500ms",
			"SLUICE_RELAY_BACKOFF_MAX": "2m0s", "SLUICE_RELAY_OUTAGE_LIMIT": "6h0m0s", "SLUICE_RELAY_POLL_INTERVAL": "100ms",
			"SLUICE_RELAY_RESCAN_INTERVAL": "2s", lambdaenv.OutboxRetention: "720h0m0s", lambdaenv.OutboxPartitionInterval: "6h0m0s",
		} {
			require.Equal(t, want, relayEnv[k], k)
		}
		cfg, err := lambdaenv.RelaySettings(func(k string) string { s, _ := relayEnv[k].(string); return s })
		require.NoError(t, err)
		require.Equal(t, 200, cfg.BatchSize)
		require.Equal(t, 20*time.Second, cfg.Lease)
	})
	t.Run("relay settings: every variable of outbox.RelaySettings has a prop", func(t *testing.T) {
		// Settings set by other constructs than OutboxProps.Relay, or not from the CDK.
		elsewhere := map[string]string{
			"MessageLimits.SNS": "a topic's limit: set on the function when the topic's is raised", "MessageLimits.SQS": "likewise, the queues'",
			"MessageLimits.EventBridge": "EventBridge's fixed limit", "MessageLimits.Kinesis": "likewise, the stream's",
			"MessageLimits.Kafka":  "MskDestinationProps.MaxMessageBytes",
			"ClaimCheck.Threshold": "ClaimCheckProps.Threshold", "ClaimCheck.MaxPayloadBytes": "ClaimCheckProps.MaxPayloadBytes",
		}
		props := reflect.TypeFor[infra.RelaySettings]()
		for _, s := range outbox.RelaySettings() {
			f, ok := props.FieldByName(s.Field)
			switch {
			case s.Env == "":
				require.False(t, ok, "%s has no variable: the relay Lambda cannot read it", s.Field)
			case ok:
				require.Contains(t, []reflect.Type{reflect.TypeFor[int](), reflect.TypeFor[time.Duration]()}, f.Type, s.Field)
			default:
				require.Contains(t, elsewhere, s.Field, "a new relay setting needs a field of infra.RelaySettings (or a line here saying which construct sets %s)", s.Env)
			}
		}
		for i := range props.NumField() {
			require.NotPanics(t, func() { outbox.RelaySetting(props.Field(i).Name) }, "infra.RelaySettings.%s is no outbox.RelaySettings entry", props.Field(i).Name)
		}
	})
	t.Run("consumer settings reach the consumer's environment", func(t *testing.T) {
		tmpl.HasResourceProperties(jsii.String("AWS::Lambda::Function"), map[string]any{
			"Environment": map[string]any{"Variables": assertions.Match_ObjectLike(&map[string]any{
				lambdaenv.ConsumerName: "billing", lambdaenv.ConsumerCommitMode: "batched",
				lambdaenv.ConsumerDeadlineMargin: "5s", lambdaenv.ConsumerStorePayload: "true",
			})},
		})
	})
	t.Run("existing database security group gets the ingress rules", func(t *testing.T) {
		tmpl.ResourceCountIs(jsii.String("AWS::EC2::SecurityGroupIngress"), jsii.Number(2))
		tmpl.HasResourceProperties(jsii.String("AWS::EC2::SecurityGroupIngress"), map[string]any{
			"GroupId": "sg-0123456789abcdef0", "FromPort": 5433.0, "ToPort": 5433.0, "IpProtocol": "tcp",
		})
		tmpl.HasResourceProperties(jsii.String("AWS::Lambda::Function"), map[string]any{
			"Environment": map[string]any{"Variables": assertions.Match_ObjectLike(&map[string]any{
				lambdaenv.ConsumerName: "billing", lambdaenv.ConsumerCommitMode: "batched",
			})},
		})
	})
	t.Run("logging in with the database secret is an explicit choice, said at synth", func(t *testing.T) {
		for _, w := range []string{"the relay logs in with Database.Secret", "the consumer's handler code logs in with Database.Secret"} {
			assertions.Annotations_FromStack(stack).HasWarning(jsii.String("*"), assertions.Match_StringLikeRegexp(jsii.String(w)))
		}
	})
	t.Run("the redrivers may send to the queue besides the topic", func(t *testing.T) {
		condition := assertions.NewCapture(nil)
		tmpl.HasResourceProperties(jsii.String("AWS::SQS::QueuePolicy"), map[string]any{
			"PolicyDocument": map[string]any{"Statement": assertions.Match_ArrayWith(&[]any{assertions.Match_ObjectLike(&map[string]any{
				"Sid": "OnlyTheTopicAndRedriversSend", "Effect": "Deny", "Condition": condition,
			})})},
		})
		not := (*condition.AsObject())["ArnNotEquals"].(map[string]any)
		require.Equal(t, []any{"arn:aws:iam::111111111111:role/operator"}, not["aws:PrincipalArn"])
		require.Contains(t, not, "aws:SourceArn")
	})
	t.Run("IAM: no wildcard action on a wildcard resource", func(t *testing.T) {
		requireNoWildcardGrants(t, tmpl)
	})
	t.Run("an explicit opt-out of alarm destinations is said at synth", func(t *testing.T) {
		assertions.Annotations_FromStack(stack).HasWarning(jsii.String("*"), assertions.Match_StringLikeRegexp(jsii.String("notify a topic nobody subscribes to")))
		tmpl.ResourceCountIs(jsii.String("AWS::SNS::Subscription"), jsii.Number(1)) // the queue's only
	})
}

// TestValidation checks that bad props fail synthesis with a message naming the problem.
func TestValidation(t *testing.T) {
	app := awscdk.NewApp(nil)
	stack := awscdk.NewStack(app, jsii.String("Bad"), nil)
	vpc := awsec2.Vpc_FromVpcAttributes(stack, jsii.String("Vpc"), &awsec2.VpcAttributes{
		VpcId: jsii.String("vpc-0123456789abcdef0"), AvailabilityZones: jsii.Strings("eu-west-1a"), PrivateSubnetIds: jsii.Strings("subnet-a"),
	})
	secret := awssecretsmanager.Secret_FromSecretCompleteArn(stack, jsii.String("Secret"),
		jsii.String("arn:aws:secretsmanager:eu-west-1:111111111111:secret:db-AbCdEf"))
	network, db := infra.Network{Vpc: vpc}, infra.Database{Secret: secret, CABundle: caBundle(t)}
	standard := awssns.NewTopic(stack, jsii.String("Standard"), nil)
	fifo := awssns.NewTopic(stack, jsii.String("Fifo"), &awssns.TopicProps{Fifo: jsii.Bool(true)})
	code := assetDir(t, "fn")
	mig := infra.NewMigrations(stack, "Migrations", &infra.MigrationsProps{CodeDir: code, Network: network, Database: db, InboxRetention: 10 * 24 * time.Hour})
	ob := infra.NewOutbox(stack, "Outbox", &infra.OutboxProps{RelayCodeDir: code, Network: network, Database: db, UseDatabaseSecret: true})
	consumer := func(mod func(*infra.ConsumerProps)) func(id string) {
		return func(id string) {
			p := &infra.ConsumerProps{Name: "c", CodeDir: code, Topic: standard, Network: network, Database: db, UseDatabaseSecret: true}
			mod(p)
			infra.NewConsumer(stack, id, p)
		}
	}

	for _, tc := range []struct {
		name  string
		build func(id string)
		want  string
	}{
		{"visibility timeout below 6x", consumer(func(p *infra.ConsumerProps) {
			p.Timeout, p.VisibilityTimeout = time.Minute, 5*time.Minute
		}), "VisibilityTimeout 5m0s is shorter than 6 × the function timeout (1m0s) = 6m0s"},
		{"FIFO consumer on standard topic", consumer(func(p *infra.ConsumerProps) { p.Fifo = true }),
			"a FIFO consumer cannot subscribe to a standard topic"},
		{"standard consumer on FIFO topic", consumer(func(p *infra.ConsumerProps) { p.Topic = fifo }),
			"a FIFO topic can only deliver to FIFO queues"},
		{"batching window on FIFO", consumer(func(p *infra.ConsumerProps) {
			p.Topic, p.Fifo, p.MaxBatchingWindow = fifo, true, time.Second
		}), "MaxBatchingWindow is not supported on FIFO queues"},
		{"max concurrency below 2", consumer(func(p *infra.ConsumerProps) { p.MaxConcurrency = 1 }),
			"MaxConcurrency must be between 2 and 1000, got 1"},
		{"negative max receive count", consumer(func(p *infra.ConsumerProps) { p.MaxReceiveCount = -1 }),
			"MaxReceiveCount must be at least 1, got -1"},
		{"missing consumer name and bootstrap", consumer(func(p *infra.ConsumerProps) { p.Name, p.CodeDir = "", t.TempDir() }),
			"Name is required"},
		{"negative alarm thresholds", func(id string) {
			infra.NewMonitoring(stack, id, &infra.MonitoringProps{Outbox: ob, OldestPendingAge: -time.Second, LambdaErrors: -1, NoAlarmDestination: true})
		}, "OldestPendingAge must not be negative, got -1s\nLambdaErrors must not be negative, got -1"},
		{"negative queue age threshold", func(id string) {
			infra.NewMonitoring(stack, id, &infra.MonitoringProps{Outbox: ob, QueueOldestMessageAge: -time.Minute, HeartbeatMissingMinutes: -2, NoAlarmDestination: true})
		}, "HeartbeatMissingMinutes must not be negative, got -2\nQueueOldestMessageAge must not be negative, got -1m0s"},
		{"relay concurrency below the schedule overlap", func(id string) {
			infra.NewOutbox(stack, id, &infra.OutboxProps{RelayCodeDir: code, Network: network, Database: db, RelayTimeout: 5 * time.Minute, RelayReservedConcurrency: 2, UseDatabaseSecret: true})
		}, "RelayReservedConcurrency 2 is below the 5 overlapping invocations"},
		{"a relay that would log in with the master secret unasked", func(id string) {
			infra.NewOutbox(stack, id, &infra.OutboxProps{RelayCodeDir: code, Network: network, Database: db})
		}, "Migrations is not set, so the relay would log in with Database.Secret (the owner's or master credentials): set Migrations"},
		{"a consumer that would log in with the master secret unasked", consumer(func(p *infra.ConsumerProps) { p.UseDatabaseSecret = false }),
			"Migrations is not set, so the consumer's handler code would log in with Database.Secret"},
		{"the master secret and a role of its own at once", consumer(func(p *infra.ConsumerProps) { p.Migrations = mig }),
			"UseDatabaseSecret and Migrations exclude each other"},
		{"an inbox retention a redelivery outlives", consumer(func(p *infra.ConsumerProps) { p.UseDatabaseSecret, p.Migrations = false, mig }),
			"the migrations' InboxRetention 240h0m0s is not longer than consumer c's dead-letter queues retention 336h0m0s"},
		{"partition maintenance slower than the partitions fill", func(id string) {
			infra.NewMigrations(stack, id, &infra.MigrationsProps{CodeDir: code, Network: network, Database: db,
				MaintenanceSchedule: 2 * time.Hour, InboxPartitionInterval: time.Hour, OutboxRetention: -time.Hour})
		}, "OutboxRetention must not be negative, got -1h0m0s\nInboxPartitionInterval 1h0m0s is shorter than MaintenanceSchedule 2h0m0s"},
		{"an outbox partition interval the maintenance cannot keep up with", func(id string) {
			infra.NewOutbox(stack, id, &infra.OutboxProps{RelayCodeDir: code, Network: network, Database: db, Migrations: mig, OutboxPartitionInterval: 30 * time.Minute})
		}, "OutboxPartitionInterval 30m0s is shorter than the migrations' MaintenanceSchedule 1h0m0s"},
		{"a redriver that is no ARN", consumer(func(p *infra.ConsumerProps) { p.Redrivers = []string{"operator"} }),
			`Redrivers[0] "operator" is not an ARN`},
		{"a deadline margin the timeout cannot hold", consumer(func(p *infra.ConsumerProps) { p.Timeout, p.DeadlineMargin = 10*time.Second, 10*time.Second }),
			"DeadlineMargin 10s must be shorter than Timeout 10s"},
		{"a consumer name the Lambda would refuse", consumer(func(p *infra.ConsumerProps) { p.Name = "   " }),
			"the consumer Lambda would refuse these settings at cold start: consumer settings: SLUICE_CONSUMER_NAME is required"},
		{"partition settings out of range", func(id string) {
			infra.NewOutbox(stack, id, &infra.OutboxProps{RelayCodeDir: code, Network: network, Database: db, UseDatabaseSecret: true,
				OutboxRetention: -time.Hour, OutboxPartitionInterval: time.Nanosecond})
		}, "OutboxRetention must not be negative, got -1h0m0s\nOutboxPartitionInterval: "},
		{"relay settings out of range, each named", func(id string) {
			infra.NewOutbox(stack, id, &infra.OutboxProps{RelayCodeDir: code, Network: network, Database: db, UseDatabaseSecret: true,
				Relay: infra.RelaySettings{BatchSize: 20000, PublishTimeout: time.Minute, Lease: 30 * time.Second}})
		}, "Relay: relay settings: SLUICE_RELAY_BATCH_SIZE: BatchSize must be between 1 and 10000, got 20000\nSLUICE_RELAY_LEASE: Lease (30s) must be longer than PublishTimeout (1m0s)"},
		{"verify-full without a CA bundle", consumer(func(p *infra.ConsumerProps) { p.Database.CABundle = "" }),
			"Database.CABundle: sslmode verify-full needs the RDS CA bundle"},
		{"a CA bundle without certificates", consumer(func(p *infra.ConsumerProps) {
			p.Database.CABundle = filepath.Join(t.TempDir(), "empty.pem")
			require.NoError(t, os.WriteFile(p.Database.CABundle, []byte("not a certificate"), 0o644))
		}), "holds no PEM certificate"},
		{"bad grants", consumer(func(p *infra.ConsumerProps) {
			p.DatabaseGrants = []infra.DatabaseGrant{{Table: "invoice; drop", Privileges: []string{"SELECT"}}}
		}), "DatabaseGrants need Migrations"},
		{"alarms without a destination", func(id string) {
			infra.NewMonitoring(stack, id, &infra.MonitoringProps{Outbox: ob})
		}, "the alarms need a destination: set AlarmEmail, AlarmTopic"},
		{"relay without bootstrap, VPC or secret", func(id string) {
			infra.NewOutbox(stack, id, &infra.OutboxProps{RelayCodeDir: t.TempDir()})
		}, "has no bootstrap file (run `make build`)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			func() {
				defer func() {
					if r := recover(); r != nil {
						err, _ = r.(error)
						require.NotNil(t, err, "panic value %v is not an error", r)
					}
				}()
				tc.build(strings.ReplaceAll(tc.name, " ", ""))
			}()
			require.Error(t, err, "no validation error")
			require.Contains(t, err.Error(), tc.want)
			require.Contains(t, err.Error(), "invalid props")
		})
	}
}
