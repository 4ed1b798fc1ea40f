package dueflow

import (
	"fmt"
	"time"
	"unicode/utf8"
)

// The command records that cancel, move and update a pending job at any horizon
// (pure): one dueflow.Command (version 1) on the job's exec partition (murmur2 of
// its idempotency key), key = the idempotency key + "\x00cmd", headers df-kind
// steer, df-due 0, df-job, df-queue, df-schema dueflow.Command/1
// (docs/wire-format.md, "Steering a job"). Only for queues that were finalized
// (`dueflow queue finalize`). There is no "replace" here: it carries the job's
// whole value, which only a client that reads the job's timer first has (the
// Python SDK does, to move a job earlier).

const (
	// MaxCommandIDChars is the longest command id the workers accept.
	MaxCommandIDChars = 64
	// TimerHeadroom is the room kept in a timer record for the rest of the job when
	// the worker writes a new payload into it.
	TimerHeadroom = 16 * 1024
)

var commandMark = []byte("\x00cmd")

// JobRef is the job a command is about: its id, queue and idempotency key (the key
// picks the worker that owns it), and its due time when the caller knows it
// (KnownDueMs: the worker refuses, code unknown, a command about a job it has no
// record of whose known due time is long past; nil: not known).
type JobRef struct {
	JobID          string
	Queue          string
	IdempotencyKey string
	KnownDueMs     *int64
}

// Ref names job jobID of queue, whose idempotency key is its id (the default).
func Ref(queue, jobID string) JobRef {
	return JobRef{JobID: jobID, Queue: queue, IdempotencyKey: jobID}
}

// Ref is what a command about job needs.
func (j ScheduledJob) Ref() JobRef {
	due := j.DueMs
	return JobRef{JobID: j.JobID, Queue: j.Queue, IdempotencyKey: j.IdempotencyKey, KnownDueMs: &due}
}

type commandFields struct {
	commandID     *string
	by            *string
	knownDueMs    *int64
	expectVersion *string
	dueMs         *int64
}

// CommandOption sets one option of a command; every one may stay unset.
type CommandOption func(*commandFields)

// CommandID is the command's id (1-64 characters): the verdict carries it, and it
// becomes the job's version. Default: a new UUIDv7 as 32 hex digits, as the SDK
// draws them. Give your own to make a retry of the same request recognizable.
func CommandID(id string) CommandOption { return func(c *commandFields) { c.commandID = &id } }

// By is who asked (a service, an operator), kept with the command.
func By(who string) CommandOption { return func(c *commandFields) { c.by = &who } }

// KnownDueMs is the job's due time as you know it (default: the ref's).
func KnownDueMs(ms int64) CommandOption { return func(c *commandFields) { c.knownDueMs = &ms } }

// ExpectVersion applies a move or update only if the job's version is still v
// ("": the job as scheduled; a verdict's Version after a change); otherwise the
// verdict is refused with code "changed". A cancel ignores it.
func ExpectVersion(v string) CommandOption { return func(c *commandFields) { c.expectVersion = &v } }

// NewDue moves the job later too, with an update (Producer.Update, PatchCommand).
func NewDue(t time.Time) CommandOption {
	return func(c *commandFields) { ms := t.UnixMilli(); c.dueMs = &ms }
}

// NewDueMs is NewDue in UTC epoch milliseconds.
func NewDueMs(ms int64) CommandOption { return func(c *commandFields) { c.dueMs = &ms } }

// Command is a checked command: its id and its record.
type Command struct {
	ID     string
	Op     string
	Record Record
}

// CancelCommand is the command that cancels ref, written at atMs: it never runs (an
// attempt running now finishes). newID draws the id when no CommandID is given.
func CancelCommand(ref JobRef, atMs int64, partitions int32, t Target, newID func(int64) string, opts ...CommandOption) (Command, error) {
	return buildCommand("cancel", ref, atMs, partitions, t, newID, nil, "", opts)
}

