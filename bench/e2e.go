package main

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
)

// E2EResult is the end-to-end suite's outcome: measured, or why not.
type E2EResult struct {
	Measured bool
	// Reason it was not measured.
	Reason string
}

// runE2ESuite would measure commit-to-apply latency through the local AWS (emulator plus the
// real relay and consumer binaries) at 100 and 1,000 events/s. It needs the Lambdas and a
// runner that starts them against the emulator; until those are in the repository it records
// that the suite is blocked instead of inventing numbers.
func runE2ESuite(_ context.Context, log *slog.Logger, _ *Env, _ Sizes, rep *Report) error {
	missing := ""
	for _, f := range []string{"../lambdas/relay/main.go", "../lambdas/consumer/main.go"} {
		if _, err := os.Stat(f); err != nil {
			missing = filepath.Clean(f[3:])
			break
		}
	}
	if missing == "" {
		missing = "a runner that starts the real relay and consumer binaries against the emulator from Go"
	} else {
		missing += " (the Lambda itself)"
	}
	rep.E2E = E2EResult{Reason: "blocked: the repository does not yet have " + missing +
		"; the end-to-end suite needs the Lambdas and their local runner (issue 4)."}
	log.Warn("end-to-end suite not measured", "reason", rep.E2E.Reason)
	return nil
}
