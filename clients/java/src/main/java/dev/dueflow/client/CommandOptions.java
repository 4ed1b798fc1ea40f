package dev.dueflow.client;

/**
 * Options of a command (docs/wire-format.md, "Steering a job"); every one may stay unset.
 *
 * <pre>{@code
 * CommandOptions.defaults().by("billing-service").expectVersion("")
 * }</pre>
 */
public final class CommandOptions {
  String commandId;
  String by;
  Long knownDueMs;
  String expectVersion;

  private CommandOptions() {}

  public static CommandOptions defaults() {
    return new CommandOptions();
  }

  /**
   * The command's id (1-64 characters): the verdict carries it, and it becomes the job's version.
   * Default: a new UUIDv7 as 32 hex digits, as the SDK draws them. Give your own to make a retry of
   * the same request recognizable.
   */
  public CommandOptions commandId(String commandId) {
    this.commandId = commandId;
    return this;
  }

  /** Who asked (a service, an operator): kept with the command. */
  public CommandOptions by(String by) {
    this.by = by;
    return this;
  }

  /** The job's due time as you know it (default: the ref's {@code knownDueMs}). */
  public CommandOptions knownDueMs(long dueMs) {
    this.knownDueMs = dueMs;
    return this;
  }

  /**
   * Apply a move or update only if the job's version is still {@code version} ({@code ""}: the job
   * as scheduled; a verdict's {@link Verdict#version()} after a change); else the verdict is {@code
   * refused} with code {@code changed}. A cancel ignores it.
   */
  public CommandOptions expectVersion(String version) {
    this.expectVersion = version;
    return this;
  }
}
