package infra_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/assertions"
	"github.com/aws/aws-cdk-go/awscdk/v2/awsec2"
	"github.com/aws/jsii-runtime-go"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/infra"
	"github.com/sluicehq/sluice/pkg/lambdaenv"
)

// costTable returns docs/deploy.md's section on what the example stack costs.
func costTable(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "docs", "deploy.md"))
	require.NoError(t, err)
	doc := string(b)
	start := strings.Index(doc, "## What the example stack costs per month")
	require.GreaterOrEqual(t, start, 0)
	end := strings.Index(doc[start+3:], "\n## ")
	if end < 0 {
		return doc[start:]
	}
	return doc[start : start+3+end]
}

// Every column of the cost table is the example stack as deployed with the settings the table
// names, and each row's quantities are the ones the synthesized template has: a change to the
// stack's defaults fails here until the table follows.
func TestCostTableIsTheStacksOwnSettings(t *testing.T) {
	doc := costTable(t)
	synth := func(p *infra.SluiceStackProps) assertions.Template {
		p.RelayCodeDir, p.ConsumerCodeDir, p.MigrateCodeDir, p.CABundle = assetDir(t, "relay"), assetDir(t, "consumer"), assetDir(t, "migrate"), caBundle(t)
		p.AlarmEmail = "oncall@example.com"
		return assertions.Template_FromStack(infra.NewSluiceStack(awscdk.NewApp(nil), "Costs", p), nil)
	}
	one := func(tmpl assertions.Template, typ string, match func(map[string]any) bool) map[string]any {
		t.Helper()
		var found []map[string]any
		for _, r := range resources(tmpl, typ) {
			if match(props(r)) {
				found = append(found, props(r))
			}
		}
		require.Len(t, found, 1, typ)
		return found[0]
	}
	isRelay := func(p map[string]any) bool { return strings.Contains(fmt.Sprint(p["Description"]), "outbox relay") }
	isConsumer := func(p map[string]any) bool { return strings.Contains(fmt.Sprint(p["Description"]), "inbox consumer") }
	all := func(map[string]any) bool { return true }

	// The idle and 100 events/s columns: the example's defaults.
	tmpl := synth(&infra.SluiceStackProps{})
	relay := one(tmpl, "AWS::Lambda::Function", isRelay)
	consumer := one(tmpl, "AWS::Lambda::Function", isConsumer)
	mapping := one(tmpl, "AWS::Lambda::EventSourceMapping", all)
	db := one(tmpl, "AWS::RDS::DBInstance", all)
	overlap := int(relay["Timeout"].(float64)) / 60
	for _, want := range []string{
		fmt.Sprintf("relay %v MB", relay["MemorySize"]),
		fmt.Sprintf("%d overlapping %d-minute invocations", overlap, overlap),
		fmt.Sprintf("consumer %v MB", consumer["MemorySize"]),
		fmt.Sprintf("batches of %v", mapping["BatchSize"]),
		fmt.Sprintf("`MaxConcurrency` %v", mapping["ScalingConfig"].(map[string]any)["MaximumConcurrency"]),
		fmt.Sprintf("%d customer-managed keys", len(resources(tmpl, "AWS::KMS::Key"))),
		fmt.Sprintf("%d secrets", len(resources(tmpl, "AWS::SecretsManager::Secret"))),
		fmt.Sprintf("%d alarms", len(resources(tmpl, "AWS::CloudWatch::Alarm"))),
		fmt.Sprintf("× %v GB minimum", db["AllocatedStorage"]),
		fmt.Sprintf("`MaxAllocatedStorage` %v GB", db["MaxAllocatedStorage"]),
	} {
		require.Contains(t, doc, want, "the cost table must say what the stack synthesizes")
	}
	// Every consumer's processor schedule: one invocation a minute (43,200 in 30 days); an
	// async one runs until its deadline margin.
	consumerID := ""
	for id, r := range resources(tmpl, "AWS::Lambda::Function") {
		if isConsumer(props(r)) {
			consumerID = id
		}
	}
	schedule := one(tmpl, "AWS::Events::Rule", func(p map[string]any) bool {
		return strings.Contains(fmt.Sprint(p["Targets"]), consumerID)
	})
	require.Equal(t, "rate(1 minute)", schedule["ScheduleExpression"])
	require.Contains(t, doc, "`rate(1 minute)`: 43,200 invocations", "30 × 24 × 60 scheduled invocations")
	runs := time.Duration(consumer["Timeout"].(float64))*time.Second - lambdaenv.DefaultConsumerDeadlineMargin
	require.Contains(t, doc, fmt.Sprintf("until its deadline margin, %.0f s", runs.Seconds()))
	require.Equal(t, "db.t4g.small", db["DBInstanceClass"])
	require.Equal(t, true, db["MultiAZ"])
	interfaces := 0
	for _, r := range resources(tmpl, "AWS::EC2::VPCEndpoint") {
		if props(r)["VpcEndpointType"] == "Interface" {
			interfaces++
		}
	}
	require.Contains(t, doc, fmt.Sprintf("%d endpoints × 2 AZs", interfaces))
	// 15 days of inbox rows: one day beyond the DLQs' retention, the shortest the stack accepts.
	for id, q := range resources(tmpl, "AWS::SQS::Queue") {
		if _, redrive := props(q)["RedrivePolicy"]; !redrive {
			require.Equal(t, 1209600.0, props(q)["MessageRetentionPeriod"], "DLQ %s keeps messages 14 days", id)
		}
	}
	require.Contains(t, doc, "15 days of outbox and inbox rows")
	// Those 15 days need a purge the stack does not deploy: no function carries a retention
	// (the partition maintenance's is unset by default, and it touches partitioned tables
	// only), and no schedule runs `sluice purge`. The storage row must say so.
	for id, fn := range resources(tmpl, "AWS::Lambda::Function") {
		require.NotContains(t, env(fn), lambdaenv.OutboxRetention, id)
		require.NotContains(t, env(fn), lambdaenv.InboxRetention, id)
	}
	for _, row := range strings.Split(doc, "\n") {
		if strings.HasPrefix(row, "| RDS storage") {
			require.Contains(t, row, "the stack deploys no purge", "the storage row must not assume a purge the stack lacks")
			require.Contains(t, row, "sluice purge --older-than 15d")
		}
	}

	// The 1,000 events/s column: the settings it names, deployed as the table says.
	const flags = "-c instanceType=m7g.large -c maxConnections=900 -c maxAllocatedStorage=1500 -c consumerMaxConcurrency=20"
	require.Contains(t, doc, flags)
	tmpl = synth(&infra.SluiceStackProps{
		InstanceType: awsec2.NewInstanceType(jsii.String("m7g.large")), MaxConnections: 900, MaxAllocatedStorageGB: 1500, ConsumerMaxConcurrency: 20,
	})
	db = one(tmpl, "AWS::RDS::DBInstance", all)
	require.Equal(t, "db.m7g.large", db["DBInstanceClass"])
	require.Equal(t, 1500.0, db["MaxAllocatedStorage"], "the 1,296 GB of 15 days at 1,000/s fit")
	mapping = one(tmpl, "AWS::Lambda::EventSourceMapping", all)
	concurrency := mapping["ScalingConfig"].(map[string]any)["MaximumConcurrency"].(float64)
	batch := mapping["BatchSize"].(float64)
	require.GreaterOrEqual(t, concurrency*batch/0.1, 2000.0, "batches of 10 in 100 ms: twice the column's rate")
}
