/**
 * The records that schedule a job, and the legacy records that cancel and reschedule one
 * on a queue not finalized (pure: no clock, no I/O; commands.ts builds the commands that
 * steer a job on a finalized one). The
 * rules are the Python SDK's; ../conformance/vectors.json holds what it writes, and the
 * tests check that these functions write the same bytes.
 */
import { randomBytes } from "node:crypto";
import { blake2bHex } from "blakejs";
import {
  byCodePoint,
  encodeJob,
  encodeKeyState,
  encodeOutcome,
  IDEMPOTENCY_V1,
  IDEMPOTENCY_V3,
  JobFields,
  OUTCOME_V1,
  OUTCOME_V2,
} from "./codec";
import { InvalidInputError } from "./errors";
import { keyPartition, placeTimer, Wheel } from "./wheel";

/** The latest due time: 9999-12-31T23:59:59.999Z. */
export const MAX_DUE_MS = 253_402_300_799_999;
/** The broker's default max.message.bytes (used until the timer topic is described). */
export const DEFAULT_MAX_RECORD_BYTES = 1_048_588;
export const MAX_NAME_CHARS = 255;
/** A queue's default idempotency retention: 7 days. */
export const DEFAULT_RETENTION_MS = 7 * 86_400_000;
const HOUR_MS = 3_600_000;
const MAX_INT32 = 2_147_483_647;
const TASK = /^[A-Za-z0-9_.:/-]{1,200}$/;
const QUEUE = /^[A-Za-z0-9_-]{1,100}$/;
const TASK_ACCEPTED = "1-200 characters of A-Z a-z 0-9 _ . : / - (the names a worker can register with @task)";
const INSTANT_LIMIT = "9999-12-31T23:59:59.999Z";
export const JSON_TYPE = "application/json";
export const BYTES_TYPE = "application/octet-stream";

/** One job to schedule. Give at most one of `json`, `jsonText`, `bytes` (none: JSON null). */
export interface JobRequest {
  /** The handler's name (registered with `@task` on the workers). */
  task: string;
  /** A JSON value, written as compact JSON with sorted keys (as the Python SDK writes it). */
  json?: unknown;
  /** JSON text you serialized yourself, written as is. */
  jsonText?: string;
  /** Raw bytes (application/octet-stream): the handler gets them unchanged. */
  bytes?: Uint8Array;
  /** Run at this time (a Date or UTC epoch ms); a time in the past runs at once. */
  runAt?: Date | number;
  /** Run this many milliseconds from now (neither runAt nor delayMs: now). */
  delayMs?: number;
  /** The queue (default "default"): the job runs on `<prefix>.exec.<queue>`. */
  queue?: string;
  /** Your own job id (default: a new UUIDv7); 1-255 characters. */
  jobId?: string;
  /** The key workers deduplicate by and handlers get (default: the job id). */
  idempotencyKey?: string;
  /** Attempts before the job is dead-lettered (default 4). */
  maxAttempts?: number;
  /** A hard limit on one attempt, in ms (default: the workers' default). */
  timeoutMs?: number;
  /** Free-form strings carried with the job (logs, status view). */
  labels?: Record<string, string>;
}

/** A job as written: every field of its value, and where its timer went. Keep it to cancel, reschedule or update. */
export interface ScheduledJob extends JobFields {
  partition: number;
}

/** A record to produce; `partition` undefined leaves it to the default (murmur2) partitioner. */
export interface OutgoingRecord {
  topic: string;
  partition?: number;
  key: Buffer;
  value: Buffer;
  headers: [string, string][];
}

/** Where and how records are written: the topic prefix, the wheel, the record limit, framing. */
export interface Target {
  prefix: string;
  wheel: Wheel;
  maxRecordBytes: number;
  /** The registry option: Confluent framing with this schema id. */
  schemaId?: number;
}

export interface Planned {
  job: ScheduledJob;
  timer: OutgoingRecord;
  outcome: OutgoingRecord;
}

/** Estimated size of a record in a batch of its own, as dueflow estimates it against max.message.bytes. */
export function estimatedSize(r: OutgoingRecord): number {
  let n = 61 + 21 + r.key.length + r.value.length;
  for (const [k, v] of r.headers) n += 10 + Buffer.byteLength(k) + Buffer.byteLength(v);
  return n;
}

/** The UUIDv7 the Python SDK draws for `nowMs` from 10 random bytes (hex digits 0-2 and 4-18). */
export function uuid7(nowMs: number, random: Uint8Array): string {
  const digits = Buffer.from(random).toString("hex");
  const time = (BigInt(nowMs) & 0xffffffffffffn).toString(16).padStart(12, "0");
  return `${time}7${digits.slice(0, 3)}8${digits.slice(4, 19)}`;
}

