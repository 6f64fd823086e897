package health

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

func status(t *testing.T, addr, path string) int {
	t.Helper()
	resp, err := http.Get("http://" + addr + path)
	require.NoError(t, err)
	resp.Body.Close()
	return resp.StatusCode
}

func TestReadinessFollowsTheServiceAndTheStop(t *testing.T) {
	t.Parallel()
	var down atomic.Bool
	s, err := Serve("127.0.0.1:0", func(context.Context) error {
		if down.Load() {
			return errors.New("database unreachable")
		}
		return nil
	}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	defer s.Close()
	require.Equal(t, http.StatusOK, status(t, s.Addr(), "/healthz"))
	require.Equal(t, http.StatusOK, status(t, s.Addr(), "/readyz"))
	down.Store(true)
	require.Equal(t, http.StatusServiceUnavailable, status(t, s.Addr(), "/readyz"))
	down.Store(false)
	s.Stopping()
	require.Equal(t, http.StatusServiceUnavailable, status(t, s.Addr(), "/readyz"), "a stopping service takes no more work")
	require.Equal(t, http.StatusOK, status(t, s.Addr(), "/healthz"), "but it is alive")
}

// The container health check succeeds against a running server and fails once it is gone.
func TestCheckProbesTheRunningProcess(t *testing.T) {
	t.Parallel()
	s, err := Serve("127.0.0.1:0", func(context.Context) error { return nil }, slog.New(slog.NewTextHandler(io.Discard, nil)))
	require.NoError(t, err)
	getenv := func(k string) string {
		if k == AddrVariable {
			return s.Addr()
		}
		return ""
	}
	require.NoError(t, Check(getenv))
	require.NoError(t, s.Close())
	require.Error(t, Check(getenv), "nothing answers: the task is unhealthy")
	require.Error(t, Check(func(string) string { return "no-port" }))
}
