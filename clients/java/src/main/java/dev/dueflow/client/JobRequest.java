package dev.dueflow.client;

import java.time.Duration;
import java.time.Instant;
import java.util.LinkedHashMap;
import java.util.Map;

/**
 * One job to schedule, as the caller gives it; {@link DueflowProducer#schedule} checks it.
 *
 * <pre>{@code
 * JobRequest.of("send_email")
 *     .payload(Payload.json(Map.of("to", "a@example.com")))
 *     .delay(Duration.ofMinutes(10))
 *     .queue("emails")
 *     .idempotencyKey("welcome:" + userId);
 * }</pre>
 */
public final class JobRequest {
  String task;
  Payload payload;
  Instant runAt;
  Long runAtMs;
  Duration delay;
  String queue = "default";
  String jobId;
  String idempotencyKey;
  Long maxAttempts;
  Duration timeout;
  Map<String, String> labels;

  private JobRequest(String task) {
    this.task = task;
  }

  /** A job of handler {@code task} (the name registered with {@code @task} on the workers). */
  public static JobRequest of(String task) {
    return new JobRequest(task);
  }

  /** The handler input (default: JSON {@code null}). */
  public JobRequest payload(Payload payload) {
    this.payload = payload;
    return this;
  }

  /** Run at this instant (a time in the past runs at once). */
  public JobRequest runAt(Instant runAt) {
    this.runAt = runAt;
    this.runAtMs = null;
    return this;
  }

  /** Run at this UTC epoch millisecond. */
  public JobRequest runAtMs(long epochMs) {
    this.runAtMs = epochMs;
    this.runAt = null;
    return this;
  }

  /** Run this long from now (neither runAt nor delay: now). */
  public JobRequest delay(Duration delay) {
    this.delay = delay;
    return this;
  }

  /** The queue (default {@code default}); the job runs on {@code <prefix>.exec.<queue>}. */
  public JobRequest queue(String queue) {
    this.queue = queue;
    return this;
  }

  /** Your own job id (default: a new UUIDv7); 1-255 characters. */
  public JobRequest jobId(String jobId) {
    this.jobId = jobId;
    return this;
  }

  /** The key workers deduplicate by, and that handlers get (default: the job id). */
  public JobRequest idempotencyKey(String key) {
    this.idempotencyKey = key;
    return this;
  }

  /** Attempts before the job is dead-lettered (default 4, the workers' default). */
  public JobRequest maxAttempts(long maxAttempts) {
    this.maxAttempts = maxAttempts;
    return this;
  }

  /** A hard limit on one attempt (default: the workers' default timeout). */
  public JobRequest timeout(Duration timeout) {
    this.timeout = timeout;
    return this;
  }

  /** One label (free-form strings carried with the job: logs, status view). */
  public JobRequest label(String name, String value) {
    if (labels == null) {
      labels = new LinkedHashMap<>();
    }
    labels.put(name, value);
    return this;
  }

  /** Every label at once (replaces those given before). */
  public JobRequest labels(Map<String, String> labels) {
    this.labels = labels == null ? null : new LinkedHashMap<>(labels);
    return this;
  }
}
