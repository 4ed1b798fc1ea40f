package dev.dueflow.client;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.SerializationFeature;
import com.fasterxml.jackson.databind.json.JsonMapper;
import com.fasterxml.jackson.databind.MapperFeature;
import java.nio.charset.StandardCharsets;

/** A job's handler input: JSON (what Python handlers get as dicts and lists) or raw bytes. */
public final class Payload {
  public static final String JSON = "application/json";
  public static final String OCTET_STREAM = "application/octet-stream";
  private static final ObjectMapper MAPPER =
      JsonMapper.builder()
          .enable(SerializationFeature.ORDER_MAP_ENTRIES_BY_KEYS)
          .enable(MapperFeature.SORT_PROPERTIES_ALPHABETICALLY)
          .build();

  private final byte[] bytes;
  private final String contentType;

  private Payload(byte[] bytes, String contentType) {
    this.bytes = bytes;
    this.contentType = contentType;
  }

  /**
   * A value serialized as compact JSON with sorted keys (Jackson), as the Python SDK writes it:
   * maps, lists, strings, numbers, booleans, null, or any bean Jackson serializes.
   */
  public static Payload json(Object value) {
    try {
      return new Payload(MAPPER.writeValueAsBytes(value), JSON);
    } catch (JsonProcessingException e) {
      throw new InvalidInputException(
          "payload", value, "a value Jackson can write as JSON (" + e.getOriginalMessage() + ")");
    }
  }

  /** JSON text you serialized yourself, written as is (it must parse as JSON). */
  public static Payload jsonText(String text) {
    try {
      MAPPER.readTree(text);
    } catch (JsonProcessingException | IllegalArgumentException e) {
      throw new InvalidInputException("payload", text, "JSON text (" + e.getMessage() + ")");
    }
    return new Payload(text.getBytes(StandardCharsets.UTF_8), JSON);
  }

  /** Raw bytes ({@code application/octet-stream}): the handler gets them unchanged. */
  public static Payload bytes(byte[] bytes) {
    if (bytes == null) {
      throw new InvalidInputException("payload", null, "bytes (not null)");
    }
    return new Payload(bytes.clone(), OCTET_STREAM);
  }

  byte[] bytes() {
    return bytes;
  }

  public String contentType() {
    return contentType;
  }
}
