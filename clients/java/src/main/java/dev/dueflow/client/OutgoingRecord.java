package dev.dueflow.client;

import java.util.List;
import java.util.Map;

/** A record to produce; {@code partition} null leaves it to the default (murmur2) partitioner. */
public record OutgoingRecord(
    String topic, Integer partition, byte[] key, byte[] value, List<Map.Entry<String, String>> headers) {

  /** Its estimated size in a batch of its own, as dueflow estimates it against max.message.bytes. */
  public int estimatedSize() {
    int size = 61 + 21 + key.length + (value == null ? 0 : value.length);
    for (Map.Entry<String, String> h : headers) {
      size += 10 + h.getKey().length() + h.getValue().getBytes(java.nio.charset.StandardCharsets.UTF_8).length;
    }
    return size;
  }
}
