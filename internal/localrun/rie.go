package localrun

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/internal/localproc"
)

// invokePath is the RIE's invocation endpoint (the Lambda Invoke API path).
const invokePath = "/2015-03-31/functions/function/invocations"

// FunctionOptions configure a Function.
type FunctionOptions struct {
	// Name is the function's name (AWS_LAMBDA_FUNCTION_NAME). Required.
	Name string
	// Bootstrap is the path of the function's executable. Required.
	Bootstrap string
	// RIE is the path of the aws-lambda-rie executable. Required.
	RIE string
	// Env is the function's environment (KEY=VALUE), added to this process's environment.
	Env []string
	// Timeout is the function timeout, which sets the invocation deadline. Defaults to 30 seconds.
	Timeout time.Duration
	// Instances is the number of execution environments, i.e. the concurrency. The emulator runs
	// one invocation at a time, so each instance is one emulator process. Defaults to 1.
	Instances int
	// Log receives the emulator's and the function's output. Defaults to discarding it.
	Log io.Writer
}

// Function is a Lambda function served by one or more emulator processes.
type Function struct {
	opts      FunctionOptions
	instances []*instance
	free      chan *instance
	client    *http.Client
}

type instance struct {
	url  string
	proc *localproc.Process
	log  *lineWriter
}

// StartFunction starts opts.Instances emulators running opts.Bootstrap and waits until they accept
// invocations. The function itself starts (cold start) on the first invocation, as in Lambda.
func StartFunction(ctx context.Context, opts FunctionOptions) (*Function, error) {
	if opts.Name == "" || opts.Bootstrap == "" || opts.RIE == "" {
		return nil, errors.New("localrun: FunctionOptions needs Name, Bootstrap and RIE")
	}
	if opts.Timeout == 0 {
		opts.Timeout = 30 * time.Second
	}
	if opts.Instances == 0 {
		opts.Instances = 1
	}
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	f := &Function{opts: opts, free: make(chan *instance, opts.Instances), client: &http.Client{}}
	for range opts.Instances {
		in, err := f.startInstanceRetrying(ctx)
		if err != nil {
			f.Stop()
			return nil, err
		}
		f.instances = append(f.instances, in)
		f.free <- in
	}
	return f, nil
}

// startInstance's ports are free when chosen (localproc.FreePort) but may be taken by another
// process before the emulator binds them; it then exits at once. startInstanceRetrying tries
// again with new ports, a few times.
func (f *Function) startInstanceRetrying(ctx context.Context) (*instance, error) {
	var err error
	for range 3 {
		var in *instance
		if in, err = f.startInstance(ctx); err == nil || !errors.Is(err, localproc.ErrExited) {
			return in, err
		}
	}
	return nil, err
}

