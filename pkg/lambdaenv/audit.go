package lambdaenv

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// The scheduled outbox → inbox audit's variables (the migrations function runs it after the
// partition maintenance, on the same schedule).
const (
	// AuditConsumers names the inbox consumers to audit, comma-separated. Defaults to none: no
	// audit runs. The CDK sets it to every consumer built with the migrations construct.
	AuditConsumers = "SLUICE_AUDIT_CONSUMERS"
	// AuditWindow is how far back, from now, the audited events were created (Go duration).
	// Defaults to DefaultAuditWindow.
	AuditWindow = "SLUICE_AUDIT_WINDOW"
	// AuditAlarmAfter is how long after its publication an event not applied counts as
	// missing (Go duration). Defaults to DefaultAuditAlarmAfter.
	AuditAlarmAfter = "SLUICE_AUDIT_ALARM_AFTER"
)

// DefaultAuditWindow is AuditWindow's default: two hours, so an hourly schedule audits each
// event at least once after it became overdue.
const DefaultAuditWindow = 2 * time.Hour

// DefaultAuditAlarmAfter is AuditAlarmAfter's default, sluice audit's --alarm-after default.
const DefaultAuditAlarmAfter = 15 * time.Minute

// AuditSettings are the scheduled audit's settings.
type AuditSettings struct {
	Consumers  []string
	Window     time.Duration
	AlarmAfter time.Duration
}

// Audit reads the scheduled audit's settings; no consumers means no audit. Every problem is
// reported at once, each naming its variable.
func Audit(getenv Getenv) (AuditSettings, error) {
	s := AuditSettings{Window: DefaultAuditWindow, AlarmAfter: DefaultAuditAlarmAfter}
	for _, c := range strings.Split(getenv(AuditConsumers), ",") {
		if c = strings.TrimSpace(c); c != "" {
			s.Consumers = append(s.Consumers, c)
		}
	}
	var errs []error
	for _, v := range []struct {
		name string
		d    *time.Duration
	}{{AuditWindow, &s.Window}, {AuditAlarmAfter, &s.AlarmAfter}} {
		name, d := v.name, v.d
		raw := strings.TrimSpace(getenv(name))
		if raw == "" {
			continue
		}
		v, err := time.ParseDuration(raw)
		if err != nil || v <= 0 {
			errs = append(errs, fmt.Errorf("%s must be a positive Go duration such as 2h, got %q", name, raw))
			continue
		}
		*d = v
	}
	if len(errs) == 0 && s.AlarmAfter >= s.Window {
		errs = append(errs, fmt.Errorf("%s (%s) must be shorter than %s (%s): no event could be overdue", AuditAlarmAfter, s.AlarmAfter, AuditWindow, s.Window))
	}
	if err := errors.Join(errs...); err != nil {
		return AuditSettings{}, fmt.Errorf("audit settings: %w", err)
	}
	return s, nil
}
