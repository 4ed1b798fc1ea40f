package dev.dueflow.client;

import java.util.Map;

/**
 * A job as written: every field of its {@code dueflow.Job} value, and where its timer went.
 * Keep it (or its {@link #ref()}) to cancel, reschedule or update the job later ({@link
 * DueflowProducer#cancel}, {@link DueflowProducer#reschedule}, {@link DueflowProducer#update}).
 */
public record ScheduledJob(
    String jobId,
    String queue,
    String task,
    byte[] payload,
    String contentType,
    long dueMs,
    String idempotencyKey,
    int maxAttempts,
    Long timeoutMs,
    long createdMs,
    String contentHash,
    Map<String, String> labels,
    int partition) {

  /** What a command about this job needs: id, queue, idempotency key, due time. */
  public JobRef ref() {
    return new JobRef(jobId, queue, idempotencyKey, dueMs);
  }

  /** The same job due at {@code dueMs}, its timer on {@code partition}. */
  public ScheduledJob movedTo(long dueMs, int partition) {
    return new ScheduledJob(
        jobId, queue, task, payload, contentType, dueMs, idempotencyKey, maxAttempts, timeoutMs,
        createdMs, contentHash, labels, partition);
  }
}
