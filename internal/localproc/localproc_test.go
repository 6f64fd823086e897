package localproc

import (
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestStartWaitsForReadinessAndStopEndsTheProcess(t *testing.T) {
	t.Parallel()
	ready := 0
	p, err := Start(context.Background(), Spec{
		Name: "sleeper",
		Cmd:  exec.Command("sleep", "60"),
		Ready: func(context.Context) error {
			if ready++; ready < 3 {
				return errors.New("not yet")
			}
			return nil
		},
	})
	require.NoError(t, err)
	require.Equal(t, 3, ready, "Start returned only once the probe passed")
	require.NoError(t, syscall.Kill(p.Pid(), 0), "the process runs")
	p.Stop()
	select {
	case <-p.Done():
	default:
		t.Fatal("Stop returned before the process exited")
	}
	p.Stop() // a second Stop is harmless
}

func TestStartNamesAProcessThatExitsBeforeItIsReady(t *testing.T) {
	t.Parallel()
	_, err := Start(context.Background(), Spec{
		Name:     "quitter",
		Cmd:      exec.Command("sh", "-c", "exit 3"),
		Ready:    func(context.Context) error { return errors.New("never") },
		ExitHint: "see quitter.log",
	})
	require.ErrorContains(t, err, "quitter exited during start-up")
	require.ErrorContains(t, err, "see quitter.log")
}

func TestStartStopsAProcessThatNeverBecomesReady(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("sleep", "60")
	_, err := Start(context.Background(), Spec{
		Name:         "stuck",
		Cmd:          cmd,
		Ready:        func(context.Context) error { return errors.New("still starting") },
		ReadyTimeout: 200 * time.Millisecond,
	})
	require.ErrorContains(t, err, "stuck was not ready within 200ms: still starting")
	require.Error(t, syscall.Kill(cmd.Process.Pid, 0), "the stuck process was stopped, not left behind")
}

func TestStopEscalatesToSIGKILLAfterTheGrace(t *testing.T) {
	t.Parallel()
	// A shell that ignores SIGTERM (ready once its trap is set): only SIGKILL ends it.
	trapped := filepath.Join(t.TempDir(), "trapped")
	p, err := Start(context.Background(), Spec{
		Name: "stubborn",
		Cmd:  exec.Command("sh", "-c", "trap '' TERM; touch "+trapped+"; while true; do sleep 0.1; done"),
		Ready: func(context.Context) error {
			_, err := os.Stat(trapped)
			return err
		},
		StopGrace: 100 * time.Millisecond,
	})
	require.NoError(t, err)
	p.Stop()
	<-p.Done()
	require.Contains(t, strings.ToLower(p.spec.Cmd.ProcessState.String()), "killed")
}

func TestFreePortAndDial(t *testing.T) {
	t.Parallel()
	port, err := FreePort()
	require.NoError(t, err)
	require.Positive(t, port)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	require.NoError(t, Dial(l.Addr().String())(context.Background()))
	require.Error(t, Dial("127.0.0.1:1")(context.Background()), "nothing listens on port 1")
}
