/**
 * Waits for verdicts (I/O edge): the end of a job id's outcomes partition is noted before a
 * command is written (`outcomesEnd`), then that partition is read from there until the
 * outcome with the command's id (`waitForVerdict`). kafkajs has no assign-only consumer: the
 * reader is a consumer of a group of its own (a new id per wait, never committed, gone
 * when it leaves), read committed, that seeks the partition to the noted offset.
 */
import { randomBytes } from "node:crypto";
import { Admin, Kafka } from "kafkajs";
import { Verdict, verdictOf } from "./commands";
import { DueflowError } from "./errors";
import { keyPartition } from "./wheel";

/**
 * A command the broker has acknowledged: its id, the job, the exec partition it went to, and
 * where the job id's outcomes partition ended just before it was written (where
 * DueflowProducer.waitVerdict starts reading).
 */
export interface SentCommand {
  commandId: string;
  op: string;
  jobId: string;
  queue: string;
  partition: number;
  outcomesPartition: number;
  outcomesOffset: string;
}

/** The outcomes partition of `jobId` among `partitions` and its end offset now. */
export async function outcomesEnd(admin: Admin, topic: string, partitions: number, jobId: string): Promise<[number, string]> {
  const partition = keyPartition(Buffer.from(jobId, "utf8"), partitions);
  try {
    const offsets = await admin.fetchTopicOffsets(topic);
    const found = offsets.find((o) => o.partition === partition);
    if (found === undefined) throw new Error(`no partition ${partition}`);
    return [partition, found.high];
  } catch (e) {
    throw new DueflowError(`end offset of ${topic}[${partition}]: ${e}`, true, { cause: e });
  }
}

/** The verdict on `sent`, read from its noted offset on; null when none came within `timeoutMs`. */
export async function waitForVerdict(kafka: Kafka, topic: string, groupPrefix: string, sent: SentCommand, timeoutMs: number): Promise<Verdict | null> {
  const consumer = kafka.consumer({
    groupId: `${groupPrefix}.verdicts.${randomBytes(8).toString("hex")}`,
    readUncommitted: false,
    maxWaitTimeInMs: 50,
    allowAutoTopicCreation: false,
  });
  let settle: (v: Verdict | null) => void = () => undefined;
  let fail: (e: unknown) => void = () => undefined;
  const result = new Promise<Verdict | null>((resolve, reject) => ((settle = resolve), (fail = reject)));
  const timer = setTimeout(() => settle(null), timeoutMs);
  consumer.on(consumer.events.CRASH, ({ payload }) => {
    if (!payload.restart) fail(new DueflowError(`reading ${topic}[${sent.outcomesPartition}]: ${payload.error}`, false, { cause: payload.error }));
  });
  try {
    await consumer.connect();
    await consumer.subscribe({ topics: [topic], fromBeginning: false });
    await consumer.run({
      autoCommit: false,
      eachMessage: async ({ partition, message }) => {
        if (partition !== sent.outcomesPartition) return;
        const schema = message.headers?.["df-schema"];
        const found = verdictOf(message.key, message.value, schema === undefined ? undefined : String(schema), sent.jobId, sent.commandId);
        if (found !== null) settle(found);
      },
    });
    consumer.seek({ topic, partition: sent.outcomesPartition, offset: sent.outcomesOffset });
    return await result;
  } finally {
    clearTimeout(timer);
    await consumer.disconnect().catch(() => undefined);
  }
}
