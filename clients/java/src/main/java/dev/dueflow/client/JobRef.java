package dev.dueflow.client;

/**
 * The job a command is about: its id, queue and idempotency key (the key picks the worker that
 * owns it), and its due time when the caller knows it. {@link ScheduledJob#ref()} gives the ref of
 * a job this client scheduled; {@link #of} names one scheduled elsewhere.
 *
 * <p>{@code knownDueMs}: the worker refuses ({@code unknown}) a command about a job it has no
 * record of whose known due time is long past (it ran and its records expired); null: not known.
 */
public record JobRef(String jobId, String queue, String idempotencyKey, Long knownDueMs) {

  /** Job {@code jobId} of {@code queue}, whose idempotency key is its id (the default). */
  public static JobRef of(String queue, String jobId) {
    return new JobRef(jobId, queue, jobId, null);
  }

  /** The same job with idempotency key {@code key} (when it was scheduled with one). */
  public JobRef withIdempotencyKey(String key) {
    return new JobRef(jobId, queue, key, knownDueMs);
  }

  /** The same job, due at {@code dueMs} as far as the caller knows. */
  public JobRef withKnownDueMs(Long dueMs) {
    return new JobRef(jobId, queue, idempotencyKey, dueMs);
  }
}
