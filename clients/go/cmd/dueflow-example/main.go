// Command dueflow-example schedules dueflow jobs and steers them: it reads one JSON
// document on stdin ({bootstrap, prefix, wheel, registry_url, ops}) and runs its
// ops in order, printing one JSON line per op. Ops: {"op": "schedule", "request":
// {...}}; the commands {"op": "cancel", "job": N}, {"op": "reschedule", "job": N,
// "run_at_ms": T}, {"op": "update", "job": N, "payload": {...}, "run_at_ms": T?}
// (each with optional wait_ms, command_id, by, expect_version, known_due_ms, and
// "ref": {job_id, queue, idempotency_key} instead of job); the legacy records
// legacy_cancel, legacy_reschedule (N: the number of the schedule op, counting
// schedule ops only, from 0).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	dueflow "dueflow.dev/client"
	"dueflow.dev/client/internal/jsonreq"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "dueflow-example:", err)
		os.Exit(1)
	}
}

func run() error {
	var doc struct {
		Bootstrap   string                       `json:"bootstrap"`
		Prefix      string                       `json:"prefix"`
		Wheel       json.RawMessage              `json:"wheel"`
		RegistryURL string                       `json:"registry_url"`
		Ops         []map[string]json.RawMessage `json:"ops"`
	}
	if err := json.NewDecoder(os.Stdin).Decode(&doc); err != nil {
		return err
	}
	cfg := dueflow.Config{Brokers: strings.Split(doc.Bootstrap, ","), Prefix: doc.Prefix, SchemaRegistryURL: doc.RegistryURL}
	if doc.Wheel != nil {
		w, err := jsonreq.Wheel(doc.Wheel)
		if err != nil {
			return err
		}
		cfg.Wheel = &w
	}
	ctx := context.Background()
	p, err := dueflow.NewProducer(ctx, cfg)
	if err != nil {
		return err
	}
	defer p.Close()
	var jobs []*dueflow.ScheduledJob
	out := json.NewEncoder(os.Stdout)
	for _, op := range doc.Ops {
		var kind string
		_ = json.Unmarshal(op["op"], &kind)
		var job dueflow.ScheduledJob
		var err error
		switch kind {
		case "schedule":
			var req map[string]json.RawMessage
			if err = json.Unmarshal(op["request"], &req); err != nil {
				return err
			}
			r, perr := jsonreq.Request(req)
			if perr != nil {
				return perr
			}
			job, err = p.Schedule(ctx, r)
			if err != nil {
				jobs = append(jobs, nil) // keeps the indexes of later ops
			} else {
				jobs = append(jobs, &job)
			}
		case "cancel", "reschedule", "update":
			ref, i := refOf(op, jobs)
			var sent dueflow.SentCommand
			opts := commandOptions(op)
			switch kind {
			case "cancel":
				sent, err = p.Cancel(ctx, ref, opts...)
			case "reschedule":
				var at int64
				_ = json.Unmarshal(op["run_at_ms"], &at)
				sent, err = p.RescheduleMs(ctx, ref, at, opts...)
				if err == nil && i >= 0 {
					moved := *jobs[i]
					moved.DueMs, moved.Partition = at, -1
					jobs[i] = &moved
				}
			default:
				payload, perr := jsonreq.Payload(op["payload"])
				if perr != nil {
					return perr
				}
				if raw, ok := op["run_at_ms"]; ok {
					var at int64
					_ = json.Unmarshal(raw, &at)
					opts = append(opts, dueflow.NewDueMs(at))
				}
				sent, err = p.Update(ctx, ref, payload, opts...)
			}
			if err == nil {
				line, werr := steered(ctx, p, op, sent)
				if werr != nil {
					return werr
				}
				_ = out.Encode(line)
				continue
			}
		case "legacy_cancel", "legacy_reschedule":
			var i int
			_ = json.Unmarshal(op["job"], &i)
			job = *jobs[i]
			if kind == "legacy_cancel" {
				err = p.LegacyCancel(ctx, job)
			} else {
				var at int64
				_ = json.Unmarshal(op["run_at_ms"], &at)
				job, err = p.LegacyRescheduleMs(ctx, job, at)
				if err == nil {
					jobs[i] = &job
				}
			}
		default:
			return fmt.Errorf("unknown op %q", kind)
		}
		var bad *dueflow.InvalidInputError
		switch {
		case errors.As(err, &bad):
			_ = out.Encode(map[string]any{"error": map[string]string{"field": bad.Field, "message": bad.Error()}})
		case err != nil:
			return err
		default:
			_ = out.Encode(map[string]any{
				"job_id": job.JobID, "due_ms": job.DueMs, "partition": job.Partition,
				"idempotency_key": job.IdempotencyKey, "created_ms": job.CreatedMs,
			})
		}
	}
	return nil
}

// refOf is the job an op steers: "job": N (a schedule op's, and its index), or
// "ref": {job_id, queue, idempotency_key} (index -1).
func refOf(op map[string]json.RawMessage, jobs []*dueflow.ScheduledJob) (dueflow.JobRef, int) {
	if raw, ok := op["job"]; ok {
		var i int
		_ = json.Unmarshal(raw, &i)
		return jobs[i].Ref(), i
	}
	var r struct {
		JobID          string `json:"job_id"`
		Queue          string `json:"queue"`
		IdempotencyKey string `json:"idempotency_key"`
	}
	_ = json.Unmarshal(op["ref"], &r)
	ref := dueflow.Ref(r.Queue, r.JobID)
	if r.IdempotencyKey != "" {
		ref.IdempotencyKey = r.IdempotencyKey
	}
	return ref, -1
}

func commandOptions(op map[string]json.RawMessage) []dueflow.CommandOption {
	var opts []dueflow.CommandOption
	text := func(name string, f func(string) dueflow.CommandOption) {
		if raw, ok := op[name]; ok {
			var s string
			_ = json.Unmarshal(raw, &s)
			opts = append(opts, f(s))
		}
	}
	text("command_id", dueflow.CommandID)
	text("by", dueflow.By)
	text("expect_version", dueflow.ExpectVersion)
	if raw, ok := op["known_due_ms"]; ok {
		var ms int64
		_ = json.Unmarshal(raw, &ms)
		opts = append(opts, dueflow.KnownDueMs(ms))
	}
	return opts
}

// steered is a command's line: its id and partition, and with wait_ms the verdict
// (null: none in time).
func steered(ctx context.Context, p *dueflow.Producer, op map[string]json.RawMessage, sent dueflow.SentCommand) (map[string]any, error) {
	line := map[string]any{"job_id": sent.JobID, "command_id": sent.CommandID, "partition": sent.Partition}
	raw, ok := op["wait_ms"]
	if !ok {
		return line, nil
	}
	var ms int64
	_ = json.Unmarshal(raw, &ms)
	v, err := p.WaitVerdict(ctx, sent, time.Duration(ms)*time.Millisecond)
	switch {
	case errors.Is(err, dueflow.ErrNoVerdict):
		line["verdict"] = nil
	case err != nil:
		return nil, err
	default:
		line["verdict"] = map[string]any{"state": v.State, "code": v.Code, "reason": v.Reason, "due_ms": v.DueMs, "version": v.Version}
	}
	return line, nil
}
