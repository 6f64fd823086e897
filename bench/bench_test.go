package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestNum(t *testing.T) {
	t.Parallel()
	for in, want := range map[float64]string{0: "0", 999: "999", 1000: "1,000", 1234567.4: "1,234,567", 71733.2: "71,733"} {
		if got := num(in); got != want {
			t.Errorf("num(%v) = %q, want %q", in, got, want)
		}
	}
}

func TestSummarize(t *testing.T) {
	t.Parallel()
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	l := summarize(d)
	if l.N != 100 || l.P50 != 51*time.Millisecond || l.P99 != 100*time.Millisecond || l.Max != 100*time.Millisecond {
		t.Fatalf("summarize = %+v", l)
	}
	if median([]float64{3, 1, 2, 10}) != 2.5 {
		t.Fatal("median of an even sample is the mean of the middle two")
	}
}

// The consumer workload has 10% duplicates, each a message delivered well before it.
func TestConsumerBatches(t *testing.T) {
	t.Parallel()
	batches, unique := consumerBatches(2000, 10)
	seen := map[string]bool{}
	dups, total := 0, 0
	for _, b := range batches {
		if len(b.Records) != 10 {
			t.Fatalf("batch of %d records", len(b.Records))
		}
		for _, r := range b.Records {
			id := *r.MessageAttributes["messageId"].StringValue
			if seen[id] {
				dups++
			}
			seen[id] = true
			total++
		}
	}
	if total != 2000 || unique != len(seen) || total-dups != unique {
		t.Fatalf("total %d, dups %d, unique %d (seen %d)", total, dups, unique, len(seen))
	}
	if ratio := float64(dups) / float64(total); ratio < 0.09 || ratio > 0.11 {
		t.Fatalf("duplicate ratio %.3f, want about 0.10", ratio)
	}
}

// The committed results render into a report with every section and a verdict for every target.
func TestRenderCommittedResults(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("results.json")
	if err != nil {
		t.Skip("no results.json")
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		t.Fatal(err)
	}
	md := rep.Markdown()
	for _, s := range []string{"## Machine", "## Targets", "## 1. Relay", "## 2. Producer", "## 3. Consumer", "## 4. End-to-end", "## 5. Scale", "## Analysis"} {
		if !strings.Contains(md, s) {
			t.Errorf("report lacks %q", s)
		}
	}
	for _, tg := range rep.targets() {
		if tg.Status == "" || tg.Measured == "" {
			t.Errorf("target %q has no verdict or measurement", tg.Name)
		}
	}
	if err := writeChart(filepath.Join(t.TempDir(), "chart.png"), &rep); err != nil {
		t.Fatal(err)
	}
}

// CPU use is per group in cores over the window; the machine's busy share scales to its cores.
func TestCPUBetween(t *testing.T) {
	t.Parallel()
	t0 := time.Unix(0, 0)
	a := cpuSnapshot{at: t0, ticks: map[int]uint64{1: 100, 2: 50}, waitNS: map[int]uint64{1: 0, 2: 0},
		group: map[int]string{1: "x", 2: "y"}, busy: 0, total: 0}
	b := cpuSnapshot{at: t0.Add(2 * time.Second), ticks: map[int]uint64{1: 200, 2: 60, 3: 20}, waitNS: map[int]uint64{1: 1e9, 2: 0, 3: 0},
		group: map[int]string{1: "x", 2: "y", 3: "y"}, busy: 100, total: 200}
	g, _, _ := cpuBetween(a, b)
	if len(g) != 2 || g[0].Group != "x" || g[0].Cores != 0.5 || g[0].RunQueue != 0.5 || g[1].Procs != 2 || g[1].Cores < 0.149 || g[1].Cores > 0.151 {
		t.Fatalf("cpuBetween = %+v", g)
	}
}

// A run of some suites merged onto a full run replaces just those suites and says so.
func TestMergeOnto(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("results.json")
	if err != nil {
		t.Skip("no results.json")
	}
	var base Report
	if err := json.Unmarshal(b, &base); err != nil {
		t.Fatal(err)
	}
	part := &Report{Sizes: fullSizes(), Producer: &ProducerResult{BulkEvents: 1}, ProducerDurable: &ProducerResult{Durable: true},
		SuiteTimes: []suiteTime{{"producer", time.Second}}}
	rep, err := mergeOnto("results.json", part)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Producer.BulkEvents != 1 || rep.ProducerDurable == nil || len(rep.Relay) != len(base.Relay) || len(rep.Merged) > len(base.Merged)+1 ||
		!strings.HasPrefix(rep.Merged[len(rep.Merged)-1], "the producer suites were re-run on") {
		t.Fatalf("merge kept the wrong suites: %+v", rep.Merged)
	}
	if md := rep.Markdown(); !strings.Contains(md, "re-run on") {
		t.Error("the merged report does not say which suites were re-run")
	}
}
