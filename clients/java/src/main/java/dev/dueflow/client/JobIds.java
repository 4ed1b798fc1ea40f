package dev.dueflow.client;

import java.security.SecureRandom;

/** Job ids as the Python SDK draws them: UUIDv7 (RFC 9562) as 32 lowercase hex digits. */
public final class JobIds {
  private static final char[] HEX = "0123456789abcdef".toCharArray();
  private static final SecureRandom RANDOM = new SecureRandom();

  private JobIds() {}

  /** A new id for time {@code nowMs}. */
  public static String next(long nowMs) {
    byte[] random = new byte[10];
    RANDOM.nextBytes(random);
    return uuid7(nowMs, random);
  }

  /**
   * The UUIDv7 of {@code nowMs} with 10 random bytes {@code r} (pure): the 48-bit time, the
   * version 7, hex digits 0-2 of {@code r}, the variant 8, hex digits 4-18 of {@code r}.
   */
  public static String uuid7(long nowMs, byte[] r) {
    String time = String.format("%012x", nowMs & 0xFFFFFFFFFFFFL);
    String digits = hex(r);
    return time + "7" + digits.substring(0, 3) + "8" + digits.substring(4, 19);
  }

  static String hex(byte[] bytes) {
    char[] out = new char[bytes.length * 2];
    for (int i = 0; i < bytes.length; i++) {
      out[2 * i] = HEX[(bytes[i] >> 4) & 0xf];
      out[2 * i + 1] = HEX[bytes[i] & 0xf];
    }
    return new String(out);
  }
}
