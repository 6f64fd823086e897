package audit_test

import (
	"context"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/audit"
	"github.com/sluicehq/sluice/internal/localaws"
	"github.com/sluicehq/sluice/internal/testdb"
)

// subscriptionPolicy subscribes a new queue to a new topic with the filter policy and scope,
// through the standard AWS APIs, and reads them back as the CLI does
// (GetSubscriptionAttributes).
func subscriptionPolicy(t *testing.T, policy, scope string) *audit.FilterPolicy {
	t.Helper()
	ctx := context.Background()
	cfg := localaws.TestConfig(t)
	snsc, sqsc := sns.NewFromConfig(cfg), sqs.NewFromConfig(cfg)
	name := "audit-filter-" + uuid.NewString()[:8]
	topic, err := snsc.CreateTopic(ctx, &sns.CreateTopicInput{Name: aws.String(name)})
	require.NoError(t, err)
	q, err := sqsc.CreateQueue(ctx, &sqs.CreateQueueInput{QueueName: aws.String(name)})
	require.NoError(t, err)
	qa, err := sqsc.GetQueueAttributes(ctx, &sqs.GetQueueAttributesInput{QueueUrl: q.QueueUrl, AttributeNames: []sqstypes.QueueAttributeName{sqstypes.QueueAttributeNameQueueArn}})
	require.NoError(t, err)
	attrs := map[string]string{"FilterPolicy": policy, "RawMessageDelivery": "true"}
	if scope != "" {
		attrs["FilterPolicyScope"] = scope // absent: SNS's default, MessageAttributes
	}
	sub, err := snsc.Subscribe(ctx, &sns.SubscribeInput{TopicArn: topic.TopicArn, Protocol: aws.String("sqs"), Endpoint: aws.String(qa.Attributes["QueueArn"]),
		ReturnSubscriptionArn: true, Attributes: attrs})
	require.NoError(t, err)
	got, err := snsc.GetSubscriptionAttributes(ctx, &sns.GetSubscriptionAttributesInput{SubscriptionArn: sub.SubscriptionArn})
	require.NoError(t, err)
	require.JSONEq(t, policy, got.Attributes["FilterPolicy"], "the emulator keeps the filter policy")
	p, err := audit.ParseFilterPolicy(got.Attributes["FilterPolicy"], got.Attributes["FilterPolicyScope"])
	require.NoError(t, err)
	return p
}

// A subscription's filter policy decides which events the consumer can receive: events it
// filters out are not missing (Report.Filtered), whether the policy reads the message
// attributes or the body; an event it delivers and the consumer lacks is still missing.
func TestAuditDoesNotCountFilteredOutEventsAsMissing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testdb.Pool(t)
	insert := func(eventType, payload string, at time.Duration) string {
		return oneID(t, db, `INSERT INTO outbox_event
			(event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload, created_at, published_at)
			VALUES (gen_random_uuid(), 'orders', 'order', 'o-1', $1, 'o-1', $2, $3, $3) RETURNING event_id::text`,
			eventType, payload, t0.Add(at))
	}
	apply := func(id, eventType string, at time.Duration) {
		_, err := db.Exec(ctx, `INSERT INTO inbox_event (consumer, message_id, event_type, created_at, processed_at) VALUES ('billing', $1, $2, $3, $3)`,
			id, eventType, t0.Add(at))
		require.NoError(t, err)
	}
	euCreated := insert("OrderCreated", `{"region": "eu", "total": 120}`, time.Second)
	apply(euCreated, "OrderCreated", time.Second)
	usCreated := insert("OrderCreated", `{"region": "us", "total": 80}`, 2*time.Second)
	cancelled := insert("OrderCancelled", `{"region": "eu", "total": 120}`, 3*time.Second)
	lost := insert("OrderCreated", `{"region": "eu", "total": 300}`, 4*time.Second) // delivered by every policy below, never applied

	opts := audit.Options{Consumer: "billing", Since: t0, Until: t0.Add(time.Minute), EventTypes: []string{"OrderCreated", "OrderCancelled"},
		Now: func() time.Time { return t0.Add(time.Hour) }}
	missing := func(r audit.Report) []string {
		var ids []string
		for _, g := range r.Missing {
			ids = append(ids, g.EventID)
		}
		return ids
	}
	r, err := audit.Run(ctx, db, db, opts)
	require.NoError(t, err)
	require.ElementsMatch(t, []string{usCreated, cancelled, lost}, missing(r), "without the policy every unapplied event is missing")

	for _, c := range []struct {
		policy, scope string
		missing       []string
	}{
		{`{"eventType": ["OrderCreated"], "$or": [{"aggregateType": [{"prefix": "ord"}]}, {"aggregateId": ["none"]}]}`, "", []string{usCreated, lost}},
		{`{"region": ["eu"], "total": [{"numeric": [">", 100]}]}`, audit.ScopeMessageBody, []string{cancelled, lost}},
	} {
		opts.Filters = []*audit.FilterPolicy{subscriptionPolicy(t, c.policy, c.scope)}
		r, err := audit.Run(ctx, db, db, opts)
		require.NoError(t, err)
		require.ElementsMatch(t, c.missing, missing(r), c.policy)
		require.Equal(t, 3-len(c.missing), r.Filtered, "the unapplied events the policy filters out", c.policy)
	}
}

