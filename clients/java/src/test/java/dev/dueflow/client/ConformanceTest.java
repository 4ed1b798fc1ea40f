package dev.dueflow.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import dev.dueflow.client.cli.Requests;
import java.io.File;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.function.Consumer;
import java.util.stream.Stream;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;

/** The shared conformance table (clients/conformance/vectors.json), made by the Python SDK. */
class ConformanceTest {
  static final JsonNode V = load();
  static final HexFormat HEX = HexFormat.of();

  static JsonNode load() {
    try {
      return new ObjectMapper().readTree(new File(System.getProperty("dueflow.vectors", "../conformance/vectors.json")));
    } catch (IOException e) {
      throw new IllegalStateException(e);
    }
  }

  static Wheel wheel(String name) {
    return Requests.wheel(V.get("wheels").get(name));
  }

  static JobRecords.Target target(String wheel, Integer schemaId) {
    return new JobRecords.Target(V.get("prefix").asText(), wheel(wheel), V.get("max_record_bytes").asInt(), schemaId);
  }

  static final Consumer<String> QUEUES =
      q -> {
        Set<String> known = new java.util.HashSet<>();
        V.get("queues").forEach(n -> known.add(n.asText()));
        if (!known.contains(q)) {
          throw new InvalidInputException("queue", q, "one of " + known);
        }
      };

  @Test
  void placement() {
    for (JsonNode c : V.get("placement")) {
      int got = wheel(c.get("wheel").asText()).partition(c.get("due_ms").asLong(), c.get("now_ms").asLong(), HEX.parseHex(c.get("key_hex").asText()));
      assertEquals(c.get("partition").asInt(), got, c.toString());
    }
  }

  @Test
  void murmur2() {
    for (JsonNode c : V.get("murmur2")) {
      assertEquals(c.get("partition").asInt(), Murmur2.partition(HEX.parseHex(c.get("key_hex").asText()), c.get("partitions").asInt()), c.toString());
    }
  }

  @Test
  void uuid7() {
    for (JsonNode c : V.get("uuid7")) {
      assertEquals(c.get("job_id").asText(), JobIds.uuid7(c.get("now_ms").asLong(), HEX.parseHex(c.get("random_hex").asText())));
    }
  }

  static JobRecords.Planned plan(JsonNode c, JsonNode request) {
    Integer schemaId = c.has("schema_id") ? c.get("schema_id").asInt() : null;
    String random = c.path("random_hex").asText("00000000000000000000");
    return JobRecords.schedule(
        Requests.request(request), c.get("now_ms").asLong(), target(c.get("wheel").asText(), schemaId), QUEUES,
        now -> JobIds.uuid7(now, HEX.parseHex(random)));
  }

  static void assertRecord(JsonNode want, OutgoingRecord got, String name) {
    assertEquals(want.get("topic").asText(), got.topic(), name);
    assertEquals(want.get("partition").isNull() ? null : want.get("partition").asInt(), got.partition(), name + " partition");
    assertEquals(want.get("key_hex").asText(), HEX.formatHex(got.key()), name + " key");
    assertEquals(want.get("value_hex").asText(), HEX.formatHex(got.value()), name + " value");
    List<List<String>> headers = new ArrayList<>();
    for (Map.Entry<String, String> h : got.headers()) {
      headers.add(List.of(h.getKey(), h.getValue()));
    }
    List<List<String>> expected = new ArrayList<>();
    want.get("headers").forEach(h -> expected.add(List.of(h.get(0).asText(), h.get(1).asText())));
    assertEquals(expected, headers, name + " headers");
  }

  @TestFactory
  Stream<DynamicTest> schedule() {
    List<DynamicTest> out = new ArrayList<>();
    for (JsonNode c : V.get("schedule")) {
      String name = c.get("name").asText();
      out.add(DynamicTest.dynamicTest(name, () -> {
        JobRecords.Planned p = plan(c, c.get("request"));
        JsonNode exp = c.get("expected");
        assertEquals(exp.get("job_id").asText(), p.job().jobId());
        assertEquals(exp.get("due_ms").asLong(), p.job().dueMs());
        assertEquals(exp.get("content_hash").asText(), p.job().contentHash());
        assertRecord(exp.get("records").get(0), p.timer(), name + " timer");
        assertRecord(exp.get("records").get(1), p.outcome(), name + " outcome");
      }));
      if (c.get("request").path("payload").has("json")) { // the same bytes from a Java value
        out.add(DynamicTest.dynamicTest(name + " (Payload.json of a value)", () -> {
          com.fasterxml.jackson.databind.node.ObjectNode req = c.get("request").deepCopy();
          ((com.fasterxml.jackson.databind.node.ObjectNode) req.get("payload")).remove("json_text");
          JobRecords.Planned p = plan(c, req);
          if (!c.has("schema_id")) {
            assertRecord(c.get("expected").get("records").get(0), p.timer(), name);
          }
        }));
      }
    }
    return out.stream();
  }

