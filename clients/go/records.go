package dueflow

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"time"
	"unicode/utf8"

	"golang.org/x/crypto/blake2b"
)

// Limits and defaults of the Python SDK.
const (
	MaxDueMs              = int64(253_402_300_799_999) // 9999-12-31T23:59:59.999Z
	DefaultMaxRecordBytes = 1_048_588                  // the broker's default max.message.bytes
	MaxNameChars          = 255
	DefaultRetention      = 7 * 24 * time.Hour // a queue's default idempotency retention
	JSONContentType       = "application/json"
	BytesContentType      = "application/octet-stream"
	taskAccepted          = "1-200 characters of A-Z a-z 0-9 _ . : / - (the names a worker can register with @task)"
	instantLimit          = "9999-12-31T23:59:59.999Z"
	hourMs                = int64(3_600_000)
)

var (
	taskName       = regexp.MustCompile(`^[A-Za-z0-9_.:/-]{1,200}$`)
	queueName      = regexp.MustCompile(`^[A-Za-z0-9_-]{1,100}$`)
	rescheduleMark = []byte("\x00reschedule")
)

// Request is one job to schedule, built with options; Schedule checks it.
type Request struct {
	task           string
	queue          string
	payload        []byte
	contentType    string
	payloadErr     error
	runAtMs        *int64
	runAt          *time.Time
	delayMs        *int64
	delayShown     any
	jobID          *string
	idempotencyKey *string
	maxAttempts    *int64
	timeout        *time.Duration
	labels         map[string]string
}

// Option sets one field of a Request.
type Option func(*Request)

// NewRequest is a job of handler task (the name registered with @task on the workers).
func NewRequest(task string, opts ...Option) *Request {
	r := &Request{task: task, queue: "default", payload: []byte("null"), contentType: JSONContentType}
	for _, o := range opts {
		o(r)
	}
	return r
}

// JSON is the payload v, written as compact JSON (encoding/json: map keys sorted, no HTML escaping).
func JSON(v any) Option {
	return func(r *Request) {
		var buf bytes.Buffer
		enc := json.NewEncoder(&buf)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(v); err != nil {
			r.payloadErr = invalid("payload", fmt.Sprintf("<%T: %v>", v, err), "a value encoding/json can write (no NaN or Inf)")
			return
		}
		r.payload, r.contentType = bytes.TrimRight(buf.Bytes(), "\n"), JSONContentType
	}
}

// JSONText is a JSON payload you serialized yourself, written as is (it must be valid JSON).
func JSONText(text string) Option {
	return func(r *Request) {
		if !json.Valid([]byte(text)) {
			r.payloadErr = invalid("payload", text, "JSON text")
			return
		}
		r.payload, r.contentType = []byte(text), JSONContentType
	}
}

// Bytes is a raw payload (application/octet-stream): the handler gets the bytes unchanged.
func Bytes(b []byte) Option {
	return func(r *Request) { r.payload, r.contentType = append([]byte{}, b...), BytesContentType }
}

// Queue is the queue (default "default"): the job runs on <prefix>.exec.<queue>.
func Queue(name string) Option { return func(r *Request) { r.queue = name } }

// At runs the job at t (a time in the past runs it at once).
func At(t time.Time) Option { return func(r *Request) { r.runAt = &t } }

// AtMs runs the job at UTC epoch millisecond ms.
func AtMs(ms int64) Option { return func(r *Request) { r.runAtMs = &ms } }

// After runs the job d from now (neither At nor After: now).
func After(d time.Duration) Option {
	return func(r *Request) { ms := d.Milliseconds(); r.delayMs, r.delayShown = &ms, d }
}

// AfterMs runs the job ms milliseconds from now (for delays past time.Duration's 292 years).
func AfterMs(ms int64) Option { return func(r *Request) { r.delayMs, r.delayShown = &ms, ms } }

// JobID is your own job id (default: a new UUIDv7); 1-255 characters.
func JobID(id string) Option { return func(r *Request) { r.jobID = &id } }

// IdempotencyKey is the key workers deduplicate by and handlers get (default: the job id).
func IdempotencyKey(key string) Option { return func(r *Request) { r.idempotencyKey = &key } }

