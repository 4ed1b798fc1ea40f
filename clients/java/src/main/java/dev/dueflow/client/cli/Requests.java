package dev.dueflow.client.cli;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import dev.dueflow.client.JobRequest;
import dev.dueflow.client.Payload;
import dev.dueflow.client.Wheel;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.Iterator;
import java.util.List;
import java.util.Map;

/**
 * Requests and wheels in the JSON shape of the conformance vectors and the example CLI: {@code
 * task, queue, payload {json_text | bytes_hex}, delay_ms | run_at_ms, job_id, idempotency_key,
 * max_attempts, timeout_ms, labels}.
 */
public final class Requests {
  private static final ObjectMapper JSON = new ObjectMapper();

  private Requests() {}

  public static JobRequest request(JsonNode doc) {
    JobRequest req = JobRequest.of(doc.path("task").isNull() ? null : doc.path("task").asText(null));
    Payload payload = payload(doc.path("payload"));
    if (payload != null) {
      req.payload(payload);
    }
    if (doc.has("queue")) {
      req.queue(doc.get("queue").asText());
    }
    if (doc.has("delay_ms")) {
      req.delay(Duration.ofMillis(doc.get("delay_ms").asLong()));
    }
    if (doc.has("run_at_ms")) {
      req.runAtMs(doc.get("run_at_ms").asLong());
    }
    if (doc.has("job_id")) {
      req.jobId(doc.get("job_id").asText());
    }
    if (doc.has("idempotency_key")) {
      req.idempotencyKey(doc.get("idempotency_key").asText());
    }
    if (doc.has("max_attempts")) {
      req.maxAttempts(doc.get("max_attempts").asLong());
    }
    if (doc.has("timeout_ms")) {
      req.timeout(Duration.ofMillis(doc.get("timeout_ms").asLong()));
    }
    if (doc.has("labels")) {
      Iterator<Map.Entry<String, JsonNode>> it = doc.get("labels").fields();
      while (it.hasNext()) {
        Map.Entry<String, JsonNode> e = it.next();
        req.label(e.getKey(), e.getValue().asText());
      }
    }
    return req;
  }

  /** A payload in the vectors' shape ({@code json_text | bytes_hex | bytes_fill | json}); null when none. */
  public static Payload payload(JsonNode pay) {
    if (pay.has("json_text")) {
      return Payload.jsonText(pay.get("json_text").asText());
    } else if (pay.has("bytes_hex")) {
      return Payload.bytes(HexFormat.of().parseHex(pay.get("bytes_hex").asText()));
    } else if (pay.has("bytes_fill")) {
      byte[] b = new byte[pay.get("bytes_fill").get("count").asInt()];
      java.util.Arrays.fill(b, (byte) pay.get("bytes_fill").get("byte").asInt());
      return Payload.bytes(b);
    } else if (pay.has("json")) {
      return Payload.json(JSON.convertValue(pay.get("json"), Object.class));
    }
    return null;
  }

  public static Wheel wheel(JsonNode doc) {
    List<Wheel.Level> levels = new ArrayList<>();
    for (JsonNode lv : doc.get("levels")) {
      levels.add(new Wheel.Level(lv.get(0).asInt(), lv.get(1).asLong()));
    }
    return new Wheel(
        doc.get("near_partitions").asInt(),
        doc.get("near_window_ms").asLong(),
        doc.get("lookahead_ms").asLong(),
        levels,
        doc.path("shards").asInt(1));
  }
}