export function newJobId(nowMs: number): string {
  return uuid7(nowMs, randomBytes(10));
}

/** BLAKE2b-128 hex of `utf8(task) 0 utf8(contentType) 0 payload`: the SDK's content hash. */
export function contentHash(task: string, payload: Uint8Array, contentType: string): string {
  const head = Buffer.from(`${task}\0${contentType}\0`, "utf8");
  return blake2bHex(Buffer.concat([head, payload]), undefined, 16);
}

/** `value` as compact JSON with keys sorted in code point order; NaN and Infinity refused. */
export function canonicalJson(value: unknown): string {
  const walk = (v: unknown, path: string): unknown => {
    if (typeof v === "number" && !Number.isFinite(v)) {
      throw new InvalidInputError(path, v, "a finite number: JSON has no NaN or Infinity");
    }
    if (typeof v === "bigint") throw new InvalidInputError(path, `${v}n`, "a number JSON can hold (not a bigint)");
    if (v === null || typeof v !== "object") return v;
    if (Array.isArray(v)) return v.map((item, i) => walk(item, `${path}[${i}]`));
    if (typeof (v as { toJSON?: unknown }).toJSON === "function") return v;
    const out: Record<string, unknown> = {};
    for (const k of Object.keys(v).sort(byCodePoint)) out[k] = walk((v as Record<string, unknown>)[k], `${path}[${JSON.stringify(k)}]`);
    return out;
  };
  // JSON.stringify keeps the insertion order of string keys (integer-like keys come first
  // in any object): build the text ourselves so that the sorted order holds.
  const write = (v: unknown): string => {
    if (v !== null && typeof v === "object" && !Array.isArray(v) && typeof (v as { toJSON?: unknown }).toJSON !== "function") {
      const o = v as Record<string, unknown>;
      const keys = Object.keys(o).sort(byCodePoint).filter((k) => o[k] !== undefined && typeof o[k] !== "function");
      return `{${keys.map((k) => `${JSON.stringify(k)}:${write(o[k])}`).join(",")}}`;
    }
    if (Array.isArray(v)) return `[${v.map((item) => (item === undefined ? "null" : write(item))).join(",")}]`;
    const text = JSON.stringify(v);
    return text === undefined ? "null" : text;
  };
  return write(walk(value, "payload"));
}

function isName(s: unknown): s is string {
  if (typeof s !== "string") return false;
  const chars = [...s].length;
  return chars >= 1 && chars <= MAX_NAME_CHARS && wellFormed(s);
}

function wellFormed(s: string): boolean {
  return !/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/.test(s);
}

export function checkName(field: string, value: unknown): string {
  if (!isName(value)) {
    throw new InvalidInputError(field, value, `a non-empty string of at most ${MAX_NAME_CHARS} chars (valid UTF-8)`);
  }
  return value;
}

export function checkQueue(queue: unknown): string {
  if (typeof queue !== "string" || !QUEUE.test(queue)) {
    throw new InvalidInputError("queue", queue, "a queue name: 1-100 of [A-Za-z0-9_-] (create one with `dueflow queue create NAME`)");
  }
  return queue;
}

export function payloadOf(req: JobRequest): [Buffer, string] {
  const given = ["json", "jsonText", "bytes"].filter((k) => k in req && (req as unknown as Record<string, unknown>)[k] !== undefined);
  if (given.length > 1) throw new InvalidInputError("payload", given.join(", "), "one of json, jsonText, bytes");
  if (req.bytes !== undefined) {
    if (!(req.bytes instanceof Uint8Array)) throw new InvalidInputError("payload", req.bytes, "a Uint8Array or Buffer");
    return [Buffer.from(req.bytes), BYTES_TYPE];
  }
  if (req.jsonText !== undefined) {
    try {
      JSON.parse(req.jsonText);
    } catch (e) {
      throw new InvalidInputError("payload", req.jsonText, `JSON text (${(e as Error).message})`);
    }
    return [Buffer.from(req.jsonText, "utf8"), JSON_TYPE];
  }
  return [Buffer.from(canonicalJson(req.json === undefined ? null : req.json), "utf8"), JSON_TYPE];
}

function wholeMs(field: string, value: unknown, min: number): number {
  if (typeof value !== "number" || !Number.isSafeInteger(value) || value < min) {
    throw new InvalidInputError(field, value, `a whole number of milliseconds >= ${min}${min === 0 ? " (it must not be negative)" : ""}`);
  }
  return value;
}

