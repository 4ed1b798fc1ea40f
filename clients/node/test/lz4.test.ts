/** The LZ4 codec the verdict reader registers with kafkajs (dueflow's workers write outcomes LZ4-compressed). */
import assert from "node:assert/strict";
import { test } from "node:test";
import { CompressionCodecs, CompressionTypes } from "kafkajs";
import { ensureLz4Codec } from "../src/lz4";

const TEXT = "dueflow verdicts: an LZ4 frame as librdkafka writes it, dueflow verdicts";
// `printf '%s' "$TEXT" | lz4 -c` (the reference tool: block-independent, content checksum)
const FRAME =
  "04224d186440a742000000f729647565666c6f772076657264696374733a20616e204c5a34206672616d65206173206c696272646b61666b6120" +
  "7772697465732069742c20380050646963747300000000447bfbfa";

test("kafkajs reads LZ4 frames once the codec is registered", async () => {
  ensureLz4Codec();
  const codec = CompressionCodecs[CompressionTypes.LZ4]();
  assert.equal((await codec.decompress(Buffer.from(FRAME, "hex"))).toString("utf8"), TEXT);
  const big = Buffer.from(TEXT.repeat(5000));
  const packed = await codec.compress({ buffer: big });
  assert.ok(packed.length < big.length / 10);
  assert.deepEqual(await codec.decompress(packed), big);
  ensureLz4Codec(); // a second registration keeps the first
  assert.equal(CompressionCodecs[CompressionTypes.LZ4](), codec);
});