  @TestFactory
  Stream<DynamicTest> invalid() {
    List<DynamicTest> out = new ArrayList<>();
    for (JsonNode c : V.get("invalid")) {
      out.add(DynamicTest.dynamicTest(c.get("name").asText(), () -> {
        InvalidInputException e = assertThrows(InvalidInputException.class, () -> JobRecords.schedule(
            Requests.request(c.get("request")), c.get("now_ms").asLong(), target("default", null), QUEUES,
            now -> "generated"));
        assertEquals(c.get("field").asText(), e.field(), e.getMessage());
      }));
    }
    return out.stream();
  }

  static JsonNode scheduleCase(String name) {
    for (JsonNode c : V.get("schedule")) {
      if (c.get("name").asText().equals(name)) {
        return c;
      }
    }
    throw new IllegalArgumentException(name);
  }

  @TestFactory
  Stream<DynamicTest> cancelAndReschedule() {
    List<DynamicTest> out = new ArrayList<>();
    for (String kind : List.of("cancel", "reschedule")) {
      for (JsonNode c : V.get(kind)) {
        out.add(DynamicTest.dynamicTest(kind + ": " + c.get("name").asText(), () -> {
          JsonNode s = scheduleCase(c.get("schedule").asText());
          JobRecords.Planned p = plan(s, s.get("request"));
          JobRecords.Target t = target(s.get("wheel").asText(), null);
          List<OutgoingRecord> got = kind.equals("cancel")
              ? JobRecords.legacyCancel(p.job(), c.get("at_ms").asLong(), c.get("partitions").asInt(), t, JobRecords.DEFAULT_RETENTION_MS)
              : JobRecords.legacyReschedule(p.job(), c.get("new_due_ms").asLong(), c.get("at_ms").asLong(), c.get("partitions").asInt(), t, JobRecords.DEFAULT_RETENTION_MS);
          JsonNode want = c.get("expected").get("records");
          assertEquals(want.size(), got.size());
          for (int i = 0; i < got.size(); i++) {
            assertRecord(want.get(i), got.get(i), c.get("name").asText() + " record " + i);
          }
        }));
      }
    }
    return out.stream();
  }

  @TestFactory
  Stream<DynamicTest> commands() {
    List<DynamicTest> out = new ArrayList<>();
    for (JsonNode c : V.get("command")) {
      out.add(DynamicTest.dynamicTest(c.get("name").asText(), () -> {
        JsonNode j = c.get("job");
        JobRef ref = new JobRef(
            j.get("job_id").asText(), j.get("queue").asText(), j.get("idempotency_key").asText(),
            c.hasNonNull("known_due_ms") ? c.get("known_due_ms").asLong() : null);
        CommandOptions o = CommandOptions.defaults().commandId(c.get("command_id").asText());
        if (c.has("by")) {
          o.by(c.get("by").asText());
        }
        if (c.has("expect_version")) {
          o.expectVersion(c.get("expect_version").asText());
        }
        long at = c.get("at_ms").asLong();
        int n = c.get("partitions").asInt();
        JobRecords.Target t = target("default", null);
        Long due = c.hasNonNull("due_ms") ? c.get("due_ms").asLong() : null;
        java.util.function.LongFunction<String> noId = now -> {
          throw new AssertionError("the case gives its command id");
        };
        Command got = switch (c.get("op").asText()) {
          case "cancel" -> Commands.cancel(ref, at, n, t, o, noId);
          case "move" -> Commands.move(ref, due, at, n, t, o, noId);
          default -> Commands.patch(ref, Requests.payload(c.get("payload")), due, at, n, t, o, noId);
        };
        assertRecord(c.get("expected").get("records").get(0), got.record(), c.get("name").asText());
        assertEquals(c.get("command_id").asText(), got.id());
        assertEquals(c.get("op").asText(), got.op());
        if (c.get("payload") != null && c.get("payload").has("json")) { // the same bytes from a Java value
          com.fasterxml.jackson.databind.node.ObjectNode pay = c.get("payload").deepCopy();
          pay.remove("json_text");
          Command again = Commands.patch(ref, Requests.payload(pay), due, at, n, t, o, noId);
          assertRecord(c.get("expected").get("records").get(0), again.record(), c.get("name").asText() + " (json)");
        }
      }));
    }
    return out.stream();
  }

