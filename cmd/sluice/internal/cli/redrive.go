package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	sqstypes "github.com/aws/aws-sdk-go-v2/service/sqs/types"
	"github.com/aws/smithy-go"
	"github.com/spf13/cobra"
)

func (a *app) redriveCommand() *cobra.Command {
	var (
		opts RedriveOptions
		g    guard
	)
	cmd := &cobra.Command{
		Use:   "redrive --dlq URL [--to URL] [--max N] [--dry-run] [--yes]",
		Short: "Move messages from a DLQ back to its source queue",
		Long: `Move messages from a dead-letter queue back to the queue they came from (the queue whose
RedrivePolicy names the DLQ), or to --to. Fix the consumer first: messages that fail again return
to the DLQ after maxReceiveCount receives.

It first prints what it would move: the DLQ, the destination, the method and how many messages
(SQS's approximate counts, visible and in flight; at most --max). --dry-run stops there. On a
terminal it asks for confirmation; --yes confirms for scripts; without a terminal and without --yes
it refuses and moves nothing.

Where the endpoint supports it (AWS, standard queues, no --max) redrive starts an SQS message move
task and follows its progress; an interrupted redrive leaves the task running in SQS, and running
the same command again follows it. Otherwise (FIFO queues, --max, emulators without
StartMessageMoveTask) it receives, sends and then deletes, ten messages at a time, keeping the body,
the message attributes and, for FIFO queues, MessageGroupId and MessageDeduplicationId. A message is
deleted from the DLQ only after the destination accepted it, so an interrupted redrive (Ctrl-C stops
after the batch in flight) loses nothing: run the same command again to move the rest. At worst
(interrupted between send and delete) a message is in both queues, and the consumer's inbox
deduplicates it by its messageId.

Progress (messages moved, rate, time left) is a bar on a terminal, lines otherwise, JSON lines with
--json.`,
		Example: `  sluice redrive --dlq https://sqs.eu-west-1.amazonaws.com/123456789012/billing-dlq --dry-run
  sluice redrive --dlq https://sqs.eu-west-1.amazonaws.com/123456789012/billing-dlq --max 10
  sluice redrive --dlq http://localhost:4566/000000000000/billing-dlq --to http://localhost:4566/000000000000/billing --yes`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := opts.validate(); err != nil {
				return err
			}
			ctx := cmd.Context()
			c, err := a.sqsClient(ctx)
			if err != nil {
				return err
			}
			opts.Progress = a.io.Err
			opts.TTY = a.io.IsTerminal(a.io.Err)
			if g.json {
				opts.Progress, opts.JSON = a.io.Out, true
			}
			opts.DryRun = g.dryRun
			opts.Confirm = func(p RedrivePlan) error {
				if g.json {
					emitJSON(a.io.Out, map[string]any{"event": "plan", "op": "redrive", "dry_run": g.dryRun, "plan": p})
				} else {
					fmt.Fprintln(a.io.Out, p.line(g.dryRun))
				}
				if p.Messages == 0 && p.InFlight == 0 {
					return nil
				}
				ok, err := a.proceed(g, "Move these messages?", "redrive")
				if err == nil && !ok {
					return errDryRun
				}
				return err
			}
			res, err := Redrive(ctx, c, opts)
			if errors.Is(err, errDryRun) || opts.DryRun && err == nil {
				return nil
			}
			if g.json {
				emitJSON(a.io.Out, map[string]any{"event": "result", "op": "redrive", "moved": res.Moved, "destination": res.Destination,
					"method": res.Method, "interrupted": errors.Is(err, ErrInterrupted), "note": res.Note})
				return err
			}
			if res.Moved > 0 || err == nil {
				fmt.Fprintln(a.io.Out, res.line(opts.DLQ))
			}
			if res.Note != "" {
				fmt.Fprintln(a.io.Err, res.Note)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.DLQ, "dlq", "", "URL of the dead-letter queue to drain (required)")
	f.StringVar(&opts.To, "to", "", "URL of the destination queue (default: the queue whose RedrivePolicy names the DLQ)")
	f.IntVar(&opts.Max, "max", 0, "move at most N messages (default: all)")
	g.flags(cmd, "be moved")
	return cmd
}

// RedrivePlan is what Redrive moves: from which DLQ, to where, how, and about how many.
type RedrivePlan struct {
	DLQ         string `json:"dlq"`
	Destination string `json:"destination"`
	Method      string `json:"method"`
	// Messages and InFlight are SQS's approximate counts of the DLQ's visible and in-flight
	// messages; Max bounds the move (0: all).
	Messages int64 `json:"messages"`
	InFlight int64 `json:"in_flight"`
	Max      int   `json:"max,omitempty"`
}

// line is the plan as `sluice redrive` prints it.
func (p RedrivePlan) line(dryRun bool) string {
	verb := "Moving"
	if dryRun {
		verb = "Dry run: would move"
	}
	return fmt.Sprintf("%s %s from %s to %s (%s)", verb, p.describe(), p.DLQ, p.Destination, p.Method)
}

func (p RedrivePlan) describe() string {
	n := p.Messages
	if p.Max > 0 && int64(p.Max) < n {
		return fmt.Sprintf("%d of ~%d messages (--max)", p.Max, n)
	}
	s := fmt.Sprintf("~%d messages", n)
	if p.InFlight > 0 {
		s += fmt.Sprintf(" (and ~%d in flight, moved once visible again)", p.InFlight)
	}
	return s
}

// RedriveOptions configure Redrive.
type RedriveOptions struct {
	// DLQ is the URL of the queue to drain. Required.
	DLQ string
	// To is the destination URL. Defaults to the DLQ's single source queue.
	To string
	// Max bounds the number of messages moved. Defaults to 0: all.
	Max int
	// Visibility is how long a received message stays hidden while it is being moved.
	// Defaults to 2 minutes.
	Visibility time.Duration
	// PollInterval is how often a message move task's progress is read. Defaults to 2 seconds.
	PollInterval time.Duration
	// Progress receives progress output (a bar when TTY is true, lines otherwise). Defaults to none.
	Progress io.Writer
	// TTY draws the progress as a bar that updates in place. Defaults to plain lines.
	TTY bool
	// JSON writes the progress as JSON lines. Defaults to false.
	JSON bool
	// DryRun only plans: nothing is moved.
	DryRun bool
	// Confirm is given the plan before anything moves (also on a dry run); an error stops the
	// redrive. Defaults to nil: no confirmation.
	Confirm func(RedrivePlan) error
}

func (o RedriveOptions) validate() error {
	if o.DLQ == "" {
		return usagef("--dlq is required")
	}
	if o.Max < 0 {
		return usagef("--max must not be negative, got %d", o.Max)
	}
	return nil
}

// RedriveResult is what Redrive did.
type RedriveResult struct {
	// Moved is the number of messages moved (also when an error stopped the redrive).
	Moved int
	// Destination is the URL of the queue the messages went to.
	Destination string
	// Method is "message move task" or "receive/send/delete".
	Method string
	// Note explains an early stop that is not an error.
	Note string
}

// line is the result as `sluice redrive` prints it.
func (r RedriveResult) line(dlq string) string {
	return fmt.Sprintf("moved %d messages from %s to %s (%s)", r.Moved, dlq, r.Destination, r.Method)
}

// ErrInterrupted is returned when the context ended during a redrive; what was moved stays moved,
// the rest stays in the DLQ.
var ErrInterrupted = errors.New("interrupted")

// Redrive moves messages from opts.DLQ to its source queue (or opts.To). See the command's help.
func Redrive(ctx context.Context, c SQSAPI, opts RedriveOptions) (RedriveResult, error) {
	if err := opts.validate(); err != nil {
		return RedriveResult{}, err
	}
	if opts.Visibility <= 0 {
		opts.Visibility = 2 * time.Minute
	}
	if opts.Progress == nil {
		opts.Progress = io.Discard
	}
	if opts.PollInterval <= 0 {
		opts.PollInterval = 2 * time.Second
	}
	dlq, err := describeQueue(ctx, c, opts.DLQ)
	if err != nil {
		return RedriveResult{}, fmt.Errorf("--dlq: %w", err)
	}
	var dest queueInfo
	if opts.To != "" {
		if dest, err = describeQueue(ctx, c, opts.To); err != nil {
			return RedriveResult{}, fmt.Errorf("--to: %w", err)
		}
		if dest.ARN == dlq.ARN {
			return RedriveResult{}, usagef("--to is the DLQ itself")
		}
	} else {
		sources, err := sourceQueues(ctx, c, dlq.URL, dlq.ARN)
		if err != nil {
			return RedriveResult{}, err
		}
		switch len(sources) {
		case 0:
			return RedriveResult{}, fmt.Errorf("queue %s is not the dead-letter queue of any queue (no RedrivePolicy names it); pass --to URL to choose the destination", opts.DLQ)
		case 1:
		default:
			return RedriveResult{}, fmt.Errorf("queue %s is the dead-letter queue of %d queues (%s); choose one with --to URL", opts.DLQ, len(sources), strings.Join(sources, ", "))
		}
		if dest, err = describeQueue(ctx, c, sources[0]); err != nil {
			return RedriveResult{}, err
		}
	}
	if dest.FIFO != dlq.FIFO {
		return RedriveResult{}, fmt.Errorf("cannot move messages between a FIFO and a standard queue (%s → %s)", dlq.Name, dest.Name)
	}
	res := RedriveResult{Destination: dest.URL}
	plan := RedrivePlan{DLQ: dlq.URL, Destination: dest.URL, Method: "receive/send/delete", Messages: dlq.Visible, InFlight: dlq.InFlight, Max: opts.Max}
	if opts.Max == 0 && !dlq.FIFO {
		plan.Method = "message move task, where the endpoint supports it, else receive/send/delete"
	}
	if opts.Confirm != nil {
		if err := opts.Confirm(plan); err != nil {
			return res, err
		}
	}
	if opts.DryRun {
		return res, nil
	}
	if opts.Max == 0 && !dlq.FIFO {
		res.Method = "message move task"
		done, err := moveTask(ctx, c, dlq, dest, opts, &res)
		if done || err != nil {
			return res, err
		}
	}
	res.Method = "receive/send/delete"
	return res, moveByHand(ctx, c, dlq, dest, opts, &res)
}

// moveTask redrives with StartMessageMoveTask. done is false when the endpoint lacks the API.
func moveTask(ctx context.Context, c SQSAPI, dlq, dest queueInfo, opts RedriveOptions, res *RedriveResult) (done bool, err error) {
	running := func() (*sqstypes.ListMessageMoveTasksResultEntry, error) {
		out, err := c.ListMessageMoveTasks(ctx, &sqs.ListMessageMoveTasksInput{SourceArn: aws.String(dlq.ARN), MaxResults: aws.Int32(1)})
		if err != nil {
			return nil, err
		}
		for i := range out.Results {
			if aws.ToString(out.Results[i].Status) == "RUNNING" {
				return &out.Results[i], nil
			}
		}
		return nil, nil
	}
	task, err := running()
	if err != nil {
		if isUnsupported(err) {
			return false, nil
		}
		return true, fmt.Errorf("list message move tasks of %s: %w", dlq.URL, err)
	}
	if task != nil {
		fmt.Fprintf(opts.Progress, "a message move task is already running for this DLQ; following it\n")
	} else {
		_, err := c.StartMessageMoveTask(ctx, &sqs.StartMessageMoveTaskInput{SourceArn: aws.String(dlq.ARN), DestinationArn: aws.String(dest.ARN)})
		if err != nil {
			if isUnsupported(err) {
				return false, nil
			}
			return true, fmt.Errorf("start message move task from %s: %w", dlq.URL, err)
		}
	}
	bar := newRedriveMeter(opts, dlq)
	for {
		task, err := func() (*sqstypes.ListMessageMoveTasksResultEntry, error) {
			out, err := c.ListMessageMoveTasks(ctx, &sqs.ListMessageMoveTasksInput{SourceArn: aws.String(dlq.ARN), MaxResults: aws.Int32(1)})
			if err != nil || len(out.Results) == 0 {
				return nil, err
			}
			return &out.Results[0], nil
		}()
		if ctx.Err() != nil {
			bar.finish()
			return true, fmt.Errorf("%w: the message move task keeps running in SQS; run the same command to follow it, or cancel it with `aws sqs cancel-message-move-task`", ErrInterrupted)
		}
		if err != nil {
			bar.finish()
			return true, fmt.Errorf("follow message move task of %s: %w", dlq.URL, err)
		}
		if task != nil {
			res.Moved = int(task.ApproximateNumberOfMessagesMoved)
			if task.ApproximateNumberOfMessagesToMove != nil {
				bar.total = *task.ApproximateNumberOfMessagesToMove
			}
			bar.update(int64(res.Moved))
			switch aws.ToString(task.Status) {
			case "COMPLETED":
				bar.finish()
				return true, nil
			case "FAILED", "CANCELLED", "CANCELLING":
				bar.finish()
				return true, fmt.Errorf("message move task %s: %s", strings.ToLower(aws.ToString(task.Status)), aws.ToString(task.FailureReason))
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(opts.PollInterval):
		}
	}
}

// moveByHand redrives by receive → send → delete. A message is deleted from the DLQ only after
// the destination acknowledged it; messages received but not sent are made visible again.
func moveByHand(ctx context.Context, c SQSAPI, dlq, dest queueInfo, opts RedriveOptions, res *RedriveResult) error {
	bar := newRedriveMeter(opts, dlq)
	defer bar.finish()
	if opts.Max > 0 && (bar.total == 0 || int64(opts.Max) < bar.total) {
		bar.total = int64(opts.Max)
	}
	// Cleanup must finish even when ctx ends: deleting what was sent avoids duplicates, and
	// releasing what was not sent makes a re-run pick it up at once.
	cleanup := context.WithoutCancel(ctx)
	sent := map[string]bool{} // SQS message ids created in dest: seeing one in the DLQ means it failed again
	empty := 0
	for opts.Max == 0 || res.Moved < opts.Max {
		if ctx.Err() != nil {
			return fmt.Errorf("%w after moving %d messages; the rest are still in the DLQ: run the same command to continue", ErrInterrupted, res.Moved)
		}
		n := int32(10)
		if opts.Max > 0 && opts.Max-res.Moved < 10 {
			n = int32(opts.Max - res.Moved)
		}
		out, err := c.ReceiveMessage(ctx, &sqs.ReceiveMessageInput{
			QueueUrl: aws.String(dlq.URL), MaxNumberOfMessages: n, WaitTimeSeconds: 1,
			VisibilityTimeout:           int32(opts.Visibility.Seconds()),
			MessageAttributeNames:       []string{"All"},
			MessageSystemAttributeNames: []sqstypes.MessageSystemAttributeName{sqstypes.MessageSystemAttributeNameAll},
		})
		if err != nil {
			if ctx.Err() != nil {
				continue // reported at the top of the loop
			}
			return fmt.Errorf("receive from %s: %w", dlq.URL, err)
		}
		if len(out.Messages) == 0 {
			if empty++; empty >= 2 {
				return nil
			}
			continue
		}
		empty = 0
		var batch, back []sqstypes.Message
		for _, m := range out.Messages {
			if sent[aws.ToString(m.MessageId)] {
				back = append(back, m)
			} else {
				batch = append(batch, m)
			}
		}
		if len(back) > 0 {
			release(cleanup, c, dlq.URL, back)
			if len(batch) == 0 {
				res.Note = "stopped: messages moved by this run are failing again and coming back to the DLQ; fix the consumer before redriving"
				return nil
			}
		}
		okIDs, sendErr := sendBatch(ctx, c, dest, batch)
		var del []sqstypes.DeleteMessageBatchRequestEntry
		var unsent []sqstypes.Message
		for i, m := range batch {
			if newID, ok := okIDs[i]; ok {
				sent[newID] = true
				del = append(del, sqstypes.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle})
			} else {
				unsent = append(unsent, m)
			}
		}
		if len(del) > 0 {
			dout, err := c.DeleteMessageBatch(cleanup, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(dlq.URL), Entries: del})
			if err != nil {
				return fmt.Errorf("%d messages were sent to %s but could not be deleted from the DLQ (%w); they are in both queues, and the consumer's inbox deduplicates them", len(del), dest.URL, err)
			}
			res.Moved += len(dout.Successful)
			if len(dout.Failed) > 0 {
				return fmt.Errorf("%d messages were sent to %s but could not be deleted from the DLQ (%s); they are in both queues, and the consumer's inbox deduplicates them",
					len(dout.Failed), dest.URL, aws.ToString(dout.Failed[0].Message))
			}
		}
		bar.update(int64(res.Moved))
		if len(unsent) > 0 {
			release(cleanup, c, dlq.URL, unsent)
			if ctx.Err() != nil {
				continue
			}
			return fmt.Errorf("could not send %d messages to %s (%w); they stay in the DLQ", len(unsent), dest.URL, sendErr)
		}
	}
	return nil
}

