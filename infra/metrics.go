package infra

import (
	"fmt"

	"github.com/aws/aws-cdk-go/awscdk/v2"
	"github.com/aws/aws-cdk-go/awscdk/v2/awscloudwatch"
	"github.com/aws/jsii-runtime-go"

	"github.com/sluicehq/sluice/pkg/metrics"
)

// RelayMetric returns the CloudWatch metric of m, one of the relay's metrics defined in
// pkg/metrics (e.g. metrics.OutboxOldestPendingAge), with the given statistic ("Sum",
// "Maximum", "p99", ...) over one-minute periods.
func RelayMetric(m metrics.Metric, statistic string) awscloudwatch.Metric {
	return cloudWatchMetric(m, metrics.ServiceRelay, "", statistic)
}

// ConsumerMetric returns the CloudWatch metric of m, one of the inbox's metrics defined in
// pkg/metrics (e.g. metrics.InboxFailures), of the named inbox consumer with the given
// statistic over one-minute periods.
func ConsumerMetric(consumer string, m metrics.Metric, statistic string) awscloudwatch.Metric {
	return cloudWatchMetric(m, metrics.ServiceConsumer, consumer, statistic)
}

// ProcessorMetric returns an inbox metric as the inbox processor of the named consumer
// emits it (dimensions Service=inbox-processor, Consumer=consumer), with the given statistic
// over one minute.
func ProcessorMetric(consumer string, m metrics.Metric, statistic string) awscloudwatch.Metric {
	return cloudWatchMetric(m, metrics.ServiceInboxProcessor, consumer, statistic)
}

// FleetRelayMetric returns m, one of a fleet's per-tenant metrics defined in pkg/metrics
// (metrics.TenantOldestPendingAge, ...), over every tenant of a fleet: a CloudWatch Metrics
// Insights query over the {Service=relay, Tenant} series with the statistic's function ("Maximum" → MAX, "Sum" → SUM, "Minimum" → MIN,
// "Average" → AVG, "SampleCount" → COUNT), over one-minute periods. An alarm may watch it.
func FleetRelayMetric(m metrics.Metric, statistic string) awscloudwatch.IMetric {
	fn, ok := map[string]string{"Maximum": "MAX", "Sum": "SUM", "Minimum": "MIN", "Average": "AVG", "SampleCount": "COUNT"}[statistic]
	if !ok {
		panic(fmt.Errorf("sluice FleetRelayMetric: statistic %q has no Metrics Insights function", statistic))
	}
	return awscloudwatch.NewMathExpression(&awscloudwatch.MathExpressionProps{
		Expression: jsii.String(fmt.Sprintf(`SELECT %s(%s) FROM SCHEMA(%q, %s, %s) WHERE %s = '%s'`, fn, m.Name, metrics.Namespace,
			metrics.DimensionService, metrics.DimensionTenant, metrics.DimensionService, metrics.ServiceRelay)),
		Label:  jsii.String(m.Name + " (all tenants)"),
		Period: awscdk.Duration_Minutes(jsii.Number(1)),
	})
}

// FleetShardMetric returns m, a fleet's per-shard metric defined in pkg/metrics
// (metrics.FleetShardHeartbeat), as shard i of n emits it ({Service=relay, Shard=<i/n>}), with
// the given statistic over one-minute periods.
func FleetShardMetric(m metrics.Metric, i, n int, statistic string) awscloudwatch.Metric {
	return cloudWatchMetric(m, metrics.ServiceRelay, metrics.FleetShard(i, n), statistic)
}

// cloudWatchMetric is m as service emits it, with the dimensions m.Dimensions names; name is
// the value of its Consumer or Shard dimension.
func cloudWatchMetric(m metrics.Metric, service, name, statistic string) awscloudwatch.Metric {
	dims := map[string]*string{}
	for _, d := range m.Dimensions {
		switch d {
		case metrics.DimensionService:
			dims[d] = jsii.String(service)
		case metrics.DimensionConsumer, metrics.DimensionShard:
			dims[d] = jsii.String(name)
		}
	}
	return awscloudwatch.NewMetric(&awscloudwatch.MetricProps{
		Namespace:     jsii.String(metrics.Namespace),
		MetricName:    jsii.String(m.Name),
		DimensionsMap: &dims,
		Statistic:     jsii.String(statistic),
		Period:        awscdk.Duration_Minutes(jsii.Number(1)),
	})
}
