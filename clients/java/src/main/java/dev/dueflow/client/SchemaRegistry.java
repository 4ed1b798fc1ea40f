package dev.dueflow.client;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.net.URI;
import java.net.URLEncoder;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Map;

/**
 * The part of the Confluent Schema Registry REST API the registry option uses: register a schema
 * under a subject and get its id ({@code POST /subjects/{subject}/versions}). Registering a schema
 * the subject has already returns its existing id.
 */
public final class SchemaRegistry {
  private static final ObjectMapper JSON = new ObjectMapper();
  private final URI base;
  private final HttpClient http;

  public SchemaRegistry(String url) {
    this.base = URI.create(url.endsWith("/") ? url : url + "/");
    this.http = HttpClient.newBuilder().connectTimeout(Duration.ofSeconds(10)).build();
  }

  /** The id of Avro schema {@code schema} under {@code subject}, registering it if new. */
  public int register(String subject, String schema) {
    URI uri = base.resolve("subjects/" + URLEncoder.encode(subject, StandardCharsets.UTF_8) + "/versions");
    try {
      String body = JSON.writeValueAsString(Map.of("schemaType", "AVRO", "schema", schema));
      HttpRequest req =
          HttpRequest.newBuilder(uri)
              .timeout(Duration.ofSeconds(30))
              .header("Content-Type", "application/vnd.schemaregistry.v1+json")
              .POST(HttpRequest.BodyPublishers.ofString(body))
              .build();
      HttpResponse<String> resp = http.send(req, HttpResponse.BodyHandlers.ofString());
      JsonNode answer = JSON.readTree(resp.body());
      if (resp.statusCode() / 100 != 2 || !answer.has("id")) {
        throw new DueflowException(
            "schema registry at " + base + " refused subject " + subject + ": HTTP " + resp.statusCode()
                + " " + resp.body(), null, resp.statusCode() >= 500);
      }
      return answer.get("id").asInt();
    } catch (IOException e) {
      throw new DueflowException("schema registry at " + base + " not reachable: " + e, e, true);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      throw new DueflowException("interrupted while registering " + subject, e, true);
    }
  }
}
