package dev.dueflow.client;

import java.time.Duration;
import java.time.Instant;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.function.LongSupplier;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.Config;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.errors.UnknownTopicOrPartitionException;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Schedules dueflow jobs, and cancels, reschedules and updates them by command: writes the records
 * of docs/wire-format.md (built by {@link JobRecords} and {@link Commands}) with an idempotent
 * {@code acks=all} producer, and reads a command's verdict from the outcomes topic.
 *
 * <pre>{@code
 * try (DueflowProducer dueflow = DueflowProducer.builder("127.0.0.1:9092").build()) {
 *   ScheduledJob job = dueflow.schedule(
 *       JobRequest.of("send_email").payload(Payload.json(Map.of("to", "a@example.com")))
 *           .delay(Duration.ofMinutes(10)));
 * }
 * }</pre>
 *
 * <p>Thread-safe. Every call returns once the broker has acknowledged what it wrote.
 */
public final class DueflowProducer implements AutoCloseable {
  private static final long TIMEOUT_S = 30;
  private final KafkaProducer<byte[], byte[]> producer;
  private final Admin admin;
  private final JobRecords.Target target;
  private final boolean scheduledOutcomes;
  private final long retentionMs;
  private final LongSupplier clock;
  private final Map<String, Integer> queuePartitions = new ConcurrentHashMap<>();
  private final VerdictWatch verdicts;

  /** How to reach the cluster and what it looks like. */
  public static final class Builder {
    private final Properties props = new Properties();
    private String prefix = "dueflow";
    private Wheel wheel = Wheel.DEFAULT;
    private boolean scheduledOutcomes = true;
    private long retentionMs = JobRecords.DEFAULT_RETENTION_MS;
    private String registryUrl;
    private LongSupplier clock = System::currentTimeMillis;

    private Builder(String bootstrap) {
      props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    }

    /** The topic prefix (default {@code dueflow}: {@code dueflow.timers}, ...). */
    public Builder prefix(String prefix) {
      this.prefix = prefix;
      return this;
    }

    /** The cluster's wheel geometry (default: dueflow's; {@code dueflow topics describe}). */
    public Builder wheel(Wheel wheel) {
      this.wheel = wheel;
      return this;
    }

    /** Write a {@code scheduled} outcome per job for the status view (default true, as the SDK). */
    public Builder scheduledOutcomes(boolean on) {
      this.scheduledOutcomes = on;
      return this;
    }

    /** The queues' idempotency retention (default 7 days): legacyCancel/legacyReschedule refuse jobs beyond it. */
    public Builder idempotencyRetention(Duration retention) {
      this.retentionMs = retention.toMillis();
      return this;
    }

    /**
     * Write job values in the Confluent wire format, with the id the registry at {@code url} gives
     * job.avsc under subject {@code <prefix>.timers-value}. Upgrade every worker first.
     */
    public Builder schemaRegistry(String url) {
      this.registryUrl = url;
      return this;
    }

    /** Any Kafka producer setting (security, client.id, ...); dueflow's own win. */
    public Builder property(String name, Object value) {
      props.put(name, value);
      return this;
    }

    /** The clock (UTC epoch ms; tests give their own). */
    public Builder clock(LongSupplier clock) {
      this.clock = clock;
      return this;
    }

    /** Connect, and check that the timer topic has the wheel's partitions. */
    public DueflowProducer build() {
      return new DueflowProducer(this);
    }
  }

  public static Builder builder(String bootstrap) {
    return new Builder(bootstrap);
  }

  private DueflowProducer(Builder b) {
    Properties p = new Properties();
    p.putAll(b.props);
    p.put(ProducerConfig.ACKS_CONFIG, "all");
    p.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
    p.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
    p.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
    Properties a = new Properties();
    for (String name : p.stringPropertyNames()) {
      if (AdminClientConfig.configNames().contains(name)) {
        a.put(name, p.get(name));
      }
    }
    this.admin = Admin.create(a);
    this.scheduledOutcomes = b.scheduledOutcomes;
    this.retentionMs = b.retentionMs;
    this.clock = b.clock;
    try {
      String timers = b.prefix + ".timers";
      int maxBytes = checkTimerTopic(timers, b.wheel);
      Integer schemaId = null;
      if (b.registryUrl != null) {
        schemaId = new SchemaRegistry(b.registryUrl).register(timers + "-value", Codec.schemaText("job.avsc"));
      }
      this.target = new JobRecords.Target(b.prefix, b.wheel, maxBytes, schemaId);
      this.producer = new KafkaProducer<>(p);
      this.verdicts = new VerdictWatch(admin, b.props, b.prefix);
    } catch (RuntimeException e) {
      admin.close();
      throw e;
    }
  }

  /** The schema id job values are framed with (null: plain Avro). */
  public Integer schemaId() {
    return target.schemaId();
  }