  @TestFactory
  Stream<DynamicTest> verdicts() {
    List<DynamicTest> out = new ArrayList<>();
    for (JsonNode c : V.get("verdict")) {
      out.add(DynamicTest.dynamicTest(c.get("name").asText(), () -> {
        JsonNode r = c.get("record");
        String schema = null;
        for (JsonNode h : r.get("headers")) {
          if (h.get(0).asText().equals("df-schema")) {
            schema = h.get(1).asText();
          }
        }
        Verdict got = Verdict.of(
            HEX.parseHex(r.get("key_hex").asText()), HEX.parseHex(r.get("value_hex").asText()), schema,
            c.get("job_id").asText(), c.get("command_id").asText());
        JsonNode want = c.get("expected");
        if (want.isNull()) {
          assertEquals(null, got);
          return;
        }
        assertEquals(
            new Verdict(
                want.get("state").asText(), want.get("code").asText(), want.get("reason").asText(),
                want.get("due_ms").isNull() ? null : want.get("due_ms").asLong(),
                want.get("version").isNull() ? null : want.get("version").asText()),
            got);
      }));
    }
    return out.stream();
  }

  @Test
  void commandsRefuseBadInputNamingTheField() {
    JobRecords.Target t = target("default", null);
    JobRef ref = JobRef.of("default", "job-1").withKnownDueMs(2_000_000_000_000L);
    CommandOptions o = CommandOptions.defaults();
    assertEquals("command_id", assertThrows(InvalidInputException.class,
        () -> Commands.cancel(ref, 0, 3, t, CommandOptions.defaults().commandId("x".repeat(65)), JobIds::next)).field());
    assertEquals("command_id", assertThrows(InvalidInputException.class,
        () -> Commands.cancel(ref, 0, 3, t, CommandOptions.defaults().commandId("a\u001bb"), JobIds::next)).field());
    assertEquals("run_at", assertThrows(InvalidInputException.class,
        () -> Commands.move(ref, 1_999_999_999_999L, 0, 3, t, o, JobIds::next)).field());
    assertEquals("run_at", assertThrows(InvalidInputException.class,
        () -> Commands.move(ref, JobRecords.MAX_DUE_MS + 1, 0, 3, t, o, JobIds::next)).field());
    assertEquals("queue", assertThrows(InvalidInputException.class,
        () -> Commands.cancel(JobRef.of("no such", "j"), 0, 3, t, o, JobIds::next)).field());
    assertEquals("idempotency_key", assertThrows(InvalidInputException.class,
        () -> Commands.cancel(ref.withIdempotencyKey(""), 0, 3, t, o, JobIds::next)).field());
    assertEquals("payload", assertThrows(InvalidInputException.class,
        () -> Commands.patch(ref, Payload.bytes(new byte[t.maxRecordBytes()]), null, 0, 3, t, o, JobIds::next)).field());
    // a drawn id is a UUIDv7 of the command's time, as the SDK draws it
    String id = Commands.cancel(ref, 1_900_000_000_123L, 3, t, o, JobIds::next).id();
    assertEquals(32, id.length());
    assertEquals(JobIds.uuid7(1_900_000_000_123L, new byte[10]).substring(0, 13), id.substring(0, 13));
  }

  @Test
  void contentHashIsBlake2b128() {
    // RFC 7693 appendix A: BLAKE2b-512("abc") starts ba80a53f981c4d0d
    assertEquals("ba80a53f981c4d0d", HEX.formatHex(Blake2b.digest("abc".getBytes(StandardCharsets.US_ASCII), 64)).substring(0, 16));
    assertArrayEquals(Blake2b.digest(new byte[300], 16), Blake2b.digest(new byte[300], 16));
  }
}
