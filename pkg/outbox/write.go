package outbox

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/propagation"
)

// Executor is what Write needs: a pgx.Tx, or anything with the same Exec and CopyFrom
// (a *pgx.Conn or *pgxpool.Pool works too, but then the write is not part of your transaction).
type Executor interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	CopyFrom(ctx context.Context, table pgx.Identifier, columns []string, rows pgx.CopyFromSource) (int64, error)
}

// WriterConfig configures a Writer.
type WriterConfig struct {
	// MaxMessageBytes is the largest message accepted, measured as the strictest destination
	// counts it: Write does not know which destination the relay maps a topic to, so it takes
	// the largest of every kind's MessageSize (SNS body and attributes, the EventBridge entry
	// with its envelope and the longest Source, the Kinesis record with its partition key, the
	// Kafka record batch). Defaults to 261,888 bytes (MessageLimits{}.Smallest()), the smallest
	// limit of the destinations at AWS's defaults (an EventBridge event delivered to a queue of
	// 256 KiB), which every relay can publish. Without a claim check, keep it at most the
	// smallest limit the deployment's relays use (RelayConfig.MessageLimits.Smallest()), or a
	// row Write accepted could be quarantined as too large. With the relay's claim check
	// (RelayConfig.ClaimCheck, docs/claimcheck.md) raise it up to the claim check's
	// MaxPayloadBytes (32 MiB by default; at most 256 MiB, RelaySetting("ClaimCheck.MaxPayloadBytes")):
	// whatever its destination would refuse is stored in S3. Whatever the maximum, a
	// message may carry at most 16 KiB beside its payload, so that the claim
	// check's pointer always fits. The row keeps its whole payload in PostgreSQL either way.
	MaxMessageBytes int
	// CopyThreshold is the number of messages from which Write uses COPY instead of one
	// multi-row INSERT. Defaults to 100.
	CopyThreshold int
	// Propagator injects the span context active in Write's ctx into each message's headers,
	// so that the consumer's span joins the writer's trace (see docs/tracing.md). A message
	// whose Headers already hold one of the propagator's fields is left as it is. Injected
	// headers count against the attribute limit Write holds every message to, whatever its
	// destination (SNS's; EventBridge, Kinesis and Kafka carry the headers too), like any other: they are added only while
	// they fit (count and size), and a message with no room is written without them rather than
	// refused, so tracing never makes a Write fail. Defaults to W3C trace context
	// (propagation.TraceContext: traceparent and tracestate); pass
	// propagation.NewCompositeTextMapPropagator() to inject nothing, or
	// otel.GetTextMapPropagator() for the global one.
	Propagator propagation.TextMapPropagator
}

// defaultMaxWriteBytes is WriterConfig.MaxMessageBytes's default: the smallest message limit
// of the destinations at their defaults (an EventBridge event delivered to a queue of the
// default size), so that whatever Write accepts, every destination takes.
func defaultMaxWriteBytes() int { return MessageLimits{}.Smallest() }

// maxOffloadBytes is the largest payload a claim check may store: WriterConfig.MaxMessageBytes'
// bound.
func maxOffloadBytes() int { return int(RelaySetting("ClaimCheck.MaxPayloadBytes").Max) }

// WithDefaults returns c with every zero field set to its default.
func (c WriterConfig) WithDefaults() WriterConfig {
	if c.MaxMessageBytes == 0 {
		c.MaxMessageBytes = defaultMaxWriteBytes()
	}
	if c.CopyThreshold == 0 {
		c.CopyThreshold = 100
	}
	if c.Propagator == nil {
		c.Propagator = defaultPropagator
	}
	return c
}

func (c WriterConfig) validate() error {
	if maxBytes := maxOffloadBytes(); c.MaxMessageBytes < 1 || c.MaxMessageBytes > maxBytes {
		return fmt.Errorf("outbox: MaxMessageBytes must be between 1 and %d (ClaimCheck.MaxPayloadBytes' maximum; above %d only with the relay's claim check), got %d",
			maxBytes, defaultMaxWriteBytes(), c.MaxMessageBytes)
	}
	if c.CopyThreshold < 1 {
		return fmt.Errorf("outbox: CopyThreshold must be positive, got %d", c.CopyThreshold)
	}
	return nil
}

// Writer writes messages into the caller's transaction. The zero value is not usable; use
// NewWriter, or the package-level Write for the defaults.
type Writer struct {
	cfg WriterConfig
}

// NewWriter returns a Writer with cfg (zero fields take their defaults).
func NewWriter(cfg WriterConfig) (*Writer, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Writer{cfg: cfg}, nil
}

