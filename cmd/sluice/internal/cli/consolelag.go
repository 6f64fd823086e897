package cli

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch/schemas"
	cwtypes "github.com/aws/aws-sdk-go-v2/service/cloudwatch/types"
	"github.com/aws/smithy-go/transport/http/protocol/awsquery"

	"github.com/sluicehq/sluice/cmd/sluice/internal/console"
	"github.com/sluicehq/sluice/pkg/metrics"
)

// cloudWatchQuery makes a CloudWatch client speak the service's Query protocol, which every
// CloudWatch endpoint serves (AWS's, LocalStack's, moto's), instead of the SDK's default RPC v2
// CBOR, which moto_server (5.2) answers with 404.
func cloudWatchQuery(o *cloudwatch.Options) {
	o.Protocol = awsquery.New(schemas.GraniteServiceVersion20100801)
}

// lagMetrics are the relay's metrics the console's lag charts show, by their query ids.
var lagMetrics = map[string]metrics.Metric{"age": metrics.OutboxOldestPendingAge, "pending": metrics.OutboxPending}

// CloudWatchLag reads the relay's lag in namespace over [since, until] from CloudWatch: the
// one-minute maxima of OutboxOldestPendingAgeSeconds and OutboxPending with {Service=relay} (a
// fleet relay's figures over all its tenants), oldest first; a minute with only one of the two
// has the other at 0.
func CloudWatchLag(ctx context.Context, cw CloudWatchAPI, namespace string, since, until time.Time) ([]console.LagPoint, error) {
	in := &cloudwatch.GetMetricDataInput{StartTime: aws.Time(since), EndTime: aws.Time(until), ScanBy: cwtypes.ScanByTimestampAscending}
	for _, id := range []string{"age", "pending"} {
		in.MetricDataQueries = append(in.MetricDataQueries, cwtypes.MetricDataQuery{Id: aws.String(id), MetricStat: &cwtypes.MetricStat{
			Metric: &cwtypes.Metric{Namespace: aws.String(namespace), MetricName: aws.String(lagMetrics[id].Name),
				Dimensions: []cwtypes.Dimension{{Name: aws.String(metrics.DimensionService), Value: aws.String(metrics.ServiceRelay)}}},
			Period: aws.Int32(60), Stat: aws.String("Maximum")}})
	}
	byTime := map[time.Time]*console.LagPoint{}
	for {
		out, err := cw.GetMetricData(ctx, in)
		if err != nil {
			return nil, fmt.Errorf("CloudWatch GetMetricData (%s): %w", namespace, err)
		}
		for _, r := range out.MetricDataResults {
			for i, at := range r.Timestamps {
				if i >= len(r.Values) {
					break
				}
				p := byTime[at]
				if p == nil {
					p = &console.LagPoint{At: at}
					byTime[at] = p
				}
				switch aws.ToString(r.Id) {
				case "age":
					p.OldestAge = time.Duration(r.Values[i] * float64(time.Second))
				case "pending":
					p.Pending = int64(r.Values[i])
				}
			}
		}
		if out.NextToken == nil {
			break
		}
		in.NextToken = out.NextToken
	}
	ps := make([]console.LagPoint, 0, len(byTime))
	for _, p := range byTime {
		ps = append(ps, *p)
	}
	slices.SortFunc(ps, func(a, b console.LagPoint) int { return a.At.Compare(b.At) })
	return ps, nil
}

// consoleLagHistory returns Config.LagHistory and its source's name for --cloudwatch-namespace
// in region ("": the command's region).
func (a *app) consoleLagHistory(ctx context.Context, namespace, region string) (func(context.Context, time.Time, time.Time) ([]console.LagPoint, error), string, error) {
	cfg, err := a.awsConfig(ctx)
	if err != nil {
		return nil, "", err
	}
	if region == "" {
		region = cfg.Region
	}
	cw := cloudwatch.NewFromConfig(cfg, cloudWatchQuery, func(o *cloudwatch.Options) { o.Region = region })
	source := fmt.Sprintf("CloudWatch %s/%s and %s {%s=%s} in %s", namespace, metrics.OutboxOldestPendingAge.Name,
		metrics.OutboxPending.Name, metrics.DimensionService, metrics.ServiceRelay, region)
	return func(ctx context.Context, since, until time.Time) ([]console.LagPoint, error) {
		return CloudWatchLag(ctx, cw, namespace, since, until)
	}, source, nil
}
