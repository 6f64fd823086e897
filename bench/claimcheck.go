package main

// The claim check suite (issue 13): one relay's throughput when 10% of the rows carry a 1 MB
// payload, which the claim check stores before publishing a pointer, against the same number of
// rows all small. The store is a stub PayloadStore with a fixed latency per upload
// (claimCheckStoreLatency, about an in-region S3 PUT of 1 MB), not the emulator's S3: the suite
// measures what sluice adds (reading megabyte payloads out of PostgreSQL within the round's
// byte budget, the uploads before the publish call, the larger rounds), not an emulator's disk.
// The publisher stub takes claimCheckPublishDelay per call, like the relay suite's 10 ms case.
// The large payloads are random base64, so PostgreSQL cannot compress them away. The two
// workloads run interleaved, best of several repeats each, on the same database.

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/sluicehq/sluice/pkg/outbox"
)

const (
	// claimCheckStoreLatency is the stub store's time per upload.
	claimCheckStoreLatency = 25 * time.Millisecond
	// claimCheckPublishDelay is the stub publisher's time per call.
	claimCheckPublishDelay = 10 * time.Millisecond
	// claimCheckLargeBytes is the large rows' payload size.
	claimCheckLargeBytes = 1 << 20
)

// ClaimCheckResult is the claim check suite's runs.
type ClaimCheckResult struct {
	// Runs holds the best run of each workload.
	Runs    []ClaimCheckRun
	Repeats int
	// StoreLatency and PublishDelay are the stubs' fixed latencies.
	StoreLatency, PublishDelay time.Duration
}

// ClaimCheckRun is one workload.
type ClaimCheckRun struct {
	// Workload is claimCheckSmall or claimCheckMixed.
	Workload string
	Events   int
	// Offloaded rows and their payload bytes (the relay's Stats), in the best run.
	Offloaded, OffloadedBytes int
	Elapsed                   time.Duration
	// Rates of every repeat (events/s).
	Rates []float64
}

// Rate is the throughput in events per second.
func (r ClaimCheckRun) Rate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Events) / r.Elapsed.Seconds()
}

const (
	claimCheckSmall = "all rows small (~100 B)"
	claimCheckMixed = "10% of rows 1 MB (stored in S3 by the claim check)"
)

func claimCheckSizes(sz Sizes) (rows, repeats int) {
	if sz.Name == "quick" {
		return 1_000, 2
	}
	return 5_000, 3
}

// delayStore is a PayloadStore that takes a fixed time per upload and counts them.
type delayStore struct {
	delay        time.Duration
	puts, stored atomic.Int64
}

func (s *delayStore) PutPayload(ctx context.Context, _, _ string, body []byte) error {
	if err := sleepCtx(ctx, s.delay); err != nil {
		return err
	}
	s.puts.Add(1)
	s.stored.Add(int64(len(body)))
	return nil
}