var defaultWriter = &Writer{cfg: WriterConfig{}.WithDefaults()}

// Write inserts msgs into the outbox inside tx, in one round trip, and returns the messages
// as written (with EventID, PartitionKey and the trace headers it injected filled). The span
// context active in ctx, if any, goes into each message's headers (W3C traceparent, see
// WriterConfig.Propagator) unless the message carries trace headers of its own. It never begins, commits or rolls back:
// the events become visible to the relay exactly when the caller's transaction commits.
// Invalid input is refused before the database is touched, with a *ValidationError.
func Write(ctx context.Context, tx Executor, msgs ...Message) ([]Message, error) {
	return defaultWriter.Write(ctx, tx, msgs...)
}

var columns = []string{"event_id", "topic", "aggregate_type", "aggregate_id", "event_type", "partition_key", "payload", "headers"}

// Write is the package-level Write with this Writer's configuration.
func (w *Writer) Write(ctx context.Context, tx Executor, msgs ...Message) ([]Message, error) {
	prepared, headers, err := w.prepare(msgs, w.traceHeaders(ctx))
	if err != nil || len(prepared) == 0 {
		return nil, err
	}
	if len(prepared) >= w.cfg.CopyThreshold {
		_, err := tx.CopyFrom(ctx, pgx.Identifier{"outbox_event"}, columns, pgx.CopyFromSlice(len(prepared), func(i int) ([]any, error) {
			m := prepared[i]
			return []any{m.EventID, m.Topic, m.AggregateType, m.AggregateID, m.EventType, m.PartitionKey, string(m.Payload), string(headers[i])}, nil
		}))
		if err != nil {
			return nil, fmt.Errorf("copy %d outbox rows: %w", len(prepared), err)
		}
		return prepared, nil
	}
	sql, args := insertStatement(prepared, headers)
	if _, err := tx.Exec(ctx, sql, args...); err != nil {
		return nil, fmt.Errorf("insert %d outbox rows: %w", len(prepared), err)
	}
	return prepared, nil
}

// Queue adds the insert of msgs to b, so that it travels in the same round trip as the
// statements you queue beside it; send b inside your transaction (tx.SendBatch). It validates
// like Write, before anything is queued, and returns the messages as they will be written; a
// database error surfaces when the batch's results are read or closed. Queue has no context,
// so it injects no trace headers: use QueueContext to carry the active span.
func Queue(b *pgx.Batch, msgs ...Message) ([]Message, error) {
	return defaultWriter.Queue(b, msgs...)
}

// QueueContext is Queue that also injects the span context active in ctx into the messages'
// headers, as Write does.
func QueueContext(ctx context.Context, b *pgx.Batch, msgs ...Message) ([]Message, error) {
	return defaultWriter.QueueContext(ctx, b, msgs...)
}

// Queue is the package-level Queue with this Writer's configuration.
func (w *Writer) Queue(b *pgx.Batch, msgs ...Message) ([]Message, error) {
	return w.queue(b, msgs, nil)
}

// QueueContext is the package-level QueueContext with this Writer's configuration.
func (w *Writer) QueueContext(ctx context.Context, b *pgx.Batch, msgs ...Message) ([]Message, error) {
	return w.queue(b, msgs, w.traceHeaders(ctx))
}

func (w *Writer) queue(b *pgx.Batch, msgs []Message, trace map[string]string) ([]Message, error) {
	prepared, headers, err := w.prepare(msgs, trace)
	if err != nil || len(prepared) == 0 {
		return nil, err
	}
	sql, args := insertStatement(prepared, headers)
	b.Queue(sql, args...)
	return prepared, nil
}

