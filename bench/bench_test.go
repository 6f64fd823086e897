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