func runClaimCheckSuite(ctx context.Context, log *slog.Logger, env *Env, sz Sizes, rep *Report) error {
	rows, repeats := claimCheckSizes(sz)
	pool, _, err := env.NewDatabase(ctx, "claimcheck", 16, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	res := &ClaimCheckResult{Repeats: repeats, StoreLatency: claimCheckStoreLatency, PublishDelay: claimCheckPublishDelay}
	best := map[string]*ClaimCheckRun{}
	for range repeats {
		for _, wl := range []string{claimCheckSmall, claimCheckMixed} {
			r, err := claimCheckRun(ctx, pool, rows, wl)
			if err != nil {
				return fmt.Errorf("%s: %w", wl, err)
			}
			log.Info("claim check run", "workload", wl, "events", r.Events, "offloaded", r.Offloaded,
				"elapsed", r.Elapsed.Round(time.Millisecond), "ev/s", int(r.Rate()))
			b := best[wl]
			if b == nil {
				b = &ClaimCheckRun{Workload: wl}
				best[wl] = b
			}
			b.Rates = append(b.Rates, r.Rate())
			if b.Elapsed == 0 || r.Elapsed < b.Elapsed {
				b.Events, b.Elapsed, b.Offloaded, b.OffloadedBytes = r.Events, r.Elapsed, r.Offloaded, r.OffloadedBytes
			}
		}
	}
	for _, wl := range []string{claimCheckSmall, claimCheckMixed} {
		res.Runs = append(res.Runs, *best[wl])
	}
	rep.ClaimCheck = res
	return nil
}

// claimCheckRun seeds n rows of the workload and times one relay (defaults, a claim check over
// the stub store) until every row is published; it checks that exactly the large rows went
// through the store.
func claimCheckRun(ctx context.Context, pool *pgxpool.Pool, n int, workload string) (ClaimCheckRun, error) {
	if _, err := pool.Exec(ctx, "TRUNCATE outbox_event"); err != nil {
		return ClaimCheckRun{}, err
	}
	w, err := outbox.NewWriter(outbox.WriterConfig{MaxMessageBytes: 2 * claimCheckLargeBytes})
	if err != nil {
		return ClaimCheckRun{}, err
	}
	large := 0
	random := make([]byte, claimCheckLargeBytes*3/4)
	for done := 0; done < n; {
		chunk := min(50, n-done)
		msgs := make([]outbox.Message, chunk)
		for i := range msgs {
			k := done + i
			payload := json.RawMessage(fmt.Sprintf(`{"n":%d}`, k))
			if workload == claimCheckMixed && k%10 == 0 {
				_, _ = rand.Read(random)
				payload = json.RawMessage(fmt.Sprintf(`{"n":%d,"doc":%q}`, k, base64.StdEncoding.EncodeToString(random)))
				large++
			}
			msgs[i] = outbox.Message{Topic: "orders", AggregateType: "order", AggregateID: fmt.Sprintf("o-%d", k),
				PartitionKey: fmt.Sprintf("k%d", k%200), EventType: "OrderCreated", Payload: payload}
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { _, err := w.Write(ctx, tx, msgs...); return err }); err != nil {
			return ClaimCheckRun{}, err
		}
		done += chunk
	}
	if _, err := pool.Exec(ctx, "VACUUM ANALYZE outbox_event"); err != nil {
		return ClaimCheckRun{}, err
	}
	store := &delayStore{delay: claimCheckStoreLatency}
	pub := &stubPublisher{Delay: claimCheckPublishDelay}
	r, err := outbox.NewRelay(pool, outbox.RelayConfig{Publisher: pub, Topics: map[string]string{"orders": "arn:aws:sns:us-east-1:000000000000:orders"},
		ClaimCheck: &outbox.ClaimCheck{Store: store, Bucket: "bench", KeyPrefix: "outbox/"}})
	if err != nil {
		return ClaimCheckRun{}, err
	}
	elapsed, err := drainWith(ctx, pool, []*outbox.Relay{r}, n, nil, 5*time.Minute)
	if err != nil {
		return ClaimCheckRun{}, fmt.Errorf("%d of %d published: %w", pub.events.Load(), n, err)
	}
	if got := int(store.puts.Load()); got != large {
		return ClaimCheckRun{}, fmt.Errorf("the store received %d payloads for %d large rows", got, large)
	}
	return ClaimCheckRun{Workload: workload, Events: n, Elapsed: elapsed, Offloaded: large, OffloadedBytes: int(store.stored.Load())}, nil
}

// claimCheckMarkdown renders the suite's section.
func (r *Report) claimCheckMarkdown(w func(string, ...any)) {
	c := r.ClaimCheck
	if c == nil || len(c.Runs) < 2 {
		return
	}
	w("## 12. Claim check (issue 13)\n\n")
	w("One relay (defaults: 16 MiB round budget, 2 pipelines) with a claim check, publisher stub of %s per call, draining the same number "+
		"of rows twice: all small, and with every tenth row's payload 1 MB of random base64 (incompressible), which the claim check "+
		"stores before publishing a pointer. The store is a stub with a fixed %s per upload (about an S3 PUT of 1 MB in-region), not the "+
		"emulator's S3, so the difference is sluice's: reading megabyte payloads out of PostgreSQL within the round budget and waiting "+
		"for the uploads before each publish call. Best of %d interleaved runs each.\n\n", c.PublishDelay, c.StoreLatency, c.Repeats)
	w("| workload | events | offloaded | MB offloaded | events/s | MB/s offloaded | vs. all small | every run (events/s) |\n|---|---|---|---|---|---|---|---|\n")
	small := c.Runs[0].Rate()
	for _, run := range c.Runs {
		vs := "—"
		if run.Workload != claimCheckSmall && small > 0 {
			vs = fmt.Sprintf("%.2f×", run.Rate()/small)
		}
		mb := float64(run.OffloadedBytes) / 1e6
		rates := ""
		for i, x := range run.Rates {
			if i > 0 {
				rates += ", "
			}
			rates += fmt.Sprintf("%.0f", x)
		}
		w("| %s | %d | %d | %.0f | %.0f | %.1f | %s | %s |\n", run.Workload, run.Events, run.Offloaded, mb, run.Rate(),
			mb/run.Elapsed.Seconds(), vs, rates)
	}
	w("\n")
}
