package inbox_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/pkg/inbox"
)

type OrderCreated struct {
	OrderID    string `json:"orderId"`
	TotalCents int    `json:"totalCents"`
}

// A consumer Lambda: the handler's writes and the inbox row commit together, once per message.
func ExampleNewConsumer() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL")) // once per cold start
	if err != nil {
		log.Fatal(err)
	}
	r := inbox.NewRouter(inbox.FailUnknown)
	r.Handle("OrderCreated", func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		o, err := inbox.Decode[OrderCreated](msg)
		if err != nil {
			return err // the record fails and comes back; after maxReceiveCount it reaches the DLQ
		}
		_, err = tx.Exec(ctx, `INSERT INTO invoice (order_id, cents) VALUES ($1, $2)`, o.OrderID, o.TotalCents)
		return err
	})
	consumer, err := inbox.NewConsumer(pool, inbox.ConsumerConfig{Consumer: "billing", Router: r, Metrics: os.Stdout})
	if err != nil {
		log.Fatal(err)
	}
	lambda.StartWithOptions(consumer.HandleSQS, lambda.WithEnableSIGTERM(pool.Close))
}

// The asynchronous inbox: the consumer Lambda only stores each message (Mode: inbox.Async);
// a worker you run applies the stored rows, retrying with backoff and parking what keeps
// failing (inbox.ListParked, inbox.RetryParked).
func ExampleNewProcessor() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	r := inbox.NewRouter(inbox.FailUnknown)
	r.Handle("OrderCreated", func(ctx context.Context, tx pgx.Tx, msg inbox.Message) error {
		_, err := tx.Exec(ctx, `INSERT INTO invoice (message_id) VALUES ($1)`, msg.ID)
		return err
	})
	p, err := inbox.NewProcessor(pool, inbox.ProcessorConfig{Consumer: "billing", Router: r, MaxAttempts: 5})
	if err != nil {
		log.Fatal(err)
	}
	// Run applies rows until ctx ends (it returns ctx's error then) or a database error.
	log.Println(p.Run(ctx))
}

func ExampleParse() {
	body := `{"orderId":"ord-1","totalCents":990}`
	attr := func(s string) events.SQSMessageAttribute {
		return events.SQSMessageAttribute{DataType: "String", StringValue: &s}
	}
	msg, err := inbox.Parse(events.SQSMessage{
		MessageId: "sqs-1",
		Body:      body,
		MessageAttributes: map[string]events.SQSMessageAttribute{
			"messageId":   attr("0193a2b4-7c1d-7e3f-8a9b-0c1d2e3f4a5b"),
			"eventType":   attr("OrderCreated"),
			"createdAt":   attr("2026-11-29T10:40:00Z"),
			"traceparent": attr("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	o, _ := inbox.Decode[OrderCreated](msg)
	fmt.Println(msg.ID, msg.IDSource, msg.EventType, msg.CreatedAt.Format("15:04"))
	fmt.Println(msg.Traceparent())
	fmt.Printf("%+v\n", o)

	_, err = inbox.Parse(events.SQSMessage{MessageId: "sqs-2", Body: "not json"})
	fmt.Println(err)
	// Output:
	// 0193a2b4-7c1d-7e3f-8a9b-0c1d2e3f4a5b attribute OrderCreated 10:40
	// 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
	// {OrderID:ord-1 TotalCents:990}
	// inbox: bad message: body is not JSON (8 bytes)
}

func ExampleReport_Response() {
	rep := inbox.Report{Results: []inbox.Result{
		{SQSMessageID: "a", Outcome: inbox.Applied},
		{SQSMessageID: "b", Outcome: inbox.Duplicate},
		{SQSMessageID: "c", Outcome: inbox.Failed},
	}}
	fmt.Printf("%+v\n", rep.Response())
	// Output: {BatchItemFailures:[{ItemIdentifier:c}]}
}