  /**
   * Schedule {@code req}: returns once the broker has the timer record. Throws {@link
   * InvalidInputException} (nothing written) for bad input or a queue that does not exist.
   */
  public ScheduledJob schedule(JobRequest req) {
    JobRecords.Planned planned =
        JobRecords.schedule(req, clock.getAsLong(), target, this::partitionsOf, JobIds::next);
    await(send(planned.timer()), "scheduling job " + planned.job().jobId());
    if (scheduledOutcomes) {
      send(planned.outcome()); // for the status view; nobody waits for it (as the SDK)
    }
    return planned.job();
  }

  // ------------------------------------------------------------------ commands

  /**
   * Cancel {@code job} by command (a finalized queue; any horizon): it never runs, and an attempt
   * running now finishes without another starting. Returns once the broker has the command; {@link
   * #awaitVerdict} waits for the worker's verdict ({@code cancelled}, or {@code refused}).
   */
  public SentCommand cancel(ScheduledJob job) {
    return cancel(job.ref(), CommandOptions.defaults());
  }

  /** Cancel the job {@code ref} names, by command, with {@code options}. */
  public SentCommand cancel(JobRef ref, CommandOptions options) {
    return steer(ref, "cancelling", at -> Commands.cancel(ref, at, partitionsOf(ref.queue()), target, options, JobIds::next));
  }

  /**
   * Move pending {@code job} to {@code runAt} by command (a finalized queue; any horizon): it runs
   * then, not before, once. Only later than its due time: to run a job earlier, cancel it and
   * schedule it again. The verdict: {@code rescheduled}, or {@code refused}.
   */
  public SentCommand reschedule(ScheduledJob job, Instant runAt) {
    return reschedule(job.ref(), runAt, CommandOptions.defaults());
  }

  /** Move pending {@code job} to {@code delay} from now, by command. */
  public SentCommand reschedule(ScheduledJob job, Duration delay) {
    return reschedule(job.ref(), instantAfter(delay), CommandOptions.defaults());
  }

  /** Move the job {@code ref} names to {@code runAt}, by command, with {@code options}. */
  public SentCommand reschedule(JobRef ref, Instant runAt, CommandOptions options) {
    long dueMs = epochMs(runAt);
    return steer(ref, "rescheduling", at -> Commands.move(ref, dueMs, at, partitionsOf(ref.queue()), target, options, JobIds::next));
  }

  /**
   * Replace the payload of pending {@code job} by command (a finalized queue; any horizon): it runs
   * once, with {@code payload}. The verdict: {@code updated}, or {@code refused}.
   */
  public SentCommand update(ScheduledJob job, Payload payload) {
    return update(job.ref(), payload, null, CommandOptions.defaults());
  }

  /**
   * Replace the payload of the job {@code ref} names and, when {@code runAt} is not null, move it
   * later too, by command, with {@code options}.
   */
  public SentCommand update(JobRef ref, Payload payload, Instant runAt, CommandOptions options) {
    Long dueMs = runAt == null ? null : epochMs(runAt);
    return steer(ref, "updating", at -> Commands.patch(ref, payload, dueMs, at, partitionsOf(ref.queue()), target, options, JobIds::next));
  }

  /**
   * The verdict of the worker that owns the job's partition on {@code sent}: read from the job id's
   * outcomes partition, from where it ended before the command was written, until the outcome with
   * the command's id. Empty when none came within {@code timeout} (the worker of that partition is
   * down or behind: the command stays and is applied when it gets there).
   */
  public Optional<Verdict> awaitVerdict(SentCommand sent, Duration timeout) {
    return verdicts.await(sent, timeout);
  }

  private SentCommand steer(JobRef ref, String what, java.util.function.LongFunction<Command> plan) {
    Command cmd = plan.apply(clock.getAsLong()); // checks everything before anything is read or written
    VerdictWatch.Mark mark = verdicts.mark(ref.jobId());
    await(send(cmd.record()), what + " job " + ref.jobId());
    return new SentCommand(
        cmd.id(), cmd.op(), ref.jobId(), ref.queue(), cmd.record().partition(), mark.partition(), mark.offset());
  }

  private Instant instantAfter(Duration delay) {
    if (delay.isNegative()) {
      throw new InvalidInputException("delay", delay, "a duration; it must not be negative");
    }
    return Instant.ofEpochMilli(clock.getAsLong() + delay.toMillis());
  }

  private static long epochMs(Instant runAt) {
    if (runAt == null) {
      throw new InvalidInputException("run_at", null, "a time at or before 9999-12-31T23:59:59.999Z");
    }
    try {
      return runAt.toEpochMilli();
    } catch (ArithmeticException e) {
      throw new InvalidInputException("run_at", runAt, "a time at or before 9999-12-31T23:59:59.999Z");
    }
  }

  // ------------------------------------------------------------------ legacy records

  /**
   * Cancel {@code job} with the legacy records, for a queue not finalized (its workers may be of a
   * release before commands): workers skip it (and its retries) if it has not run yet. Refused for
   * a job due beyond the queue's idempotency retention (7 days by default) less an hour.
   */
  public void legacyCancel(ScheduledJob job) {
    List<OutgoingRecord> records =
        JobRecords.legacyCancel(job, clock.getAsLong(), partitionsOf(job.queue()), target, retentionMs);
    writeAll(records, "cancelling job " + job.jobId());
  }

