package cli

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/cmd/sluice/internal/human"
)

var dayPrefix = regexp.MustCompile(`^(\d+)d(.*)$`)

// ParseDuration parses a Go duration (90s, 15m, 36h) that may start with a number of days
// (7d, 1d12h). Days are 24 hours. Negative durations are rejected.
func ParseDuration(s string) (time.Duration, error) {
	in := strings.TrimSpace(s)
	if in == "" {
		return 0, fmt.Errorf("empty duration (want e.g. 90s, 36h or 7d)")
	}
	var total time.Duration
	rest := in
	if m := dayPrefix.FindStringSubmatch(in); m != nil {
		days, err := strconv.Atoi(m[1])
		if err != nil || days > 100000 {
			return 0, fmt.Errorf("invalid duration %q (want e.g. 90s, 36h or 7d)", s)
		}
		total = time.Duration(days) * 24 * time.Hour
		rest = m[2]
	}
	if rest != "" {
		d, err := time.ParseDuration(rest)
		if err != nil {
			return 0, fmt.Errorf("invalid duration %q (want e.g. 90s, 36h or 7d)", s)
		}
		total += d
	}
	if total < 0 {
		return 0, fmt.Errorf("invalid duration %q: must not be negative", s)
	}
	return total, nil
}

// ParseTime parses an RFC 3339 timestamp, a date (midnight UTC), "now", or a time relative to
// now: a signed duration such as -2h or -7d (a leading + means the future).
func ParseTime(s string, now time.Time) (time.Time, error) {
	in := strings.TrimSpace(s)
	switch {
	case in == "":
		return time.Time{}, fmt.Errorf("empty timestamp (want RFC 3339, a date, now, or relative like -2h)")
	case strings.EqualFold(in, "now"):
		return now, nil
	case in[0] == '-' || in[0] == '+':
		d, err := ParseDuration(in[1:])
		if err != nil {
			return time.Time{}, fmt.Errorf("invalid relative time %q (want e.g. -2h or -7d)", s)
		}
		if in[0] == '-' {
			d = -d
		}
		return now.Add(d), nil
	}
	if t, err := time.Parse(time.RFC3339Nano, in); err == nil {
		return t, nil
	}
	if t, err := time.Parse("2006-01-02", in); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("invalid timestamp %q (want RFC 3339 like 2026-11-28T09:00:00Z, a date, now, or relative like -2h)", s)
}

// FormatDuration renders a duration compactly for tables: 0s, 42s, 5m3s, 3h2m, 2d4h (as the
// console's pages do: package human).
func FormatDuration(d time.Duration) string { return human.Duration(d) }

// durationValue is a pflag.Value accepting ParseDuration's syntax.
type durationValue struct {
	d   *time.Duration
	set bool
}

func (v *durationValue) String() string {
	if v.d == nil || (!v.set && *v.d == 0) {
		return ""
	}
	return FormatDuration(*v.d)
}

func (v *durationValue) Set(s string) error {
	d, err := ParseDuration(s)
	if err != nil {
		return err
	}
	*v.d, v.set = d, true
	return nil
}

func (v *durationValue) Type() string { return "duration" }

// timeValue is a pflag.Value accepting ParseTime's syntax, relative to the moment of parsing.
type timeValue struct {
	t   *time.Time
	now func() time.Time
}

func (v *timeValue) String() string {
	if v.t == nil || v.t.IsZero() {
		return ""
	}
	return v.t.Format(time.RFC3339)
}

func (v *timeValue) Set(s string) error {
	t, err := ParseTime(s, v.now())
	if err != nil {
		return err
	}
	*v.t = t
	return nil
}

func (v *timeValue) Type() string { return "time" }
