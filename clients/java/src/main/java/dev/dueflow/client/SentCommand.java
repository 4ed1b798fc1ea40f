package dev.dueflow.client;

/**
 * A command the broker has acknowledged: its id, the job, the exec partition it went to, and where
 * the job id's outcomes partition ended just before it was written (where {@link
 * DueflowProducer#awaitVerdict} starts reading).
 */
public record SentCommand(
    String commandId, String op, String jobId, String queue, int partition, int outcomesPartition,
    long outcomesOffset) {}
