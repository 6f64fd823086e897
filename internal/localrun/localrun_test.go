package localrun

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/stretchr/testify/require"
)

// The proxy forwards untouched requests, refuses throttled ones without forwarding, and forwards
// then fails the "lost response" ones.
func TestFaultProxyBreaksTheConfiguredShares(t *testing.T) {
	t.Parallel()
	var reached atomic.Int64
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		_, _ = io.WriteString(w, "ok")
	}))
	defer backend.Close()
	get := func(p *FaultProxy) (int, string) {
		resp, err := http.Post(p.URL, "text/plain", strings.NewReader("Action=PublishBatch"))
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	p, err := StartFaultProxy(backend.URL, Faults{Throttle: 1})
	require.NoError(t, err)
	defer p.Close()
	status, body := get(p)
	require.Equal(t, http.StatusBadRequest, status)
	require.Contains(t, body, "<Code>Throttling</Code>")
	require.Zero(t, reached.Load(), "a throttled request is not forwarded")

	p.SetFaults(Faults{LoseResponse: 1})
	status, _ = get(p)
	require.Equal(t, http.StatusInternalServerError, status)
	require.EqualValues(t, 1, reached.Load(), "a lost response was forwarded first")

	p.SetFaults(Faults{})
	status, body = get(p)
	require.Equal(t, http.StatusOK, status)
	require.Equal(t, "ok", body)
	require.Equal(t, ProxyStats{Forwarded: 1, Throttled: 1, LostResponses: 1}, p.Stats())
}

// Received SQS messages become the Lambda SQS event, attributes included.
func TestSQSEventHasTheLambdaShape(t *testing.T) {
	t.Parallel()
	ev := SQSEvent([]sqstypes.Message{{
		MessageId: aws.String("m-1"), ReceiptHandle: aws.String("rh"), Body: aws.String(`{"a":1}`),
		Attributes: map[string]string{"ApproximateReceiveCount": "2", "MessageGroupId": "g"},
		MessageAttributes: map[string]sqstypes.MessageAttributeValue{
			"messageId": {DataType: aws.String("String"), StringValue: aws.String("evt-1")},
		},
	}}, "arn:aws:sqs:us-east-1:000000000000:q")
	b, err := json.Marshal(ev)
	require.NoError(t, err)
	var generic struct {
		Records []map[string]any `json:"Records"`
	}
	require.NoError(t, json.Unmarshal(b, &generic))
	require.Len(t, generic.Records, 1)
	r := generic.Records[0]
	require.Equal(t, "m-1", r["messageId"])
	require.Equal(t, "aws:sqs", r["eventSource"])
	require.Equal(t, "arn:aws:sqs:us-east-1:000000000000:q", r["eventSourceARN"])
	require.Equal(t, "2", r["attributes"].(map[string]any)["ApproximateReceiveCount"])
	require.Equal(t, "evt-1", r["messageAttributes"].(map[string]any)["messageId"].(map[string]any)["stringValue"])
}

// The faults are spread so that each configured share shows up early and holds over any run of
// requests, however the requests are scheduled.
func TestFaultSpreadCoversEveryShareEarlyAndEvenly(t *testing.T) {
	t.Parallel()
	f := Faults{Throttle: 0.15, Unavailable: 0.10, LoseResponse: 0.15}
	firstOf := map[string]uint64{}
	counts := map[string]int{}
	for n := uint64(1); n <= 1000; n++ {
		x := spread(n)
		kind := "forward"
		switch {
		case x < f.Throttle:
			kind = "throttle"
		case x < f.Throttle+f.Unavailable:
			kind = "unavailable"
		case x < f.Throttle+f.Unavailable+f.LoseResponse:
			kind = "lose"
		}
		if _, ok := firstOf[kind]; !ok {
			firstOf[kind] = n
		}
		counts[kind]++
	}
	for _, kind := range []string{"throttle", "unavailable", "lose", "forward"} {
		require.LessOrEqual(t, firstOf[kind], uint64(10), "%s within the first 10 requests", kind)
	}
	require.InDelta(t, 150, counts["throttle"], 5)
	require.InDelta(t, 100, counts["unavailable"], 5)
	require.InDelta(t, 150, counts["lose"], 5)
}
