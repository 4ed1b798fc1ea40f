import { DueflowError } from "./errors";

/**
 * Register Avro `schema` under `subject` at a Confluent-compatible schema registry
 * (`POST /subjects/{subject}/versions`) and return its id; a schema the subject has
 * already returns its existing id.
 */
export async function registerSchema(url: string, subject: string, schema: string): Promise<number> {
  const base = url.endsWith("/") ? url : `${url}/`;
  let resp: Response;
  try {
    resp = await fetch(`${base}subjects/${encodeURIComponent(subject)}/versions`, {
      method: "POST",
      headers: { "Content-Type": "application/vnd.schemaregistry.v1+json" },
      body: JSON.stringify({ schemaType: "AVRO", schema }),
    });
  } catch (e) {
    throw new DueflowError(`schema registry at ${url} not reachable: ${e}`, true, { cause: e });
  }
  const text = await resp.text();
  let id: unknown;
  try {
    id = (JSON.parse(text) as { id?: unknown }).id;
  } catch {
    id = undefined;
  }
  if (!resp.ok || typeof id !== "number") {
    throw new DueflowError(`schema registry at ${url} refused subject ${subject}: HTTP ${resp.status} ${text}`, resp.status >= 500);
  }
  return id;
}
