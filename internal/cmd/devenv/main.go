// Command devenv runs a command with a local PostgreSQL and SNS/SQS endpoint around it:
//
//	go run ./internal/cmd/devenv -- go test ./...
//
// It starts a throwaway PostgreSQL cluster unless TEST_DATABASE_URL is set, and an AWS emulator
// unless AWS_ENDPOINT_URL is set: fauxqs, or moto_server with SLUICE_AWS_EMULATOR=moto. It
// exports both variables to the command, and stops everything it started when the command ends
// or is interrupted. Its exit code is the command's. When moto is chosen and not installed it
// says so and leaves AWS_ENDPOINT_URL unset: the tests that need it then skip, naming it.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"syscall"

	"github.com/sluicehq/sluice/internal/localaws"
	"github.com/sluicehq/sluice/internal/pgcluster"
	"github.com/sluicehq/sluice/internal/testdb"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: devenv -- COMMAND [ARGS...]")
		return 2
	}
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	env := os.Environ()

	if os.Getenv(testdb.EnvURL) == "" {
		c, err := pgcluster.Start(ctx, pgcluster.Options{})
		if err != nil {
			fmt.Fprintln(os.Stderr, "devenv: start PostgreSQL:", err)
			return 1
		}
		defer c.Stop()
		env = append(env, testdb.EnvURL+"="+c.URL)
		log.Info("devenv: PostgreSQL started", "url", c.URL)
	}
	if os.Getenv(localaws.EnvEndpoint) == "" {
		e, err := localaws.Start(ctx, localaws.Options{})
		switch {
		case errors.Is(err, localaws.ErrNotInstalled) && localaws.Chosen() == localaws.Moto:
			log.Warn("devenv: the AWS emulator is not installed; tests that need it will skip", "emulator", localaws.Chosen(), "error", err)
		case err != nil:
			fmt.Fprintf(os.Stderr, "devenv: start %s: %v\n", localaws.Chosen(), err)
			return 1
		default:
			defer e.Stop()
			// Name the emulator too, so a test can tell what serves the endpoint (fauxqs has no
			// EventBridge or Kinesis) from an endpoint the user chose (LocalStack).
			env = append(env, localaws.EnvEndpoint+"="+e.URL, localaws.EnvEmulator+"="+e.Kind)
			log.Info("devenv: AWS emulator started", "emulator", e.Kind, "endpoint", e.URL)
		}
	}

	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "devenv:", err)
		return 1
	}
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		for s := range sigs {
			_ = cmd.Process.Signal(s)
		}
	}()
	err := cmd.Wait()
	signal.Stop(sigs)
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "devenv:", err)
		return 1
	}
	return 0
}
