package dev.dueflow.client;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.function.Consumer;
import java.util.function.LongFunction;
import java.util.regex.Pattern;

/**
 * The records that schedule a job, and the legacy records that cancel and reschedule one on a queue
 * not finalized (pure: no clock, no I/O; {@link Commands} builds the commands that steer a job on a
 * finalized queue, at any horizon). The rules are
 * the Python SDK's; {@code ../conformance/vectors.json} holds what it writes, and the tests check
 * that this class writes the same bytes.
 */
public final class JobRecords {
  /** The latest due time: 9999-12-31T23:59:59.999Z. */
  public static final long MAX_DUE_MS = 253_402_300_799_999L;
  /** The broker's default max.message.bytes (used until the timer topic is described). */
  public static final int DEFAULT_MAX_RECORD_BYTES = 1_048_588;
  public static final int MAX_NAME_CHARS = 255;
  public static final long DEFAULT_RETENTION_MS = 7L * 86_400_000L;
  static final long HOUR_MS = 3_600_000L;
  static final String TASK_ACCEPTED =
      "1-200 characters of A-Z a-z 0-9 _ . : / - (the names a worker can register with @task)";
  private static final Pattern TASK = Pattern.compile("[A-Za-z0-9_.:/-]{1,200}");
  private static final Pattern QUEUE = Pattern.compile("[A-Za-z0-9_-]{1,100}");
  private static final byte[] RESCHEDULE_MARK = "\0reschedule".getBytes(StandardCharsets.UTF_8);
  private static final String INSTANT_LIMIT = "9999-12-31T23:59:59.999Z";

  /** Where and how records are written: the topic prefix, the wheel, the record limit, framing. */
  public record Target(String prefix, Wheel wheel, int maxRecordBytes, Integer schemaId) {
    public Target {
      if (schemaId != null && schemaId < 0) {
        throw new IllegalArgumentException("schemaId: got " + schemaId + "; accepted: >= 0");
      }
    }

    public Target(String prefix, Wheel wheel) {
      this(prefix, wheel, DEFAULT_MAX_RECORD_BYTES, null);
    }

    String timers() {
      return prefix + ".timers";
    }

    String outcomes() {
      return prefix + ".outcomes";
    }

    String idempotency(String queue) {
      return prefix + ".idempotency." + queue;
    }
  }

  /** A checked job, its timer record and its {@code scheduled} outcome. */
  public record Planned(ScheduledJob job, OutgoingRecord timer, OutgoingRecord outcome) {}

  private JobRecords() {}

  /**
   * Check {@code req} and build its records, written at {@code nowMs}. {@code queueCheck} throws
   * {@link InvalidInputException} for a queue that does not exist; {@code newJobId} draws an id
   * for a request without one. Throws {@link InvalidInputException} naming the first bad field
   * (in the SDK's order: task, queue, payload, job_id, idempotency_key, run_at/delay,
   * max_attempts, timeout, labels; then the record's size as payload).
   */
  public static Planned schedule(
      JobRequest req,
      long nowMs,
      Target target,
      Consumer<String> queueCheck,
      LongFunction<String> newJobId) {
    if (req.task == null || !TASK.matcher(req.task).matches()) {
      throw new InvalidInputException("task", req.task, TASK_ACCEPTED);
    }
    checkQueue(req.queue);
    queueCheck.accept(req.queue);
    Payload payload = req.payload == null ? Payload.jsonText("null") : req.payload;
    String jobId = req.jobId == null ? newJobId.apply(nowMs) : checkName("job_id", req.jobId);
    String key = req.idempotencyKey == null ? jobId : checkName("idempotency_key", req.idempotencyKey);
    long dueMs = dueOf(req, nowMs);
    int attempts = 4;
    if (req.maxAttempts != null) {
      if (req.maxAttempts < 1 || req.maxAttempts > Integer.MAX_VALUE) {
        throw new InvalidInputException("max_attempts", req.maxAttempts, "an integer from 1 to 2147483647");
      }
      attempts = req.maxAttempts.intValue();
    }
    Long timeoutMs = null;
    if (req.timeout != null) {
      timeoutMs = millis(req.timeout, "timeout");
      if (timeoutMs < 1) {
        throw new InvalidInputException(
            "timeout", req.timeout, "a duration of at least 1 ms and at most 9223372036854775807 ms, or null");
      }
    }
    Map<String, String> labels = Map.of();
    if (req.labels != null) {
      for (Map.Entry<String, String> e : req.labels.entrySet()) {
        if (e.getKey() == null || e.getValue() == null || !utf8(e.getKey()) || !utf8(e.getValue())) {
          throw new InvalidInputException("labels", req.labels, "a map of strings to strings (valid UTF-8)");
        }
      }
      labels = Codec.sortedLabels(req.labels);
    }
    byte[] body = payload.bytes();
    ScheduledJob job =
        new ScheduledJob(
            jobId, req.queue, req.task, body, payload.contentType(), dueMs, key, attempts,
            timeoutMs, nowMs, contentHash(req.task, body, payload.contentType()), labels, -1);
    OutgoingRecord timer = timer(job, nowMs, target);
    if (timer.estimatedSize() > target.maxRecordBytes()) {
      throw new InvalidInputException(
          "payload",
          body.length + " bytes (a timer record of " + timer.estimatedSize() + " bytes)",
          "a timer record of at most " + target.maxRecordBytes() + " bytes (max.message.bytes of "
              + target.timers() + ")");
    }
    job = job.movedTo(dueMs, timer.partition());
    OutgoingRecord outcome =
        new OutgoingRecord(
            target.outcomes(), null, utf8Bytes(jobId),
            Codec.outcome(Codec.OUTCOME_V1, job, "scheduled", nowMs, dueMs),
            headers("df-schema", "dueflow.Outcome/1"));
    return new Planned(job, timer, outcome);
  }

