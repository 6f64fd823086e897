package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// guard is what every command that changes data goes through before it changes anything
// (purge, partition maintain --older-than, partition convert, redrive, replay, dead retry,
// migrate down, fleet add and fleet remove): it prints the plan, stops there with --dry-run,
// asks on a terminal, proceeds with --yes, and refuses on a non-terminal without --yes.
//
// Every command of the tree says what it changes with [changesAnnotation]: guard.flags marks
// it guarded, readsOnly and unguarded mark the others, and a test walks the tree and fails on a
// command that says nothing, or on an unguarded one it was not told about.
type guard struct {
	dryRun, yes, json bool
}

// changesAnnotation is the key of the cobra annotation that says what a command changes:
// changesGuarded, changesNothing, or changesUnguarded followed by the reason.
const changesAnnotation = "sluice.changes"

const (
	changesGuarded   = "guarded"
	changesNothing   = "nothing"
	changesUnguarded = "unguarded: "
)

func annotate(cmd *cobra.Command, value string) {
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[changesAnnotation] = value
}

// readsOnly marks commands that change nothing (they read, or print help).
func readsOnly(cmds ...*cobra.Command) {
	for _, c := range cmds {
		annotate(c, changesNothing)
	}
}

// unguarded marks a command that changes data without the guard, saying why that is safe
// (it only adds what is missing, or does the service's own work).
func unguarded(cmd *cobra.Command, why string) {
	annotate(cmd, changesUnguarded+why)
}

func (g *guard) flags(cmd *cobra.Command, what string) {
	annotate(cmd, changesGuarded)
	fl := cmd.Flags()
	fl.BoolVar(&g.dryRun, "dry-run", false, "print exactly what would "+what+", and change nothing")
	fl.BoolVarP(&g.yes, "yes", "y", false, "do not ask for confirmation (scripts; without a terminal on stdin it is required)")
	fl.BoolVar(&g.json, "json", false, "print the plan, progress and result as JSON lines on stdout")
}

// ErrGuarantee is returned when an action would break one of sluice's guarantees and the flag
// that accepts that risk was not given: nothing was changed.
var ErrGuarantee = errors.New("refused: it would break a guarantee")

// guaranteeError names the broken guarantee and the flag that accepts the risk.
type guaranteeError struct{ msg string }

func (e guaranteeError) Error() string        { return e.msg }
func (e guaranteeError) Is(target error) bool { return target == ErrGuarantee }

// proceed decides, once the plan was printed, whether to change anything: false (and no error)
// on a dry run; asks on a terminal unless --yes; refuses without a terminal and without --yes.
func (a *app) proceed(g guard, question, action string) (bool, error) {
	if g.dryRun {
		return false, nil
	}
	if g.yes {
		return true, nil
	}
	if !a.io.IsTerminal(a.io.In) {
		return false, fmt.Errorf("refusing to %s (%w): stdin is not a terminal; pass --yes to confirm, or --dry-run to see the plan. Nothing was changed", action, ErrNotConfirmed)
	}
	fmt.Fprintf(a.io.Err, "%s [y/N] ", question)
	var answer string
	_, _ = fmt.Fscanln(a.io.In, &answer)
	switch strings.ToLower(strings.TrimSpace(answer)) {
	case "y", "yes":
		return true, nil
	}
	return false, fmt.Errorf("refusing to %s (%w): nothing was changed", action, ErrNotConfirmed)
}

// proceedOrStop is proceed for a Confirm callback: nil to go on, errDryRun on a dry run (the
// command then ends without an error), or the refusal.
func (a *app) proceedOrStop(g guard, question, action string) error {
	ok, err := a.proceed(g, question, action)
	if err == nil && !ok {
		return errDryRun
	}
	return err
}

// ignoreDryRun ends a command without an error after a dry run's plan.
func ignoreDryRun(err error) error {
	if errors.Is(err, errDryRun) {
		return nil
	}
	return err
}

// printPlan prints a guarded command's plan: one JSON line {"event":"plan"} with --json, else
// text, after "Dry run: nothing is changed." on a dry run.
func (a *app) printPlan(g guard, op string, plan any, text func(io.Writer)) {
	if g.json {
		emitJSON(a.io.Out, map[string]any{"event": "plan", "op": op, "dry_run": g.dryRun, "plan": plan})
		return
	}
	if g.dryRun {
		fmt.Fprintln(a.io.Out, "Dry run: nothing is changed.")
	}
	text(a.io.Out)
}

// emitJSON writes v as one JSON line.
func emitJSON(w io.Writer, v any) {
	b, _ := json.Marshal(v)
	fmt.Fprintln(w, string(b))
}

