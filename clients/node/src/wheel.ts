/** The timer topic's timing wheel and the placement rule of docs/wire-format.md (pure). */

export interface Level {
  slots: number;
  widthMs: number;
}

/** The cluster's geometry (`dueflow topics describe` prints it). */
export interface Wheel {
  nearPartitions: number;
  nearWindowMs: number;
  lookaheadMs: number;
  levels: Level[];
  shards?: number;
}

export const DEFAULT_WHEEL: Wheel = {
  nearPartitions: 4,
  nearWindowMs: 2_000,
  lookaheadMs: 500,
  levels: [
    { slots: 64, widthMs: 1_000 },
    { slots: 64, widthMs: 60_000 },
    { slots: 64, widthMs: 3_600_000 },
    { slots: 64, widthMs: 86_400_000 },
  ],
  shards: 1,
};

/** Partitions of one shard: the near partitions and every level's slots. */
export function shardPartitions(w: Wheel): number {
  return w.levels.reduce((n, lv) => n + lv.slots, w.nearPartitions);
}

const CRC_TABLE = (() => {
  const t = new Uint32Array(256);
  for (let n = 0; n < 256; n++) {
    let c = n;
    for (let k = 0; k < 8; k++) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    t[n] = c >>> 0;
  }
  return t;
})();

/** CRC-32 (zlib, IEEE) as an unsigned integer. */
export function crc32(data: Uint8Array): number {
  let c = 0xffffffff;
  for (const b of data) c = CRC_TABLE[(c ^ b) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

const floorMod = (a: number, b: number): number => ((a % b) + b) % b;

/** The timer-topic partition of a timer with `key` due at `dueMs`, written at `nowMs`. */
export function placeTimer(w: Wheel, dueMs: number, nowMs: number, key: Uint8Array): number {
  const spread = crc32(key);
  const first = (Math.floor(spread / 65536) % (w.shards ?? 1)) * shardPartitions(w);
  const delta = dueMs - nowMs;
  if (delta <= w.nearWindowMs) return first + (spread % w.nearPartitions);
  let base = first + w.nearPartitions;
  for (const lv of w.levels) {
    const reach = (lv.slots - 1) * lv.widthMs - w.lookaheadMs;
    if (delta <= reach) return base + floorMod(Math.floor(dueMs / lv.widthMs), lv.slots);
    base += lv.slots;
  }
  const top = w.levels[w.levels.length - 1];
  const reach = (top.slots - 1) * top.widthMs - w.lookaheadMs;
  return base - top.slots + floorMod(Math.floor((nowMs + reach) / top.widthMs), top.slots);
}

/** Kafka's `Utils.murmur2`: the hash of the default key partitioner (signed 32-bit). */
export function murmur2(data: Uint8Array): number {
  const m = 0x5bd1e995;
  const length = data.length;
  let h = (0x9747b28c ^ length) | 0;
  const n = length >> 2;
  for (let i = 0; i < n; i++) {
    const j = i * 4;
    let k = data[j] | (data[j + 1] << 8) | (data[j + 2] << 16) | (data[j + 3] << 24);
    k = Math.imul(k, m);
    k ^= k >>> 24;
    k = Math.imul(k, m);
    h = Math.imul(h, m) ^ k;
  }
  const tail = n * 4;
  switch (length & 3) {
    case 3:
      h ^= data[tail + 2] << 16;
    // falls through
    case 2:
      h ^= data[tail + 1] << 8;
    // falls through
    case 1:
      h ^= data[tail];
      h = Math.imul(h, m);
  }
  h ^= h >>> 13;
  h = Math.imul(h, m);
  h ^= h >>> 15;
  return h | 0;
}

/** The partition of a keyed record among `partitions` (Java's default partitioner). */
export function keyPartition(key: Uint8Array, partitions: number): number {
  return (murmur2(key) & 0x7fffffff) % partitions;
}
