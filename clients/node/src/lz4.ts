/**
 * The LZ4 codec kafkajs lacks (pure JS, lz4js: no native build). dueflow's workers write
 * outcomes LZ4-compressed (librdkafka's `compression.type` lz4), and a kafkajs consumer
 * without a codec for it fails on the first such batch: the verdict reader needs it.
 * Registered once, by DueflowProducer.connect, unless the application registered its own.
 */
import { CompressionCodecs, CompressionTypes } from "kafkajs";
import * as lz4 from "lz4js";

export function ensureLz4Codec(): void {
  try {
    CompressionCodecs[CompressionTypes.LZ4]();
    return; // the application's own
  } catch {
    // kafkajs' placeholder throws "LZ4 compression not implemented"
  }
  const codec = {
    async compress(encoder: { buffer: Buffer }): Promise<Buffer> {
      return Buffer.from(lz4.compress(encoder.buffer));
    },
    async decompress(buffer: Buffer): Promise<Buffer> {
      return Buffer.from(lz4.decompress(buffer));
    },
  };
  CompressionCodecs[CompressionTypes.LZ4] = () => codec;
}
