import { Admin, CompressionTypes, Kafka, KafkaConfig, logLevel, Producer } from "kafkajs";
import { JOB_SCHEMA_TEXT } from "./codec";
import { DueflowError, InvalidInputError } from "./errors";
import { cancelCommand, Command, CommandOptions, JobRef, moveCommand, patchCommand, PayloadUpdate, Verdict } from "./commands";
import {
  checkQueue,
  DEFAULT_MAX_RECORD_BYTES,
  DEFAULT_RETENTION_MS,
  JobRequest,
  legacyCancelRecords,
  legacyRescheduleRecords,
  OutgoingRecord,
  planSchedule,
  ScheduledJob,
  Target,
} from "./records";
import { ensureLz4Codec } from "./lz4";
import { registerSchema } from "./registry";
import { outcomesEnd, SentCommand, waitForVerdict } from "./verdicts";
import { DEFAULT_WHEEL, shardPartitions, Wheel } from "./wheel";

export interface DueflowProducerOptions {
  /** Brokers to bootstrap from. */
  brokers: string[];
  /** Topic prefix (default "dueflow": dueflow.timers, ...). */
  prefix?: string;
  /** The cluster's wheel geometry (default: dueflow's; `dueflow topics describe`). */
  wheel?: Wheel;
  /** Write a "scheduled" outcome per job for the status view (default true, as the SDK). */
  scheduledOutcomes?: boolean;
  /** The queues' idempotency retention in ms (default 7 days): legacyCancel/legacyReschedule refuse jobs beyond it. */
  retentionMs?: number;
  /**
   * The registry option: job values in the Confluent wire format, with the id this
   * registry gives job.avsc under subject `<prefix>.timers-value`. Upgrade every worker first.
   */
  schemaRegistryUrl?: string;
  /** More kafkajs settings (ssl, sasl, clientId, ...). */
  kafka?: Partial<KafkaConfig>;
  /** UTC epoch ms (default Date.now). */
  clock?: () => number;
}

/**
 * Schedules dueflow jobs, and cancels, reschedules and updates them by command, with
 * kafkajs: the records of docs/wire-format.md, with an idempotent acks=all producer; reads
 * a command's verdict from the outcomes topic.
 *
 * ```ts
 * const dueflow = await DueflowProducer.connect({ brokers: ["127.0.0.1:9092"] });
 * const job = await dueflow.schedule({ task: "send_email", json: { to: "a@example.com" }, delayMs: 600_000 });
 * await dueflow.close();
 * ```
 */
export class DueflowProducer {
  private readonly queuePartitions = new Map<string, number>();
  // scheduled outcomes on their way (close() waits for them)
  private readonly pending = new Set<Promise<void>>();
  private outcomesPartitions: number | undefined;

  private constructor(
    private readonly kafka: Kafka,
    private readonly producer: Producer,
    private readonly admin: Admin,
    readonly target: Target,
    private readonly scheduledOutcomes: boolean,
    private readonly retentionMs: number,
    private readonly clock: () => number,
  ) {}

