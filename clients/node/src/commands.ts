/**
 * The command records that cancel, move and update a pending job at any horizon (pure:
 * no clock, no I/O): one dueflow.Command (version 1) on the job's exec partition (murmur2
 * of its idempotency key), key = the idempotency key + "\0cmd", headers df-kind steer,
 * df-due 0, df-job, df-queue, df-schema dueflow.Command/1 (docs/wire-format.md, "Steering
 * a job"). Only for queues that were finalized (`dueflow queue finalize`). There is no
 * "replace" here: it carries the job's whole value, which only a client that reads the
 * job's timer first has (the Python SDK does, to move a job earlier).
 * ../conformance/vectors.json holds what the Python SDK writes; the tests check that these
 * functions write the same bytes.
 */
import { COMMAND_V1, OUTCOME_V3 } from "./codec";
import { InvalidInputError } from "./errors";
import { checkName, checkQueue, MAX_DUE_MS, newJobId, OutgoingRecord, payloadOf, ScheduledJob, Target } from "./records";
import { keyPartition } from "./wheel";

/** The longest command id the workers accept. */
export const MAX_COMMAND_ID_CHARS = 64;
/** Room kept in a timer record for the rest of the job when the worker writes a new payload in. */
export const TIMER_HEADROOM = 16 * 1024;
const CONTROL = /[\u0000-\u001f\u007f-\u009f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]/;

/**
 * The job a command is about: its id, queue and idempotency key (default: the job id; the
 * key picks the worker that owns it), and its due time when you know it (`knownDueMs`: the
 * worker refuses, code `unknown`, a command about a job it has no record of whose known due
 * time is long past). A ScheduledJob this client returned is one too (its `dueMs` is known).
 */
export interface JobRef {
  jobId: string;
  queue: string;
  idempotencyKey?: string;
  knownDueMs?: number;
}

/** Options of a command (docs/wire-format.md, "Steering a job"); every one may stay unset. */
export interface CommandOptions {
  /**
   * The command's id (1-64 characters): the verdict carries it, and it becomes the job's
   * version. Default: a new UUIDv7 as 32 hex digits, as the SDK draws them.
   */
  commandId?: string;
  /** Who asked (a service, an operator), kept with the command. */
  by?: string;
  /** The job's due time as you know it (default: the ref's knownDueMs, or a ScheduledJob's dueMs). */
  knownDueMs?: number;
  /**
   * Apply a move or update only if the job's version is still this one ("": the job as
   * scheduled; a verdict's `version` after a change); else the verdict is refused with code
   * `changed`. A cancel ignores it.
   */
  expectVersion?: string;
}

/** A new payload (one of json, jsonText, bytes), and optionally a later due time. */
export interface PayloadUpdate {
  json?: unknown;
  jsonText?: string;
  bytes?: Uint8Array;
  /** Move the job later too (a Date or UTC epoch ms). */
  runAt?: Date | number;
}

/** A checked command: its id, op and record. */
export interface Command {
  id: string;
  op: "cancel" | "move" | "patch";
  record: OutgoingRecord;
}

type Steerable = JobRef | ScheduledJob;

/** The command that cancels `job`: it never runs (an attempt running now finishes). */
export function cancelCommand(
  job: Steerable,
  atMs: number,
  partitions: number,
  target: Target,
  options: CommandOptions = {},
  newId: (nowMs: number) => string = newJobId,
): Command {
  return build("cancel", job, atMs, partitions, target, options, newId, {});
}

/**
 * The command that moves `job` to `dueMs`, not before its current due time (to run a job
 * earlier, cancel it and schedule it again): it runs then, not before, once.
 */
export function moveCommand(
  job: Steerable,
  dueMs: number,
  atMs: number,
  partitions: number,
  target: Target,
  options: CommandOptions = {},
  newId: (nowMs: number) => string = newJobId,
): Command {
  return build("move", job, atMs, partitions, target, options, newId, { dueMs });
}

/** The command that replaces the payload of `job` (and with `runAt` moves it later too). */
export function patchCommand(
  job: Steerable,
  update: PayloadUpdate,
  atMs: number,
  partitions: number,
  target: Target,
  options: CommandOptions = {},
  newId: (nowMs: number) => string = newJobId,
): Command {
  if (update === null || typeof update !== "object") {
    throw new InvalidInputError("payload", update, "the new payload: { json | jsonText | bytes }");
  }
  const [payload, contentType] = payloadOf({ task: "", json: update.json, jsonText: update.jsonText, bytes: update.bytes });
  const dueMs = update.runAt === undefined ? undefined : update.runAt instanceof Date ? update.runAt.getTime() : update.runAt;
  return build("patch", job, atMs, partitions, target, options, newId, { dueMs, payload, contentType });
}

