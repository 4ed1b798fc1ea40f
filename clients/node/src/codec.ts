/**
 * Avro binary of dueflow's records with avsc and the schemas of schemas/dueflow/schemas
 * (copied into this package; a test of the repository checks the copies).
 */
import { readFileSync } from "node:fs";
import { join } from "node:path";
import * as avro from "avsc";

const SCHEMAS = join(__dirname, "..", "..", "schemas");

/** job.avsc, what the registry option registers. */
export const JOB_SCHEMA_TEXT = readFileSync(join(SCHEMAS, "job.avsc"), "utf8");

// Each schema with a registry of its own: versions of one record share their full name.
function load(file: string): avro.Type {
  return avro.Type.forSchema(JSON.parse(readFileSync(join(SCHEMAS, file), "utf8")), { registry: {} });
}

const JOB = avro.Type.forSchema(JSON.parse(JOB_SCHEMA_TEXT), { registry: {} });
export const IDEMPOTENCY_V1 = load("v1/idempotency_record.avsc");
export const IDEMPOTENCY_V3 = load("idempotency_record.avsc");
export const OUTCOME_V1 = load("v1/outcome.avsc");
export const OUTCOME_V2 = load("outcome.avsc");
/** What a verdict is written with. */
export const OUTCOME_V3 = load("v3/outcome.avsc");
export const COMMAND_V1 = load("command.avsc");
const LONG = avro.Type.forSchema("long");
const STRING = avro.Type.forSchema("string");

/** A job's fields, as written in its dueflow.Job value. */
export interface JobFields {
  jobId: string;
  queue: string;
  task: string;
  payload: Buffer;
  contentType: string;
  dueMs: number;
  idempotencyKey: string;
  maxAttempts: number;
  timeoutMs: number | null;
  createdMs: number;
  contentHash: string;
  labels: Record<string, string>;
}

/** Code point (UTF-8 byte) order, the order every dueflow writer sorts labels in. */
export function byCodePoint(a: string, b: string): number {
  return Buffer.compare(Buffer.from(a, "utf8"), Buffer.from(b, "utf8"));
}

/**
 * The Avro value of `job` (job.avsc). The labels map is the record's last field: avsc
 * writes the record with an empty map (one 0 byte), and the labels follow in code point
 * order, written with avsc's long and string types (a JS object puts integer-like keys
 * first, whatever their order, so it cannot carry the order itself).
 */
export function encodeJob(job: JobFields): Buffer {
  const head = JOB.toBuffer({
    job_id: job.jobId,
    queue: job.queue,
    task: job.task,
    payload: job.payload,
    content_type: job.contentType,
    due_ms: job.dueMs,
    idempotency_key: job.idempotencyKey,
    max_attempts: job.maxAttempts,
    backoff: null,
    timeout_ms: job.timeoutMs,
    jitter_ms: 0,
    created_ms: job.createdMs,
    trace: {},
    schedule_id: null,
    schedule_version: null,
    content_hash: job.contentHash,
    labels: {},
  });
  const keys = Object.keys(job.labels).sort(byCodePoint);
  if (keys.length === 0) return head;
  const parts = [head.subarray(0, head.length - 1), LONG.toBuffer(keys.length)];
  for (const k of keys) parts.push(STRING.toBuffer(k), STRING.toBuffer(job.labels[k]));
  parts.push(Buffer.from([0]));
  return Buffer.concat(parts);
}

export function encodeKeyState(type: avro.Type, job: JobFields, atMs: number, runOnlyDueMs?: number): Buffer {
  const rec: Record<string, unknown> = {
    idempotency_key: job.idempotencyKey,
    job_id: job.jobId,
    state: "cancelled",
    at_ms: atMs,
    attempts: 0,
    content_hash: job.contentHash,
  };
  if (runOnlyDueMs !== undefined) rec.run_only_due_ms = runOnlyDueMs;
  return type.toBuffer(rec);
}

export function encodeOutcome(type: avro.Type, job: JobFields, state: string, atMs: number, dueMs: number): Buffer {
  return type.toBuffer({
    job_id: job.jobId,
    queue: job.queue,
    task: job.task,
    idempotency_key: job.idempotencyKey,
    state,
    attempt: 0,
    at_ms: atMs,
    due_ms: dueMs,
    duration_ms: null,
    error_type: null,
    error: null,
    worker: null,
    trace_id: null,
    schedule_id: null,
  });
}

/** Decode a plain Job value (for tests and tools). */
export function decodeJob(value: Buffer): Record<string, unknown> {
  return JOB.fromBuffer(value) as Record<string, unknown>;
}