// The policy language, case by case, as SNS documents it.
func TestFilterPolicyMatches(t *testing.T) {
	t.Parallel()
	attrs := map[string]string{"eventType": "OrderCreated", "aggregateType": "order", "traceparent": "00-ab"}
	for policy, want := range map[string]bool{
		`{"eventType": ["OrderCreated", "OrderPaid"]}`:                          true,
		`{"eventType": ["OrderPaid"]}`:                                          false,
		`{"eventType": [{"anything-but": ["OrderPaid"]}]}`:                      true,
		`{"eventType": [{"anything-but": {"prefix": "Order"}}]}`:                false,
		`{"eventType": [{"equals-ignore-case": "ordercreated"}]}`:               true,
		`{"eventType": [{"suffix": "Created"}]}`:                                true,
		`{"tenant": [{"exists": false}]}`:                                       true,
		`{"tenant": [{"exists": true}]}`:                                        false,
		`{"tenant": [{"anything-but": ["x"]}]}`:                                 false,
		`{"eventType": ["OrderPaid"], "$or": [{"aggregateType": ["order"]}]}`:   false,
		`{"$or": [{"eventType": ["OrderPaid"]}, {"aggregateType": ["order"]}]}`: true,
		`{"eventType": [{"numeric": [">", 1]}]}`:                                false,
	} {
		p, err := audit.ParseFilterPolicy(policy, "")
		require.NoError(t, err, policy)
		got, err := p.Matches(attrs, nil)
		require.NoError(t, err)
		require.Equal(t, want, got, policy)
	}
	body := []byte(`{"order": {"region": "eu", "items": ["book", "pen"], "total": 42.5, "gift": false}}`)
	for policy, want := range map[string]bool{
		`{"order": {"region": ["eu"]}}`:                            true,
		`{"order": {"items": ["pen"]}}`:                            true,
		`{"order": {"total": [{"numeric": [">=", 40, "<", 50]}]}}`: true,
		`{"order": {"total": [42.5]}}`:                             true,
		`{"order": {"gift": [true]}}`:                              false,
		`{"order": {"coupon": [{"exists": false}]}}`:               true,
		`{"order": {"region": ["us"]}}`:                            false,
	} {
		p, err := audit.ParseFilterPolicy(policy, audit.ScopeMessageBody)
		require.NoError(t, err, policy)
		got, err := p.Matches(nil, body)
		require.NoError(t, err)
		require.Equal(t, want, got, policy)
	}
	_, err := audit.ParseFilterPolicy(`{"eventType": [{"wildcard": "Order*"}]}`, "")
	require.ErrorContains(t, err, `unknown operator "wildcard"`)
	_, err = audit.ParseFilterPolicy(`{"order": {"region": ["eu"]}}`, "")
	require.ErrorContains(t, err, "nested keys need the MessageBody scope")
}
