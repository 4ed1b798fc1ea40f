package dev.dueflow.client;

import java.nio.charset.StandardCharsets;

/**
 * The answer of the worker that owns a job's exec partition to a command: an {@code Outcome}
 * (version 3) with the command's id.
 *
 * @param state {@code cancelled}, {@code rescheduled}, {@code updated} or {@code refused}
 * @param code for {@code refused}, why: {@code finished}, {@code started}, {@code cancelled},
 *     {@code changed}, {@code needs_value}, {@code due_already}, {@code unsupported}, {@code
 *     unknown}, {@code invalid} (empty when applied)
 * @param reason for {@code refused}, the worker's words (empty when applied)
 * @param dueMs the job's due time after the command ({@code rescheduled}), else null
 * @param version the job's version after the change (null when the worker did not say)
 */
public record Verdict(String state, String code, String reason, Long dueMs, String version) {

  /** Whether the worker applied the command. */
  public boolean applied() {
    return !state.equals("refused");
  }

  /**
   * The verdict on {@code commandId} of {@code jobId} in one outcome record (key, value and its
   * {@code df-schema} header), or null when the record is not that verdict. Pure.
   */
  public static Verdict of(byte[] key, byte[] value, String schema, String jobId, String commandId) {
    if (key == null || value == null || schema == null || !schema.endsWith("/3")) {
      return null; // only version 3 outcomes carry a command id
    }
    if (!new String(key, StandardCharsets.UTF_8).equals(jobId)) {
      return null;
    }
    Codec.Outcome o;
    try {
      o = Codec.readOutcomeV3(value);
    } catch (RuntimeException e) {
      return null;
    }
    if (!commandId.equals(o.commandId())) {
      return null;
    }
    String error = o.error() == null ? "" : o.error();
    boolean refused = o.state().equals("refused");
    int colon = error.indexOf(": ");
    String code = !refused ? "" : colon < 0 ? error : error.substring(0, colon);
    String reason = !refused || colon < 0 ? "" : error.substring(colon + 2);
    return new Verdict(o.state(), code, reason, o.dueMs(), o.version());
  }
}