func (f *Function) startInstance(ctx context.Context) (*instance, error) {
	port, err := localproc.FreePort()
	if err != nil {
		return nil, err
	}
	apiPort, err := localproc.FreePort()
	if err != nil {
		return nil, err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	// Each emulator needs its own Runtime API port (it defaults to 9001).
	cmd := exec.Command(f.opts.RIE, "--runtime-interface-emulator-address", addr,
		"--runtime-api-address", "127.0.0.1:"+strconv.Itoa(apiPort), "--log-level", "warn", f.opts.Bootstrap)
	cmd.Dir = filepath.Dir(f.opts.Bootstrap)
	cmd.Env = append(os.Environ(), f.opts.Env...)
	cmd.Env = append(cmd.Env,
		"AWS_LAMBDA_FUNCTION_NAME="+f.opts.Name,
		"AWS_LAMBDA_FUNCTION_TIMEOUT="+strconv.Itoa(int(f.opts.Timeout.Round(time.Second)/time.Second)),
		"AWS_LAMBDA_FUNCTION_MEMORY_SIZE=256")
	lw := newLineWriter(f.opts.Log)
	cmd.Stdout, cmd.Stderr = lw, lw
	// SIGTERM to the group reaches the function too (its SIGTERM hook runs), as on Lambda.
	p, err := localproc.Start(ctx, localproc.Spec{Name: "the emulator for " + f.opts.Name, Cmd: cmd, SignalGroup: true,
		StopGrace: 3 * time.Second, ReadyTimeout: 20 * time.Second, Ready: localproc.Dial(addr)})
	if err != nil {
		return nil, err
	}
	return &instance{url: "http://" + addr + invokePath, proc: p, log: lw}, nil
}

// FunctionError is an invocation that failed: the function returned an error, crashed or timed out.
type FunctionError struct {
	// Status is the emulator's HTTP status (200 for an error the handler returned).
	Status int
	// Body is the response body, e.g. {"errorMessage": ..., "errorType": ...}.
	Body string
}

// Error gives the status and the function's error body.
func (e *FunctionError) Error() string {
	return fmt.Sprintf("function failed (status %d): %s", e.Status, strings.TrimSpace(e.Body))
}

// Invoke runs one synchronous invocation with payload (marshalled to JSON) on a free instance,
// waiting for one, and unmarshals the response into out (when not nil).
func (f *Function) Invoke(ctx context.Context, payload, out any) error {
	var in *instance
	select {
	case in = <-f.free:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { f.free <- in }()
	return f.invokeOn(ctx, in, payload, out)
}

// TryInvoke is Invoke when an instance is free right now; it reports false otherwise.
func (f *Function) TryInvoke(ctx context.Context, payload, out any) (bool, error) {
	select {
	case in := <-f.free:
		defer func() { f.free <- in }()
		return true, f.invokeOn(ctx, in, payload, out)
	default:
		return false, nil
	}
}

func (f *Function) invokeOn(ctx context.Context, in *instance, payload, out any) error {
	body, err := json.Marshal(payload)
	if err != nil {
		return fmt.Errorf("encode %s payload: %w", f.opts.Name, err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, in.url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return fmt.Errorf("invoke %s: %w", f.opts.Name, err)
	}
	defer resp.Body.Close()
	respBody, err := io.ReadAll(resp.Body)
	if err != nil {
		return fmt.Errorf("read %s response: %w", f.opts.Name, err)
	}
	if resp.StatusCode != http.StatusOK || isErrorPayload(respBody) {
		return fmt.Errorf("invoke %s: %w", f.opts.Name, &FunctionError{Status: resp.StatusCode, Body: string(respBody)})
	}
	if out != nil {
		if err := json.Unmarshal(respBody, out); err != nil {
			return fmt.Errorf("decode %s response %q: %w", f.opts.Name, respBody, err)
		}
	}
	return nil
}

// isErrorPayload recognises the Lambda error response shape.
func isErrorPayload(b []byte) bool {
	var e struct {
		ErrorType    string `json:"errorType"`
		ErrorMessage string `json:"errorMessage"`
	}
	return json.Unmarshal(b, &e) == nil && (e.ErrorType != "" || e.ErrorMessage != "")
}

// KillRuntimes sends SIGKILL to every running function process (the bootstraps, not the
// emulators), as a crash or an out-of-memory kill would, and returns how many it killed.
// The emulator starts the function again on the next invocation.
func (f *Function) KillRuntimes() int {
	n := 0
	for _, in := range f.instances {
		for _, pid := range children(in.proc.Pid()) {
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				n++
			}
		}
	}
	return n
}

// children lists the direct child processes of pid (Linux /proc).
func children(pid int) []int {
	var out []int
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if c, err := strconv.Atoi(f); err == nil {
				out = append(out, c)
			}
		}
	}
	return out
}

// Stop ends every instance: SIGTERM to the emulator's process group (the function gets its
// SIGTERM), then SIGKILL after a grace period.
func (f *Function) Stop() {
	for _, in := range f.instances {
		in.proc.Stop()
		in.log.flush()
	}
}
