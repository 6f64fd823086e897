// Command sluice is the operator CLI of the sluice transactional outbox and inbox: schema
// migrations, the relay, status, quarantined and parked rows, DLQ redrive, replay and retention.
// Run `sluice --help`; docs/operations.md maps each alarm to the command to run.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/sluicehq/sluice/cmd/sluice/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		// After the first signal, let a second one end the process the usual way.
		<-ctx.Done()
		stop()
	}()
	code := cli.Run(ctx, os.Args[1:], cli.IO{In: os.Stdin, Out: os.Stdout, Err: os.Stderr})
	stop()
	os.Exit(code)
}
