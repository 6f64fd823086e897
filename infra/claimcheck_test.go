package infra_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awskms"
	"github.com/aws/aws-cdk-go/awscdk/v2/awssecretsmanager"
	"github.com/aws/jsii-runtime-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/infra"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
)

// statements returns the bucket policy's statements.
func bucketStatements(t *testing.T, tmpl assertions.Template) []map[string]any {
	t.Helper()
	policies := resources(tmpl, "AWS::S3::BucketPolicy")
	require.Len(t, policies, 1)
	var out []map[string]any
	for _, s := range props(policies[firstKey(policies)])["PolicyDocument"].(map[string]any)["Statement"].([]any) {
		out = append(out, s.(map[string]any))
	}
	return out
}

// roleActions returns every action the function's role policies allow, with their resources.
func roleActions(tmpl assertions.Template, fn map[string]any) map[string]string {
	role := refID(props(fn)["Role"])
	out := map[string]string{}
	for _, p := range resources(tmpl, "AWS::IAM::Policy") {
		attached := false
		for _, r := range asList(props(p)["Roles"]) {
			attached = attached || refID(r) == role
		}
		if !attached {
			continue
		}
		for _, s := range props(p)["PolicyDocument"].(map[string]any)["Statement"].([]any) {
			st := s.(map[string]any)
			for _, a := range asList(st["Action"]) {
				out[fmt.Sprint(a)] = fmt.Sprint(st["Resource"]) + " " + fmt.Sprint(st["Condition"])
			}
		}
	}
	return out
}