  /** Connect, and check that the timer topic has the wheel's partitions. */
  static async connect(options: DueflowProducerOptions): Promise<DueflowProducer> {
    ensureLz4Codec(); // verdicts are read from LZ4-compressed outcome batches
    const kafka = new Kafka({ logLevel: logLevel.NOTHING, ...options.kafka, brokers: options.brokers });
    const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1, allowAutoTopicCreation: false });
    const admin = kafka.admin();
    const prefix = options.prefix ?? "dueflow";
    const wheel = options.wheel ?? DEFAULT_WHEEL;
    try {
      await Promise.all([producer.connect(), admin.connect()]);
      const timers = `${prefix}.timers`;
      const maxRecordBytes = await checkTimerTopic(admin, timers, wheel);
      const target: Target = { prefix, wheel, maxRecordBytes };
      if (options.schemaRegistryUrl !== undefined) {
        target.schemaId = await registerSchema(options.schemaRegistryUrl, `${timers}-value`, JOB_SCHEMA_TEXT);
      }
      return new DueflowProducer(
        kafka,
        producer,
        admin,
        target,
        options.scheduledOutcomes ?? true,
        options.retentionMs ?? DEFAULT_RETENTION_MS,
        options.clock ?? Date.now,
      );
    } catch (e) {
      await Promise.allSettled([producer.disconnect(), admin.disconnect()]);
      throw e;
    }
  }

  /**
   * Schedule `req`: resolves once the broker has the timer record. Rejects with
   * InvalidInputError (nothing written) for bad input or a queue that does not exist.
   */
  async schedule(req: JobRequest): Promise<ScheduledJob> {
    // Planning is synchronous: a queue not looked up yet is looked up, then planned again
    // (so a bad task is still named before an unknown queue, as the SDK does).
    const known = (q: string): void => {
      if (!this.queuePartitions.has(q)) throw new QueueNotLookedUp(q);
    };
    let planned;
    try {
      planned = planSchedule(req, this.clock(), this.target, known);
    } catch (e) {
      if (!(e instanceof QueueNotLookedUp)) throw e;
      await this.partitionsOf(e.queue);
      planned = planSchedule(req, this.clock(), this.target, known);
    }
    await this.write(planned.timer, `scheduling job ${planned.job.jobId}`);
    if (this.scheduledOutcomes) {
      // for the status view; nobody waits for it (as the SDK)
      const sent: Promise<void> = this.write(planned.outcome, "scheduled outcome")
        .catch(() => undefined)
        .finally(() => this.pending.delete(sent));
      this.pending.add(sent);
    }
    return planned.job;
  }

  /**
   * Cancel `job` by command (a finalized queue; any horizon): it never runs, and an
   * attempt running now finishes without another starting. Resolves once the broker has
   * the command; `waitVerdict` waits for the worker's verdict (cancelled, or refused).
   */
  async cancel(job: ScheduledJob | JobRef, options: CommandOptions = {}): Promise<SentCommand> {
    return this.steer(job, "cancelling", (at, n) => cancelCommand(job, at, n, this.target, options));
  }

  /**
   * Move pending `job` to `runAt` (a Date or UTC epoch ms) by command (a finalized queue;
   * any horizon): it runs then, not before, once. Only later than its due time: to run a
   * job earlier, cancel it and schedule it again. The verdict: rescheduled, or refused.
   */
  async reschedule(job: ScheduledJob | JobRef, runAt: Date | number, options: CommandOptions = {}): Promise<SentCommand> {
    const dueMs = runAt instanceof Date ? runAt.getTime() : runAt;
    return this.steer(job, "rescheduling", (at, n) => moveCommand(job, dueMs, at, n, this.target, options));
  }

  /**
   * Replace the payload of pending `job` by command (a finalized queue; any horizon), and
   * with `runAt` move it later too: it runs once, with the new payload. The verdict:
   * updated, or refused.
   */
  async update(job: ScheduledJob | JobRef, update: PayloadUpdate, options: CommandOptions = {}): Promise<SentCommand> {
    return this.steer(job, "updating", (at, n) => patchCommand(job, update, at, n, this.target, options));
  }

  /**
   * The verdict of the worker that owns the job's partition on `sent`: read from the job
   * id's outcomes partition, from where it ended before the command was written, until the
   * outcome with the command's id. Null when none came within `timeoutMs` (the worker of
   * that partition is down or behind: the command stays and is applied when it gets there).
   */
  async waitVerdict(sent: SentCommand, { timeoutMs }: { timeoutMs: number }): Promise<Verdict | null> {
    return waitForVerdict(this.kafka, `${this.target.prefix}.outcomes`, this.target.prefix, sent, timeoutMs);
  }

  private async steer(job: ScheduledJob | JobRef, what: string, plan: (atMs: number, partitions: number) => Command): Promise<SentCommand> {
    const n = await this.partitionsOf(job?.queue);
    const cmd = plan(this.clock(), n);
    const topic = `${this.target.prefix}.outcomes`;
    if (this.outcomesPartitions === undefined) {
      const count = await partitionCount(this.admin, topic);
      if (count === undefined) throw new DueflowError(`outcomes topic ${topic} not found (run \`dueflow topics ensure\`?)`);
      this.outcomesPartitions = count;
    }
    const [outcomesPartition, outcomesOffset] = await outcomesEnd(this.admin, topic, this.outcomesPartitions, job.jobId);
    await this.write(cmd.record, `${what} job ${job.jobId}`);
    return {
      commandId: cmd.id,
      op: cmd.op,
      jobId: job.jobId,
      queue: job.queue,
      partition: cmd.record.partition!,
      outcomesPartition,
      outcomesOffset,
    };
  }

  /**
   * Cancel `job` with the legacy records, for a queue not finalized (its workers may be of
   * a release before commands): workers skip it (and its retries) if it has not run yet.
   * Refused for a job due beyond the queue's idempotency retention (7 days by default) less
   * an hour.
   */
  async legacyCancel(job: ScheduledJob): Promise<void> {
    const n = await this.partitionsOf(job.queue);
    for (const r of legacyCancelRecords(job, this.clock(), n, this.target, this.retentionMs)) {
      await this.write(r, `cancelling job ${job.jobId}`);
    }
  }

  /**
   * Move pending `job` to `runAt` (a Date or UTC epoch ms) with the legacy records, for a
   * queue not finalized: it runs then, never at its old time, never twice. Refused beyond
   * the idempotency retention.
   */
  async legacyReschedule(job: ScheduledJob, runAt: Date | number): Promise<ScheduledJob> {
    const dueMs = runAt instanceof Date ? runAt.getTime() : runAt;
    const n = await this.partitionsOf(job.queue);
    const records = legacyRescheduleRecords(job, dueMs, this.clock(), n, this.target, this.retentionMs);
    for (const r of records) await this.write(r, `rescheduling job ${job.jobId}`);
    return { ...job, dueMs, partition: records[0].partition! };
  }

  /** Write what is pending and disconnect. */
  async close(): Promise<void> {
    await Promise.allSettled([...this.pending]);
    await Promise.allSettled([this.producer.disconnect(), this.admin.disconnect()]);
  }

  private async write(r: OutgoingRecord, what: string): Promise<void> {
    try {
      await this.producer.send({
        topic: r.topic,
        acks: -1,
        compression: CompressionTypes.None,
        messages: [{ key: r.key, value: r.value, partition: r.partition, headers: Object.fromEntries(r.headers) }],
      });
    } catch (e) {
      throw new DueflowError(`${what} (${r.topic}): ${e}`, true, { cause: e });
    }
  }

  private async partitionsOf(queue: string): Promise<number> {
    checkQueue(queue);
    const known = this.queuePartitions.get(queue);
    if (known !== undefined) return known;
    const topic = `${this.target.prefix}.exec.${queue}`;
    const n = await partitionCount(this.admin, topic);
    if (n === undefined) {
      throw new InvalidInputError(
        "queue",
        queue,
        `a queue that exists (no topic ${topic}); to create it: \`dueflow queue create ${queue} --partitions N\` (docs/queues.md)`,
      );
    }
    this.queuePartitions.set(queue, n);
    return n;
  }
}

