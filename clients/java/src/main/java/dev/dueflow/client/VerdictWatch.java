package dev.dueflow.client;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ListOffsetsOptions;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.IsolationLevel;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * Waits for verdicts: notes the end of a job id's outcomes partition before a command is written
 * ({@link #mark}), then reads from there until the outcome with the command's id ({@link #await}).
 * Read committed, assign-only consumers (no group), made when needed and kept for the next wait;
 * waits in several threads each take a consumer of their own.
 */
final class VerdictWatch implements AutoCloseable {
  private static final long TIMEOUT_S = 30;
  private final Admin admin;
  private final Properties consumerProps = new Properties();
  private final String topic;
  private final ConcurrentLinkedQueue<KafkaConsumer<byte[], byte[]>> idle = new ConcurrentLinkedQueue<>();
  private volatile Integer partitions;
  private volatile boolean closed;

  /** Where the outcomes partition of a job id ended. */
  record Mark(int partition, long offset) {}

  VerdictWatch(Admin admin, Properties clientProps, String prefix) {
    this.admin = admin;
    this.topic = prefix + ".outcomes";
    for (String name : clientProps.stringPropertyNames()) {
      if (ConsumerConfig.configNames().contains(name)) {
        consumerProps.put(name, clientProps.get(name));
      }
    }
    consumerProps.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
    consumerProps.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    consumerProps.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
    consumerProps.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
    consumerProps.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, "50");
  }

  /** The end (last stable offset) of {@code jobId}'s outcomes partition now. */
  Mark mark(String jobId) {
    int p = Murmur2.partition(JobRecords.utf8Bytes(jobId), partitions());
    TopicPartition tp = new TopicPartition(topic, p);
    try {
      long end =
          admin.listOffsets(Map.of(tp, OffsetSpec.latest()), new ListOffsetsOptions(IsolationLevel.READ_COMMITTED))
              .partitionResult(tp).get(TIMEOUT_S, TimeUnit.SECONDS).offset();
      return new Mark(p, Math.max(0, end));
    } catch (ExecutionException e) {
      throw new DueflowException("end offset of " + tp + ": " + e.getCause(), e.getCause(), true);
    } catch (TimeoutException | InterruptedException e) {
      throw new DueflowException("end offset of " + tp + ": " + e, e, true);
    }
  }

  /** The verdict on {@code sent}, read from its mark on; empty when none came within {@code timeout}. */
  Optional<Verdict> await(SentCommand sent, Duration timeout) {
    long deadline = System.nanoTime() + timeout.toNanos();
    KafkaConsumer<byte[], byte[]> consumer = idle.poll();
    if (consumer == null) {
      consumer = new KafkaConsumer<>(consumerProps);
    }
    TopicPartition tp = new TopicPartition(topic, sent.outcomesPartition());
    try {
      consumer.assign(List.of(tp));
      consumer.seek(tp, sent.outcomesOffset());
      while (true) {
        long left = deadline - System.nanoTime();
        if (left <= 0) {
          return Optional.empty();
        }
        for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofNanos(Math.min(left, 200_000_000L)))) {
          Header schema = r.headers().lastHeader("df-schema");
          Verdict v = Verdict.of(
              r.key(), r.value(), schema == null ? null : new String(schema.value(), StandardCharsets.UTF_8),
              sent.jobId(), sent.commandId());
          if (v != null) {
            return Optional.of(v);
          }
        }
      }
    } finally {
      consumer.unsubscribe();
      if (closed) {
        consumer.close();
      } else {
        idle.add(consumer);
      }
    }
  }

  private int partitions() {
    Integer known = partitions;
    if (known != null) {
      return known;
    }
    try {
      TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames().get(TIMEOUT_S, TimeUnit.SECONDS).get(topic);
      partitions = d.partitions().size();
      return partitions;
    } catch (ExecutionException e) {
      throw new DueflowException(
          "outcomes topic " + topic + " not usable (run `dueflow topics ensure`?): " + e.getCause(), e.getCause(), true);
    } catch (TimeoutException | InterruptedException e) {
      throw new DueflowException("describing " + topic + ": " + e, e, true);
    }
  }

  @Override
  public void close() {
    closed = true;
    KafkaConsumer<byte[], byte[]> c;
    while ((c = idle.poll()) != null) {
      c.close(Duration.ofSeconds(5));
    }
  }
}
