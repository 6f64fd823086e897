package lambdaenv

import (
	"strconv"

	"github.com/sluicehq/sluice/pkg/outbox"
)

// RelayEnvironment is RelaySettings' inverse for deployment tools (the CDK constructs): the
// variables that make RelaySettings return cfg's settings. Fields left at zero are left out, so
// the relay applies outbox's default; topics, Publisher, Metrics and Logger are not settings.
// It walks the same table as RelaySettings, so the two cannot name different variables.
func RelayEnvironment(cfg outbox.RelayConfig) map[string]string {
	env := map[string]string{}
	ints, durations := relaySettings(&cfg)
	for _, s := range ints {
		if *s.v != 0 {
			env[s.env] = strconv.Itoa(*s.v)
		}
	}
	for _, s := range durations {
		if *s.v != 0 {
			env[s.env] = s.v.String()
		}
	}
	return env
}
