package localrun

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"sync/atomic"
)

// Faults are the shares of requests a FaultProxy breaks, each between 0 and 1.
type Faults struct {
	// Throttle answers HTTP 400 Throttling without forwarding: the request had no effect.
	Throttle float64
	// Unavailable answers HTTP 503 without forwarding.
	Unavailable float64
	// LoseResponse forwards the request (the broker acts on it) and then answers HTTP 500, so
	// the caller believes it failed: the at-least-once case that makes duplicates.
	LoseResponse float64
}

// FaultProxy is an HTTP reverse proxy that breaks a share of requests on their way to an AWS
// endpoint, spread evenly and deterministically over the requests (see spread). Point a
// client's AWS_ENDPOINT_URL at URL.
type FaultProxy struct {
	// URL is the proxy's address, e.g. http://127.0.0.1:39123.
	URL string

	faults                                  atomic.Pointer[Faults]
	requests                                atomic.Uint64
	forwarded, throttled, unavailable, lost atomic.Int64
	srv                                     *http.Server
}

// ProxyStats counts what a FaultProxy did.
type ProxyStats struct {
	Forwarded, Throttled, Unavailable, LostResponses int64
}

// StartFaultProxy listens on a free local port and forwards to target with faults.
func StartFaultProxy(target string, faults Faults) (*FaultProxy, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, fmt.Errorf("parse proxy target %q: %w", target, err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listen for the fault proxy: %w", err)
	}
	p := &FaultProxy{URL: "http://" + l.Addr().String()}
	p.faults.Store(&faults)
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ErrorLog = nil
	p.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f := p.faults.Load()
		x := spread(p.requests.Add(1))
		switch {
		case x < f.Throttle:
			p.throttled.Add(1)
			awsError(w, http.StatusBadRequest, "Throttling", "Rate exceeded (injected by the fault proxy)")
			return
		case x < f.Throttle+f.Unavailable:
			p.unavailable.Add(1)
			awsError(w, http.StatusServiceUnavailable, "ServiceUnavailable", "Service unavailable (injected by the fault proxy)")
			return
		case x < f.Throttle+f.Unavailable+f.LoseResponse:
			p.lost.Add(1)
			rec := &discardWriter{header: http.Header{}}
			rp.ServeHTTP(rec, r)
			awsError(w, http.StatusInternalServerError, "InternalError", "Response lost (injected by the fault proxy after forwarding)")
			return
		}
		p.forwarded.Add(1)
		rp.ServeHTTP(w, r)
	})}
	go func() { _ = p.srv.Serve(l) }()
	return p, nil
}

// spread places the nth request in [0, 1) by the golden-ratio sequence: deterministic, and any
// run of requests covers the interval evenly, so every configured fault shows up within the
// first few requests (1/share of them at most, about) whatever the scheduling, and the shares
// hold over any stretch. A random draw could skip a 10% fault for 20 requests one time in 8.
func spread(n uint64) float64 {
	const phi = 0.6180339887498949
	x := float64(n) * phi
	return x - math.Floor(x)
}

// SetFaults changes the fault shares, e.g. to zero to let a test finish.
func (p *FaultProxy) SetFaults(f Faults) { p.faults.Store(&f) }

// Stats returns the counts so far.
func (p *FaultProxy) Stats() ProxyStats {
	return ProxyStats{p.forwarded.Load(), p.throttled.Load(), p.unavailable.Load(), p.lost.Load()}
}

// Close stops the proxy.
func (p *FaultProxy) Close() { _ = p.srv.Shutdown(context.Background()) }

// awsError writes an AWS query-protocol error document (SNS's protocol).
func awsError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "text/xml")
	w.Header().Set("x-amzn-RequestId", "fault-proxy")
	w.WriteHeader(status)
	fmt.Fprintf(w, `<ErrorResponse><Error><Type>%s</Type><Code>%s</Code><Message>%s</Message></Error><RequestId>fault-proxy</RequestId></ErrorResponse>`,
		map[bool]string{true: "Receiver", false: "Sender"}[status >= 500], code, msg)
}

// discardWriter swallows a forwarded response.
type discardWriter struct{ header http.Header }

func (d *discardWriter) Header() http.Header         { return d.header }
func (d *discardWriter) Write(b []byte) (int, error) { return len(b), nil }
func (d *discardWriter) WriteHeader(int)             {}

func region() string {
	if r := os.Getenv("AWS_REGION"); r != "" {
		return r
	}
	return "us-east-1"
}
