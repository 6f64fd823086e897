package lambdaenv

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestAuditSettings(t *testing.T) {
	t.Parallel()
	s, err := Audit(env(nil))
	require.NoError(t, err)
	require.Empty(t, s.Consumers, "no consumers, no audit")
	s, err = Audit(env(map[string]string{AuditConsumers: " billing, shipping ,", AuditWindow: "3h", AuditAlarmAfter: "5m"}))
	require.NoError(t, err)
	require.Equal(t, AuditSettings{Consumers: []string{"billing", "shipping"}, Window: 3 * time.Hour, AlarmAfter: 5 * time.Minute}, s)
	_, err = Audit(env(map[string]string{AuditWindow: "soon", AuditAlarmAfter: "-1m"}))
	require.ErrorContains(t, err, AuditWindow+" must be a positive Go duration")
	require.ErrorContains(t, err, AuditAlarmAfter+" must be a positive Go duration")
	_, err = Audit(env(map[string]string{AuditWindow: "10m"}))
	require.ErrorContains(t, err, "must be shorter than")
}
