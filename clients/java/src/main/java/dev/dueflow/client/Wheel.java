package dev.dueflow.client;

import java.util.List;
import java.util.zip.CRC32;

/**
 * The timer topic's timing wheel and the placement rule of docs/wire-format.md (pure).
 *
 * <p>Use the cluster's geometry: {@code dueflow topics describe} prints it; {@link #DEFAULT} is
 * dueflow's default.
 */
public final class Wheel {
  /** One level of the wheel: {@code slots} partitions of {@code widthMs} each. */
  public record Level(int slots, long widthMs) {}

  public static final Wheel DEFAULT =
      new Wheel(
          4,
          2_000,
          500,
          List.of(
              new Level(64, 1_000),
              new Level(64, 60_000),
              new Level(64, 3_600_000),
              new Level(64, 86_400_000)),
          1);

  private final int nearPartitions;
  private final long nearWindowMs;
  private final long lookaheadMs;
  private final List<Level> levels;
  private final int shards;

  public Wheel(
      int nearPartitions, long nearWindowMs, long lookaheadMs, List<Level> levels, int shards) {
    if (nearPartitions < 1 || levels.isEmpty() || shards < 1 || lookaheadMs < 0) {
      throw new IllegalArgumentException("wheel: near_partitions >= 1, a level, shards >= 1");
    }
    this.nearPartitions = nearPartitions;
    this.nearWindowMs = nearWindowMs;
    this.lookaheadMs = lookaheadMs;
    this.levels = List.copyOf(levels);
    this.shards = shards;
  }

  /** The same wheel, {@code shards} times side by side (the deployment's wheel.shards). */
  public Wheel withShards(int shards) {
    return new Wheel(nearPartitions, nearWindowMs, lookaheadMs, levels, shards);
  }

  /** Partitions of one shard: the near partitions and every level's slots. */
  public int shardPartitions() {
    int n = nearPartitions;
    for (Level lv : levels) {
      n += lv.slots();
    }
    return n;
  }

  /** Partitions of the whole timer topic. */
  public int totalPartitions() {
    return shards * shardPartitions();
  }

  /** The timer-topic partition of a timer with {@code key} due at {@code dueMs}, written at {@code nowMs}. */
  public int partition(long dueMs, long nowMs, byte[] key) {
    CRC32 crc = new CRC32();
    crc.update(key);
    long spread = crc.getValue();
    long first = ((spread >>> 16) % shards) * shardPartitions();
    long delta = dueMs - nowMs;
    if (delta <= nearWindowMs) {
      return (int) (first + spread % nearPartitions);
    }
    long base = first + nearPartitions;
    for (Level lv : levels) {
      long reach = (lv.slots() - 1) * lv.widthMs() - lookaheadMs;
      if (delta <= reach) {
        return (int) (base + Math.floorMod(Math.floorDiv(dueMs, lv.widthMs()), (long) lv.slots()));
      }
      base += lv.slots();
    }
    Level top = levels.get(levels.size() - 1);
    long reach = (top.slots() - 1) * top.widthMs() - lookaheadMs;
    base -= top.slots();
    return (int)
        (base + Math.floorMod(Math.floorDiv(nowMs + reach, top.widthMs()), (long) top.slots()));
  }

  @Override
  public String toString() {
    return "Wheel[near=" + nearPartitions + ", window=" + nearWindowMs + "ms, lookahead="
        + lookaheadMs + "ms, levels=" + levels + ", shards=" + shards + "]";
  }
}
