package main

import (
	"fmt"
	"strings"
	"text/template"
	"time"
)

// renderNotes renders notes.md, a text/template: the hand-written analysis quotes the numbers of
// the run the report comes from through the values of noteValues ({{.notify_pct}}), so that
// it stays true when the suites run again. A value whose suite did not run is "n/a". A broken
// template renders as it is, with the error, rather than failing the report.
func (r *Report) renderNotes(text string) string {
	t, err := template.New("notes").Option("missingkey=error").Parse(text)
	if err != nil {
		return text + "\n\n(notes.md does not parse as a template: " + err.Error() + ")"
	}
	var b strings.Builder
	if err := t.Execute(&b, r.noteValues()); err != nil {
		return text + "\n\n(notes.md does not render: " + err.Error() + ")"
	}
	return b.String()
}

// noteKeys are the values notes.md may quote. Each is "n/a" unless its suite's results say
// otherwise.
var noteKeys = []string{
	"v_isolation", "isolation_target", "isolation_worst",
	"v_producers", "v_overhead", "producers_clients_max", "notify_min_tx", "notify_tx", "notify_pct", "notify_pct_by_clients",
	"notify_p50", "notify_idle_pct", "write_vs_minimal_pct", "overhead_ratio_1", "overhead_ratio_max",
	"v_wakeup", "wakeup_p50", "wakeup_p99", "wakeup_poll", "wakeup_idle_stmts", "wakeup_busy_stmts",
	"held_warmup", "measure",
}

// sustainedNoteKeys are quoted once per layout, prefixed with "plain_" or "part_".
var sustainedNoteKeys = []string{"v_claim", "v_tput", "horizon", "claim_free", "claim_held", "claim_ratio", "tput_free", "tput_held",
	"tput_ratio", "read_ratio", "sweep_ratio", "poll_ratio", "settle_ratio", "pkidx_free", "pkidx_held", "heap_free", "heap_held",
	"dead_free", "dead_held", "kept"}