// MoveCommand is the command that moves ref to dueMs, not before its current due
// time (to run a job earlier, cancel it and schedule it again): it runs then, not
// before, once.
func MoveCommand(ref JobRef, dueMs, atMs int64, partitions int32, t Target, newID func(int64) string, opts ...CommandOption) (Command, error) {
	return buildCommand("move", ref, atMs, partitions, t, newID, nil, "", append(opts, NewDueMs(dueMs)))
}

// PatchCommand is the command that replaces the payload of ref with payload (one of
// JSON, JSONText, Bytes) and, with NewDue, moves it later too: it runs once, with
// the new payload.
func PatchCommand(ref JobRef, payload Option, atMs int64, partitions int32, t Target, newID func(int64) string, opts ...CommandOption) (Command, error) {
	if payload == nil {
		return Command{}, invalid("payload", nil, "the new payload (JSON, JSONText or Bytes)")
	}
	req := &Request{}
	payload(req)
	if req.payloadErr != nil {
		return Command{}, req.payloadErr
	}
	if req.payload == nil || req.contentType == "" {
		return Command{}, invalid("payload", nil, "the new payload (JSON, JSONText or Bytes)")
	}
	return buildCommand("patch", ref, atMs, partitions, t, newID, req.payload, req.contentType, opts)
}

func buildCommand(op string, ref JobRef, atMs int64, partitions int32, t Target, newID func(int64) string,
	payload []byte, contentType string, opts []CommandOption) (Command, error) {
	var f commandFields
	for _, o := range opts {
		o(&f)
	}
	if err := checkQueue(ref.Queue); err != nil {
		return Command{}, err
	}
	if err := checkCommandName("job_id", ref.JobID); err != nil {
		return Command{}, err
	}
	if err := checkCommandName("idempotency_key", ref.IdempotencyKey); err != nil {
		return Command{}, err
	}
	var id string
	if f.commandID != nil {
		id = *f.commandID
	} else {
		id = newID(atMs)
	}
	if err := checkCommandName("command_id", id); err != nil {
		return Command{}, err
	}
	if utf8.RuneCountInString(id) > MaxCommandIDChars {
		return Command{}, invalid("command_id", id, fmt.Sprintf("a non-empty string of at most %d chars", MaxCommandIDChars))
	}
	known := ref.KnownDueMs
	if f.knownDueMs != nil {
		known = f.knownDueMs
	}
	if known != nil {
		if err := checkTime("known_due_ms", *known); err != nil {
			return Command{}, err
		}
	}
	if f.dueMs != nil {
		if err := checkTime("run_at", *f.dueMs); err != nil {
			return Command{}, err
		}
		if known != nil && *f.dueMs < *known {
			return Command{}, invalid("run_at", time.UnixMilli(*f.dueMs).UTC().Format(time.RFC3339Nano), fmt.Sprintf(
				"a time at or after the job's due time %s: a command moves a job only later (to run it earlier, cancel it and schedule it again)",
				time.UnixMilli(*known).UTC().Format(time.RFC3339Nano)))
		}
	}
	if payload != nil && len(payload) > t.MaxRecordBytes-TimerHeadroom {
		return Command{}, invalid("payload", fmt.Sprintf("%d bytes", len(payload)), fmt.Sprintf(
			"at most %d bytes (the timer topic's record limit, less room for the job's other fields)", t.MaxRecordBytes-TimerHeadroom))
	}
	key := []byte(ref.IdempotencyKey)
	rec := map[string]any{
		"command_id": id, "op": op, "job_id": ref.JobID, "idempotency_key": ref.IdempotencyKey,
		"queue": ref.Queue, "at_ms": atMs, "by": nil, "expect_version": nil, "known_due_ms": nil,
		"due_ms": nil, "payload": nil, "content_type": nil, "job": nil, "job_schema": nil,
		"unique": nil, "group": nil, "member": nil,
	}
	if f.by != nil {
		rec["by"] = *f.by
	}
	if f.expectVersion != nil {
		rec["expect_version"] = *f.expectVersion
	}
	if known != nil {
		rec["known_due_ms"] = *known
	}
	if f.dueMs != nil {
		rec["due_ms"] = *f.dueMs
	}
	if payload != nil {
		rec["payload"] = payload
		rec["content_type"] = contentType
	}
	return Command{ID: id, Op: op, Record: Record{
		Topic: t.exec(ref.Queue), Partition: KeyPartition(key, partitions),
		Key:   append(append([]byte{}, key...), commandMark...),
		Value: mustMarshal(commandV1, rec),
		Headers: []Header{
			{"df-kind", "steer"}, {"df-due", "0"}, {"df-job", ref.JobID}, {"df-queue", ref.Queue},
			{"df-schema", "dueflow.Command/1"},
		},
	}}, nil
}