// prepare validates msgs, fills their defaults, adds the trace headers (see withTrace) and
// encodes their headers.
func (w *Writer) prepare(msgs []Message, trace map[string]string) ([]Message, [][]byte, error) {
	prepared := make([]Message, len(msgs))
	headers := make([][]byte, len(msgs))
	for i, m := range msgs {
		p, err := m.prepare(i, w.cfg.MaxMessageBytes)
		if err != nil {
			return nil, nil, err
		}
		if !surelyFits(p, w.cfg.MaxMessageBytes) {
			size, overhead := writeSize(p)
			if overhead > maxMessageOverheadBytes {
				return nil, nil, &ValidationError{Index: i, Field: "Headers", Problem: fmt.Sprintf("the message carries %d bytes beside its payload (attributes, headers and partition key, as the strictest destination counts them), above the %d Write allows, so that a claim check's pointer always fits",
					overhead, maxMessageOverheadBytes)}
			}
			if size > w.cfg.MaxMessageBytes {
				return nil, nil, &ValidationError{Index: i, Field: "Payload", Problem: fmt.Sprintf("message is %d bytes as the strictest destination counts it (payload %d bytes), above the publishable %d bytes%s",
					size, len(p.Payload), w.cfg.MaxMessageBytes, raiseHint(w.cfg.MaxMessageBytes))}
			}
		}
		if len(trace) > 0 {
			p.Headers = withTrace(p, trace, w.cfg.Propagator.Fields(), w.cfg.MaxMessageBytes)
		}
		hb := []byte("{}")
		if len(p.Headers) > 0 {
			if hb, err = json.Marshal(p.Headers); err != nil {
				return nil, nil, fmt.Errorf("encode headers of message %d: %w", i, err)
			}
		}
		prepared[i], headers[i] = p, hb
	}
	return prepared, headers, nil
}

// raiseHint tells, after a refusal at limit, how to write larger payloads.
func raiseHint(limit int) string {
	if limit >= maxOffloadBytes() {
		return ""
	}
	if limit > defaultMaxWriteBytes() {
		return " (WriterConfig.MaxMessageBytes; at most ClaimCheck.MaxPayloadBytes' maximum, 256 MiB)"
	}
	return " (WriterConfig.MaxMessageBytes): to write larger payloads, turn on the relay's S3 claim check " +
		"(RelayConfig.ClaimCheck, SLUICE_CLAIM_CHECK_BUCKET; docs/claimcheck.md) and raise MaxMessageBytes to its MaxPayloadBytes"
}

// insertOneSQL and insertOneWithHeadersSQL insert one row, the common case (an event with the
// state change that caused it): a plain VALUES row is cheaper for PostgreSQL to plan and run
// than unnest over eight one-element arrays, and without headers the column's default ('{}')
// saves parsing a jsonb parameter.
const (
	insertOneSQL = `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload)
	VALUES ($1, $2, $3, $4, $5, $6, $7)`
	insertOneWithHeadersSQL = `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload, headers)
	VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`
)

// insertStatement returns the statement and arguments that insert prepared: one row as a
// VALUES row, more as one insertSQL over arrays.
func insertStatement(prepared []Message, headers [][]byte) (string, []any) {
	if len(prepared) == 1 {
		m := prepared[0]
		args := []any{m.EventID, m.Topic, m.AggregateType, m.AggregateID, m.EventType, m.PartitionKey, string(m.Payload)}
		if len(m.Headers) == 0 {
			return insertOneSQL, args
		}
		return insertOneWithHeadersSQL, append(args, string(headers[0]))
	}
	return insertSQL, insertArgs(prepared, headers)
}

// insertSQL inserts any number of rows in one statement from parallel arrays.
const insertSQL = `INSERT INTO outbox_event (event_id, topic, aggregate_type, aggregate_id, event_type, partition_key, payload, headers)
	SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::json[], $8::jsonb[])`

// insertArgs turns prepared messages into insertSQL's arrays.
func insertArgs(prepared []Message, headers [][]byte) []any {
	n := len(prepared)
	var (
		ids                               = make([]uuid.UUID, n)
		topics, aggTypes, aggIDs, evTypes = make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		keys, payloads, hdrs              = make([]string, n), make([]string, n), make([]string, n)
	)
	for i, m := range prepared {
		ids[i], topics[i], aggTypes[i], aggIDs[i], evTypes[i] = m.EventID, m.Topic, m.AggregateType, m.AggregateID, m.EventType
		keys[i], payloads[i], hdrs[i] = m.PartitionKey, string(m.Payload), string(headers[i])
	}
	return []any{ids, topics, aggTypes, aggIDs, evTypes, keys, payloads, hdrs}
}

// writeSize returns m's size as the strictest destination counts it (strictestSize: the
// largest of every kind's MessageSize, with the longest EventBridge Source and createdAt), and
// what of it is not the payload. Write does not know m's destination (the relay's
// configuration maps topics to destinations), so it holds every message to all of them.
func writeSize(m Message) (size, overhead int) {
	e := &Event{EventID: m.EventID, Topic: m.Topic, AggregateType: m.AggregateType, AggregateID: m.AggregateID,
		EventType: m.EventType, PartitionKey: m.PartitionKey, Headers: m.Headers}
	size = strictestSize(e, len(m.Payload))
	return size, size - len(m.Payload)
}
