package dev.dueflow.client;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.io.UncheckedIOException;
import java.nio.ByteBuffer;
import java.util.Map;
import java.util.TreeMap;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericDatumWriter;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.avro.io.EncoderFactory;

/**
 * Avro binary of dueflow's records with the schemas of schemas/dueflow/schemas (copied into this
 * jar; a test checks the copies). Writers write the oldest version that holds what they write.
 */
final class Codec {
  static final Schema JOB = load("job.avsc"); // dueflow.Job/1
  static final Schema IDEMPOTENCY_V1 = load("v1/idempotency_record.avsc");
  static final Schema IDEMPOTENCY_V3 = load("idempotency_record.avsc");
  static final Schema OUTCOME_V1 = load("v1/outcome.avsc");
  static final Schema OUTCOME_V2 = load("outcome.avsc");
  static final Schema OUTCOME_V3 = load("v3/outcome.avsc"); // what a verdict is written with
  static final Schema COMMAND = load("command.avsc"); // dueflow.Command/1

  /** The fields of an outcome a verdict is read from. */
  record Outcome(String state, String error, Long dueMs, String version, String commandId) {}

  private Codec() {}

  /** The text of a bundled schema (what the registry option registers). */
  static String schemaText(String file) {
    try (InputStream in = Codec.class.getResourceAsStream("schemas/" + file)) {
      return new String(in.readAllBytes(), java.nio.charset.StandardCharsets.UTF_8);
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  private static Schema load(String file) {
    return new Schema.Parser().parse(schemaText(file));
  }

  static byte[] job(ScheduledJob job) {
    GenericRecord r = new GenericData.Record(JOB);
    r.put("job_id", job.jobId());
    r.put("queue", job.queue());
    r.put("task", job.task());
    r.put("payload", ByteBuffer.wrap(job.payload()));
    r.put("content_type", job.contentType());
    r.put("due_ms", job.dueMs());
    r.put("idempotency_key", job.idempotencyKey());
    r.put("max_attempts", job.maxAttempts());
    r.put("backoff", null);
    r.put("timeout_ms", job.timeoutMs());
    r.put("jitter_ms", 0L);
    r.put("created_ms", job.createdMs());
    r.put("trace", Map.of());
    r.put("schedule_id", null);
    r.put("schedule_version", null);
    r.put("content_hash", job.contentHash());
    r.put("labels", job.labels());
    return write(JOB, r);
  }

  static byte[] keyState(
      Schema schema, ScheduledJob job, String state, long atMs, Long runOnlyDueMs) {
    GenericRecord r = new GenericData.Record(schema);
    r.put("idempotency_key", job.idempotencyKey());
    r.put("job_id", job.jobId());
    r.put("state", new GenericData.EnumSymbol(schema.getField("state").schema(), state));
    r.put("at_ms", atMs);
    r.put("attempts", 0);
    r.put("content_hash", job.contentHash());
    if (schema.getField("run_only_due_ms") != null) {
      r.put("run_only_due_ms", runOnlyDueMs);
    }
    return write(schema, r);
  }

  static byte[] outcome(Schema schema, ScheduledJob job, String state, long atMs, long dueMs) {
    GenericRecord r = new GenericData.Record(schema);
    r.put("job_id", job.jobId());
    r.put("queue", job.queue());
    r.put("task", job.task());
    r.put("idempotency_key", job.idempotencyKey());
    r.put("state", new GenericData.EnumSymbol(schema.getField("state").schema(), state));
    r.put("attempt", 0);
    r.put("at_ms", atMs);
    r.put("due_ms", dueMs);
    for (String f : new String[] {"duration_ms", "error_type", "error", "worker", "trace_id", "schedule_id"}) {
      r.put(f, null);
    }
    return write(schema, r);
  }

  /** A {@code dueflow.Command} (version 1) of op cancel, move or patch. */
  static byte[] command(
      String commandId, String op, JobRef ref, long atMs, CommandOptions o, Long knownDueMs,
      Long dueMs, byte[] payload, String contentType) {
    GenericRecord r = new GenericData.Record(COMMAND);
    r.put("command_id", commandId);
    r.put("op", new GenericData.EnumSymbol(COMMAND.getField("op").schema(), op));
    r.put("job_id", ref.jobId());
    r.put("idempotency_key", ref.idempotencyKey());
    r.put("queue", ref.queue());
    r.put("at_ms", atMs);
    r.put("by", o.by);
    r.put("expect_version", o.expectVersion);
    r.put("known_due_ms", knownDueMs);
    r.put("due_ms", dueMs);
    r.put("payload", payload == null ? null : ByteBuffer.wrap(payload));
    r.put("content_type", contentType);
    for (String f : new String[] {"job", "job_schema", "unique", "group", "member"}) {
      r.put(f, null);
    }
    return write(COMMAND, r);
  }

  /** The fields of an {@code Outcome} version 3 value that a verdict needs. */
  static Outcome readOutcomeV3(byte[] value) {
    try {
      GenericRecord r =
          new GenericDatumReader<GenericRecord>(OUTCOME_V3)
              .read(null, DecoderFactory.get().binaryDecoder(value, null));
      return new Outcome(
          String.valueOf(r.get("state")), text(r.get("error")), (Long) r.get("due_ms"),
          text(r.get("version")), text(r.get("command_id")));
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
  }

  private static String text(Object o) {
    return o == null ? null : o.toString();
  }

  /** Labels sorted by key in code point order (UTF-8 byte order), as every dueflow writer does. */
  static Map<String, String> sortedLabels(Map<String, String> labels) {
    Map<String, String> out = new TreeMap<>(Codec::compareCodePoints);
    out.putAll(labels);
    return out;
  }

  static int compareCodePoints(String a, String b) {
    int i = 0;
    int j = 0;
    while (i < a.length() && j < b.length()) {
      int ca = a.codePointAt(i);
      int cb = b.codePointAt(j);
      if (ca != cb) {
        return Integer.compare(ca, cb);
      }
      i += Character.charCount(ca);
      j += Character.charCount(cb);
    }
    return Integer.compare(a.length() - i, b.length() - j);
  }

  private static byte[] write(Schema schema, GenericRecord record) {
    ByteArrayOutputStream out = new ByteArrayOutputStream(256);
    BinaryEncoder enc = EncoderFactory.get().directBinaryEncoder(out, null);
    try {
      new GenericDatumWriter<GenericRecord>(schema).write(record, enc);
      enc.flush();
    } catch (IOException e) {
      throw new UncheckedIOException(e);
    }
    return out.toByteArray();
  }
}
