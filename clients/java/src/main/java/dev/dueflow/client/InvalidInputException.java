package dev.dueflow.client;

/** Bad input at a door of dueflow: names the field, the value and what is accepted. */
public class InvalidInputException extends DueflowException {
  private static final long serialVersionUID = 1L;
  private final String field;
  private final transient Object value;
  private final String accepted;

  public InvalidInputException(String field, Object value, String accepted) {
    super(field + ": got " + shown(value) + "; accepted: " + accepted);
    this.field = field;
    this.value = value;
    this.accepted = accepted;
  }

  /** The input field at fault ({@code task}, {@code delay}, {@code job_id}, ...). */
  public String field() {
    return field;
  }

  public Object value() {
    return value;
  }

  public String accepted() {
    return accepted;
  }

  private static String shown(Object value) {
    if (value == null) {
      return "null";
    }
    String text = value instanceof String ? "'" + value + "'" : String.valueOf(value);
    return text.length() > 200 ? text.substring(0, 200) + "..." : text;
  }
}
