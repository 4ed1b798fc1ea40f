package dev.dueflow.client;

/** The root of the exceptions this client raises. {@link #retriable()} says whether a retry may help. */
public class DueflowException extends RuntimeException {
  private static final long serialVersionUID = 1L;
  private final boolean retriable;

  public DueflowException(String message) {
    this(message, null, false);
  }

  public DueflowException(String message, Throwable cause, boolean retriable) {
    super(message, cause);
    this.retriable = retriable;
  }

  public boolean retriable() {
    return retriable;
  }
}