  /** The timer record of {@code job}, placed at {@code nowMs}. */
  static OutgoingRecord timer(ScheduledJob job, long nowMs, Target target) {
    byte[] key = utf8Bytes(job.idempotencyKey());
    byte[] value = Codec.job(job);
    String schema = "dueflow.Job/1";
    if (target.schemaId() != null) {
      value = frame(target.schemaId(), value);
      schema += "+confluent";
    }
    return new OutgoingRecord(
        target.timers(),
        target.wheel().partition(job.dueMs(), nowMs, key),
        key,
        value,
        headers(
            "df-due", Long.toString(job.dueMs()),
            "df-queue", job.queue(),
            "df-kind", "job",
            "df-job", job.jobId(),
            "df-task", job.task(),
            "df-schema", schema));
  }

  /** The Confluent wire format: magic byte 0, the 4-byte schema id, the Avro bytes. */
  static byte[] frame(int schemaId, byte[] avro) {
    return ByteBuffer.allocate(5 + avro.length).put((byte) 0).putInt(schemaId).put(avro).array();
  }

  /**
   * The legacy records that cancel {@code job} on a queue not finalized (use {@link Commands#cancel}
   * on a finalized one), written at {@code atMs}: an IdempotencyRecord (version 1,
   * state cancelled) on the key's murmur2 partition among the queue's {@code partitions}, then the
   * {@code cancelled} outcome. Refused (job_id) when the job is due beyond the queue's
   * idempotency retention (less an hour): workers would forget the cancellation first.
   */
  public static List<OutgoingRecord> legacyCancel(
      ScheduledJob job, long atMs, int partitions, Target target, long retentionMs) {
    checkRetention(job, atMs, retentionMs);
    byte[] key = utf8Bytes(job.idempotencyKey());
    List<OutgoingRecord> out = new ArrayList<>();
    out.add(
        new OutgoingRecord(
            target.idempotency(job.queue()), Murmur2.partition(key, partitions), key,
            Codec.keyState(Codec.IDEMPOTENCY_V1, job, "cancelled", atMs, null),
            headers("df-job", job.jobId(), "df-queue", job.queue(), "df-schema", "dueflow.IdempotencyRecord/1")));
    out.add(
        new OutgoingRecord(
            target.outcomes(), null, utf8Bytes(job.jobId()),
            Codec.outcome(Codec.OUTCOME_V1, job, "cancelled", atMs, job.dueMs()),
            headers("df-job", job.jobId(), "df-queue", job.queue(), "df-schema", "dueflow.Outcome/1")));
    return out;
  }

  /**
   * The legacy records (a queue not finalized: else {@link Commands#move}) that move pending {@code
   * job} to {@code dueMs}, written at {@code atMs}, in the
   * order to write them: the job's timer again (same key and value but the due time), the
   * reschedule record (IdempotencyRecord version 3, key + {@code \0reschedule}, on the key's own
   * murmur2 partition, run_only_due_ms = the new due time), and the {@code rescheduled} outcome.
   */
  public static List<OutgoingRecord> legacyReschedule(
      ScheduledJob job, long dueMs, long atMs, int partitions, Target target, long retentionMs) {
    if (dueMs > MAX_DUE_MS) {
      throw new InvalidInputException("run_at", dueMs, "a time at or before " + INSTANT_LIMIT);
    }
    if (dueMs == job.dueMs()) {
      throw new InvalidInputException("run_at", dueMs, "a due time other than the job's own");
    }
    checkRetention(job, atMs, retentionMs);
    ScheduledJob moved = job.movedTo(dueMs, -1);
    byte[] key = utf8Bytes(job.idempotencyKey());
    byte[] markKey = ByteBuffer.allocate(key.length + RESCHEDULE_MARK.length).put(key).put(RESCHEDULE_MARK).array();
    List<OutgoingRecord> out = new ArrayList<>();
    out.add(timer(moved, atMs, target));
    out.add(
        new OutgoingRecord(
            target.idempotency(job.queue()), Murmur2.partition(key, partitions), markKey,
            Codec.keyState(Codec.IDEMPOTENCY_V3, job, "cancelled", atMs, dueMs),
            headers("df-job", job.jobId(), "df-queue", job.queue(), "df-schema", "dueflow.IdempotencyRecord/3")));
    out.add(
        new OutgoingRecord(
            target.outcomes(), null, utf8Bytes(job.jobId()),
            Codec.outcome(Codec.OUTCOME_V2, job, "rescheduled", atMs, dueMs),
            headers("df-job", job.jobId(), "df-queue", job.queue(), "df-schema", "dueflow.Outcome/2")));
    return out;
  }