function dueOf(req: JobRequest, nowMs: number): number {
  if (req.runAt !== undefined) {
    if (req.delayMs !== undefined) throw new InvalidInputError("delay", req.delayMs, "either run_at or delay, not both");
    const ms = req.runAt instanceof Date ? req.runAt.getTime() : req.runAt;
    if (typeof ms !== "number" || !Number.isSafeInteger(ms)) {
      throw new InvalidInputError("run_at", req.runAt, "a Date or UTC epoch milliseconds");
    }
    if (ms > MAX_DUE_MS) throw new InvalidInputError("run_at", req.runAt, `a time at or before ${INSTANT_LIMIT}`);
    return ms;
  }
  if (req.delayMs === undefined) return nowMs;
  const delay = wholeMs("delay", req.delayMs, 0);
  if (delay > MAX_DUE_MS - nowMs) {
    throw new InvalidInputError(
      "delay",
      req.delayMs,
      `a duration putting the due time at or before ${INSTANT_LIMIT} (at most ${MAX_DUE_MS - nowMs} ms from now)`,
    );
  }
  return nowMs + delay;
}

/**
 * Check `req` and build its records, written at `nowMs`. `queueCheck` throws for a queue
 * that does not exist; `newId` draws an id for a request without one. Throws
 * InvalidInputError naming the first bad field, in the SDK's order.
 */
export function planSchedule(
  req: JobRequest,
  nowMs: number,
  target: Target,
  queueCheck: (queue: string) => void,
  newId: (nowMs: number) => string = newJobId,
): Planned {
  if (typeof req.task !== "string" || !TASK.test(req.task)) throw new InvalidInputError("task", req.task, TASK_ACCEPTED);
  const queue = checkQueue(req.queue ?? "default");
  queueCheck(queue);
  const [payload, contentType] = payloadOf(req);
  const jobId = req.jobId === undefined ? newId(nowMs) : checkName("job_id", req.jobId);
  const key = req.idempotencyKey === undefined ? jobId : checkName("idempotency_key", req.idempotencyKey);
  const dueMs = dueOf(req, nowMs);
  let maxAttempts = 4;
  if (req.maxAttempts !== undefined) {
    const n = req.maxAttempts;
    if (typeof n !== "number" || !Number.isInteger(n) || n < 1 || n > MAX_INT32) {
      throw new InvalidInputError("max_attempts", n, `an integer from 1 to ${MAX_INT32}`);
    }
    maxAttempts = n;
  }
  const timeoutMs = req.timeoutMs === undefined ? null : wholeMs("timeout", req.timeoutMs, 1);
  const labels: Record<string, string> = {};
  if (req.labels !== undefined) {
    const ok =
      req.labels !== null &&
      typeof req.labels === "object" &&
      Object.entries(req.labels).every(([k, v]) => typeof v === "string" && wellFormed(k) && wellFormed(v));
    if (!ok) throw new InvalidInputError("labels", req.labels, "an object of strings to strings (valid UTF-8)");
    Object.assign(labels, req.labels);
  }
  const job: ScheduledJob = {
    jobId,
    queue,
    task: req.task,
    payload,
    contentType,
    dueMs,
    idempotencyKey: key,
    maxAttempts,
    timeoutMs,
    createdMs: nowMs,
    contentHash: contentHash(req.task, payload, contentType),
    labels,
    partition: -1,
  };
  const timer = timerRecord(job, nowMs, target);
  const size = estimatedSize(timer);
  if (size > target.maxRecordBytes) {
    throw new InvalidInputError(
      "payload",
      `${payload.length} bytes (a timer record of ${size} bytes)`,
      `a timer record of at most ${target.maxRecordBytes} bytes (max.message.bytes of ${target.prefix}.timers)`,
    );
  }
  job.partition = timer.partition!;
  const outcome: OutgoingRecord = {
    topic: `${target.prefix}.outcomes`,
    key: Buffer.from(jobId, "utf8"),
    value: encodeOutcome(OUTCOME_V1, job, "scheduled", nowMs, dueMs),
    headers: [["df-schema", "dueflow.Outcome/1"]],
  };
  return { job, timer, outcome };
}

/** The Confluent wire format: magic byte 0, the 4-byte schema id, the Avro bytes. */
export function frame(schemaId: number, avroBytes: Buffer): Buffer {
  const head = Buffer.alloc(5);
  head.writeUInt32BE(schemaId, 1);
  return Buffer.concat([head, avroBytes]);
}

