package outbox

import (
	"crypto/sha256"
	"encoding/hex"
	"time"
	"unicode/utf8"

	"github.com/sluicehq/sluice/internal/wire"
)

// envelopeOf returns the JSON envelope (wire.Envelope) that carries e to destinations without
// message attributes: the contract's attributes under "metadata", the payload under "data",
// byte for byte as stored (never re-encoded: neither compacted nor escaped), so that its size
// is the metadata's and the payload's (envelopeSize).
func envelopeOf(e *Event) ([]byte, error) {
	meta, err := envelopeMetadata(e)
	if err != nil {
		return nil, err
	}
	b := make([]byte, 0, len(envelopeOpen)+len(meta)+len(envelopeData)+len(e.Payload)+len(envelopeClose))
	b = append(b, envelopeOpen...)
	b = append(b, meta...)
	b = append(b, envelopeData...)
	b = append(b, e.Payload...)
	return append(b, envelopeClose...), nil
}

// envelopeMetadata encodes e's envelope metadata (without escaping <, > and &).
func envelopeMetadata(e *Event) ([]byte, error) {
	meta := wire.EnvelopeMetadata{
		MessageID: e.EventID.String(), EventType: e.EventType, AggregateType: e.AggregateType,
		AggregateID: e.AggregateID, PartitionKey: e.PartitionKey,
		CreatedAt: e.CreatedAt.UTC().Format(time.RFC3339Nano), ExtendedPayloadSize: e.ExtendedPayloadSize,
	}
	if len(e.Headers) > 0 {
		meta.Headers = make(map[string]string, len(e.Headers))
		for k, v := range e.Headers {
			if checkHeaderName(k) == "" && checkAttrValue(v) == "" {
				meta.Headers[k] = v
			}
		}
	}
	return encodeJSON(meta)
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
