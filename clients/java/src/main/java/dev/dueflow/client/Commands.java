package dev.dueflow.client;

import java.nio.ByteBuffer;
import java.time.Instant;
import java.util.List;
import java.util.Map;
import java.util.function.LongFunction;

/**
 * The command records that cancel, move and update a pending job at any horizon (pure: no clock,
 * no I/O): one {@code dueflow.Command} (version 1) on the job's exec partition (murmur2 of its
 * idempotency key), key = the idempotency key + {@code \0cmd}, headers {@code df-kind: steer},
 * {@code df-due: 0}, {@code df-job}, {@code df-queue}, {@code df-schema: dueflow.Command/1}
 * (docs/wire-format.md, "Steering a job"). Only for queues that were finalized ({@code dueflow
 * queue finalize}). {@code ../conformance/vectors.json} holds what the Python SDK writes; the tests
 * check that this class writes the same bytes.
 *
 * <p>There is no {@code replace} here: it carries the job's whole value, which only a client that
 * reads the job's timer first has (the Python SDK does, to move a job earlier).
 */
public final class Commands {
  /** The longest command id the workers accept. */
  public static final int MAX_COMMAND_ID_CHARS = 64;
  /** Room kept in a timer record for the rest of the job when the worker writes a new payload in. */
  public static final int TIMER_HEADROOM = 16 * 1024;
  private static final byte[] MARK = {0, 'c', 'm', 'd'};

  private Commands() {}

  /** The command that cancels {@code ref}: it never runs (an attempt running now finishes). */
  public static Command cancel(
      JobRef ref, long atMs, int partitions, JobRecords.Target target, CommandOptions o,
      LongFunction<String> newId) {
    return record("cancel", ref, atMs, partitions, target, o, newId, null, null, null);
  }

  /**
   * The command that moves {@code ref} to {@code dueMs}, not before its current due time (a job is
   * moved earlier by cancelling it and scheduling it again): it runs then, not before, once.
   */
  public static Command move(
      JobRef ref, long dueMs, long atMs, int partitions, JobRecords.Target target, CommandOptions o,
      LongFunction<String> newId) {
    return record("move", ref, atMs, partitions, target, o, newId, dueMs, null, null);
  }

  /**
   * The command that replaces the payload of {@code ref} (and, with {@code dueMs} not null, moves
   * it later too): it runs once, with the new payload.
   */
  public static Command patch(
      JobRef ref, Payload payload, Long dueMs, long atMs, int partitions, JobRecords.Target target,
      CommandOptions o, LongFunction<String> newId) {
    if (payload == null) {
      throw new InvalidInputException("payload", null, "the new payload (Payload.json, jsonText or bytes)");
    }
    return record("patch", ref, atMs, partitions, target, o, newId, dueMs, payload.bytes(), payload.contentType());
  }

  private static Command record(
      String op, JobRef ref, long atMs, int partitions, JobRecords.Target target, CommandOptions o,
      LongFunction<String> newId, Long dueMs, byte[] payload, String contentType) {
    if (ref == null) {
      throw new InvalidInputException("job", null, "the job to steer (ScheduledJob.ref() or JobRef.of)");
    }
    CommandOptions opts = o == null ? CommandOptions.defaults() : o;
    JobRecords.checkQueue(ref.queue());
    checkName("job_id", ref.jobId());
    checkName("idempotency_key", ref.idempotencyKey());
    String commandId = opts.commandId == null ? newId.apply(atMs) : opts.commandId;
    checkName("command_id", commandId);
    if (commandId.codePointCount(0, commandId.length()) > MAX_COMMAND_ID_CHARS) {
      throw new InvalidInputException(
          "command_id", commandId, "a non-empty string of at most " + MAX_COMMAND_ID_CHARS + " chars");
    }
    Long known = opts.knownDueMs != null ? opts.knownDueMs : ref.knownDueMs();
    if (known != null) {
      checkTime("known_due_ms", known);
    }
    if (dueMs != null) {
      checkTime("run_at", dueMs);
      if (known != null && dueMs < known) {
        throw new InvalidInputException(
            "run_at", Instant.ofEpochMilli(dueMs),
            "a time at or after the job's due time " + Instant.ofEpochMilli(known)
                + ": a command moves a job only later (to run it earlier, cancel it and schedule it again)");
      }
    }
    if (payload != null && payload.length > target.maxRecordBytes() - TIMER_HEADROOM) {
      throw new InvalidInputException(
          "payload", payload.length + " bytes",
          "at most " + (target.maxRecordBytes() - TIMER_HEADROOM) + " bytes (the timer topic's record "
              + "limit, less room for the job's other fields)");
    }
    byte[] key = JobRecords.utf8Bytes(ref.idempotencyKey());
    byte[] recordKey = ByteBuffer.allocate(key.length + MARK.length).put(key).put(MARK).array();
    byte[] value = Codec.command(commandId, op, ref, atMs, opts, known, dueMs, payload, contentType);
    return new Command(
        commandId, op,
        new OutgoingRecord(
            target.prefix() + ".exec." + ref.queue(), Murmur2.partition(key, partitions), recordKey, value,
            List.of(
                Map.entry("df-kind", "steer"),
                Map.entry("df-due", "0"),
                Map.entry("df-job", ref.jobId()),
                Map.entry("df-queue", ref.queue()),
                Map.entry("df-schema", "dueflow.Command/1"))));
  }

  private static void checkTime(String field, long ms) {
    if (ms < 0 || ms > JobRecords.MAX_DUE_MS) {
      throw new InvalidInputException(
          field, ms, "UTC epoch milliseconds from 0 to " + JobRecords.MAX_DUE_MS + " (year 9999)");
    }
  }

  private static void checkName(String field, String value) {
    if (value == null) {
      throw new InvalidInputException(field, null, "a non-empty string of at most 255 chars");
    }
    JobRecords.checkName(field, value);
    for (int i = 0; i < value.length(); ) {
      int cp = value.codePointAt(i);
      if (controlChar(cp)) {
        throw new InvalidInputException(
            field, value, "a string without control characters (C0, DEL, C1, U+2028/U+2029, bidi controls)");
      }
      i += Character.charCount(cp);
    }
  }

  /** dueflow/control_chars.py: what no id or key may hold. */
  static boolean controlChar(int cp) {
    return cp <= 0x1f || (cp >= 0x7f && cp <= 0x9f) || cp == 0x2028 || cp == 0x2029 || cp == 0x061c
        || cp == 0x200e || cp == 0x200f || (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069);
  }
}
