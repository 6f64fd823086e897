package inbox_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-lambda-go/events"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/pkg/inbox"
)

func TestFixturesRoundTrip(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"sqs_raw.json", "sqs_sns_envelope.json", "sqs_fifo.json"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ev := loadEvent(t, name)
			require.NotEmpty(t, ev.Records)
			b, err := json.Marshal(ev)
			require.NoError(t, err)
			var again events.SQSEvent
			require.NoError(t, json.Unmarshal(b, &again))
			require.Equal(t, ev, again)
		})
	}
}

func TestParseRawFixture(t *testing.T) {
	t.Parallel()
	ev := loadEvent(t, "sqs_raw.json")
	msg, err := inbox.Parse(ev.Records[0])
	require.NoError(t, err)
	require.Equal(t, "0193a2b4-7c1d-7e3f-8a9b-0c1d2e3f4a5b", msg.ID)
	require.Equal(t, inbox.IDFromAttribute, msg.IDSource)
	require.Equal(t, "OrderCreated", msg.EventType)
	require.Equal(t, "order", msg.AggregateType)
	require.Equal(t, "ord-1001", msg.AggregateID)
	require.Equal(t, time.Date(2026, 11, 29, 10, 40, 0, 123456000, time.UTC), msg.CreatedAt)
	require.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", msg.Traceparent())
	require.Equal(t, map[string]string{"traceparent": msg.Traceparent()}, msg.Headers, "only non-contract attributes are headers")
	require.Equal(t, "059f36b4-87a3-44ab-83d2-661975830a7d", msg.SQSMessageID)
	require.Equal(t, 1, msg.ReceiveCount)
	require.False(t, msg.Enveloped)
	require.JSONEq(t, ev.Records[0].Body, string(msg.Payload))

	type order struct {
		OrderID    string `json:"orderId"`
		TotalCents int    `json:"totalCents"`
	}
	o, err := inbox.Decode[order](msg)
	require.NoError(t, err)
	require.Equal(t, order{OrderID: "ord-1001", TotalCents: 12990}, o)

	msg2, err := inbox.Parse(ev.Records[1])
	require.NoError(t, err)
	require.Equal(t, "OrderCancelled", msg2.EventType)
	require.Equal(t, 3, msg2.ReceiveCount)
	require.Empty(t, msg2.Headers)
}

