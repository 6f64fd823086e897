// Package localproc starts and stops the helper processes of tests and the demo the same way:
// the throwaway PostgreSQL (internal/pgcluster), the AWS emulators (internal/localaws) and the
// Lambda runtime interface emulators (internal/localrun). A process gets its own process group
// (a terminal's Ctrl-C reaches the Go program, which stops its helpers in order) and a parent-
// death signal (it does not outlive a Go program that died without cleaning up); Start returns
// once a readiness probe passes, and Stop escalates from a polite signal to SIGKILL.
package localproc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"syscall"
	"time"
)

// Spec describes a process to start.
type Spec struct {
	// Name names the process in errors, e.g. "postgres" or "fauxqs". Required.
	Name string
	// Cmd is the configured command (path, arguments, environment, directory, output). Start
	// adds a process group and the parent-death signal to its SysProcAttr. Required.
	Cmd *exec.Cmd
	// Credential runs the process as another account (PostgreSQL refuses root). Defaults to
	// this process's.
	Credential *syscall.Credential
	// Ready reports nil once the process serves. Start calls it every 50 ms until it passes,
	// the process exits, ctx ends or ReadyTimeout passes. Defaults to ready at once.
	Ready func(ctx context.Context) error
	// ReadyTimeout bounds the wait for Ready. Defaults to 30 seconds.
	ReadyTimeout time.Duration
	// ExitHint is added to the error when the process exits before it is ready, e.g.
	// "port 4566 in use?" or "see /tmp/x/postgres.log".
	ExitHint string
	// StopSignal asks the process to stop. Defaults to SIGTERM.
	StopSignal syscall.Signal
	// StopGrace is how long Stop waits after StopSignal before SIGKILL. Defaults to 5 seconds.
	StopGrace time.Duration
	// DeathSignal is sent to the process when the Go program dies. Defaults to SIGKILL.
	DeathSignal syscall.Signal
	// SignalGroup sends the stop signals to the whole process group (the emulator and the
	// function it runs), not only to the process. Defaults to false.
	SignalGroup bool
}

// Process is a started process.
type Process struct {
	spec Spec
	done chan struct{}
	err  error // the Wait result, valid once done is closed
}

// Start starts spec.Cmd and waits until spec.Ready passes. On any failure the process is
// stopped and the error names it.
func Start(ctx context.Context, spec Spec) (*Process, error) {
	if spec.Name == "" || spec.Cmd == nil {
		return nil, errors.New("localproc: Spec needs Name and Cmd")
	}
	if spec.ReadyTimeout == 0 {
		spec.ReadyTimeout = 30 * time.Second
	}
	if spec.StopSignal == 0 {
		spec.StopSignal = syscall.SIGTERM
	}
	if spec.StopGrace == 0 {
		spec.StopGrace = 5 * time.Second
	}
	if spec.DeathSignal == 0 {
		spec.DeathSignal = syscall.SIGKILL
	}
	attr := spec.Cmd.SysProcAttr
	if attr == nil {
		attr = &syscall.SysProcAttr{}
	}
	attr.Setpgid, attr.Pdeathsig = true, spec.DeathSignal
	if spec.Credential != nil {
		attr.Credential = spec.Credential
	}
	spec.Cmd.SysProcAttr = attr
	if err := spec.Cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", spec.Name, err)
	}
	p := &Process{spec: spec, done: make(chan struct{})}
	go func() { p.err = spec.Cmd.Wait(); close(p.done) }()
	if spec.Ready == nil {
		return p, nil
	}
	deadline := time.Now().Add(spec.ReadyTimeout)
	for {
		err := spec.Ready(ctx)
		if err == nil {
			return p, nil
		}
		select {
		case <-p.done:
			msg := fmt.Sprintf("%s exited during start-up (%v)", spec.Name, p.err)
			if spec.ExitHint != "" {
				msg += "; " + spec.ExitHint
			}
			return nil, fmt.Errorf("%w: %s", ErrExited, msg)
		case <-ctx.Done():
			p.Stop()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.Stop()
			return nil, fmt.Errorf("%s was not ready within %s: %w", spec.Name, spec.ReadyTimeout, err)
		}
	}
}

// Pid is the process id.
func (p *Process) Pid() int { return p.spec.Cmd.Process.Pid }

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Stop sends the stop signal, waits up to the grace period, then kills, and returns once the
// process has exited. It is safe to call more than once.
func (p *Process) Stop() {
	select {
	case <-p.done:
		return
	default:
	}
	p.signal(p.spec.StopSignal)
	select {
	case <-p.done:
	case <-time.After(p.spec.StopGrace):
		p.signal(syscall.SIGKILL)
		<-p.done
	}
	if p.spec.SignalGroup {
		// The function the emulator ran may outlive it for a moment; leave nothing behind.
		p.signal(syscall.SIGKILL)
	}
}

func (p *Process) signal(sig syscall.Signal) {
	pid := p.Pid()
	if p.spec.SignalGroup {
		pid = -pid
	}
	_ = syscall.Kill(pid, sig)
}

// ErrExited marks a process that exited before it was ready (Start).
var ErrExited = errors.New("exited before it was ready")

// FreePort asks the kernel for a free TCP port on 127.0.0.1.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Dial is a readiness probe for a process that serves TCP on addr (host:port).
func Dial(addr string) func(context.Context) error {
	return func(ctx context.Context) error {
		d := net.Dialer{Timeout: time.Second}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return c.Close()
	}
}