// MaxAttempts is the attempts before the job is dead-lettered (default 4).
func MaxAttempts(n int64) Option { return func(r *Request) { r.maxAttempts = &n } }

// Timeout is a hard limit on one attempt (default: the workers' default).
func Timeout(d time.Duration) Option { return func(r *Request) { r.timeout = &d } }

// Labels are free-form strings carried with the job (logs, status view).
func Labels(labels map[string]string) Option {
	return func(r *Request) {
		r.labels = make(map[string]string, len(labels))
		for k, v := range labels {
			r.labels[k] = v
		}
	}
}

// ScheduledJob is a job as written: every field of its dueflow.Job value and where
// its timer went. Keep it (or its Ref) to cancel, reschedule or update the job.
type ScheduledJob struct {
	JobID          string
	Queue          string
	Task           string
	Payload        []byte
	ContentType    string
	DueMs          int64
	IdempotencyKey string
	MaxAttempts    int32
	TimeoutMs      *int64
	CreatedMs      int64
	ContentHash    string
	Labels         map[string]string
	Partition      int32
}

// Header is one record header (dueflow's are UTF-8 text).
type Header struct{ Key, Value string }

// Record is one record to produce; Partition -1 leaves it to the default (murmur2) partitioner.
type Record struct {
	Topic     string
	Partition int32
	Key       []byte
	Value     []byte
	Headers   []Header
}

// EstimatedSize is the record's size in a batch of its own, as dueflow estimates it.
func (r Record) EstimatedSize() int {
	n := 61 + 21 + len(r.Key) + len(r.Value)
	for _, h := range r.Headers {
		n += 10 + len(h.Key) + len(h.Value)
	}
	return n
}

// Target is where and how records are written.
type Target struct {
	Prefix         string
	Wheel          Wheel
	MaxRecordBytes int
	SchemaID       *int32 // the registry option: Confluent framing with this id
}

func (t Target) timers() string              { return t.Prefix + ".timers" }
func (t Target) outcomes() string            { return t.Prefix + ".outcomes" }
func (t Target) idempotency(q string) string { return t.Prefix + ".idempotency." + q }
func (t Target) exec(q string) string        { return t.Prefix + ".exec." + q }

// Planned is a checked job, its timer record and its scheduled outcome.
type Planned struct {
	Job     ScheduledJob
	Timer   Record
	Outcome Record
}

// Plan checks req and builds its records, written at nowMs (pure). queueCheck
// returns an error for a queue that does not exist; newJobID draws an id. The error
// is an *InvalidInputError naming the first bad field, in the SDK's order.
func Plan(req *Request, nowMs int64, t Target, queueCheck func(string) error, newJobID func(int64) string) (Planned, error) {
	if !taskName.MatchString(req.task) {
		return Planned{}, invalid("task", req.task, taskAccepted)
	}
	if err := checkQueue(req.queue); err != nil {
		return Planned{}, err
	}
	if err := queueCheck(req.queue); err != nil {
		return Planned{}, err
	}
	if req.payloadErr != nil {
		return Planned{}, req.payloadErr
	}
	var jobID string
	if req.jobID == nil {
		jobID = newJobID(nowMs)
	} else if err := checkName("job_id", *req.jobID); err != nil {
		return Planned{}, err
	} else {
		jobID = *req.jobID
	}
	key := jobID
	if req.idempotencyKey != nil {
		if err := checkName("idempotency_key", *req.idempotencyKey); err != nil {
			return Planned{}, err
		}
		key = *req.idempotencyKey
	}
	dueMs, err := dueOf(req, nowMs)
	if err != nil {
		return Planned{}, err
	}
	attempts := int32(4)
	if req.maxAttempts != nil {
		if *req.maxAttempts < 1 || *req.maxAttempts > (1<<31)-1 {
			return Planned{}, invalid("max_attempts", *req.maxAttempts, "an integer from 1 to 2147483647")
		}
		attempts = int32(*req.maxAttempts)
	}
	var timeoutMs *int64
	if req.timeout != nil {
		ms := req.timeout.Milliseconds()
		if ms < 1 {
			return Planned{}, invalid("timeout", *req.timeout, "a duration of at least 1 ms")
		}
		timeoutMs = &ms
	}
	for k, v := range req.labels {
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			return Planned{}, invalid("labels", req.labels, "a map of strings to strings (valid UTF-8)")
		}
	}
	job := ScheduledJob{
		JobID: jobID, Queue: req.queue, Task: req.task, Payload: req.payload,
		ContentType: req.contentType, DueMs: dueMs, IdempotencyKey: key, MaxAttempts: attempts,
		TimeoutMs: timeoutMs, CreatedMs: nowMs, ContentHash: ContentHash(req.task, req.payload, req.contentType),
		Labels: req.labels,
	}
	timer := timerRecord(&job, nowMs, t)
	if size := timer.EstimatedSize(); size > t.MaxRecordBytes {
		return Planned{}, invalid("payload", fmt.Sprintf("%d bytes (a timer record of %d bytes)", len(req.payload), size),
			fmt.Sprintf("a timer record of at most %d bytes (max.message.bytes of %s)", t.MaxRecordBytes, t.timers()))
	}
	job.Partition = timer.Partition
	outcome := Record{
		Topic: t.outcomes(), Partition: -1, Key: []byte(jobID),
		Value:   encodeOutcome(outcomeV1, &job, "scheduled", nowMs, dueMs),
		Headers: []Header{{"df-schema", "dueflow.Outcome/1"}},
	}
	return Planned{Job: job, Timer: timer, Outcome: outcome}, nil
}

