/** The shared conformance table (clients/conformance/vectors.json), made by the Python SDK. */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { test } from "node:test";
import { requestOf, wheelOf } from "../src/cli/requests";
import {
  cancelCommand,
  decodeJob,
  DEFAULT_RETENTION_MS,
  InvalidInputError,
  JobRef,
  keyPartition,
  legacyCancelRecords,
  legacyRescheduleRecords,
  moveCommand,
  OutgoingRecord,
  patchCommand,
  placeTimer,
  planSchedule,
  Target,
  uuid7,
  verdictOf,
} from "../src/index";

/* eslint-disable @typescript-eslint/no-explicit-any */
const V: any = JSON.parse(readFileSync(join(__dirname, "..", "..", "..", "conformance", "vectors.json"), "utf8"));

function target(wheel: string, schemaId?: number): Target {
  return { prefix: V.prefix, wheel: wheelOf(V.wheels[wheel]), maxRecordBytes: V.max_record_bytes, schemaId };
}

function queueCheck(q: string): void {
  if (!V.queues.includes(q)) throw new InvalidInputError("queue", q, "a known queue");
}

function plan(c: any, request: any) {
  const random = Buffer.from(c.random_hex ?? "00000000000000000000", "hex");
  return planSchedule(requestOf(request), c.now_ms, target(c.wheel, c.schema_id), queueCheck, (now) => uuid7(now, random));
}

function assertRecord(want: any, got: OutgoingRecord, name: string): void {
  assert.equal(got.topic, want.topic, name);
  assert.equal(got.partition ?? null, want.partition, `${name} partition`);
  assert.equal(got.key.toString("hex"), want.key_hex, `${name} key`);
  assert.equal(got.value.toString("hex"), want.value_hex, `${name} value`);
  assert.deepEqual(got.headers, want.headers, `${name} headers`);
}

test("placement", () => {
  for (const c of V.placement) {
    assert.equal(placeTimer(wheelOf(V.wheels[c.wheel]), c.due_ms, c.now_ms, Buffer.from(c.key_hex, "hex")), c.partition, JSON.stringify(c));
  }
});

test("murmur2", () => {
  for (const c of V.murmur2) assert.equal(keyPartition(Buffer.from(c.key_hex, "hex"), c.partitions), c.partition, JSON.stringify(c));
});

test("uuid7", () => {
  for (const c of V.uuid7) assert.equal(uuid7(c.now_ms, Buffer.from(c.random_hex, "hex")), c.job_id);
});

for (const c of V.schedule) {
  test(`schedule: ${c.name}`, () => {
    const p = plan(c, c.request);
    assert.equal(p.job.jobId, c.expected.job_id);
    assert.equal(p.job.dueMs, c.expected.due_ms);
    assert.equal(p.job.contentHash, c.expected.content_hash);
    assertRecord(c.expected.records[0], p.timer, "timer");
    assertRecord(c.expected.records[1], p.outcome, "outcome");
    if (c.schema_id === undefined) assert.equal(decodeJob(p.timer.value).job_id, p.job.jobId);
  });
  if (c.request.payload && "json" in c.request.payload) {
    test(`schedule: ${c.name} (json of a value)`, () => {
      const request = { ...c.request, payload: { json: c.request.payload.json } };
      const p = plan(c, request);
      assertRecord(c.expected.records[0], p.timer, "timer");
    });
  }
}

for (const c of V.invalid) {
  test(`invalid: ${c.name}`, () => {
    assert.throws(
      () => planSchedule(requestOf(c.request), c.now_ms, target("default"), queueCheck, () => "generated"),
      (e: unknown) => e instanceof InvalidInputError && e.field === c.field,
    );
  });
}

for (const kind of ["cancel", "reschedule"]) {
  for (const c of V[kind]) {
    test(`${kind}: ${c.name}`, () => {
      const s = V.schedule.find((x: any) => x.name === c.schedule);
      const p = plan(s, s.request);
      const t = target(s.wheel);
      const got =
        kind === "cancel"
          ? legacyCancelRecords(p.job, c.at_ms, c.partitions, t, DEFAULT_RETENTION_MS)
          : legacyRescheduleRecords(p.job, c.new_due_ms, c.at_ms, c.partitions, t, DEFAULT_RETENTION_MS);
      assert.equal(got.length, c.expected.records.length);
      got.forEach((r, i) => assertRecord(c.expected.records[i], r, `${c.name} record ${i}`));
    });
  }
}

