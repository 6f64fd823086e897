// Package localaws runs the local AWS endpoint used by tests and the demo: the fauxqs SNS/SQS
// emulator from the repository's npm lockfile, or moto_server (SLUICE_AWS_EMULATOR=moto), unless
// AWS_ENDPOINT_URL already names one (LocalStack, say). It also builds AWS SDK configurations
// for such an endpoint. Tests that need EventBridge or Kinesis, which fauxqs lacks, ask
// TestEndpointServing, which falls back to a private moto_server.
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
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/sluicehq/sluice/internal/localproc"
)

// EnvEndpoint is the standard AWS SDK variable naming a custom endpoint.
const EnvEndpoint = "AWS_ENDPOINT_URL"

// DefaultRegion is used when AWS_REGION is unset.
const DefaultRegion = "us-east-1"

// EnvEmulator chooses the emulator that TestEndpoint, devenv and the demo start when
// AWS_ENDPOINT_URL is unset: "fauxqs" (the default) or "moto".
const EnvEmulator = "SLUICE_AWS_EMULATOR"

// The emulators this package starts.
const (
	// Fauxqs is the SNS/SQS emulator pinned in tools/node (npm).
	Fauxqs = "fauxqs"
	// Moto is moto_server, the emulator LocalStack is built on (pip install 'moto[server]'),
	// when it is on PATH.
	Moto = "moto"
)

// ErrNotInstalled is returned by Start when the chosen emulator is not installed here.
var ErrNotInstalled = errors.New("emulator not installed")

// Emulator is a running emulator process.
type Emulator struct {
	// Kind is Fauxqs or Moto.
	Kind string
	// URL is the endpoint, e.g. http://127.0.0.1:4566.
	URL  string
	proc *localproc.Process
}

// Options tune the emulator.
type Options struct {
	// Kind is the emulator: Fauxqs or Moto. Defaults to $SLUICE_AWS_EMULATOR, else Fauxqs.
	Kind string
	// Port to listen on. Defaults to a free port.
	Port int
	// Log receives the emulator's request log. Defaults to discarding it.
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

// Chosen returns the emulator Start uses by default: $SLUICE_AWS_EMULATOR, else Fauxqs.
func Chosen() string {
	if k := os.Getenv(EnvEmulator); k != "" {
		return k
	}
	return Fauxqs
}

// readyTimeout bounds the wait for a started emulator to answer: only one that neither answers
// nor exits is given up on. moto_server took 10 s to answer on a machine whose two cores were
// busy (localproc's default of 30 s is close to that); a loaded machine is slow, not broken.
const readyTimeout = 5 * time.Minute

// Start launches the emulator and waits until it answers. It returns an error wrapping
// ErrNotInstalled when the emulator is not installed on this machine.
func Start(ctx context.Context, opts Options) (*Emulator, error) {
	if opts.Kind == "" {
		opts.Kind = Chosen()
	}
	var err error
	if opts.Port == 0 {
		if opts.Port, err = localproc.FreePort(); err != nil {
			return nil, err
		}
	}
	log := opts.Log
	if log == nil {
		log = io.Discard
	}
	e := &Emulator{Kind: opts.Kind, URL: fmt.Sprintf("http://127.0.0.1:%d", opts.Port)}
	var cmd *exec.Cmd
	var health string
	switch opts.Kind {
	case Fauxqs:
		root, err := RepoRoot()
		if err != nil {
			return nil, err
		}
		cli := filepath.Join(root, NodeTools, "node_modules", "fauxqs", "dist", "cli.js")
		if !fileExists(cli) {
			return nil, fmt.Errorf("%w: fauxqs (%s missing): run `make deps` (npm ci in %s), or set %s", ErrNotInstalled, cli, NodeTools, EnvEndpoint)
		}
		node, err := exec.LookPath("node")
		if err != nil {
			return nil, fmt.Errorf("%w: node is needed to run fauxqs: %v", ErrNotInstalled, err)
		}
		cmd = exec.Command(node, cli)
		cmd.Env = append(os.Environ(), "FAUXQS_PORT="+strconv.Itoa(opts.Port), "FAUXQS_HOST=127.0.0.1",
			"FAUXQS_DEFAULT_REGION="+Region(), "FAUXQS_LOGGER=false")
		health = "/health"
	case Moto:
		bin, err := exec.LookPath("moto_server")
		if err != nil {
			return nil, fmt.Errorf("%w: moto_server is not on PATH (pip install 'moto[server]')", ErrNotInstalled)
		}
		cmd = exec.Command(bin, "-H", "127.0.0.1", "-p", strconv.Itoa(opts.Port))
		health = "/moto-api/"
	default:
		return nil, fmt.Errorf("unknown AWS emulator %q (%s): want %s or %s", opts.Kind, EnvEmulator, Fauxqs, Moto)
	}
	cmd.Stdout, cmd.Stderr = log, log
	e.proc, err = localproc.Start(ctx, localproc.Spec{
		Name: opts.Kind, Cmd: cmd, ExitHint: fmt.Sprintf("port %d in use?", opts.Port),
		ReadyTimeout: readyTimeout,
		Ready: func(ctx context.Context) error {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.URL+health, nil)
			if err != nil {
				return err
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return err
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("%s answered %s", health, resp.Status)
			}
			return nil
		},
	})
	if err != nil {
		return nil, err
	}
	return e, nil
}

// Stop ends the emulator.
func (e *Emulator) Stop() { e.proc.Stop() }

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
	// sharedSkip is the reason to skip once the chosen emulator was found missing.
	sharedSkip string
)

// TestEndpoint returns AWS_ENDPOINT_URL when set; otherwise it starts one emulator (Chosen:
// fauxqs, or moto with SLUICE_AWS_EMULATOR=moto) for the test binary on first use. When moto is
// chosen and not installed, it skips the test with a message saying so. Call StopShared when
// the tests end (testdb.Main does).
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
	if sharedSkip != "" {
		t.Skip(sharedSkip)
	}
	e, err := Start(context.Background(), Options{})
	if errors.Is(err, ErrNotInstalled) && Chosen() == Moto { // fauxqs is a dependency (make deps): missing is a failure
		sharedSkip = fmt.Sprintf("skipped: %s=%s asks for an emulator this machine lacks (%v)", EnvEmulator, Chosen(), err)
		t.Skip(sharedSkip)
	}
	if err != nil {
		t.Fatalf("start the local AWS emulator (%s): %v", Chosen(), err)
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

// StopShared stops the emulator TestEndpoint started, and the moto_server TestEndpointServing
// started, if any.
func StopShared() {
	defer stopPrivate()
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if shared != nil {
		shared.Stop()
		shared, sharedURL = nil, ""
	}
}