func timerRecord(job *ScheduledJob, nowMs int64, t Target) Record {
	key := []byte(job.IdempotencyKey)
	value := encodeJob(job)
	schema := "dueflow.Job/1"
	if t.SchemaID != nil {
		value = Frame(*t.SchemaID, value)
		schema += "+confluent"
	}
	return Record{
		Topic: t.timers(), Partition: t.Wheel.Partition(job.DueMs, nowMs, key), Key: key, Value: value,
		Headers: []Header{
			{"df-due", strconv.FormatInt(job.DueMs, 10)}, {"df-queue", job.Queue}, {"df-kind", "job"},
			{"df-job", job.JobID}, {"df-task", job.Task}, {"df-schema", schema},
		},
	}
}

// Frame is avro in the Confluent wire format: magic byte 0, the 4-byte schema id, the Avro bytes.
func Frame(schemaID int32, avroBytes []byte) []byte {
	out := make([]byte, 5, 5+len(avroBytes))
	binary.BigEndian.PutUint32(out[1:], uint32(schemaID))
	return append(out, avroBytes...)
}

// LegacyCancelRecords are the legacy records (a queue not finalized; on a finalized
// one, CancelCommand) that cancel job, written at atMs: an IdempotencyRecord
// (version 1, cancelled) on the key's murmur2 partition among the queue's partitions,
// then the cancelled outcome. A job due beyond retention (less an hour) is refused:
// workers would forget the cancellation before it comes due.
func LegacyCancelRecords(job *ScheduledJob, atMs int64, partitions int32, t Target, retention time.Duration) ([]Record, error) {
	if err := checkRetention(job, atMs, retention); err != nil {
		return nil, err
	}
	key := []byte(job.IdempotencyKey)
	return []Record{
		{
			Topic: t.idempotency(job.Queue), Partition: KeyPartition(key, partitions), Key: key,
			Value:   encodeKeyState(idempotencyV1, job, atMs, nil),
			Headers: []Header{{"df-job", job.JobID}, {"df-queue", job.Queue}, {"df-schema", "dueflow.IdempotencyRecord/1"}},
		},
		{
			Topic: t.outcomes(), Partition: -1, Key: []byte(job.JobID),
			Value:   encodeOutcome(outcomeV1, job, "cancelled", atMs, job.DueMs),
			Headers: []Header{{"df-job", job.JobID}, {"df-queue", job.Queue}, {"df-schema", "dueflow.Outcome/1"}},
		},
	}, nil
}

