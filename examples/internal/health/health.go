// Package health is what the long-running examples (examples/relay, examples/processor) share:
// their main (Main: a context that ends on SIGTERM or Ctrl-C, the JSON logger, the exit code) and
// the liveness and readiness endpoints an orchestrator (ECS, Kubernetes) probes. Copy it with
// the example you adopt.
package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/pkg/lambdaenv"
)

// DefaultAddr is where Serve listens unless told otherwise (AddrVariable).
const DefaultAddr = ":8080"

// AddrVariable names the address the probes listen on (host:port, ":0" for any free port).
const AddrVariable = "SLUICE_HEALTH_ADDR"

// CheckFlag, as the only argument, makes Main probe the running process's /healthz instead of
// running the service, and exit 0 when it answers 200, 1 otherwise: the container health
// check of an image without a shell or curl (ECS: ["CMD", "/relay", "-healthcheck"]).
const CheckFlag = "-healthcheck"

// Main runs run until SIGTERM or Ctrl-C, with the JSON logger of the named service, and exits 1
// when it fails: the shared main of the long-running examples. With CheckFlag it probes instead.
func Main(service string, run func(ctx context.Context, getenv lambdaenv.Getenv, log *slog.Logger) error) {
	if len(os.Args) == 2 && os.Args[1] == CheckFlag {
		if err := Check(os.Getenv); err != nil {
			fmt.Fprintln(os.Stderr, service+" health check:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	ctx, stop := SignalContext(context.Background())
	defer stop()
	log := lambdaenv.Logger(os.Getenv, service)
	if err := run(ctx, os.Getenv, log); err != nil {
		log.Error(service+" failed", "error", err)
		stop()
		os.Exit(1)
	}
}

// ServeFrom is Serve on the address AddrVariable names in getenv (DefaultAddr when unset).
func ServeFrom(getenv lambdaenv.Getenv, ready func(context.Context) error, log *slog.Logger) (*Server, error) {
	addr := getenv(AddrVariable)
	if addr == "" {
		addr = DefaultAddr
	}
	s, err := Serve(addr, ready, log)
	if err != nil {
		return nil, fmt.Errorf("health endpoint: %w", err)
	}
	return s, nil
}

// Check asks the liveness endpoint of the process in this container (the address AddrVariable
// names in getenv, on the loopback interface when it names no host) and returns nil when it
// answers 200 within two seconds.
func Check(getenv lambdaenv.Getenv) error {
	addr := getenv(AddrVariable)
	if addr == "" {
		addr = DefaultAddr
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%s %q: %w", AddrVariable, addr, err)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	client := &http.Client{Timeout: 2 * time.Second}
	resp, err := client.Get("http://" + net.JoinHostPort(host, port) + "/healthz")
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("/healthz answered %s", resp.Status)
	}
	return nil
}

// SignalContext returns a context that ends on SIGTERM (ECS and Kubernetes stop a task with it)
// or SIGINT, and a function that stops listening for them.
func SignalContext(parent context.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(parent, syscall.SIGTERM, os.Interrupt)
}

// Server answers /healthz (200 while the process runs: liveness) and /readyz (200 while the
// service is ready and not stopping, 503 with the reason otherwise: readiness).
type Server struct {
	ready    func(context.Context) error
	stopping atomic.Bool
	srv      *http.Server
	ln       net.Listener
}

// Serve listens on addr and answers the probes; ready reports whether the service can work
// (the examples ping their database). It returns once the listener is open.
func Serve(addr string, ready func(context.Context) error, log *slog.Logger) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s := &Server{ready: ready, ln: ln}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
		if s.stopping.Load() {
			http.Error(w, "stopping", http.StatusServiceUnavailable)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if err := s.ready(ctx); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	s.srv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("health endpoint stopped", "error", err)
		}
	}()
	return s, nil
}

// Addr is the address the server listens on (useful with ":0").
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Stopping makes /readyz answer 503 from now on, so that the orchestrator stops sending work
// while the service finishes what it holds.
func (s *Server) Stopping() { s.stopping.Store(true) }

// Close stops the server.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.srv.Shutdown(ctx)
}
