package dev.dueflow.client.cli;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import dev.dueflow.client.CommandOptions;
import dev.dueflow.client.DueflowProducer;
import dev.dueflow.client.InvalidInputException;
import dev.dueflow.client.JobRef;
import dev.dueflow.client.ScheduledJob;
import dev.dueflow.client.SentCommand;
import dev.dueflow.client.Verdict;
import java.time.Duration;
import java.time.Instant;
import java.util.Optional;
import java.util.ArrayList;
import java.util.List;

/**
 * The example program: reads one JSON document on stdin ({@code bootstrap, prefix, wheel,
 * registry_url, ops}) and runs its ops in order, printing one JSON line per op. Ops: {@code
 * {"op": "schedule", "request": {...}}}; the commands {@code {"op": "cancel", "job": N}}, {@code
 * {"op": "reschedule", "job": N, "run_at_ms": T}}, {@code {"op": "update", "job": N, "payload":
 * {...}, "run_at_ms": T?}} (each with optional {@code wait_ms}, {@code command_id}, {@code by},
 * {@code expect_version}, {@code known_due_ms}, and {@code "ref": {job_id, queue,
 * idempotency_key}} instead of {@code job}); the legacy records {@code legacy_cancel}, {@code
 * legacy_reschedule} (N: the number of the schedule op, counting schedule ops only, from 0).
 */
public final class DueflowCli {
  private DueflowCli() {}

  public static void main(String[] args) throws Exception {
    ObjectMapper json = new ObjectMapper();
    JsonNode doc = json.readTree(System.in);
    DueflowProducer.Builder b =
        DueflowProducer.builder(doc.get("bootstrap").asText()).prefix(doc.path("prefix").asText("dueflow"));
    if (doc.has("wheel")) {
      b.wheel(Requests.wheel(doc.get("wheel")));
    }
    if (doc.hasNonNull("registry_url")) {
      b.schemaRegistry(doc.get("registry_url").asText());
    }
    List<ScheduledJob> jobs = new ArrayList<>();
    try (DueflowProducer dueflow = b.build()) {
      for (JsonNode op : doc.get("ops")) {
        ObjectNode out = json.createObjectNode();
        try {
          switch (op.get("op").asText()) {
            case "schedule" -> {
              ScheduledJob job = dueflow.schedule(Requests.request(op.get("request")));
              jobs.add(job);
              describe(out, job);
            }
            case "cancel" -> {
              JobRef ref = refOf(op, jobs);
              steered(out, dueflow, op, dueflow.cancel(ref, options(op)));
            }
            case "reschedule" -> {
              JobRef ref = refOf(op, jobs);
              Instant at = Instant.ofEpochMilli(op.get("run_at_ms").asLong());
              steered(out, dueflow, op, dueflow.reschedule(ref, at, options(op)));
              if (op.has("job")) {
                int i = op.get("job").asInt();
                jobs.set(i, jobs.get(i).movedTo(at.toEpochMilli(), -1));
              }
            }
            case "update" -> {
              JobRef ref = refOf(op, jobs);
              Instant at = op.has("run_at_ms") ? Instant.ofEpochMilli(op.get("run_at_ms").asLong()) : null;
              steered(out, dueflow, op, dueflow.update(ref, Requests.payload(op.get("payload")), at, options(op)));
            }
            case "legacy_cancel" -> {
              ScheduledJob job = jobs.get(op.get("job").asInt());
              dueflow.legacyCancel(job);
              describe(out, job);
            }
            case "legacy_reschedule" -> {
              int i = op.get("job").asInt();
              ScheduledJob job = dueflow.legacyReschedule(jobs.get(i), Instant.ofEpochMilli(op.get("run_at_ms").asLong()));
              jobs.set(i, job);
              describe(out, job);
            }
            default -> throw new IllegalArgumentException("unknown op " + op);
          }
        } catch (InvalidInputException e) {
          out.putObject("error").put("field", e.field()).put("message", e.getMessage());
          if (op.get("op").asText().equals("schedule")) {
            jobs.add(null); // keeps the indexes of later ops
          }
        }
        System.out.println(json.writeValueAsString(out));
        System.out.flush();
      }
    }
  }

  /** The job an op steers: {@code "job": N} (a schedule op's), or {@code "ref": {job_id, queue, idempotency_key}}. */
  private static JobRef refOf(JsonNode op, List<ScheduledJob> jobs) {
    if (op.has("job")) {
      return jobs.get(op.get("job").asInt()).ref();
    }
    JsonNode r = op.get("ref");
    JobRef ref = JobRef.of(r.get("queue").asText(), r.get("job_id").asText());
    return r.has("idempotency_key") ? ref.withIdempotencyKey(r.get("idempotency_key").asText()) : ref;
  }

  private static CommandOptions options(JsonNode op) {
    CommandOptions o = CommandOptions.defaults();
    if (op.has("command_id")) {
      o.commandId(op.get("command_id").asText());
    }
    if (op.has("by")) {
      o.by(op.get("by").asText());
    }
    if (op.has("expect_version")) {
      o.expectVersion(op.get("expect_version").asText());
    }
    if (op.has("known_due_ms")) {
      o.knownDueMs(op.get("known_due_ms").asLong());
    }
    return o;
  }

  /** A command's line: its id and partition, and with {@code wait_ms} the verdict (null: none in time). */
  private static void steered(ObjectNode out, DueflowProducer dueflow, JsonNode op, SentCommand sent) {
    out.put("job_id", sent.jobId()).put("command_id", sent.commandId()).put("partition", sent.partition());
    if (op.has("wait_ms")) {
      Optional<Verdict> v = dueflow.awaitVerdict(sent, Duration.ofMillis(op.get("wait_ms").asLong()));
      if (v.isEmpty()) {
        out.putNull("verdict");
      } else {
        ObjectNode o = out.putObject("verdict");
        o.put("state", v.get().state()).put("code", v.get().code()).put("reason", v.get().reason())
            .put("version", v.get().version());
        if (v.get().dueMs() == null) {
          o.putNull("due_ms");
        } else {
          o.put("due_ms", v.get().dueMs());
        }
      }
    }
  }

  private static void describe(ObjectNode out, ScheduledJob job) {
    out.put("job_id", job.jobId()).put("due_ms", job.dueMs()).put("partition", job.partition())
        .put("idempotency_key", job.idempotencyKey()).put("created_ms", job.createdMs());
  }
}