function payloadUpdate(pay: any): any {
  if ("json_text" in pay) return { jsonText: pay.json_text };
  if ("json" in pay) return { json: pay.json };
  return { bytes: Buffer.from(pay.bytes_hex, "hex") };
}

for (const c of V.command) {
  test(`command: ${c.name}`, () => {
    const ref: JobRef = { jobId: c.job.job_id, queue: c.job.queue, idempotencyKey: c.job.idempotency_key };
    if (c.known_due_ms !== undefined) ref.knownDueMs = c.known_due_ms;
    const options = { commandId: c.command_id, by: c.by, expectVersion: c.expect_version };
    const noId = (): string => {
      throw new Error("the case gives its command id");
    };
    const t = target("default");
    const payloads = c.payload && "json" in c.payload ? [c.payload, { json: c.payload.json }] : [c.payload];
    for (const pay of payloads) {
      const cmd =
        c.op === "cancel"
          ? cancelCommand(ref, c.at_ms, c.partitions, t, options, noId)
          : c.op === "move"
            ? moveCommand(ref, c.due_ms, c.at_ms, c.partitions, t, options, noId)
            : patchCommand(ref, { ...payloadUpdate(pay), runAt: c.due_ms }, c.at_ms, c.partitions, t, options, noId);
      assert.equal(cmd.id, c.command_id);
      assert.equal(cmd.op, c.op);
      assertRecord(c.expected.records[0], cmd.record, c.name);
    }
  });
}

for (const c of V.verdict) {
  test(`verdict: ${c.name}`, () => {
    const schema = c.record.headers.find((h: [string, string]) => h[0] === "df-schema")?.[1];
    const got = verdictOf(Buffer.from(c.record.key_hex, "hex"), Buffer.from(c.record.value_hex, "hex"), schema, c.job_id, c.command_id);
    if (c.expected === null) assert.equal(got, null);
    else
      assert.deepEqual(got, {
        state: c.expected.state,
        code: c.expected.code,
        reason: c.expected.reason,
        dueMs: c.expected.due_ms,
        version: c.expected.version,
      });
  });
}

test("commands refuse bad input naming the field", () => {
  const t = target("default");
  const ref: JobRef = { jobId: "job-1", queue: "default", knownDueMs: 2_000_000_000_000 };
  const field = (f: () => unknown, name: string): void => {
    assert.throws(f, (e: unknown) => e instanceof InvalidInputError && e.field === name);
  };
  field(() => cancelCommand(ref, 0, 3, t, { commandId: "x".repeat(65) }), "command_id");
  field(() => cancelCommand(ref, 0, 3, t, { commandId: "a\u001bb" }), "command_id");
  field(() => moveCommand(ref, 1_999_999_999_999, 0, 3, t), "run_at");
  field(() => moveCommand(ref, 253_402_300_800_000, 0, 3, t), "run_at");
  field(() => cancelCommand({ jobId: "j", queue: "no such" }, 0, 3, t), "queue");
  field(() => cancelCommand({ ...ref, idempotencyKey: "" }, 0, 3, t), "idempotency_key");
  field(() => patchCommand(ref, { bytes: Buffer.alloc(t.maxRecordBytes) }, 0, 3, t), "payload");
  field(() => patchCommand(ref, { json: 1, bytes: Buffer.alloc(1) }, 0, 3, t), "payload");
  // a drawn id is a UUIDv7 of the command's time, as the SDK draws it
  const cmd = cancelCommand(ref, 1_900_000_000_123, 3, t);
  assert.equal(cmd.id.length, 32);
  assert.equal(cmd.id.slice(0, 13), uuid7(1_900_000_000_123, Buffer.alloc(10)).slice(0, 13));
});
