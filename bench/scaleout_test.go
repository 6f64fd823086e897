package main

import (
	"strings"
	"testing"
	"time"
)

// The suite at a tiny size, on its own cluster: every configuration drains the backlog, and
// each run's breakdown has the relays' statements, rounds, samples and CPU, which the report
// renders with a verdict for each target.
func TestScaleoutSuiteTiny(t *testing.T) {
	ctx, log := clusterTest(t, 3*time.Minute)
	env, err := startScaleoutEnv(ctx, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(env.Close)
	spec := scaleoutSpec{Rows: 3000, Keys: 60, Repeats: 1, Relays: []int{1, 4}, OnePipelines: []int{4}, Delays: []time.Duration{0, 10 * time.Millisecond},
		Rescans: []time.Duration{5 * time.Second}, Timeout: time.Minute}
	res, err := measureScaleout(ctx, log, env, spec)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Runs) != 7 || len(res.Ceiling) != 2 || res.ceiling() <= 0 {
		t.Fatalf("%d runs, %d ceiling runs", len(res.Runs), len(res.Ceiling))
	}
	for _, run := range res.Runs {
		b := run.Breakdown
		if run.Result.Events != spec.Rows || run.Result.Rate() <= 0 || b.Elapsed <= 0 {
			t.Errorf("%d relays, %s: %d events in %s", run.Relays, run.Delay, run.Result.Events, b.Elapsed)
		}
		// Every row was claimed by a round and marked published by one statement or another.
		if b.Rounds.Rounds == 0 || b.Rounds.Claimed < spec.Rows || b.Rounds.Locked == 0 || b.Pipelines != max(2*run.Relays, run.Pipelines) || b.CPUPerEvent() <= 0 {
			t.Errorf("%d relays, %s: rounds %+v, pipelines %d", run.Relays, run.Delay, b.Rounds, b.Pipelines)
		}
		var marked, locks int64
		for _, s := range b.Statements {
			switch s.Class {
			case classMark:
				marked += s.Rows
			case classLock:
				locks += s.Calls
			}
		}
		if marked < int64(spec.Rows) || locks == 0 {
			t.Errorf("%d relays, %s: %d rows marked published, %d lock statements: %+v", run.Relays, run.Delay, marked, locks, b.Statements)
		}
		if b.Samples == 0 || len(b.CPU) == 0 || cpuOf(b.CPU, "PostgreSQL backends of the relays") == "—" {
			t.Errorf("%d relays, %s: %d samples, CPU %+v", run.Relays, run.Delay, b.Samples, b.CPU)
		}
	}
	rep := &Report{Scaleout: res}
	md := rep.Markdown()
	for _, want := range []string{"## 16. Scale-out", "| 4 | 10 ms |", "| 1, Pipelines 4 | 0 ms |", "| 4, RescanInterval 5s | 10 ms |", "ceiling loop, 4 worker(s)", "Statements by class", classRead, "4 relays vs 1, 10 ms, 60 keys"} {
		if !strings.Contains(md, want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	if ts := rep.scaleoutTargets(); len(ts) != 2 || ts[0].Measured == "" || ts[1].Status == "" {
		t.Fatalf("targets %+v", ts)
	}
}

func TestScaleoutClass(t *testing.T) {
	t.Parallel()
	for q, want := range map[string]string{
		"SELECT k FROM unnest($1::text[]) AS k WHERE pg_try_advisory_lock(hashtextextended(k, $2))":          classLock,
		"WITH chain AS (SELECT r.*, k.ord FROM unnest($1::text[])":                                           classRead,
		"UPDATE outbox_event o SET published_at = now(), available_at = NULL":                                classMark,
		"SELECT count(*) FILTER (WHERE pg_advisory_unlock(hashtextextended(k, $1))) FROM unnest($2::text[])": classUnlock,
		"SELECT pg_advisory_unlock_all()":                                                                    classRoundEnd,
		"SET statement_timeout = 15000":                                                                      classSettings,
		"RESET jit":                                                                                          classSettings,
		"commit":                                                                                             classTx,
		"SELECT admin_epoch FROM outbox_control WHERE singleton":                                             classOther,
		"SELECT id FROM outbox_event WHERE published_at IS NULL ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED": classCeiling,
	} {
		if got := scaleoutClass(q); got != want {
			t.Errorf("scaleoutClass(%q) = %q, want %q", q, got, want)
		}
	}
}

// The targets judge two runs only when other work on the machine took about the same cores
// during both; otherwise they report the ratio as not measured.
func TestScaleoutTargetsJudgeComparableRuns(t *testing.T) {
	t.Parallel()
	run := func(relays, workers int, delay time.Duration, rate, others float64) ScaleoutRun {
		return ScaleoutRun{scaleoutConfig: scaleoutConfig{Relays: relays, Workers: workers, Delay: delay},
			Result:    RelayResult{Events: int(rate), Elapsed: time.Second},
			Breakdown: ScaleoutBreakdown{Others: others}}
	}
	const at = 10 * time.Millisecond
	for _, c := range []struct {
		four, others4 float64
		want          []string
	}{
		{16_000, 1.0, []string{"met", "met"}},
		{12_000, 1.1, []string{"**not met**", "met"}},
		{16_000, 0.5, []string{"**not measured**", "met"}},
	} {
		rep := &Report{Scaleout: &ScaleoutResult{Keys: 1000,
			Ceiling: []ScaleoutRun{run(0, 4, 0, 12_000, 1.0)},
			Runs:    []ScaleoutRun{run(1, 0, at, 10_000, 1.0), run(4, 0, at, c.four, c.others4)}}}
		ts := rep.scaleoutTargets()
		if len(ts) != 2 || ts[0].Status != c.want[0] || ts[1].Status != c.want[1] {
			t.Errorf("4 relays at %v events/s with %.2f cores of other work: %+v, want %v", c.four, c.others4, ts, c.want)
		}
	}
}
