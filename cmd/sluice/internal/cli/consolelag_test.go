package cli_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch"
	"github.com/aws/aws-sdk-go-v2/service/cloudwatch/schemas"
	cwtypes "github.com/aws/aws-sdk-go-v2/service/cloudwatch/types"
	"github.com/aws/smithy-go/transport/http/protocol/awsquery"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/localaws"
	"github.com/sluicehq/sluice/internal/testwait"
	"github.com/sluicehq/sluice/pkg/metrics"
)

// With --cloudwatch-namespace, the overview's lag charts show the relay's metrics as
// CloudWatch has them (moto_server here, which serves PutMetricData and GetMetricData over the
// Query protocol): the relay's one-minute maxima of the last hour, not the console's own
// samples; a region without datapoints falls back to the console's samples and says so.
func TestConsoleLagChartsFromCloudWatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	moto, err := localaws.Start(ctx, localaws.Options{Kind: localaws.Moto})
	if errors.Is(err, localaws.ErrNotInstalled) {
		t.Skip("moto_server is not installed (pip install 'moto[server]'): ", err)
	}
	require.NoError(t, err)
	t.Cleanup(moto.Stop)
	cfg, err := localaws.Config(ctx, moto.URL)
	require.NoError(t, err)
	cw := cloudwatch.NewFromConfig(cfg, func(o *cloudwatch.Options) { o.Protocol = awsquery.New(schemas.GraniteServiceVersion20100801) })
	now := time.Now().Truncate(time.Minute)
	relay := []cwtypes.Dimension{{Name: aws.String(metrics.DimensionService), Value: aws.String(metrics.ServiceRelay)}}
	var data []cwtypes.MetricDatum
	for _, p := range []struct {
		ago          time.Duration
		age, pending float64
	}{{30 * time.Minute, 30, 3}, {20 * time.Minute, 120, 9}, {10 * time.Minute, 45, 4}} {
		data = append(data,
			cwtypes.MetricDatum{MetricName: aws.String(metrics.OutboxOldestPendingAge.Name), Dimensions: relay, Timestamp: aws.Time(now.Add(-p.ago)), Value: aws.Float64(p.age)},
			cwtypes.MetricDatum{MetricName: aws.String(metrics.OutboxPending.Name), Dimensions: relay, Timestamp: aws.Time(now.Add(-p.ago)), Value: aws.Float64(p.pending)})
	}
	_, err = cw.PutMetricData(ctx, &cloudwatch.PutMetricDataInput{Namespace: aws.String("SluiceConsoleTest"), MetricData: data})
	require.NoError(t, err)

	b := setup(t)
	b.insertOutbox(t, outboxRow{aggID: "o-1"}) // the console's own samples: 1 pending
	b.env["AWS_ENDPOINT_URL"] = moto.URL
	requireOneLineError(t, b.run(t, "console", "--listen", "127.0.0.1:0", "--cloudwatch-region", "eu-west-1"), 2, "--cloudwatch-region needs --cloudwatch-namespace")
	base, _ := serveConsole(t, b, "--listen", "127.0.0.1:0", "--cloudwatch-namespace", "SluiceConsoleTest", "--region", localaws.Region())
	var page string
	testwait.Until(t, "the charts from CloudWatch", func() bool {
		_, page = getPage(t, base+"/")
		require.NotContains(t, page, "could not be read", page)
		return strings.Contains(page, "From CloudWatch SluiceConsoleTest/OutboxOldestPendingAgeSeconds and OutboxPending {Service=relay} in "+localaws.Region())
	})
	require.Contains(t, page, "Oldest pending row&#39;s age: now 45s, peak 2m0s (3 samples)")
	require.Contains(t, page, "Pending rows: now 4, peak 9 (3 samples)")

	// A region without the relay's metrics (moto 5.2 ignores the namespace of a query with
	// dimensions, so another namespace would find these).
	empty, _ := serveConsole(t, b, "--listen", "127.0.0.1:0", "--cloudwatch-namespace", "SluiceConsoleTest", "--region", "ap-south-2")
	testwait.Until(t, "the console's own samples, saying why", func() bool {
		_, page = getPage(t, empty+"/")
		return strings.Contains(page, "has no datapoints in the last hour: the console&#39;s own samples meanwhile")
	})
	require.Contains(t, page, "Sampled by this console every 10s")
	require.Regexp(t, `Pending rows: now 1, peak 1 \(\d+ samples\)`, page)
}
