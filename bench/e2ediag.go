package main

// Diagnostics for the end-to-end suite: where does the time go when the local stack falls behind?
//
//   - a timing proxy between the relay Lambda and the SNS endpoint, which times every SNS call
//     the relay makes (PublishBatch) as the relay sees it;
//   - a probe of the SNS endpoint alone: PublishBatch of 10 messages from Go with a fixed number
//     of callers, to a topic fanned out to its own SQS queue, as the relay's topic is;
//   - CPU use per process of this run (the harness, PostgreSQL, fauxqs, the RIE emulators and
//     the two functions), read from /proc, and the machine's total.

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sns"
	snstypes "github.com/aws/aws-sdk-go-v2/service/sns/types"
	"github.com/aws/aws-sdk-go-v2/service/sqs"

	"github.com/sluicehq/sluice/internal/localaws"
	"github.com/sluicehq/sluice/internal/localrun"
)

// SNSCalls summarises the SNS calls seen in a window.
type SNSCalls struct {
	Calls   int
	PerSec  float64
	Latency Latencies
}

// timingProxy forwards to an endpoint and records each request's duration.
type timingProxy struct {
	URL string
	mu  sync.Mutex
	d   []time.Duration
	srv *http.Server
}

func startTimingProxy(target string) (*timingProxy, error) {
	u, err := url.Parse(target)
	if err != nil {
		return nil, err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &timingProxy{URL: "http://" + l.Addr().String()}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: time.Minute}
	p.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rp.ServeHTTP(w, r)
		d := time.Since(start)
		p.mu.Lock()
		p.d = append(p.d, d)
		p.mu.Unlock()
	})}
	go func() { _ = p.srv.Serve(l) }()
	return p, nil
}

// take returns and clears the durations recorded since the last take, summarised over window.
func (p *timingProxy) take(window time.Duration) SNSCalls {
	p.mu.Lock()
	d := p.d
	p.d = nil
	p.mu.Unlock()
	return SNSCalls{Calls: len(d), PerSec: float64(len(d)) / window.Seconds(), Latency: summarize(d)}
}

func (p *timingProxy) Close() { _ = p.srv.Close() }

// SNSProbe is the SNS endpoint measured alone.
type SNSProbe struct {
	Callers  int
	Duration time.Duration
	Calls    SNSCalls
	// Events is Calls × 10 per second: the events/s the endpoint accepts at this concurrency.
	EventsPerSec float64
	Err          string
}