// LegacyRescheduleRecords are the legacy records (a queue not finalized; on a
// finalized one, MoveCommand) that move pending job to dueMs, written at atMs,
// in the order to write them: the timer again (same key and value but the due time),
// the reschedule record (IdempotencyRecord version 3, key + "\x00reschedule", on the
// key's own murmur2 partition), and the rescheduled outcome.
func LegacyRescheduleRecords(job *ScheduledJob, dueMs, atMs int64, partitions int32, t Target, retention time.Duration) ([]Record, error) {
	if dueMs > MaxDueMs {
		return nil, invalid("run_at", dueMs, "a time at or before "+instantLimit)
	}
	if dueMs == job.DueMs {
		return nil, invalid("run_at", dueMs, "a due time other than the job's own")
	}
	if err := checkRetention(job, atMs, retention); err != nil {
		return nil, err
	}
	moved := *job
	moved.DueMs = dueMs
	key := []byte(job.IdempotencyKey)
	mark := append(append([]byte{}, key...), rescheduleMark...)
	return []Record{
		timerRecord(&moved, atMs, t),
		{
			Topic: t.idempotency(job.Queue), Partition: KeyPartition(key, partitions), Key: mark,
			Value:   encodeKeyState(idempotencyV3, job, atMs, &dueMs),
			Headers: []Header{{"df-job", job.JobID}, {"df-queue", job.Queue}, {"df-schema", "dueflow.IdempotencyRecord/3"}},
		},
		{
			Topic: t.outcomes(), Partition: -1, Key: []byte(job.JobID),
			Value:   encodeOutcome(outcomeV2, job, "rescheduled", atMs, dueMs),
			Headers: []Header{{"df-job", job.JobID}, {"df-queue", job.Queue}, {"df-schema", "dueflow.Outcome/2"}},
		},
	}, nil
}

// ContentHash is the SDK's content hash: BLAKE2b-128 hex of task 0 content type 0 payload.
func ContentHash(task string, payload []byte, contentType string) string {
	h, _ := blake2b.New(16, nil)
	h.Write([]byte(task))
	h.Write([]byte{0})
	h.Write([]byte(contentType))
	h.Write([]byte{0})
	h.Write(payload)
	return hex.EncodeToString(h.Sum(nil))
}

func checkQueue(q string) error {
	if !queueName.MatchString(q) {
		return invalid("queue", q, "a queue name: 1-100 of [A-Za-z0-9_-] (create one with `dueflow queue create NAME`)")
	}
	return nil
}

func checkName(field, value string) error {
	n := utf8.RuneCountInString(value)
	if n < 1 || n > MaxNameChars || !utf8.ValidString(value) {
		return invalid(field, value, fmt.Sprintf("a non-empty string of at most %d chars (valid UTF-8)", MaxNameChars))
	}
	return nil
}

func checkRetention(job *ScheduledJob, nowMs int64, retention time.Duration) error {
	if job.DueMs > nowMs+retention.Milliseconds()-hourMs {
		return invalid("job_id", job.JobID, fmt.Sprintf(
			"a job due within its queue's idempotency retention (%v, less an hour) from now; this one is due at %s, and workers would forget the record before then",
			retention, time.UnixMilli(job.DueMs).UTC().Format(time.RFC3339Nano)))
	}
	return nil
}

func dueOf(req *Request, nowMs int64) (int64, error) {
	var runAt *int64
	var shown any
	if req.runAtMs != nil {
		runAt, shown = req.runAtMs, *req.runAtMs
	}
	if req.runAt != nil {
		ms := req.runAt.UnixMilli()
		if req.runAt.Year() > 9999 {
			ms = MaxDueMs + 1
		}
		runAt, shown = &ms, *req.runAt
	}
	if runAt != nil {
		if req.delayMs != nil {
			return 0, invalid("delay", req.delayShown, "either run_at or delay, not both")
		}
		if *runAt > MaxDueMs {
			return 0, invalid("run_at", shown, "a time at or before "+instantLimit)
		}
		return *runAt, nil
	}
	if req.delayMs == nil {
		return nowMs, nil
	}
	ms := *req.delayMs
	if ms < 0 {
		return 0, invalid("delay", req.delayShown, "a duration (e.g. 10*time.Minute); it must not be negative")
	}
	if ms > MaxDueMs-nowMs {
		return 0, invalid("delay", req.delayShown, fmt.Sprintf(
			"a duration putting the due time at or before %s (at most %d ms from now)", instantLimit, MaxDueMs-nowMs))
	}
	return nowMs + ms, nil
}
