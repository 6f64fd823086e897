package outbox

import (
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// hostileValues are field and header values that Message.prepare accepts and that grow most
// when a destination renders them: JSON escapes (quote, backslash, tab, newline, U+2028),
// multi-byte characters, and partition keys long enough for Kinesis to hash.
var hostileValues = []string{"", "a", `"`, `\`, "\t\n\r", "\u2028\u2029", "é", "<>&", "o-42",
	strings.Repeat(`"`, 300), strings.Repeat("\u2028", 257), strings.Repeat("é", 300), strings.Repeat("x", 4000)}

// hostileMessages are valid messages over every combination of hostileValues in each field
// and up to four headers.
func hostileMessages(t *testing.T) []Message {
	var msgs []Message
	for i, v := range hostileValues {
		for j, w := range hostileValues {
			for h := 0; h <= 4; h++ {
				m := Message{Topic: "orders", EventType: "E" + v, AggregateType: v, AggregateID: w, PartitionKey: hostileValues[(i+j)%len(hostileValues)],
					Payload: []byte("{}")}
				if h > 0 {
					m.Headers = map[string]string{}
					for k := range h {
						val := hostileValues[(i+j+k)%len(hostileValues)]
						if val == "" {
							val = "v"
						}
						m.Headers[fmt.Sprintf("x-h.%d", k)] = val
					}
				}
				p, err := m.prepare(0, defaultMaxWriteBytes())
				require.NoError(t, err, "message %d/%d/%d", i, j, h)
				msgs = append(msgs, p)
			}
		}
	}
	return msgs
}

// The fast path may accept a message without measuring it only if its bound is never below
// what the exact measure counts: otherwise Write would let through a message some destination
// refuses.
func TestOverheadBoundIsNeverBelowTheExactMeasure(t *testing.T) {
	t.Parallel()
	for _, m := range hostileMessages(t) {
		_, exact := writeSize(m)
		require.GreaterOrEqual(t, overheadBound(m), exact, "message %+v", m)
	}
}

// Whatever the path, Write refuses exactly the messages the exact measure puts above the limit:
// around the limit, where the bound no longer decides, prepare's verdict is writeSize's.
func TestWriteRefusesExactlyWhatTheExactMeasurePutsAboveTheLimit(t *testing.T) {
	t.Parallel()
	w, err := NewWriter(WriterConfig{MaxMessageBytes: 64 << 10})
	require.NoError(t, err)
	base := Message{Topic: "orders", EventType: "OrderCreated", AggregateType: "order", AggregateID: "o-42",
		PartitionKey: "o-42", Headers: map[string]string{"x-note": "\u2028\"quoted\"\t"}}
	_, overhead := writeSize(base)
	for _, extra := range []int{-2000, -1, 0, 1, 2000} {
		n := w.cfg.MaxMessageBytes - overhead + extra
		m := base
		m.Payload = []byte(`"` + strings.Repeat("a", n-2) + `"`)
		size, _ := writeSize(m)
		_, _, err := w.prepare([]Message{m}, nil)
		if size > w.cfg.MaxMessageBytes {
			require.ErrorIs(t, err, ErrInvalidMessage, "payload %d bytes, message %d", n, size)
		} else {
			require.NoError(t, err, "payload %d bytes, message %d", n, size)
		}
	}
}