function build(
  op: Command["op"],
  job: Steerable,
  atMs: number,
  partitions: number,
  target: Target,
  options: CommandOptions,
  newId: (nowMs: number) => string,
  change: { dueMs?: number; payload?: Buffer; contentType?: string },
): Command {
  if (job === null || typeof job !== "object") {
    throw new InvalidInputError("job", job, "the job to steer: a ScheduledJob or { jobId, queue, idempotencyKey? }");
  }
  const queue = checkQueue(job.queue);
  const jobId = commandName("job_id", job.jobId);
  const key = commandName("idempotency_key", job.idempotencyKey ?? job.jobId);
  const commandId = commandName("command_id", options.commandId ?? newId(atMs));
  if ([...commandId].length > MAX_COMMAND_ID_CHARS) {
    throw new InvalidInputError("command_id", commandId, `a non-empty string of at most ${MAX_COMMAND_ID_CHARS} chars`);
  }
  const known = options.knownDueMs ?? ("knownDueMs" in job ? job.knownDueMs : (job as ScheduledJob).dueMs);
  if (known !== undefined) time("known_due_ms", known);
  if (change.dueMs !== undefined) {
    time("run_at", change.dueMs);
    if (known !== undefined && change.dueMs < known) {
      throw new InvalidInputError(
        "run_at",
        new Date(change.dueMs).toISOString(),
        `a time at or after the job's due time ${new Date(known).toISOString()}: a command moves a job only later (to run it earlier, cancel it and schedule it again)`,
      );
    }
  }
  if (change.payload !== undefined && change.payload.length > target.maxRecordBytes - TIMER_HEADROOM) {
    throw new InvalidInputError(
      "payload",
      `${change.payload.length} bytes`,
      `at most ${target.maxRecordBytes - TIMER_HEADROOM} bytes (the timer topic's record limit, less room for the job's other fields)`,
    );
  }
  const keyBytes = Buffer.from(key, "utf8");
  const value = COMMAND_V1.toBuffer({
    command_id: commandId,
    op,
    job_id: jobId,
    idempotency_key: key,
    queue,
    at_ms: atMs,
    by: options.by ?? null,
    expect_version: options.expectVersion ?? null,
    known_due_ms: known ?? null,
    due_ms: change.dueMs ?? null,
    payload: change.payload ?? null,
    content_type: change.contentType ?? null,
    job: null,
    job_schema: null,
    unique: null,
    group: null,
    member: null,
  });
  return {
    id: commandId,
    op,
    record: {
      topic: `${target.prefix}.exec.${queue}`,
      partition: keyPartition(keyBytes, partitions),
      key: Buffer.concat([keyBytes, Buffer.from([0, 0x63, 0x6d, 0x64])]),
      value,
      headers: [
        ["df-kind", "steer"],
        ["df-due", "0"],
        ["df-job", jobId],
        ["df-queue", queue],
        ["df-schema", "dueflow.Command/1"],
      ],
    },
  };
}

function commandName(field: string, value: unknown): string {
  const name = checkName(field, value);
  if (CONTROL.test(name)) {
    throw new InvalidInputError(field, name, "a string without control characters (C0, DEL, C1, U+2028/U+2029, bidi controls)");
  }
  return name;
}

function time(field: string, ms: unknown): number {
  if (typeof ms !== "number" || !Number.isSafeInteger(ms) || ms < 0 || ms > MAX_DUE_MS) {
    throw new InvalidInputError(field, ms, `UTC epoch milliseconds from 0 to ${MAX_DUE_MS} (year 9999)`);
  }
  return ms;
}

/** The answer of the worker that owns a job's exec partition to a command: an Outcome (version 3) with its id. */
export interface Verdict {
  /** cancelled, rescheduled, updated or refused. */
  state: string;
  /**
   * Why, for refused: finished, started, cancelled, changed, needs_value, due_already,
   * unsupported, unknown, invalid ("" when applied).
   */
  code: string;
  /** The worker's words, for refused ("" when applied). */
  reason: string;
  /** The job's due time after the command (rescheduled), else null. */
  dueMs: number | null;
  /** The job's version after the change (null when the worker did not say). */
  version: string | null;
}

/** Whether the worker applied the command. */
export function applied(v: Verdict): boolean {
  return v.state !== "refused";
}

/**
 * The verdict on `commandId` of `jobId` in one outcome record (key, value and its
 * df-schema header), or null when the record is not that verdict (pure).
 */
export function verdictOf(key: Buffer | null, value: Buffer | null, schema: string | undefined, jobId: string, commandId: string): Verdict | null {
  if (!key || !value || !schema || !schema.endsWith("/3")) return null; // only version 3 carries a command id
  if (key.toString("utf8") !== jobId) return null;
  let o: Record<string, unknown>;
  try {
    o = OUTCOME_V3.fromBuffer(value) as Record<string, unknown>;
  } catch {
    return null;
  }
  if (o.command_id !== commandId) return null;
  const state = String(o.state);
  const error = typeof o.error === "string" ? o.error : "";
  const at = error.indexOf(": ");
  const refused = state === "refused";
  return {
    state,
    code: refused ? (at < 0 ? error : error.slice(0, at)) : "",
    reason: refused && at >= 0 ? error.slice(at + 2) : "",
    dueMs: typeof o.due_ms === "number" ? o.due_ms : null,
    version: typeof o.version === "string" ? o.version : null,
  };
}