// noteValues computes the values notes.md quotes from the report.
func (r *Report) noteValues() map[string]string {
	v := map[string]string{}
	for _, k := range noteKeys {
		v[k] = "n/a"
	}
	for _, k := range scaleoutNoteKeys {
		v[k] = "n/a"
	}
	r.scaleoutNoteValues(v) // issue 25, bench/scaleout.go
	for _, prefix := range []string{"plain_", "part_"} {
		for _, k := range sustainedNoteKeys {
			v[prefix+k] = "n/a"
		}
	}
	status := map[string]string{}
	for _, t := range r.targets() {
		status[t.Name] = strings.Trim(t.Status, "*")
	}
	if iso := r.Isolation; iso != nil && len(iso.Runs) > 0 {
		v["isolation_target"] = isolationTarget.String()
		var unmet []string
		worst := iso.Runs[0]
		for _, run := range iso.Runs {
			if run.All.Max > worst.All.Max {
				worst = run
			}
			if s, ok := status["Isolation "+run.Name]; ok && s != "met" {
				unmet = append(unmet, run.Name+" "+s)
			}
		}
		v["v_isolation"] = "met in every scenario"
		if len(unmet) > 0 {
			v["v_isolation"] = strings.Join(unmet, ", ")
		}
		v["isolation_worst"] = fmt.Sprintf("%s, %s", dur(worst.All.Max), worst.Name)
	}
	if p := r.Producers; p != nil && len(p.Clients) > 0 {
		maxC := p.Clients[len(p.Clients)-1]
		v["producers_clients_max"] = fmt.Sprint(maxC)
		v["v_producers"] = orNA(status[fmt.Sprintf("Concurrent producers, %d clients, durable commits", maxC)])
		v["v_overhead"] = orNA(status["Producer overhead vs the minimal row, durable commits"])
		m, okm := p.run(varMinimal, maxC)
		if n, ok := p.run(varNotify, maxC); ok && okm && m.Rate() > 0 {
			v["notify_min_tx"], v["notify_tx"] = num(m.Rate())+" tx/s", num(n.Rate())+" tx/s"
			v["notify_pct"] = fmt.Sprintf("%.0f%%", 100*n.Rate()/m.Rate())
			v["notify_p50"] = fmt.Sprintf("%s against %s", dur(n.Latency.P50), dur(m.Latency.P50))
			var parts []string
			for _, c := range p.Clients {
				mc, ok1 := p.run(varMinimal, c)
				nc, ok2 := p.run(varNotify, c)
				if ok1 && ok2 && mc.Rate() > 0 {
					parts = append(parts, fmt.Sprintf("%.0f%% with %s", 100*nc.Rate()/mc.Rate(), clientsLabel(c)))
				}
			}
			v["notify_pct_by_clients"] = strings.Join(parts, ", ")
		}
		if i, ok := p.run(varNotifyIdle, maxC); ok && okm && m.Rate() > 0 {
			v["notify_idle_pct"] = fmt.Sprintf("%.0f%%", 100*i.Rate()/m.Rate())
		}
		if w, ok := p.run(varWrite, maxC); ok && okm && m.Rate() > 0 {
			v["write_vs_minimal_pct"] = fmt.Sprintf("%.0f%%", 100*w.Rate()/m.Rate())
		}
		for key, c := range map[string]int{"overhead_ratio_1": p.Clients[0], "overhead_ratio_max": maxC} {
			o, ok1 := p.run(varOrder, c)
			w, ok2 := p.run(varWrite, c)
			mm, ok3 := p.run(varMinimal, c)
			if ratio, ok := addedCostRatio(judgedLatency(w).P50, judgedLatency(mm).P50, judgedLatency(o).P50); ok && ok1 && ok2 && ok3 {
				v[key] = fmt.Sprintf("%.2f", ratio)
			}
		}
	}
	if wk := r.Wakeup; wk != nil {
		v["v_wakeup"] = orNA(status["Relay wake-up at 100 events/s"])
		v["wakeup_p50"], v["wakeup_p99"], v["wakeup_poll"] = dur(wk.Latency.P50), dur(wk.Latency.P99), wk.PollInterval.String()
		v["wakeup_idle_stmts"], v["wakeup_busy_stmts"] = num(wk.IdleStatements), num(wk.BusyStatements)
	}
	if s := r.Sustained; s != nil {
		v["held_warmup"], v["measure"] = s.HeldWarmup.String(), s.Measure.String()
		for layout, prefix := range map[string]string{layoutPlain: "plain_", layoutPartitioned: "part_"} {
			base, held, ok := s.pair(layout)
			if !ok {
				continue
			}
			set := func(k, val string) { v[prefix+k] = val }
			set("v_claim", orNA(status["Claim latency with VACUUM held back, "+layout]))
			set("v_tput", orNA(status["Relay throughput with VACUUM held back, "+layout]))
			set("horizon", held.HorizonAtMeasure.Round(time.Second).String())
			set("claim_free", p50OrNone(base.Claim))
			set("claim_held", p50OrNone(held.Claim))
			set("claim_ratio", ratioOf(base.Claim, held.Claim))
			set("tput_free", num(base.Throughput)+" events/s")
			set("tput_held", num(held.Throughput)+" events/s")
			if f, ok := slowdown(base.Throughput, held.Throughput, false); ok {
				set("tput_ratio", fmt.Sprintf("%.2f×", f))
			}
			for _, k := range []string{stmtRead, stmtSweep, stmtPoll, stmtSettle} {
				set(k+"_ratio", ratioOf(base.Stmts[k], held.Stmts[k]))
			}
			last := func(x SustainedRun) (SizeSample, bool) {
				if len(x.Sizes) == 0 {
					return SizeSample{}, false
				}
				return x.Sizes[len(x.Sizes)-1], true
			}
			if e, ok := last(base); ok {
				set("pkidx_free", mib(e.Index["outbox_event_pending_key_idx"]))
				set("heap_free", mib(e.Heap))
			}
			if e, ok := last(held); ok {
				set("pkidx_held", mib(e.Index["outbox_event_pending_key_idx"]))
				set("heap_held", mib(e.Heap))
			}
			set("dead_free", num(float64(base.DeadTuples)))
			set("dead_held", num(float64(held.DeadTuples)))
			kept := 0
			for _, p := range held.Purges {
				kept = max(kept, p.Kept)
			}
			set("kept", fmt.Sprint(kept))
		}
	}
	return v
}

func orNA(s string) string {
	if s == "" {
		return "n/a"
	}
	return s
}