// The example stack with a claim check: an encrypted, TLS-only, private bucket whose objects
// expire after the consumer's queue and DLQ retention plus the replay window; only the relay
// writes (under the prefix) and only the consumer reads; both functions get their variables
// and HTTPS to the S3 gateway endpoint; cdk-nag has nothing to say.
func TestClaimCheckStack(t *testing.T) {
	app := awscdk.NewApp(nil)
	s := infra.NewSluiceStack(app, "Claims", &infra.SluiceStackProps{
		RelayCodeDir: assetDir(t, "relay"), ConsumerCodeDir: assetDir(t, "consumer"), MigrateCodeDir: assetDir(t, "migrate"),
		CABundle: caBundle(t), NoAlarmDestination: true, ClaimCheck: &infra.ClaimCheckProps{MaxPayloadBytes: 8 << 20, Threshold: 200 << 10},
	})
	withNag(s)
	tmpl := assertions.Template_FromStack(s, nil)
	requireNoNagErrors(t, s)
	fns := resources(tmpl, "AWS::Lambda::Function")
	relay := fns[*s.GetLogicalId(s.Outbox().Relay().Node().DefaultChild().(awscdk.CfnElement))]
	consumer := fns[*s.GetLogicalId(s.Consumer().Function().Node().DefaultChild().(awscdk.CfnElement))]
	buckets := resources(tmpl, "AWS::S3::Bucket")
	require.Len(t, buckets, 1)
	bucketID := firstKey(buckets)
	bucket := buckets[bucketID]

	t.Run("bucket: encrypted, private, ACLs off, retained, objects expire after 26 days (4 + 14 + 7, plus one)", func(t *testing.T) {
		tmpl.HasResourceProperties(jsii.String("AWS::S3::Bucket"), map[string]any{
			"BucketEncryption": map[string]any{"ServerSideEncryptionConfiguration": []any{
				map[string]any{"ServerSideEncryptionByDefault": map[string]any{"SSEAlgorithm": "AES256"}}}},
			"PublicAccessBlockConfiguration": map[string]any{"BlockPublicAcls": true, "BlockPublicPolicy": true, "IgnorePublicAcls": true, "RestrictPublicBuckets": true},
			"OwnershipControls":              map[string]any{"Rules": []any{map[string]any{"ObjectOwnership": "BucketOwnerEnforced"}}},
			"LifecycleConfiguration": map[string]any{"Rules": []any{map[string]any{
				"ExpirationInDays": 26.0, "Status": "Enabled", "AbortIncompleteMultipartUpload": map[string]any{"DaysAfterInitiation": 1.0}}}},
		})
		require.Equal(t, "Retain", bucket["DeletionPolicy"])
		require.NotContains(t, props(bucket), "VersioningConfiguration", "a republish overwrites its object: no versions pile up")
	})

	t.Run("bucket policy: TLS only, only the relay writes or deletes, only the consumer reads", func(t *testing.T) {
		byEffect := map[string]map[string]any{}
		var tls []map[string]any
		for _, st := range bucketStatements(t, tmpl) {
			require.Equal(t, "Deny", st["Effect"], "the policy only denies: the grants are on the roles")
			if c := fmt.Sprint(st["Condition"]); strings.Contains(c, "aws:SecureTransport") || strings.Contains(c, "s3:TlsVersion") {
				tls = append(tls, st)
				continue
			}
			byEffect[fmt.Sprint(st["Sid"])] = st
		}
		require.Len(t, tls, 2, "plain HTTP and TLS below 1.2 are denied: %v", tls)
		require.Contains(t, fmt.Sprint(tls), "aws:SecureTransport:false")
		require.Contains(t, fmt.Sprint(tls), "s3:TlsVersion:1.2")
		writes, reads := byEffect["OnlyTheRelayWrites"], byEffect["OnlyTheConsumersRead"]
		require.NotNil(t, writes, "%v", byEffect)
		require.NotNil(t, reads, "%v", byEffect)
		require.ElementsMatch(t, []any{"s3:PutObject", "s3:DeleteObject"}, writes["Action"])
		require.Equal(t, "s3:GetObject", reads["Action"])
		principal := func(st map[string]any) []any {
			return st["Condition"].(map[string]any)["ArnNotEquals"].(map[string]any)["aws:PrincipalArn"].([]any)
		}
		relayRole, consumerRole := refID(props(relay)["Role"]), refID(props(consumer)["Role"])
		require.Len(t, principal(writes), 1)
		require.Equal(t, relayRole, refID(principal(writes)[0]))
		require.Len(t, principal(reads), 1)
		require.Equal(t, consumerRole, refID(principal(reads)[0]))
	})

	t.Run("grants: the relay PutObject under the prefix only, the consumer GetObject only", func(t *testing.T) {
		ra, ca := roleActions(tmpl, relay), roleActions(tmpl, consumer)
		require.Contains(t, ra, "s3:PutObject")
		require.Contains(t, ra["s3:PutObject"], bucketID)
		require.Contains(t, ra["s3:PutObject"], "/outbox/*")
		require.Contains(t, ca, "s3:GetObject")
		require.Contains(t, ca["s3:GetObject"], bucketID)
		require.Contains(t, ca["s3:GetObject"], "/outbox/*", "the consumer reads under the relay's prefix only")
		require.Contains(t, ca, "s3:ListBucket", "so that S3 answers 404, not 403, for an expired payload")
		require.Contains(t, ca["s3:ListBucket"], bucketID)
		// S3 decides 404 or 403 for a missing key by whether the caller may list the bucket, a
		// check that carries no s3:prefix: a condition on it would never hold there.
		require.True(t, strings.HasSuffix(ca["s3:ListBucket"], " <nil>"), "ListBucket without a condition: %s", ca["s3:ListBucket"])
		for a := range ra {
			require.False(t, strings.HasPrefix(a, "s3:") && a != "s3:PutObject", "relay: %s", a)
		}
		for a := range ca {
			require.False(t, strings.HasPrefix(a, "s3:") && a != "s3:GetObject" && a != "s3:ListBucket", "consumer: %s", a)
		}
	})

	t.Run("a denied request (an extended client deleting payloads) alarms", func(t *testing.T) {
		a := alarmOn(t, tmpl, "AWS/S3", "4xxErrors")
		require.Contains(t, fmt.Sprint(a["AlarmDescription"]), "cleanupS3Payload")
		require.Contains(t, fmt.Sprint(a["Dimensions"]), "ClaimCheckRequests")
		b := resources(tmpl, "AWS::S3::Bucket")[bucketID]
		require.Contains(t, fmt.Sprint(props(b)["MetricsConfigurations"]), "ClaimCheckRequests", "the bucket publishes request metrics")
	})

	t.Run("environment: the relay's claim check settings, the consumer's bucket and bound, as their readers read them", func(t *testing.T) {
		re, ce := env(relay), env(consumer)
		require.Equal(t, bucketID, refID(re[lambdaenv.ClaimCheckBucket]))
		require.Equal(t, "outbox/", re[lambdaenv.ClaimCheckPrefix])
		require.Equal(t, "204800", re[lambdaenv.ClaimCheckThreshold])
		require.Equal(t, "8388608", re[lambdaenv.ClaimCheckMaxPayload])
		require.Equal(t, bucketID, refID(ce[lambdaenv.ClaimCheckBucket]))
		require.Equal(t, "8388608", ce[lambdaenv.ClaimCheckMaxPayload])
		require.Equal(t, "outbox/", ce[lambdaenv.ClaimCheckPrefix], "the consumer fetches under the relay's prefix only")
		require.Equal(t, "AWS::AccountId", refID(ce[lambdaenv.ClaimCheckBucketOwner]), "and sends the bucket's owner")
		require.NotContains(t, ce, lambdaenv.ClaimCheckThreshold)
	})

	t.Run("network: both functions may reach S3's gateway endpoint, and nothing else outside", func(t *testing.T) {
		for name, fn := range map[string]map[string]any{"relay": relay, "consumer": consumer} {
			egress := egressOf(tmpl, fn)
			require.Contains(t, egress, "s3-prefix-list:443", name)
			require.NotContains(t, egress, "0.0.0.0/0:443", name)
		}
		tmpl.HasOutput(jsii.String("ClaimCheckBucket"), map[string]any{"Value": map[string]any{"Ref": bucketID}})
	})
}