// probeSNS publishes batches of 10 small messages from callers goroutines for d to a topic of
// its own with a raw-delivery SQS subscription (the relay's fan-out), and times each call.
func probeSNS(ctx context.Context, endpoint, name string, callers int, d time.Duration) SNSProbe {
	res := SNSProbe{Callers: callers, Duration: d}
	cfg, err := localaws.Config(ctx, endpoint)
	if err != nil {
		res.Err = err.Error()
		return res
	}
	snsc, sqsc := sns.NewFromConfig(cfg), sqs.NewFromConfig(cfg)
	pl, err := localrun.CreatePipeline(ctx, snsc, sqsc, localrun.PipelineOptions{Name: name})
	if err != nil {
		res.Err = err.Error()
		return res
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		_, _ = snsc.DeleteTopic(cctx, &sns.DeleteTopicInput{TopicArn: &pl.TopicARN})
		_, _ = sqsc.DeleteQueue(cctx, &sqs.DeleteQueueInput{QueueUrl: &pl.QueueURL})
		_, _ = sqsc.DeleteQueue(cctx, &sqs.DeleteQueueInput{QueueUrl: &pl.DLQURL})
	}()
	var (
		mu       sync.Mutex
		lat      []time.Duration
		firstErr atomic.Value
		wg       sync.WaitGroup
	)
	body := `{"orderId":"o-1","customer":"bench-0-001","seq":1,"amountCents":1299,"currency":"EUR"}`
	runCtx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	start := time.Now()
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; runCtx.Err() == nil; i++ {
				entries := make([]snstypes.PublishBatchRequestEntry, 10)
				for k := range entries {
					entries[k] = snstypes.PublishBatchRequestEntry{Id: aws.String(strconv.Itoa(k)), Message: aws.String(body),
						MessageAttributes: map[string]snstypes.MessageAttributeValue{
							"eventType": {DataType: aws.String("String"), StringValue: aws.String("OrderCreated")},
							"messageId": {DataType: aws.String("String"), StringValue: aws.String(fmt.Sprintf("probe-%d-%d-%d", c, i, k))},
						}}
				}
				t0 := time.Now()
				_, err := snsc.PublishBatch(runCtx, &sns.PublishBatchInput{TopicArn: &pl.TopicARN, PublishBatchRequestEntries: entries})
				if err != nil {
					if runCtx.Err() == nil && firstErr.Load() == nil {
						firstErr.Store(err.Error())
					}
					continue
				}
				mu.Lock()
				lat = append(lat, time.Since(t0))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	res.Calls = SNSCalls{Calls: len(lat), PerSec: float64(len(lat)) / el.Seconds(), Latency: summarize(lat)}
	res.EventsPerSec = 10 * res.Calls.PerSec
	if e, ok := firstErr.Load().(string); ok {
		res.Err = e
	}
	return res
}

// ProcCPU is the CPU one group of processes used in a window, in cores (CPU seconds per second),
// and how long its threads were runnable but waiting for a core (RunQueue, in the same unit:
// seconds of waiting per second, summed over threads), from /proc/<pid>/task/*/schedstat.
type ProcCPU struct {
	Group    string
	Cores    float64
	RunQueue float64
	Procs    int
}

// cpuSnapshot is the cumulative CPU time of this process's descendants, by pid, and the machine's.
type cpuSnapshot struct {
	at          time.Time
	ticks       map[int]uint64
	waitNS      map[int]uint64
	group       map[int]string
	busy, total uint64
}

const clockTicks = 100 // USER_HZ on Linux

// cpuLabels name the groups a suite's own processes fall in: this process (Self) and the
// PostgreSQL backends of its database (Backends).
type cpuLabels struct{ Self, Backends string }

// e2eCPULabels are the end-to-end suite's.
var e2eCPULabels = cpuLabels{
	Self:     "harness (producers, SQS event-source and schedule drivers, SNS timing proxy)",
	Backends: "PostgreSQL backends of the e2e database",
}

// takeCPUSnapshot reads /proc for this process and its descendants (grouped by what they are,
// with labels for this process and dbName's backends) and /proc/stat for the whole machine.
func takeCPUSnapshot(dbName string, labels cpuLabels) cpuSnapshot {
	s := cpuSnapshot{at: time.Now(), ticks: map[int]uint64{}, waitNS: map[int]uint64{}, group: map[int]string{}}
	entries, _ := os.ReadDir("/proc")
	type proc struct {
		ppid  int
		ticks uint64
		comm  string
	}
	procs := map[int]proc{}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		// pid (comm) state ppid ... utime(14) stime(15) cutime cstime
		str := string(b)
		rp := strings.LastIndexByte(str, ')')
		if rp < 0 {
			continue
		}
		comm := str[strings.IndexByte(str, '(')+1 : rp]
		f := strings.Fields(str[rp+2:])
		if len(f) < 13 {
			continue
		}
		ppid, _ := strconv.Atoi(f[1])
		ut, _ := strconv.ParseUint(f[11], 10, 64)
		st, _ := strconv.ParseUint(f[12], 10, 64)
		procs[pid] = proc{ppid, ut + st, comm}
	}
	self := os.Getpid()
	isOurs := func(pid int) bool {
		for i := 0; i < 64 && pid > 1; i++ {
			if pid == self {
				return true
			}
			pid = procs[pid].ppid
		}
		return false
	}
	for pid, p := range procs {
		if !isOurs(pid) {
			continue
		}
		s.ticks[pid] = p.ticks
		s.waitNS[pid] = runQueueWait(pid)
		s.group[pid] = classify(pid, p.comm, dbName, labels)
	}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := strings.Cut(string(b), "\n")
		f := strings.Fields(line)
		for i, v := range f[1:] {
			n, _ := strconv.ParseUint(v, 10, 64)
			if i >= 8 { // guest time is already counted in user
				break
			}
			s.total += n
			if i != 3 && i != 4 { // idle, iowait
				s.busy += n
			}
		}
	}
	return s
}

