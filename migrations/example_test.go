package migrations_test

import (
	"context"
	"fmt"
	"log"

	"github.com/jackc/pgx/v5"

	"github.com/sluicehq/sluice/internal/testdb"
	"github.com/sluicehq/sluice/migrations"
)

// Up applies every embedded migration the database lacks, under an advisory lock: run it at
// start-up, from a deploy hook or with `sluice migrate up`. Running it again changes nothing.
func ExampleUp() {
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, testdb.ForExample("ExampleUp", false)) // an empty database
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)
	for range 2 {
		if err := migrations.Up(ctx, conn); err != nil {
			log.Fatal(err)
		}
	}
	v, err := migrations.Current(ctx, conn)
	if err != nil {
		log.Fatal(err)
	}
	var tables []string
	rows, _ := conn.Query(ctx, `SELECT tablename FROM pg_tables WHERE tablename IN ('outbox_event', 'inbox_event') ORDER BY 1`)
	tables, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("at the latest version:", v == migrations.Latest())
	fmt.Println(tables)
	// Output:
	// at the latest version: true
	// [inbox_event outbox_event]
}

// List shows the embedded migrations, each an up and a down script.
func ExampleList() {
	ms, err := migrations.List()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%04d_%s.up.sql and .down.sql\n", ms[0].Version, ms[0].Name)
	fmt.Println("the last is the latest:", ms[len(ms)-1].Version == migrations.Latest())
	// Output:
	// 0001_outbox.up.sql and .down.sql
	// the last is the latest: true
}
