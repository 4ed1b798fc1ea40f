package dueflow

import (
	"bytes"
	"embed"
	"sort"

	"github.com/hamba/avro/v2"
)

// The schemas of schemas/dueflow/schemas (copies: a test of the repository checks them).
//
//go:embed schemas
var schemaFiles embed.FS

// JobSchemaText is job.avsc, what the registry option registers.
var JobSchemaText = mustRead("schemas/job.avsc")

var (
	idempotencyV1 = mustParse("schemas/v1/idempotency_record.avsc")
	idempotencyV3 = mustParse("schemas/idempotency_record.avsc")
	outcomeV1     = mustParse("schemas/v1/outcome.avsc")
	outcomeV2     = mustParse("schemas/outcome.avsc")
	outcomeV3     = mustParse("schemas/v3/outcome.avsc") // what a verdict is written with
	commandV1     = mustParse("schemas/command.avsc")
)

func unmarshal(schema avro.Schema, data []byte, v any) error {
	return avro.Unmarshal(schema, data, v)
}

func mustRead(name string) string {
	b, err := schemaFiles.ReadFile(name)
	if err != nil {
		panic(err)
	}
	return string(b)
}

// Each schema in a cache of its own: versions of one record share their full name.
func mustParse(name string) avro.Schema {
	s, err := avro.ParseWithCache(mustRead(name), "", &avro.SchemaCache{})
	if err != nil {
		panic(err)
	}
	return s
}

// encodeJob writes the dueflow.Job value of job in the field order of job.avsc with
// hamba/avro's Writer. Written field by field rather than with avro.Marshal because
// a Go map has no order and the labels must be written sorted by key (every dueflow
// writer does, so equal jobs are equal bytes); the tests decode the result with
// job.avsc and compare it with the shared vectors.
func encodeJob(job *ScheduledJob) []byte {
	var buf bytes.Buffer
	w := avro.NewWriter(&buf, 512)
	w.WriteString(job.JobID)
	w.WriteString(job.Queue)
	w.WriteString(job.Task)
	w.WriteBytes(job.Payload)
	w.WriteString(job.ContentType)
	w.WriteLong(job.DueMs)
	w.WriteString(job.IdempotencyKey)
	w.WriteInt(job.MaxAttempts)
	w.WriteLong(0) // backoff: null (the queue's retry tiers)
	if job.TimeoutMs == nil {
		w.WriteLong(0)
	} else {
		w.WriteLong(1)
		w.WriteLong(*job.TimeoutMs)
	}
	w.WriteLong(0) // jitter_ms
	w.WriteLong(job.CreatedMs)
	w.WriteLong(0) // trace: {}
	w.WriteLong(0) // schedule_id: null
	w.WriteLong(0) // schedule_version: null
	w.WriteLong(1) // content_hash: string
	w.WriteString(job.ContentHash)
	keys := make([]string, 0, len(job.Labels))
	for k := range job.Labels {
		keys = append(keys, k)
	}
	sort.Strings(keys) // byte order of UTF-8: code point order
	if len(keys) > 0 {
		w.WriteLong(int64(len(keys)))
		for _, k := range keys {
			w.WriteString(k)
			w.WriteString(job.Labels[k])
		}
	}
	w.WriteLong(0)
	if err := w.Flush(); err != nil {
		panic(err) // a bytes.Buffer does not fail
	}
	return buf.Bytes()
}

func encodeKeyState(schema avro.Schema, job *ScheduledJob, atMs int64, runOnlyDueMs *int64) []byte {
	rec := map[string]any{
		"idempotency_key": job.IdempotencyKey,
		"job_id":          job.JobID,
		"state":           "cancelled",
		"at_ms":           atMs,
		"attempts":        0,
		"content_hash":    job.ContentHash,
	}
	if runOnlyDueMs != nil {
		rec["run_only_due_ms"] = *runOnlyDueMs
	}
	return mustMarshal(schema, rec)
}

func encodeOutcome(schema avro.Schema, job *ScheduledJob, state string, atMs, dueMs int64) []byte {
	return mustMarshal(schema, map[string]any{
		"job_id":          job.JobID,
		"queue":           job.Queue,
		"task":            job.Task,
		"idempotency_key": job.IdempotencyKey,
		"state":           state,
		"attempt":         0,
		"at_ms":           atMs,
		"due_ms":          dueMs,
		"duration_ms":     nil,
		"error_type":      nil,
		"error":           nil,
		"worker":          nil,
		"trace_id":        nil,
		"schedule_id":     nil,
	})
}

func mustMarshal(schema avro.Schema, rec map[string]any) []byte {
	b, err := avro.Marshal(schema, rec)
	if err != nil {
		panic(err) // the records above always fit their schemas
	}
	return b
}
