package dev.dueflow.client;

/** Kafka's default key partitioner (murmur2), as a pure function. */
public final class Murmur2 {
  private Murmur2() {}

  /** Kafka's {@code Utils.murmur2}: a signed 32-bit hash. */
  public static int hash(byte[] data) {
    int length = data.length;
    int seed = 0x9747b28c;
    int m = 0x5bd1e995;
    int r = 24;
    int h = seed ^ length;
    int length4 = length / 4;
    for (int i = 0; i < length4; i++) {
      int i4 = i * 4;
      int k = (data[i4] & 0xff) + ((data[i4 + 1] & 0xff) << 8) + ((data[i4 + 2] & 0xff) << 16)
          + ((data[i4 + 3] & 0xff) << 24);
      k *= m;
      k ^= k >>> r;
      k *= m;
      h *= m;
      h ^= k;
    }
    int tail = length4 * 4;
    switch (length % 4) {
      case 3:
        h ^= (data[tail + 2] & 0xff) << 16;
        // fall through
      case 2:
        h ^= (data[tail + 1] & 0xff) << 8;
        // fall through
      case 1:
        h ^= data[tail] & 0xff;
        h *= m;
        break;
      default:
        break;
    }
    h ^= h >>> 13;
    h *= m;
    h ^= h >>> 15;
    return h;
  }

  /** The partition of a keyed record among {@code partitions} (the Java default partitioner). */
  public static int partition(byte[] key, int partitions) {
    if (partitions < 1) {
      throw new IllegalArgumentException("partitions: got " + partitions + "; accepted: >= 1");
    }
    return (hash(key) & 0x7fffffff) % partitions;
  }
}