// runQueueWait sums the time pid's threads spent runnable, waiting for a core (nanoseconds).
func runQueueWait(pid int) uint64 {
	tasks, _ := filepath.Glob(filepath.Join("/proc", strconv.Itoa(pid), "task", "*", "schedstat"))
	var sum uint64
	for _, t := range tasks {
		b, err := os.ReadFile(t)
		if err != nil {
			continue
		}
		if f := strings.Fields(string(b)); len(f) >= 2 {
			n, _ := strconv.ParseUint(f[1], 10, 64)
			sum += n
		}
	}
	return sum
}

func classify(pid int, comm, dbName string, labels cpuLabels) string {
	cmd, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	c := strings.ReplaceAll(string(cmd), "\x00", " ")
	switch {
	case pid == os.Getpid():
		return labels.Self
	case strings.HasPrefix(c, "postgres:") && strings.Contains(c, dbName):
		return labels.Backends
	case comm == "postgres" || strings.HasPrefix(c, "postgres:"):
		return "PostgreSQL, other processes (WAL writer, checkpointer, ...)"
	case strings.Contains(comm, "node") || strings.Contains(c, "fauxqs"):
		return "fauxqs (Node: SNS and SQS)"
	case comm == "bootstrap" && strings.Contains(c, "relay"):
		return "relay function (bootstrap)"
	case comm == "bootstrap" && strings.Contains(c, "consumer"):
		return "consumer function (bootstrap)"
	case strings.Contains(comm, "rie") || strings.Contains(c, "runtime-interface-emulator"):
		return "Lambda runtime interface emulators (RIE)"
	}
	return "other (" + comm + ")"
}

// cpuBetween returns the cores each group used between a and b, the machine's busy cores
// (everything, including other users' work), and the cores used by processes not of this run.
func cpuBetween(a, b cpuSnapshot) (groups []ProcCPU, machineBusy, others float64) {
	secs := b.at.Sub(a.at).Seconds()
	byGroup := map[string]*ProcCPU{}
	var ours float64
	for pid, t := range b.ticks {
		d := t - a.ticks[pid] // a process started in the window counts from zero
		if t < a.ticks[pid] {
			continue
		}
		g := byGroup[b.group[pid]]
		if g == nil {
			g = &ProcCPU{Group: b.group[pid]}
			byGroup[b.group[pid]] = g
		}
		c := float64(d) / clockTicks / secs
		g.Cores += c
		if w := b.waitNS[pid]; w >= a.waitNS[pid] {
			g.RunQueue += float64(w-a.waitNS[pid]) / 1e9 / secs
		}
		g.Procs++
		ours += c
	}
	for _, g := range byGroup {
		groups = append(groups, *g)
	}
	slices.SortFunc(groups, func(x, y ProcCPU) int {
		switch {
		case x.Cores > y.Cores:
			return -1
		case x.Cores < y.Cores:
			return 1
		}
		return strings.Compare(x.Group, y.Group)
	})
	if tot := b.total - a.total; tot > 0 {
		machineBusy = float64(b.busy-a.busy) / float64(tot) * float64(runtime.NumCPU())
	}
	return groups, machineBusy, max(0, machineBusy-ours)
}
