/**
 * The example program: reads one JSON document on stdin ({bootstrap, prefix, wheel,
 * registry_url, ops}) and runs its ops in order, printing one JSON line per op. Ops:
 * {"op": "schedule", "request": {...}}; the commands {"op": "cancel", "job": N},
 * {"op": "reschedule", "job": N, "run_at_ms": T}, {"op": "update", "job": N, "payload":
 * {...}, "run_at_ms": T?} (each with optional wait_ms, command_id, by, expect_version,
 * known_due_ms, and "ref": {job_id, queue, idempotency_key} instead of job); the legacy
 * records legacy_cancel, legacy_reschedule (N: the number of the schedule op, counting
 * schedule ops only, from 0).
 */
import { CommandOptions, JobRef, Verdict } from "../commands";
import { InvalidInputError } from "../errors";
import { DueflowProducer } from "../producer";
import { ScheduledJob } from "../records";
import { payloadUpdateOf, requestOf, wheelOf } from "./requests";

function shown(v: Verdict | null): unknown {
  return v === null ? null : { state: v.state, code: v.code, reason: v.reason, due_ms: v.dueMs, version: v.version };
}

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString("utf8");
}

async function main(): Promise<void> {
  const doc = JSON.parse(await readStdin());
  const dueflow = await DueflowProducer.connect({
    brokers: String(doc.bootstrap).split(","),
    prefix: doc.prefix,
    wheel: doc.wheel ? wheelOf(doc.wheel) : undefined,
    schemaRegistryUrl: doc.registry_url ?? undefined,
  });
  const jobs: (ScheduledJob | null)[] = [];
  try {
    for (const op of doc.ops) {
      let job: ScheduledJob | null = null;
      try {
        if (op.op === "schedule") {
          jobs.push(null); // keeps the indexes of later ops if this one fails
          job = await dueflow.schedule(requestOf(op.request));
          jobs[jobs.length - 1] = job;
        } else if (op.op === "cancel" || op.op === "reschedule" || op.op === "update") {
          const ref: JobRef =
            "job" in op ? jobs[op.job]! : { jobId: op.ref.job_id, queue: op.ref.queue, idempotencyKey: op.ref.idempotency_key };
          const options: CommandOptions = {
            commandId: op.command_id,
            by: op.by,
            expectVersion: op.expect_version,
            knownDueMs: op.known_due_ms,
          };
          const sent =
            op.op === "cancel"
              ? await dueflow.cancel(ref, options)
              : op.op === "reschedule"
                ? await dueflow.reschedule(ref, op.run_at_ms, options)
                : await dueflow.update(ref, payloadUpdateOf(op.payload, op.run_at_ms), options);
          if (op.op === "reschedule" && "job" in op) jobs[op.job] = { ...jobs[op.job]!, dueMs: op.run_at_ms, partition: -1 };
          const line: Record<string, unknown> = { job_id: sent.jobId, command_id: sent.commandId, partition: sent.partition };
          if ("wait_ms" in op) line.verdict = await dueflow.waitVerdict(sent, { timeoutMs: op.wait_ms }).then(shown);
          console.log(JSON.stringify(line));
          continue;
        } else if (op.op === "legacy_cancel") {
          job = jobs[op.job]!;
          await dueflow.legacyCancel(job);
        } else if (op.op === "legacy_reschedule") {
          job = await dueflow.legacyReschedule(jobs[op.job]!, op.run_at_ms);
          jobs[op.job] = job;
        } else {
          throw new Error(`unknown op ${JSON.stringify(op)}`);
        }
        const { jobId, dueMs, partition, idempotencyKey, createdMs } = job;
        console.log(JSON.stringify({ job_id: jobId, due_ms: dueMs, partition, idempotency_key: idempotencyKey, created_ms: createdMs }));
      } catch (e) {
        if (!(e instanceof InvalidInputError)) throw e;
        console.log(JSON.stringify({ error: { field: e.field, message: e.message } }));
      }
    }
  } finally {
    await dueflow.close();
  }
}

main().catch((e) => {
  console.error(`dueflow example: ${e instanceof Error ? e.stack : e}`);
  process.exit(1);
});