// sendBatch sends msgs to dest with their body and attributes and returns, per index in msgs,
// the new SQS message id of each message the destination accepted.
func sendBatch(ctx context.Context, c SQSAPI, dest queueInfo, msgs []sqstypes.Message) (map[int]string, error) {
	ok := map[int]string{}
	entries := make([]sqstypes.SendMessageBatchRequestEntry, len(msgs))
	for i, m := range msgs {
		e := sqstypes.SendMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), MessageBody: m.Body}
		if len(m.MessageAttributes) > 0 {
			e.MessageAttributes = m.MessageAttributes
		}
		if dest.FIFO {
			e.MessageGroupId = aws.String(m.Attributes[string(sqstypes.MessageSystemAttributeNameMessageGroupId)])
			dedup := m.Attributes[string(sqstypes.MessageSystemAttributeNameMessageDeduplicationId)]
			if dedup == "" {
				dedup = aws.ToString(m.MessageId)
			}
			e.MessageDeduplicationId = aws.String(dedup)
		}
		entries[i] = e
	}
	out, err := c.SendMessageBatch(ctx, &sqs.SendMessageBatchInput{QueueUrl: aws.String(dest.URL), Entries: entries})
	if err != nil {
		var api smithy.APIError
		if errors.As(err, &api) && strings.Contains(api.ErrorCode(), "BatchRequestTooLong") && len(msgs) > 1 {
			// Too large together: send one at a time.
			var firstErr error
			for i := range msgs {
				one, err := sendBatch(ctx, c, dest, msgs[i:i+1])
				if id, good := one[0]; good {
					ok[i] = id
				} else if firstErr == nil {
					firstErr = err
				}
			}
			return ok, firstErr
		}
		return ok, fmt.Errorf("send to %s: %w", dest.URL, err)
	}
	for _, s := range out.Successful {
		i, _ := strconv.Atoi(aws.ToString(s.Id))
		ok[i] = aws.ToString(s.MessageId)
	}
	var firstErr error
	if len(out.Failed) > 0 {
		f := out.Failed[0]
		firstErr = fmt.Errorf("%s: %s", aws.ToString(f.Code), aws.ToString(f.Message))
	}
	return ok, firstErr
}

// release makes received messages visible again at once (best effort: otherwise they reappear
// when their visibility timeout ends).
func release(ctx context.Context, c SQSAPI, url string, msgs []sqstypes.Message) {
	entries := make([]sqstypes.ChangeMessageVisibilityBatchRequestEntry, len(msgs))
	for i, m := range msgs {
		entries[i] = sqstypes.ChangeMessageVisibilityBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: m.ReceiptHandle, VisibilityTimeout: 0}
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, _ = c.ChangeMessageVisibilityBatch(ctx, &sqs.ChangeMessageVisibilityBatchInput{QueueUrl: aws.String(url), Entries: entries})
}

// newRedriveMeter shows a redrive's progress on opts.Progress.
func newRedriveMeter(opts RedriveOptions, dlq queueInfo) *meter {
	m := &meter{w: opts.Progress, mode: meterLines, label: "redrive: moved", op: "redrive", target: dlq.URL, unit: "messages", total: dlq.Visible}
	switch {
	case opts.JSON:
		m.mode = meterJSON
	case opts.TTY:
		m.mode = meterBar
	}
	return m.started()
}