// A claim check on its own with a KMS key: SSE-KMS with a bucket key, the relay may generate data
// keys and the consumer decrypt. Synthesis refuses a lifetime a message could outlive, a
// consumer whose retention outlives the objects, and settings the relay would refuse.
func TestClaimCheckConstructAndValidation(t *testing.T) {
	app := awscdk.NewApp(nil)
	stack := awscdk.NewStack(app, jsii.String("Payloads"), nil)
	vpc := awsec2.Vpc_FromVpcAttributes(stack, jsii.String("Vpc"), &awsec2.VpcAttributes{
		VpcId: jsii.String("vpc-0123456789abcdef0"), AvailabilityZones: jsii.Strings("eu-west-1a"), PrivateSubnetIds: jsii.Strings("subnet-a"),
	})
	secret := awssecretsmanager.Secret_FromSecretCompleteArn(stack, jsii.String("Secret"), jsii.String("arn:aws:secretsmanager:eu-west-1:111111111111:secret:db-AbCdEf"))
	network, db := infra.Network{Vpc: vpc}, infra.Database{Secret: secret, CABundle: caBundle(t)}
	key := awskms.NewKey(stack, jsii.String("Key"), &awskms.KeyProps{EnableKeyRotation: jsii.Bool(true)})
	cc := infra.NewClaimCheck(stack, "Docs", &infra.ClaimCheckProps{EncryptionKey: key, KeyPrefix: "docs/", QueueRetention: 10 * 24 * time.Hour,
		ReplayWindow: 24 * time.Hour, BucketName: "sluice-docs-payloads"})
	require.Equal(t, 26*24*time.Hour, cc.Expiration(), "10 + 14 + 1 days, plus one")
	ob := infra.NewOutbox(stack, "Outbox", &infra.OutboxProps{RelayCodeDir: assetDir(t, "relay"), Network: network, Database: db,
		UseDatabaseSecret: true, ClaimCheck: cc})
	consumer := func(id string, retention time.Duration) {
		infra.NewConsumer(stack, id, &infra.ConsumerProps{Name: strings.ToLower(id), CodeDir: assetDir(t, "consumer"), Topic: ob.Topic(),
			Network: network, Database: db, UseDatabaseSecret: true, ClaimCheck: cc, RetentionPeriod: retention})
	}
	consumer("Billing", 10*24*time.Hour)
	consumer("Audit", 0)
	withNag(stack)
	tmpl := assertions.Template_FromStack(stack, nil)
	requireNoNagErrors(t, stack)

	tmpl.HasResourceProperties(jsii.String("AWS::S3::Bucket"), map[string]any{
		"BucketName": "sluice-docs-payloads",
		"BucketEncryption": map[string]any{"ServerSideEncryptionConfiguration": []any{map[string]any{
			"BucketKeyEnabled":              true,
			"ServerSideEncryptionByDefault": map[string]any{"SSEAlgorithm": "aws:kms", "KMSMasterKeyID": assertions.Match_AnyValue()}}}},
		"LifecycleConfiguration": map[string]any{"Rules": []any{assertions.Match_ObjectLike(&map[string]any{"ExpirationInDays": 26.0})}},
	})
	var readers []any
	for _, st := range bucketStatements(t, tmpl) {
		if st["Sid"] == "OnlyTheConsumersRead" {
			readers = st["Condition"].(map[string]any)["ArnNotEquals"].(map[string]any)["aws:PrincipalArn"].([]any)
		}
	}
	require.Len(t, readers, 2, "every consumer attached after the bucket is in the policy")
	fns := resources(tmpl, "AWS::Lambda::Function")
	relay := fns[*stack.GetLogicalId(ob.Relay().Node().DefaultChild().(awscdk.CfnElement))]
	require.Contains(t, roleActions(tmpl, relay), "kms:GenerateDataKey")
	require.Contains(t, roleActions(tmpl, relay)["s3:PutObject"], "/docs/*")
	decrypts := 0
	for _, fn := range fns {
		if _, ok := roleActions(tmpl, fn)["s3:GetObject"]; ok {
			require.Contains(t, roleActions(tmpl, fn), "kms:Decrypt")
			decrypts++
		}
	}
	require.Equal(t, 2, decrypts)

	bad := awscdk.NewStack(app, jsii.String("Bad"), nil)
	badNetwork := infra.Network{Vpc: awsec2.Vpc_FromVpcAttributes(bad, jsii.String("Vpc"), &awsec2.VpcAttributes{
		VpcId: jsii.String("vpc-0123456789abcdef0"), AvailabilityZones: jsii.Strings("eu-west-1a"), PrivateSubnetIds: jsii.Strings("subnet-a"),
	})}
	badDB := infra.Database{Secret: awssecretsmanager.Secret_FromSecretCompleteArn(bad, jsii.String("Secret"),
		jsii.String("arn:aws:secretsmanager:eu-west-1:111111111111:secret:db-AbCdEf")), CABundle: caBundle(t)}
	badCC := infra.NewClaimCheck(bad, "Short", &infra.ClaimCheckProps{})
	badTopic := infra.NewOutbox(bad, "Outbox", &infra.OutboxProps{RelayCodeDir: assetDir(t, "relay"), Network: badNetwork, Database: badDB,
		UseDatabaseSecret: true}).Topic()
	for _, tc := range []struct {
		name  string
		build func()
		want  string
	}{
		{"an expiration a message outlives", func() {
			infra.NewClaimCheck(bad, "Expiring", &infra.ClaimCheckProps{Expiration: 10 * 24 * time.Hour})
		}, "Expiration 240h0m0s is shorter than the 26 days a message may point at its object: queue retention 96h0m0s + DLQ retention 336h0m0s + replay window 168h0m0s"},
		{"settings the relay would refuse", func() {
			infra.NewClaimCheck(bad, "Tiny", &infra.ClaimCheckProps{Threshold: 100, MaxPayloadBytes: 1 << 30})
		}, "ClaimCheck.Threshold must be 0 (the default) or between 1024 and 104857600, got 100"},
		{"a consumer whose queues outlive the objects", func() {
			infra.NewConsumer(bad, "Slow", &infra.ConsumerProps{Name: "slow", CodeDir: assetDir(t, "consumer"), Topic: badTopic,
				Network: badNetwork, Database: badDB, UseDatabaseSecret: true, ClaimCheck: badCC, RetentionPeriod: 14 * 24 * time.Hour})
		}, "ClaimCheck: consumer slow's queue retention 336h0m0s + DLQ retention 336h0m0s + the claim check's replay window 168h0m0s need objects to live 36 days, but they expire after 26"},
		{"a consumer whose memory cannot hold its batch of payloads", func() {
			infra.NewConsumer(bad, "Small", &infra.ConsumerProps{Name: "small", CodeDir: assetDir(t, "consumer"), Topic: badTopic,
				Network: badNetwork, Database: badDB, UseDatabaseSecret: true, ClaimCheck: badCC, MemoryMB: 256})
		}, "MemoryMB 256 cannot hold a batch of 10 claim-checked payloads of up to 33554432 bytes: it needs 768 MB"},
		{"a batch no Lambda can hold", func() {
			infra.NewConsumer(bad, "Huge", &infra.ConsumerProps{Name: "huge", CodeDir: assetDir(t, "consumer"), Topic: badTopic,
				Network: badNetwork, Database: badDB, UseDatabaseSecret: true, ClaimCheck: badCC, BatchSize: 200, MaxBatchingWindow: time.Second})
		}, "it needs 12928 MB"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			func() {
				defer func() {
					if r := recover(); r != nil {
						err, _ = r.(error)
					}
				}()
				tc.build()
			}()
			require.Error(t, err, "no validation error")
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

// A claim-check consumer's memory holds a batch of its largest payloads: sized at synth by
// default (issue 21, item 7: 256 MB, batch 10 and 32 MiB payloads needed 640 MiB and more); the
// refusals are in TestClaimCheckWithKMSAndRefusals.
func TestClaimCheckConsumerMemoryFitsItsBatch(t *testing.T) {
	t.Parallel()
	require.Equal(t, 128+2*10*32, infra.ConsumerMemoryMB(10, 32<<20))
	app := awscdk.NewApp(nil)
	s := infra.NewSluiceStack(app, "Memory", &infra.SluiceStackProps{
		RelayCodeDir: assetDir(t, "relay"), ConsumerCodeDir: assetDir(t, "consumer"), MigrateCodeDir: assetDir(t, "migrate"),
		CABundle: caBundle(t), NoAlarmDestination: true, ClaimCheck: &infra.ClaimCheckProps{},
	})
	tmpl := assertions.Template_FromStack(s, nil)
	consumer := resources(tmpl, "AWS::Lambda::Function")[*s.GetLogicalId(s.Consumer().Function().Node().DefaultChild().(awscdk.CfnElement))]
	require.Equal(t, float64(768), props(consumer)["MemorySize"], "10 payloads of 32 MiB, twice, and 128 MB")
}

// Consumers not built with sluice (the AWS extended clients for Java or Python) are admitted by
// ClaimCheckProps.Readers: the bucket policy lets them fetch payloads and list the bucket (404
// for a missing payload) past its read Deny, never write or delete; with a key they may
// decrypt. Anyone else is still refused. A reader that is no IAM role or user ARN fails synth.
func TestClaimCheckReaders(t *testing.T) {
	java, python := "arn:aws:iam::123456789012:role/orders-java-consumer", "arn:aws:iam::210987654321:role/python-consumer"
	app := awscdk.NewApp(nil)
	s := infra.NewSluiceStack(app, "Readers", &infra.SluiceStackProps{
		RelayCodeDir: assetDir(t, "relay"), ConsumerCodeDir: assetDir(t, "consumer"), MigrateCodeDir: assetDir(t, "migrate"),
		CABundle: caBundle(t), NoAlarmDestination: true, ClaimCheck: &infra.ClaimCheckProps{Readers: []string{java, python}},
	})
	withNag(s)
	tmpl := assertions.Template_FromStack(s, nil)
	requireNoNagErrors(t, s)
	doc := map[string]any{"Statement": []any{}}
	for _, st := range bucketStatements(t, tmpl) {
		doc["Statement"] = append(doc["Statement"].([]any), st)
	}
	req := func(who, action string) string {
		return evaluate(t, doc, request{awsPrincipal: who, action: action,
			context: map[string]any{"aws:PrincipalArn": who, "aws:SecureTransport": "true", "s3:TlsVersion": "1.3"}})
	}
	for _, reader := range []string{java, python} {
		require.Equal(t, "allow", req(reader, "s3:GetObject"), reader)
		require.Equal(t, "allow", req(reader, "s3:ListBucket"), "%s: a missing payload reads 404", reader)
		require.Equal(t, "deny", req(reader, "s3:PutObject"), reader)
		require.Equal(t, "deny", req(reader, "s3:DeleteObject"), "%s: an extended client must not clean up payloads", reader)
	}
	forger := "arn:aws:iam::123456789012:role/other"
	require.Equal(t, "deny", req(forger, "s3:GetObject"))
	consumerRole := map[string]any{"Fn::GetAtt": []any{refID(props(resources(tmpl, "AWS::Lambda::Function")[*s.GetLogicalId(
		s.Consumer().Function().Node().DefaultChild().(awscdk.CfnElement))])["Role"]), "Arn"}}
	require.Equal(t, "implicit", evaluate(t, doc, request{awsPrincipal: "consumer", action: "s3:GetObject",
		context: map[string]any{"aws:PrincipalArn": consumerRole, "aws:SecureTransport": "true", "s3:TlsVersion": "1.3"}}),
		"the sluice consumer still reads by its role's grant")

	err := build(func() {
		infra.NewClaimCheck(awscdk.NewStack(awscdk.NewApp(nil), jsii.String("Bad"), nil), "Payloads",
			&infra.ClaimCheckProps{Readers: []string{"orders-java-consumer", "arn:aws:s3:::bucket"}})
	})
	require.ErrorContains(t, err, `Readers: "orders-java-consumer" is not an IAM role or user ARN`)
	require.ErrorContains(t, err, `Readers: "arn:aws:s3:::bucket" is not an IAM role or user ARN`)
}