func TestParseEnvelopeFixture(t *testing.T) {
	t.Parallel()
	ev := loadEvent(t, "sqs_sns_envelope.json")
	msg, err := inbox.Parse(ev.Records[0])
	require.NoError(t, err)
	require.True(t, msg.Enveloped)
	require.Equal(t, "arn:aws:sns:eu-west-1:123456789012:orders", msg.TopicARN)
	require.Equal(t, "0193a2b4-7c1d-7e3f-8a9b-0c1d2e3f4b01", msg.ID, "the messageId attribute wins over the SNS MessageId")
	require.Equal(t, inbox.IDFromAttribute, msg.IDSource)
	require.Equal(t, "OrderCreated", msg.EventType)
	require.Equal(t, "ord-2002", msg.AggregateID)
	require.Equal(t, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", msg.Traceparent())
	require.JSONEq(t, `{"orderId":"ord-2002","customerId":"cus-7","totalCents":500,"currency":"EUR","schemaVersion":1}`, string(msg.Payload))
	require.Equal(t, `{"orderId":"ord-2002","customerId":"cus-7","totalCents":500,"currency":"EUR","schemaVersion":1}`, string(msg.Payload), "payload byte for byte")

	// Second record: no messageId attribute, so the SNS MessageId is the dedup key.
	msg, err = inbox.Parse(ev.Records[1])
	require.NoError(t, err)
	require.Equal(t, "d1a8b4c2-3e4f-5a6b-7c8d-9e0f1a2b3c4d", msg.ID)
	require.Equal(t, inbox.IDFromSNS, msg.IDSource)
	require.True(t, msg.CreatedAt.IsZero())
}

func TestParseFIFOFixture(t *testing.T) {
	t.Parallel()
	ev := loadEvent(t, "sqs_fifo.json")
	groups := []string{}
	for _, r := range ev.Records {
		msg, err := inbox.Parse(r)
		require.NoError(t, err)
		groups = append(groups, msg.GroupID)
	}
	require.Equal(t, []string{"order-1", "order-1", "order-2"}, groups)
}

func TestParseFallsBackToSQSMessageID(t *testing.T) {
	t.Parallel()
	r := record("sqs-1", `{}`, map[string]string{"eventType": "X"})
	msg, err := inbox.Parse(r)
	require.NoError(t, err)
	require.Equal(t, "sqs-1", msg.ID)
	require.Equal(t, inbox.IDFromSQS, msg.IDSource)
}

func str(s string) *string { return &s }

func TestParseBadInput(t *testing.T) {
	t.Parallel()
	good := map[string]string{"messageId": "m1", "eventType": "X"}
	envelope := func(message string) string {
		return `{"Type":"Notification","MessageId":"sns-1","TopicArn":"arn:aws:sns:eu-west-1:1:t","Message":` + message +
			`,"MessageAttributes":{"eventType":{"Type":"String","Value":"X"}}}`
	}
	binary := record("s", `{}`, good)
	binary.MessageAttributes["eventType"] = events.SQSMessageAttribute{DataType: "Binary", BinaryValue: []byte("X")}
	nilString := record("s", `{}`, good)
	nilString.MessageAttributes["messageId"] = events.SQSMessageAttribute{DataType: "String"}
	numberCreated := record("s", `{}`, good)
	numberCreated.MessageAttributes["createdAt"] = events.SQSMessageAttribute{DataType: "Number", StringValue: str("1796035200")}
	nul := record("s", `{}`, map[string]string{"messageId": "m\x001", "eventType": "X"})
	noIDs := record("", `{}`, map[string]string{"eventType": "X"})

	for _, tc := range []struct {
		name string
		rec  events.SQSMessage
		want string
	}{
		{"body not JSON", record("s", `order created!`, good), "body is not JSON"},
		{"truncated JSON", record("s", `{"orderId":`, good), "body is not JSON"},
		{"empty body", record("s", ``, good), "empty body"},
		{"missing eventType", record("s", `{}`, map[string]string{"messageId": "m1"}), "missing attribute eventType"},
		{"no attributes at all", record("s", `{}`, nil), "no message attributes"},
		{"empty eventType", record("s", `{}`, map[string]string{"messageId": "m1", "eventType": " "}), "eventType is empty"},
		{"empty messageId", record("s", `{}`, map[string]string{"messageId": "", "eventType": "X"}), "messageId is empty"},
		{"binary eventType", binary, `eventType has type "Binary"`},
		{"messageId without value", nilString, "attribute messageId"},
		{"createdAt as Number", numberCreated, `createdAt has type "Number"`},
		{"createdAt not RFC 3339", record("s", `{}`, map[string]string{"messageId": "m1", "eventType": "X", "createdAt": "yesterday"}), "not an RFC 3339 time"},
		{"long createdAt quoted up to a whole character", record("s", `{}`, map[string]string{"messageId": "m1", "eventType": "X", "createdAt": strings.Repeat("x", 63) + "éé"}), `xxx..."`},
		{"NUL in messageId", nul, "not valid UTF-8 text"},
		{"no dedup key", noIDs, "no dedup key"},
		{"envelope Message not JSON", record("s", envelope(`"hello"`), nil), "body is not JSON"},
		{"envelope Message not a string", record("s", envelope(`{"a":1}`), nil), "SNS envelope"},
		{"envelope without Message", record("s", `{"Type":"Notification","TopicArn":"arn:x","MessageId":"m"}`, nil), "has no Message"},
		{"envelope mistyped attribute", record("s", `{"Type":"Notification","TopicArn":"arn:x","MessageId":"m","Message":"{}","MessageAttributes":{"eventType":{"Type":"Binary","Value":"WA=="}}}`, nil), `eventType has type "Binary"`},
		{"envelope attributes not an object", record("s", `{"Type":"Notification","TopicArn":"arn:x","MessageId":"m","Message":"{}","MessageAttributes":[1]}`, nil), "SNS envelope"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := inbox.Parse(tc.rec)
			require.ErrorIs(t, err, inbox.ErrBadMessage)
			require.Contains(t, err.Error(), tc.want)
			require.True(t, utf8.ValidString(err.Error()), "the error text is valid UTF-8: %q", err.Error())
		})
	}
}

// FuzzParse feeds arbitrary SQS records (as JSON) to Parse: it must never panic, and whatever it
// accepts must be usable (a dedup key, an event type, a JSON payload, storable text).
// Seeds: the fixtures plus testdata/fuzz/FuzzParse.
func FuzzParse(f *testing.F) {
	files, _ := filepath.Glob(filepath.Join("testdata", "sqs_*.json"))
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		var ev events.SQSEvent
		if err := json.Unmarshal(b, &ev); err != nil {
			f.Fatal(err)
		}
		for _, r := range ev.Records {
			rb, _ := json.Marshal(r)
			f.Add(rb)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var r events.SQSMessage
		if json.Unmarshal(data, &r) != nil {
			return
		}
		msg, err := inbox.Parse(r)
		if err != nil {
			if !strings.HasPrefix(err.Error(), inbox.ErrBadMessage.Error()) {
				t.Fatalf("error does not start with the sentinel: %v", err)
			}
			return
		}
		if msg.ID == "" || strings.TrimSpace(msg.EventType) == "" {
			t.Fatalf("accepted a message without id or event type: %+v", msg)
		}
		if !json.Valid(msg.Payload) {
			t.Fatalf("accepted a payload that is not JSON: %q", msg.Payload)
		}
		if msg.Headers == nil {
			t.Fatal("nil headers")
		}
		var v any
		if err := msg.Decode(&v); err != nil {
			t.Fatalf("decode of an accepted payload failed: %v", err)
		}
	})
}