function timerRecord(job: JobFields, nowMs: number, target: Target): OutgoingRecord {
  const key = Buffer.from(job.idempotencyKey, "utf8");
  let value = encodeJob(job);
  let schema = "dueflow.Job/1";
  if (target.schemaId !== undefined) {
    value = frame(target.schemaId, value);
    schema += "+confluent";
  }
  return {
    topic: `${target.prefix}.timers`,
    partition: placeTimer(target.wheel, job.dueMs, nowMs, key),
    key,
    value,
    headers: [
      ["df-due", String(job.dueMs)],
      ["df-queue", job.queue],
      ["df-kind", "job"],
      ["df-job", job.jobId],
      ["df-task", job.task],
      ["df-schema", schema],
    ],
  };
}

function checkRetention(job: ScheduledJob, nowMs: number, retentionMs: number): void {
  if (job.dueMs > nowMs + retentionMs - HOUR_MS) {
    throw new InvalidInputError(
      "job_id",
      job.jobId,
      `a job due within its queue's idempotency retention (${retentionMs / 86_400_000} days, less an hour) from now; ` +
        `this one is due at ${new Date(job.dueMs).toISOString()}, and workers would forget the record before then`,
    );
  }
}

/**
 * The legacy records (a queue not finalized; on a finalized one, cancelCommand) that
 * cancel `job`, written at `atMs`: an IdempotencyRecord (version 1,
 * cancelled) on the key's murmur2 partition among the queue's `partitions`, then the
 * cancelled outcome.
 */
export function legacyCancelRecords(job: ScheduledJob, atMs: number, partitions: number, target: Target, retentionMs = DEFAULT_RETENTION_MS): OutgoingRecord[] {
  checkRetention(job, atMs, retentionMs);
  const key = Buffer.from(job.idempotencyKey, "utf8");
  return [
    {
      topic: `${target.prefix}.idempotency.${job.queue}`,
      partition: keyPartition(key, partitions),
      key,
      value: encodeKeyState(IDEMPOTENCY_V1, job, atMs),
      headers: [["df-job", job.jobId], ["df-queue", job.queue], ["df-schema", "dueflow.IdempotencyRecord/1"]],
    },
    {
      topic: `${target.prefix}.outcomes`,
      key: Buffer.from(job.jobId, "utf8"),
      value: encodeOutcome(OUTCOME_V1, job, "cancelled", atMs, job.dueMs),
      headers: [["df-job", job.jobId], ["df-queue", job.queue], ["df-schema", "dueflow.Outcome/1"]],
    },
  ];
}

/**
 * The legacy records (a queue not finalized; on a finalized one, moveCommand) that move
 * pending `job` to `dueMs`, written at `atMs`, in the order to
 * write them: the timer again (same key and value but the due time), the reschedule
 * record (IdempotencyRecord version 3, key + "\0reschedule", on the key's own murmur2
 * partition), and the rescheduled outcome.
 */
export function legacyRescheduleRecords(
  job: ScheduledJob,
  dueMs: number,
  atMs: number,
  partitions: number,
  target: Target,
  retentionMs = DEFAULT_RETENTION_MS,
): OutgoingRecord[] {
  if (!Number.isSafeInteger(dueMs) || dueMs > MAX_DUE_MS) {
    throw new InvalidInputError("run_at", dueMs, `a time at or before ${INSTANT_LIMIT}`);
  }
  if (dueMs === job.dueMs) throw new InvalidInputError("run_at", dueMs, "a due time other than the job's own");
  checkRetention(job, atMs, retentionMs);
  const key = Buffer.from(job.idempotencyKey, "utf8");
  return [
    timerRecord({ ...job, dueMs }, atMs, target),
    {
      topic: `${target.prefix}.idempotency.${job.queue}`,
      partition: keyPartition(key, partitions),
      key: Buffer.concat([key, Buffer.from("\0reschedule", "utf8")]),
      value: encodeKeyState(IDEMPOTENCY_V3, job, atMs, dueMs),
      headers: [["df-job", job.jobId], ["df-queue", job.queue], ["df-schema", "dueflow.IdempotencyRecord/3"]],
    },
    {
      topic: `${target.prefix}.outcomes`,
      key: Buffer.from(job.jobId, "utf8"),
      value: encodeOutcome(OUTCOME_V2, job, "rescheduled", atMs, dueMs),
      headers: [["df-job", job.jobId], ["df-queue", job.queue], ["df-schema", "dueflow.Outcome/2"]],
    },
  ];
}