class QueueNotLookedUp extends Error {
  constructor(readonly queue: string) {
    super(queue);
  }
}

async function partitionCount(admin: Admin, topic: string): Promise<number | undefined> {
  const topics = await admin.listTopics();
  if (!topics.includes(topic)) return undefined;
  const meta = await admin.fetchTopicMetadata({ topics: [topic] });
  return meta.topics[0].partitions.length;
}

async function checkTimerTopic(admin: Admin, topic: string, wheel: Wheel): Promise<number> {
  const n = await partitionCount(admin, topic);
  const shard = shardPartitions(wheel);
  const total = shard * (wheel.shards ?? 1);
  if (n === undefined) throw new DueflowError(`timer topic ${topic} not found (run \`dueflow topics ensure\`?)`);
  if (n < total || n % shard !== 0) {
    throw new DueflowError(
      `${topic} has ${n} partitions, but the wheel ${JSON.stringify(wheel)} needs ${total} (a multiple of ${shard}): ` +
        "give the cluster's geometry (dueflow topics describe)",
    );
  }
  try {
    const { resources } = await admin.describeConfigs({
      resources: [{ type: 2, name: topic, configNames: ["max.message.bytes"] }],
      includeSynonyms: false,
    });
    const entry = resources[0]?.configEntries.find((c) => c.configName === "max.message.bytes");
    return entry ? Number(entry.configValue) : DEFAULT_MAX_RECORD_BYTES;
  } catch {
    return DEFAULT_MAX_RECORD_BYTES;
  }
}