  /**
   * Move pending {@code job} to {@code runAt} with the legacy records, for a queue not finalized:
   * it runs then, never at its old time, never twice. Refused beyond the idempotency retention.
   */
  public ScheduledJob legacyReschedule(ScheduledJob job, Instant runAt) {
    return legacyRescheduleTo(job, runAt.toEpochMilli());
  }

  /** Move pending {@code job} to {@code delay} from now with the legacy records. */
  public ScheduledJob legacyReschedule(ScheduledJob job, Duration delay) {
    if (delay.isNegative()) {
      throw new InvalidInputException("delay", delay, "a duration; it must not be negative");
    }
    return legacyRescheduleTo(job, clock.getAsLong() + delay.toMillis());
  }

  private ScheduledJob legacyRescheduleTo(ScheduledJob job, long dueMs) {
    List<OutgoingRecord> records =
        JobRecords.legacyReschedule(job, dueMs, clock.getAsLong(), partitionsOf(job.queue()), target, retentionMs);
    writeAll(records, "rescheduling job " + job.jobId());
    return job.movedTo(dueMs, records.get(0).partition());
  }

  private void writeAll(List<OutgoingRecord> records, String what) {
    for (OutgoingRecord r : records) { // in order: each acknowledged before the next
      await(send(r), what);
    }
  }

  private Future<RecordMetadata> send(OutgoingRecord r) {
    ProducerRecord<byte[], byte[]> rec = new ProducerRecord<>(r.topic(), r.partition(), r.key(), r.value());
    for (Map.Entry<String, String> h : r.headers()) {
      rec.headers().add(new RecordHeader(h.getKey(), JobRecords.utf8Bytes(h.getValue())));
    }
    return producer.send(rec);
  }

  private static void await(Future<RecordMetadata> f, String what) {
    try {
      f.get(TIMEOUT_S, TimeUnit.SECONDS);
    } catch (ExecutionException e) {
      throw new DueflowException(what + ": " + e.getCause(), e.getCause(), true);
    } catch (TimeoutException e) {
      throw new DueflowException(what + ": no acknowledgement in " + TIMEOUT_S + " s", e, true);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new DueflowException(what + ": interrupted", e, true);
    }
  }

  /** The partition count of {@code queue}'s exec topic; InvalidInput when it has none. */
  private int partitionsOf(String queue) {
    JobRecords.checkQueue(queue);
    Integer known = queuePartitions.get(queue);
    if (known != null) {
      return known;
    }
    String topic = target.prefix() + ".exec." + queue;
    try {
      TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames().get(TIMEOUT_S, TimeUnit.SECONDS).get(topic);
      queuePartitions.put(queue, d.partitions().size());
      return d.partitions().size();
    } catch (ExecutionException e) {
      if (e.getCause() instanceof UnknownTopicOrPartitionException) {
        throw new InvalidInputException(
            "queue", queue,
            "a queue that exists (no topic " + topic + "); to create it: `dueflow queue create "
                + queue + " --partitions N` (docs/queues.md)");
      }
      throw new DueflowException("describing " + topic + ": " + e.getCause(), e.getCause(), true);
    } catch (TimeoutException | InterruptedException e) {
      throw new DueflowException("describing " + topic + ": " + e, e, true);
    }
  }

  private int checkTimerTopic(String topic, Wheel wheel) {
    try {
      TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames().get(TIMEOUT_S, TimeUnit.SECONDS).get(topic);
      int n = d.partitions().size();
      int shard = wheel.shardPartitions();
      if (n < wheel.totalPartitions() || n % shard != 0) {
        throw new DueflowException(
            topic + " has " + n + " partitions, but " + wheel + " needs " + wheel.totalPartitions()
                + " (a multiple of " + shard + "): give the cluster's geometry (dueflow topics describe)");
      }
      ConfigResource res = new ConfigResource(ConfigResource.Type.TOPIC, topic);
      Config config = admin.describeConfigs(List.of(res)).all().get(TIMEOUT_S, TimeUnit.SECONDS).get(res);
      var entry = config.get("max.message.bytes");
      return entry == null ? JobRecords.DEFAULT_MAX_RECORD_BYTES : Integer.parseInt(entry.value());
    } catch (ExecutionException e) {
      throw new DueflowException(
          "timer topic " + topic + " not usable (run `dueflow topics ensure`?): " + e.getCause(), e.getCause(), true);
    } catch (TimeoutException | InterruptedException e) {
      throw new DueflowException("describing " + topic + ": " + e, e, true);
    }
  }

  /** Write what is pending (scheduled outcomes) and disconnect. */
  @Override
  public void close() {
    producer.close(Duration.ofSeconds(TIMEOUT_S));
    verdicts.close();
    admin.close();
  }
}
