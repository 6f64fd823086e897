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

// BenchmarkCheckPayload is the payload check alone (UTF-8, nesting, JSON grammar), for a
// typical event and a 4 KiB one: what Write would save per event by leaving the grammar to
// PostgreSQL's json input, which parses it again.
func BenchmarkCheckPayload(b *testing.B) {
	small := []byte(`{"orderId":"o-42","customerId":"c-42","totalCents":1299,"currency":"EUR","schemaVersion":1}`)
	large := []byte(`{"lines":[`)
	for len(large) < 4<<10 {
		large = append(large, `{"sku":"sku-1234","qty":2,"priceCents":1299,"note":"gift wrap \u00e9"},`...)
	}
	large = append(large[:len(large)-1], `]}`...)
	for _, c := range []struct {
		name string
		p    []byte
	}{{"typical", small}, {"4KiB", large}} {
		b.Run(c.name, func(b *testing.B) {
			b.SetBytes(int64(len(c.p)))
			for b.Loop() {
				if p := checkPayload(c.p); p != "" {
					b.Fatal(p)
				}
			}
		})
	}
}
