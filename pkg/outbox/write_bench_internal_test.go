package outbox

import (
	"context"
	"encoding/json"
	"testing"
)

// BenchmarkWritePrepare is Write's client-side work for one typical event: validation, the
// payload checked as PostgreSQL's json input would, defaults, size check and the statement's arguments.
func BenchmarkWritePrepare(b *testing.B) {
	w, err := NewWriter(WriterConfig{})
	if err != nil {
		b.Fatal(err)
	}
	msg := Message{Topic: "orders", AggregateType: "order", AggregateID: "o-42", EventType: "OrderCreated",
		Payload: json.RawMessage(`{"orderId":"o-42","customerId":"c-42","totalCents":1299,"currency":"EUR","schemaVersion":1}`)}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		prepared, headers, err := w.prepare([]Message{msg}, w.traceHeaders(ctx))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = insertStatement(prepared, headers)
	}
}
