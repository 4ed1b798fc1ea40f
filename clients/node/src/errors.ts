/** The root of the errors this client throws; `retriable` says whether a retry may help. */
export class DueflowError extends Error {
  constructor(
    message: string,
    readonly retriable = false,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = "DueflowError";
  }
}

/** Bad input at a door of dueflow: names the field, the value and what is accepted. Nothing was written. */
export class InvalidInputError extends DueflowError {
  constructor(
    readonly field: string,
    readonly value: unknown,
    readonly accepted: string,
  ) {
    super(`${field}: got ${shown(value)}; accepted: ${accepted}`);
    this.name = "InvalidInputError";
  }
}

function shown(value: unknown): string {
  let text: string;
  try {
    text = typeof value === "string" ? JSON.stringify(value) : String(value);
  } catch {
    text = Object.prototype.toString.call(value);
  }
  return text.length > 200 ? `${text.slice(0, 200)}...` : text;
}