// stopAtBatch returns a context for a batched operation that is cancelled only between
// batches: at(ctx) is called at each batch boundary and cancels the returned context once the
// caller's ctx ended (Ctrl-C), so no statement or request is cut short. interrupted reports
// whether that happened.
func stopAtBatch(ctx context.Context) (work context.Context, at func(), interrupted func() bool, cancel context.CancelFunc) {
	work, cancel = context.WithCancel(context.WithoutCancel(ctx))
	stopped := false
	at = func() {
		if ctx.Err() != nil {
			stopped = true
			cancel()
		}
	}
	return work, at, func() bool { return stopped || ctx.Err() != nil }, cancel
}

// meterMode is how a meter shows progress.
type meterMode int

const (
	meterLines meterMode = iota // a plain line at most once a second (logs, pipes)
	meterBar                    // a bar redrawn in place (a terminal)
	meterJSON                   // one JSON object per update (--json)
)

// meter shows a long operation's progress: what is done, out of how many, the rate and the
// time left.
type meter struct {
	w       io.Writer
	mode    meterMode
	label   string // "purge outbox_event: deleted"
	op      string // "purge" (JSON)
	target  string // "outbox_event" (JSON)
	unit    string // "rows", "messages"
	total   int64  // 0: unknown
	done    int64
	start   time.Time
	last    time.Time
	printed bool
	now     func() time.Time
}

// newMeter returns a meter writing JSON lines to out with asJSON, else a bar (terminal) or
// lines on errw.
func (a *app) newMeter(asJSON bool, op, target, verb, unit string, total int64) *meter {
	m := &meter{w: a.io.Err, mode: meterLines, op: op, target: target, unit: unit, total: total, label: op + " " + target + ": " + verb}
	switch {
	case asJSON:
		m.w, m.mode = a.io.Out, meterJSON // a line per batch: machine readers want each step
	case a.io.IsTerminal(a.io.Err):
		m.mode = meterBar
	}
	return m.started()
}

func (m *meter) started() *meter {
	if m.now == nil {
		m.now = time.Now
	}
	m.start = m.now()
	return m
}

func (m *meter) update(done int64) {
	m.done = done
	if m.mode == meterLines && m.now().Sub(m.last) < time.Second && (m.total == 0 || done < m.total) {
		return
	}
	m.last = m.now()
	m.draw()
}

func (m *meter) rate() float64 {
	el := m.now().Sub(m.start).Seconds()
	if el <= 0 {
		return 0
	}
	return float64(m.done) / el
}

// left is the estimated time to finish, or -1 when unknown.
func (m *meter) left() time.Duration {
	r := m.rate()
	if m.total <= 0 || r <= 0 || m.done >= m.total {
		if m.total > 0 && m.done >= m.total {
			return 0
		}
		return -1
	}
	return time.Duration(float64(m.total-m.done) / r * float64(time.Second))
}

func (m *meter) draw() {
	m.printed = true
	total := max(m.total, m.done)
	left := m.left()
	switch m.mode {
	case meterJSON:
		line := map[string]any{"event": "progress", "op": m.op, "target": m.target, "unit": m.unit, "done": m.done,
			"rate_per_second": round1(m.rate()), "elapsed_seconds": round1(m.now().Sub(m.start).Seconds())}
		if m.total > 0 {
			line["total"] = total
		}
		if left >= 0 {
			line["eta_seconds"] = round1(left.Seconds())
		}
		emitJSON(m.w, line)
	case meterBar:
		const width = 30
		filled := 0
		if total > 0 {
			filled = int(m.done * width / total)
		}
		fmt.Fprintf(m.w, "\r%s [%s%s] %d/%d %s, %.0f/s%s ", m.label, strings.Repeat("#", filled), strings.Repeat("-", width-filled),
			m.done, total, m.unit, m.rate(), leftText(left))
	default:
		fmt.Fprintf(m.w, "%s %d of ~%d %s (%.0f/s%s)\n", m.label, m.done, total, m.unit, m.rate(), leftText(left))
	}
}

func leftText(d time.Duration) string {
	if d < 0 {
		return ""
	}
	return ", " + FormatDuration(d.Round(time.Second)) + " left"
}

func round1(f float64) float64 { return float64(int64(f*10+0.5)) / 10 }

// finish draws the final state (once something was done or drawn) and ends a bar's line.
func (m *meter) finish() {
	if m.printed || m.done > 0 {
		m.draw()
		if m.mode == meterBar {
			fmt.Fprintln(m.w)
		}
	}
	m.printed = false
}
