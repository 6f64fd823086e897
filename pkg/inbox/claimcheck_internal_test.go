package inbox

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/wire"
)

// A source without message attributes (EventBridge, Kinesis) carries the claim check's size in
// wire.Envelope's metadata.extendedPayloadSize: offloadedPointer turns it and the envelope's
// data into Message.Offloaded, which fetchPayload resolves like an SQS record's.
func TestOffloadedPointerFromAnEnvelope(t *testing.T) {
	t.Parallel()
	raw := `{"metadata":{"messageId":"m1","eventType":"E","partitionKey":"k","createdAt":"2026-11-29T10:00:00Z","extendedPayloadSize":1234},` +
		`"data":["` + wire.PointerClass + `",{"s3BucketName":"b","s3Key":"outbox/m1"}]}`
	var env wire.Envelope
	require.NoError(t, json.Unmarshal([]byte(raw), &env))
	o, err := offloadedPointer(env.Metadata.ExtendedPayloadSize, env.Data)
	require.NoError(t, err)
	require.Equal(t, &Offloaded{Bucket: "b", Key: "outbox/m1", Size: 1234}, o)

	for _, body := range []string{`{"a":1}`, `["x",{"s3BucketName":"b","s3Key":"k"}]`, `["` + wire.PointerClass + `",{"s3BucketName":"b"}]`, `[1,2,3]`} {
		_, err := offloadedPointer(1, []byte(body))
		require.True(t, errors.Is(err, ErrBadMessage), "%s: %v", body, err)
	}
	for s, want := range map[string]int{"12": 12, " 7 ": 7, "1.5E6": 1500000, "0": 0} {
		n, err := payloadSize(s)
		require.NoError(t, err, s)
		require.Equal(t, want, n)
	}
	for _, s := range []string{"", "-1", "1.5", "x", "1e40"} {
		_, err := payloadSize(s)
		require.Error(t, err, s)
	}
}
