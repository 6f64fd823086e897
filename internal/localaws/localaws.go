// Package localaws runs the local SNS/SQS endpoint used by tests and the demo: the fauxqs
// emulator from the repository's npm lockfile, unless AWS_ENDPOINT_URL already names one
// (LocalStack, say). It also builds AWS SDK configurations for such an endpoint.
package localaws

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/sluicehq/sluice/internal/pgcluster"
)

// EnvEndpoint is the standard AWS SDK variable naming a custom endpoint.
const EnvEndpoint = "AWS_ENDPOINT_URL"

// DefaultRegion is used when AWS_REGION is unset.
const DefaultRegion = "us-east-1"

// Emulator is a running fauxqs process.
type Emulator struct {
	// URL is the endpoint, e.g. http://127.0.0.1:4566.
	URL  string
	cmd  *exec.Cmd
	done chan struct{}
}

// Options tune the emulator.
type Options struct {
	// Port to listen on. Defaults to a free port.
	Port int
	// Log receives fauxqs's request log. Defaults to discarding it.
	Log io.Writer
}

// NodeTools is the directory, relative to the repository root, holding the npm lockfile.
const NodeTools = "tools/node"

// RepoRoot walks up from the working directory to the repository root (go.mod and tools/node).
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if fileExists(filepath.Join(dir, "go.mod")) && fileExists(filepath.Join(dir, NodeTools, "package.json")) {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("cannot find the sluice repository root (go.mod and tools/node/package.json) above the working directory")
		}
		dir = parent
	}
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// Start launches fauxqs from node_modules and waits until it answers its health check.
func Start(ctx context.Context, opts Options) (*Emulator, error) {
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	cli := filepath.Join(root, NodeTools, "node_modules", "fauxqs", "dist", "cli.js")
	if !fileExists(cli) {
		return nil, fmt.Errorf("fauxqs is not installed (%s missing): run `make deps` (npm ci in %s), or set %s", cli, NodeTools, EnvEndpoint)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		return nil, fmt.Errorf("node is needed to run fauxqs: %w", err)
	}
	if opts.Port == 0 {
		if opts.Port, err = pgcluster.FreePort(); err != nil {
			return nil, err
		}
	}
	log := opts.Log
	if log == nil {
		log = io.Discard
	}
	e := &Emulator{URL: fmt.Sprintf("http://127.0.0.1:%d", opts.Port), done: make(chan struct{})}
	e.cmd = exec.Command(node, cli)
	e.cmd.Env = append(os.Environ(), "FAUXQS_PORT="+strconv.Itoa(opts.Port), "FAUXQS_HOST=127.0.0.1",
		"FAUXQS_DEFAULT_REGION="+Region(), "FAUXQS_LOGGER=false")
	e.cmd.Stdout, e.cmd.Stderr = log, log
	e.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := e.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start fauxqs: %w", err)
	}
	go func() { _ = e.cmd.Wait(); close(e.done) }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(e.URL + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return e, nil
			}
		}
		select {
		case <-e.done:
			return nil, fmt.Errorf("fauxqs exited during start-up (port %d in use?)", opts.Port)
		case <-ctx.Done():
			e.Stop()
			return nil, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			e.Stop()
			return nil, errors.New("fauxqs did not become healthy within 30s")
		}
	}
}

// Stop ends the emulator.
func (e *Emulator) Stop() {
	if e.cmd.Process == nil {
		return
	}
	_ = e.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-e.done:
	case <-time.After(5 * time.Second):
		_ = e.cmd.Process.Kill()
		<-e.done
	}
}

// Region returns AWS_REGION, or DefaultRegion.
func Region() string {
	if r := os.Getenv("AWS_REGION"); r != "" {
		return r
	}
	return DefaultRegion
}

// Config returns an SDK configuration for endpoint with the region from the environment and,
// unless the environment provides credentials, static dummy ones (local endpoints ignore them).
func Config(ctx context.Context, endpoint string) (aws.Config, error) {
	opts := []func(*config.LoadOptions) error{config.WithRegion(Region()), config.WithBaseEndpoint(endpoint)}
	if os.Getenv("AWS_ACCESS_KEY_ID") == "" {
		opts = append(opts, config.WithCredentialsProvider(credentials.NewStaticCredentialsProvider("test", "test", "")))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return aws.Config{}, fmt.Errorf("load AWS config for %s: %w", endpoint, err)
	}
	return cfg, nil
}

var (
	sharedMu  sync.Mutex
	sharedURL string
	shared    *Emulator
)

// TestEndpoint returns AWS_ENDPOINT_URL when set; otherwise it starts one fauxqs for the test
// binary on first use. Call StopShared when the tests end (testdb.Main does).
func TestEndpoint(t testing.TB) string {
	t.Helper()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedURL != "" {
		return sharedURL
	}
	if u := os.Getenv(EnvEndpoint); u != "" {
		sharedURL = u
		return u
	}
	e, err := Start(context.Background(), Options{})
	if err != nil {
		t.Fatalf("start the local SNS/SQS endpoint: %v", err)
	}
	shared, sharedURL = e, e.URL
	return sharedURL
}

// TestConfig is Config for TestEndpoint.
func TestConfig(t testing.TB) aws.Config {
	t.Helper()
	cfg, err := Config(context.Background(), TestEndpoint(t))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// StopShared stops the emulator TestEndpoint started, if any.
func StopShared() {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if shared != nil {
		shared.Stop()
		shared, sharedURL = nil, ""
	}
}
