package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/audit"
	"github.com/sluicehq/sluice/internal/demoapp"
	"github.com/sluicehq/sluice/internal/localrun"
)

// TestAuditFindsWhatThePipelineLost runs the real relay and consumer Lambdas, then loses two
// events the two ways production does: one is published to a topic no queue is subscribed to
// (SNS acknowledges it, and it never reaches the queue), and one applied event's inbox row is
// deleted behind the consumer's back. The audit names exactly those two.
func TestAuditFindsWhatThePipelineLost(t *testing.T) {
	t.Parallel()
	const unsubscribed = "orders-misrouted"
	var unsubscribedARN string
	b := setup(t, func(o *localrun.StackOptions) {
		o.Topics = func(p localrun.Pipeline) map[string]string {
			unsubscribedARN = strings.TrimSuffix(p.TopicARN, "-topic") + "-unsubscribed"
			return map[string]string{unsubscribed: unsubscribedARN}
		}
	})
	since := time.Now().Add(-time.Minute)
	out, err := b.stack.SNS.CreateTopic(b.ctx, &sns.CreateTopicInput{Name: aws.String(unsubscribedARN[strings.LastIndex(unsubscribedARN, ":")+1:])})
	require.NoError(t, err)
	require.Equal(t, unsubscribedARN, aws.ToString(out.TopicArn))

	b.place(t, 30, 5, 0, nil)
	// Outside the bundle's order prefix: the ledger check does not expect it.
	lost := demoapp.OrderCreated{OrderID: "lost-" + b.prefix, Customer: "c-lost", Seq: 1, AmountCents: 100, Currency: "EUR"}
	b.placeOn(t, unsubscribed, []demoapp.OrderCreated{lost})
	b.waitApplied(t, 90*time.Second)
	var lostID string
	b.waitUntil(t, 60*time.Second, "the misrouted event published", func() (bool, string) {
		err := b.pool.QueryRow(b.ctx, `SELECT event_id::text FROM outbox_event WHERE topic = $1 AND published_at IS NOT NULL`, unsubscribed).Scan(&lostID)
		return err == nil, fmt.Sprint(err)
	})

	var deletedID string
	require.NoError(t, b.pool.QueryRow(b.ctx, `DELETE FROM inbox_event WHERE consumer = $1
		AND message_id = (SELECT message_id FROM inbox_event WHERE consumer = $1 ORDER BY received_at LIMIT 1)
		RETURNING message_id`, localrun.DefaultConsumerName).Scan(&deletedID))

	r, err := audit.Run(b.ctx, b.pool, b.pool, audit.Options{Consumer: localrun.DefaultConsumerName, Since: since, AlarmAfter: time.Nanosecond})
	require.NoError(t, err)
	var missing []string
	for _, g := range r.Missing {
		missing = append(missing, g.EventID)
		require.Equal(t, "absent", g.InboxState)
		require.True(t, g.Overdue)
	}
	require.ElementsMatch(t, []string{lostID, deletedID}, missing)
	require.Empty(t, r.Unpublished)
	require.EqualValues(t, 31, r.Cost.OutboxEvents)
	require.EqualValues(t, 29, r.Cost.InboxEvents)
	require.Positive(t, r.Lag.P50, "the lag is the real commit-to-apply time")
}