  /** BLAKE2b-128 hex of {@code utf8(task) 0 utf8(contentType) 0 payload}: the SDK's content hash. */
  public static String contentHash(String task, byte[] payload, String contentType) {
    byte[] t = utf8Bytes(task);
    byte[] c = utf8Bytes(contentType);
    ByteBuffer buf = ByteBuffer.allocate(t.length + c.length + 2 + payload.length);
    buf.put(t).put((byte) 0).put(c).put((byte) 0).put(payload);
    return JobIds.hex(Blake2b.digest(buf.array(), 16));
  }

  static void checkQueue(String queue) {
    if (queue == null || !QUEUE.matcher(queue).matches()) {
      throw new InvalidInputException(
          "queue", queue, "a queue name: 1-100 of [A-Za-z0-9_-] (create one with `dueflow queue create NAME`)");
    }
  }

  private static void checkRetention(ScheduledJob job, long nowMs, long retentionMs) {
    if (job.dueMs() > nowMs + retentionMs - HOUR_MS) {
      throw new InvalidInputException(
          "job_id", job.jobId(),
          "a job due within its queue's idempotency retention (" + retentionMs / 86_400_000.0
              + " days, less an hour) from now; this one is due at "
              + java.time.Instant.ofEpochMilli(job.dueMs())
              + ", and workers would forget the record before then");
    }
  }

  private static long dueOf(JobRequest req, long nowMs) {
    Long runAt = req.runAtMs;
    if (req.runAt != null) {
      try {
        runAt = req.runAt.toEpochMilli();
      } catch (ArithmeticException e) {
        throw new InvalidInputException("run_at", req.runAt, "a time at or before " + INSTANT_LIMIT);
      }
    }
    if (runAt != null) {
      if (req.delay != null) {
        throw new InvalidInputException("delay", req.delay, "either run_at or delay, not both");
      }
      if (runAt > MAX_DUE_MS) {
        throw new InvalidInputException("run_at", req.runAt != null ? req.runAt : runAt, "a time at or before " + INSTANT_LIMIT);
      }
      return runAt;
    }
    if (req.delay == null) {
      return nowMs;
    }
    long delayMs = millis(req.delay, "delay");
    if (delayMs > MAX_DUE_MS - nowMs) {
      throw new InvalidInputException(
          "delay", req.delay,
          "a duration putting the due time at or before " + INSTANT_LIMIT + " (at most "
              + (MAX_DUE_MS - nowMs) + " ms from now)");
    }
    return nowMs + delayMs;
  }

  private static long millis(Duration d, String field) {
    if (d.isNegative()) {
      throw new InvalidInputException(field, d, "a duration (e.g. Duration.ofMinutes(10)); it must not be negative");
    }
    try {
      return d.toMillis();
    } catch (ArithmeticException e) {
      throw new InvalidInputException(field, d, "a duration of at most 9223372036854775807 ms");
    }
  }

  static String checkName(String field, String value) {
    int chars = value.codePointCount(0, value.length());
    if (chars < 1 || chars > MAX_NAME_CHARS || !utf8(value)) {
      throw new InvalidInputException(
          field, value, "a non-empty string of at most " + MAX_NAME_CHARS + " chars (valid UTF-8)");
    }
    return value;
  }

  /** No lone surrogates: the string has a UTF-8 encoding. */
  static boolean utf8(String s) {
    for (int i = 0; i < s.length(); ) {
      int cp = s.codePointAt(i);
      if (Character.isSurrogate((char) cp) && Character.charCount(cp) == 1) {
        return false;
      }
      i += Character.charCount(cp);
    }
    return true;
  }

  static byte[] utf8Bytes(String s) {
    return s.getBytes(StandardCharsets.UTF_8);
  }

  private static List<Map.Entry<String, String>> headers(String... pairs) {
    List<Map.Entry<String, String>> out = new ArrayList<>(pairs.length / 2);
    for (int i = 0; i < pairs.length; i += 2) {
      out.add(Map.entry(pairs[i], pairs[i + 1]));
    }
    return out;
  }
}