func checkTime(field string, ms int64) error {
	if ms < 0 || ms > MaxDueMs {
		return invalid(field, ms, fmt.Sprintf("UTC epoch milliseconds from 0 to %d (year 9999)", MaxDueMs))
	}
	return nil
}

// checkCommandName is checkName, and no control characters (dueflow/control_chars.py).
func checkCommandName(field, value string) error {
	if err := checkName(field, value); err != nil {
		return err
	}
	for _, r := range value {
		if controlChar(r) {
			return invalid(field, value, "a string without control characters (C0, DEL, C1, U+2028/U+2029, bidi controls)")
		}
	}
	return nil
}

func controlChar(r rune) bool {
	return r <= 0x1f || (r >= 0x7f && r <= 0x9f) || r == 0x061c || r == 0x200e || r == 0x200f ||
		(r >= 0x2028 && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069)
}

// Verdict is the answer of the worker that owns a job's exec partition to a
// command: an Outcome (version 3) with the command's id.
type Verdict struct {
	// State is cancelled, rescheduled, updated or refused.
	State string
	// Code says why, for refused: finished, started, cancelled, changed,
	// needs_value, due_already, unsupported, unknown, invalid ("" when applied).
	Code string
	// Reason is the worker's words, for refused ("" when applied).
	Reason string
	// DueMs is the job's due time after the command (rescheduled), else nil.
	DueMs *int64
	// Version is the job's version after the change (nil when the worker did not say).
	Version *string
}

// Applied says whether the worker applied the command.
func (v Verdict) Applied() bool { return v.State != "refused" }

// SentCommand is a command the broker has acknowledged: its id, the job, the exec
// partition it went to, and where the job id's outcomes partition ended just before
// it was written (where Producer.WaitVerdict starts reading).
type SentCommand struct {
	CommandID         string
	Op                string
	JobID             string
	Queue             string
	Partition         int32
	OutcomesPartition int32
	OutcomesOffset    int64
}

type outcomeV3Fields struct {
	State     string  `avro:"state"`
	Error     *string `avro:"error"`
	DueMs     *int64  `avro:"due_ms"`
	Version   *string `avro:"version"`
	CommandID *string `avro:"command_id"`
}

// VerdictOf is the verdict on commandID of jobID in one outcome record (key, value
// and its df-schema header), or nil when the record is not that verdict (pure).
func VerdictOf(key, value []byte, schema, jobID, commandID string) *Verdict {
	if value == nil || len(schema) < 2 || schema[len(schema)-2:] != "/3" || string(key) != jobID {
		return nil // only version 3 outcomes carry a command id
	}
	var o outcomeV3Fields
	if err := unmarshal(outcomeV3, value, &o); err != nil {
		return nil
	}
	if o.CommandID == nil || *o.CommandID != commandID {
		return nil
	}
	v := &Verdict{State: o.State, DueMs: o.DueMs, Version: o.Version}
	if o.State == "refused" && o.Error != nil {
		v.Code, v.Reason = *o.Error, ""
		for i := 0; i+1 < len(*o.Error); i++ {
			if (*o.Error)[i] == ':' && (*o.Error)[i+1] == ' ' {
				v.Code, v.Reason = (*o.Error)[:i], (*o.Error)[i+2:]
				break
			}
		}
	}
	return v
}
