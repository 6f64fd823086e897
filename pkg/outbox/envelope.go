package outbox

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice/internal/wire"
)

// envelopeOf returns the JSON envelope (wire.Envelope) that carries e to destinations without
// message attributes: the contract's attributes under "metadata", the payload under "data".
func envelopeOf(e *Event) ([]byte, error) {
	env := wire.Envelope{
		Metadata: wire.EnvelopeMetadata{
			MessageID: e.EventID.String(), EventType: e.EventType, AggregateType: e.AggregateType,
			AggregateID: e.AggregateID, PartitionKey: e.PartitionKey,
			CreatedAt: e.CreatedAt.UTC().Format(time.RFC3339Nano), ExtendedPayloadSize: e.ExtendedPayloadSize,
		},
		Data: json.RawMessage(e.Payload),
	}
	if len(e.Headers) > 0 {
		env.Metadata.Headers = make(map[string]string, len(e.Headers))
		for k, v := range e.Headers {
			if checkHeaderName(k) == "" && checkAttrValue(v) == "" {
				env.Metadata.Headers[k] = v
			}
		}
	}
	return json.Marshal(env)
}

// streamKey turns a partition key into one a stream accepts (Kinesis: 1 to 256 Unicode
// characters): the key itself when it fits, a stable SHA-256 of it otherwise, "_" for "".
func streamKey(key string) string {
	if key == "" {
		return "_"
	}
	if utf8.RuneCountInString(key) <= 256 && utf8.ValidString(key) {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "sha256-" + hex.EncodeToString(sum[:])
}
