declare module "lz4js" {
  /** An LZ4 frame of `src`. */
  export function compress(src: Uint8Array, maxSize?: number): Uint8Array;
  /** The bytes of the LZ4 frame `src`. */
  export function decompress(src: Uint8Array, maxSize?: number): Uint8Array;
}
