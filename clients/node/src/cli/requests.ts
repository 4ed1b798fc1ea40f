/**
 * Requests and wheels in the JSON shape of the conformance vectors and the example
 * program: task, queue, payload {json_text | json | bytes_hex | bytes_fill},
 * delay_ms | run_at_ms, job_id, idempotency_key, max_attempts, timeout_ms, labels.
 */
import { PayloadUpdate } from "../commands";
import { JobRequest } from "../records";
import { Wheel } from "../wheel";

/* eslint-disable @typescript-eslint/no-explicit-any */
export function requestOf(doc: any): JobRequest {
  const req: JobRequest = { task: doc.task };
  const pay = doc.payload ?? {};
  if ("json_text" in pay) req.jsonText = pay.json_text;
  else if ("json" in pay) req.json = pay.json;
  else if ("bytes_hex" in pay) req.bytes = Buffer.from(pay.bytes_hex, "hex");
  else if ("bytes_fill" in pay) req.bytes = Buffer.alloc(pay.bytes_fill.count, pay.bytes_fill.byte);
  if ("queue" in doc) req.queue = doc.queue;
  if ("delay_ms" in doc) req.delayMs = doc.delay_ms;
  if ("run_at_ms" in doc) req.runAt = doc.run_at_ms;
  if ("job_id" in doc) req.jobId = doc.job_id;
  if ("idempotency_key" in doc) req.idempotencyKey = doc.idempotency_key;
  if ("max_attempts" in doc) req.maxAttempts = doc.max_attempts;
  if ("timeout_ms" in doc) req.timeoutMs = doc.timeout_ms;
  if ("labels" in doc) req.labels = doc.labels;
  return req;
}

/** A payload update in the vectors' shape ({json_text | json | bytes_hex}), with run_at_ms. */
export function payloadUpdateOf(pay: any, runAtMs?: number): PayloadUpdate {
  const update: PayloadUpdate = {};
  if ("json_text" in pay) update.jsonText = pay.json_text;
  else if ("json" in pay) update.json = pay.json;
  else if ("bytes_hex" in pay) update.bytes = Buffer.from(pay.bytes_hex, "hex");
  if (runAtMs !== undefined) update.runAt = runAtMs;
  return update;
}

export function wheelOf(doc: any): Wheel {
  return {
    nearPartitions: doc.near_partitions,
    nearWindowMs: doc.near_window_ms,
    lookaheadMs: doc.lookahead_ms,
    levels: doc.levels.map(([slots, widthMs]: [number, number]) => ({ slots, widthMs })),
    shards: doc.shards ?? 1,
  };
}
