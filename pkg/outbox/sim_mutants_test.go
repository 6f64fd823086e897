//go:build sluice_mutants

package outbox

// The mutation check (make test-mutants): each planted bug of mutants.go, one at a time, under
// the simulator's seeds; the check fails unless the checker finds each in at least a tenth of
// them. Built only with the sluice_mutants tag, where mutant is a variable.

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// mutants lists the planted bugs of mutants.go (make test-mutants runs the simulator once per
// entry).
var mutants = []string{mutantUnlockBeforeCommit, mutantCachedPosition, mutantQuarantineSkipped, mutantSweepAboveFrontier,
	mutantJumpSkipsLate, mutantCancelledPublished, mutantTimedOutAcked, mutantLastFailedAcked, mutantKeyRowsShareCall,
	mutantStreamTrusted, mutantStreamComplete}

// streamMutants are the planted bugs of the WAL wake-up: TestMutants runs every seed with the
// stream (sim_stream_test.go) against them.
var streamMutants = map[string]bool{mutantStreamTrusted: true, mutantStreamComplete: true}

// simMutantCatchRate is the least share of seeds in which each planted bug must be found.
const simMutantCatchRate = 0.10

// TestMutants plants each bug (SLUICE_MUTANT=a,b restricts them) and runs the simulator's
// seeds (-sim.seeds, as TestSimulation) against it.
func TestMutants(t *testing.T) {
	simMu.Lock()
	defer simMu.Unlock()
	planted := mutants
	if only := os.Getenv("SLUICE_MUTANT"); only != "" {
		planted = strings.Split(only, ",")
		for _, m := range planted {
			if !slices.Contains(mutants, m) {
				t.Fatalf("SLUICE_MUTANT: no mutant %q (have %s)", m, strings.Join(mutants, ", "))
			}
		}
	}
	t.Cleanup(func() { mutant = "" })
	base, n := simSeedRange()
	var lines []string
	share := *simStreamShare
	t.Cleanup(func() { *simStreamShare = share })
	for _, m := range planted {
		mutant = m
		*simStreamShare = share
		if streamMutants[m] { // a stream bug can show only where relays follow the WAL
			*simStreamShare = 1
		}
		start := time.Now()
		var mu sync.Mutex
		kinds := map[string]int{}
		caught := runSeeds(t, base, n, func(t *testing.T, res *simResult) {
			mu.Lock()
			defer mu.Unlock()
			for _, k := range res.checker.kinds() {
				kinds[k]++
			}
			if testing.Verbose() && len(res.checker.counts) > 0 {
				t.Logf("mutant %s caught:\n%s", m, res.checker)
			}
		})
		var by []string
		for _, k := range sortedKinds(kinds) {
			by = append(by, fmt.Sprintf("%s %d", k, kinds[k]))
		}
		line := fmt.Sprintf("mutant %s: caught in %d of %d seeds from %d (%.0f%%; by %s), %s",
			m, caught, n, base, 100*float64(caught)/float64(n), strings.Join(by, ", "), time.Since(start).Round(time.Second))
		lines = append(lines, line)
		fmt.Fprintln(os.Stderr, "sim: "+line)
		simSummaryLine(t, line)
		if float64(caught) < simMutantCatchRate*float64(n) {
			t.Errorf("%s: below the %.0f%% required", line, 100*simMutantCatchRate)
		}
	}
	fmt.Fprintln(os.Stderr, "sim: mutation check:\n"+strings.Join(lines, "\n"))
}

// sortedKinds returns the finding kinds of counts, sorted.
func sortedKinds(counts map[string]int) []string {
	var ks []string
	for k := range counts {
		ks = append(ks, k)
	}
	slices.Sort(ks)
	return ks
}
