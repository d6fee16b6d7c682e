/**
 * WireGuard's MAC (keyed BLAKE2s with a 16-byte output, RFC 7693) for one fixed key, made for the
 * handshake gate, which computes mac1 (and often mac2) for every handshake message a flood sends.
 *
 * A keyed BLAKE2s hash begins by compressing the key, zero-padded to a 64-byte block; for a fixed
 * key that state is the same every time, so it is computed once here and each MAC starts from it:
 * a 116-byte initiation then costs two compressions instead of three. The compression works on
 * preallocated typed arrays, so a MAC allocates nothing (`verify`) or only its 16-byte result
 * (`mac`). The provider's `mac` (crypto/primitives.ts) computes the same function; the unit tests
 * compare the two.
 */
import { constantTimeEqual } from './keys.ts';

const IV = Int32Array.of(
  0x6a09e667, 0xbb67ae85 | 0, 0x3c6ef372, 0xa54ff53a | 0, 0x510e527f, 0x9b05688c | 0, 0x1f83d9ab, 0x5be0cd19,
);

/** The message word schedule of each of BLAKE2s's ten rounds. */
const SIGMA = Uint8Array.of(
  0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15,
  14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3,
  11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4,
  7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8,
  9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13,
  2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9,
  12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11,
  13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10,
  6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5,
  10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0,
);

const OUT_BYTES = 16;
const BLOCK = 64;

// Scratch shared by every KeyedMac (JavaScript runs one call at a time per thread).
const m = new Int32Array(16);
const h = new Int32Array(8);
const result = new Uint8Array(OUT_BYTES);

/** Compresses block `m` into `state`; `t` = bytes so far (< 2^32 here), `last` for the final block. */
function compress(state: Int32Array, t: number, last: boolean): void {
  // The sixteen working words live in locals and G is written out: several times faster than
  // an array and a function call per G.
  let v0 = state[0], v1 = state[1], v2 = state[2], v3 = state[3], v4 = state[4], v5 = state[5], v6 = state[6], v7 = state[7];
  let v8 = IV[0], v9 = IV[1], v10 = IV[2], v11 = IV[3], v12 = IV[4] ^ t, v13 = IV[5], v14 = last ? ~IV[6] : IV[6], v15 = IV[7];
  for (let s = 0; s < 160; s += 16) {
    v0 = (v0 + v4 + m[SIGMA[s]]) | 0; v12 ^= v0; v12 = (v12 >>> 16) | (v12 << 16);
    v8 = (v8 + v12) | 0; v4 ^= v8; v4 = (v4 >>> 12) | (v4 << 20);
    v0 = (v0 + v4 + m[SIGMA[s + 1]]) | 0; v12 ^= v0; v12 = (v12 >>> 8) | (v12 << 24);
    v8 = (v8 + v12) | 0; v4 ^= v8; v4 = (v4 >>> 7) | (v4 << 25);
    v1 = (v1 + v5 + m[SIGMA[s + 2]]) | 0; v13 ^= v1; v13 = (v13 >>> 16) | (v13 << 16);
    v9 = (v9 + v13) | 0; v5 ^= v9; v5 = (v5 >>> 12) | (v5 << 20);
    v1 = (v1 + v5 + m[SIGMA[s + 3]]) | 0; v13 ^= v1; v13 = (v13 >>> 8) | (v13 << 24);
    v9 = (v9 + v13) | 0; v5 ^= v9; v5 = (v5 >>> 7) | (v5 << 25);
    v2 = (v2 + v6 + m[SIGMA[s + 4]]) | 0; v14 ^= v2; v14 = (v14 >>> 16) | (v14 << 16);
    v10 = (v10 + v14) | 0; v6 ^= v10; v6 = (v6 >>> 12) | (v6 << 20);
    v2 = (v2 + v6 + m[SIGMA[s + 5]]) | 0; v14 ^= v2; v14 = (v14 >>> 8) | (v14 << 24);
    v10 = (v10 + v14) | 0; v6 ^= v10; v6 = (v6 >>> 7) | (v6 << 25);
    v3 = (v3 + v7 + m[SIGMA[s + 6]]) | 0; v15 ^= v3; v15 = (v15 >>> 16) | (v15 << 16);
    v11 = (v11 + v15) | 0; v7 ^= v11; v7 = (v7 >>> 12) | (v7 << 20);
    v3 = (v3 + v7 + m[SIGMA[s + 7]]) | 0; v15 ^= v3; v15 = (v15 >>> 8) | (v15 << 24);
    v11 = (v11 + v15) | 0; v7 ^= v11; v7 = (v7 >>> 7) | (v7 << 25);
    v0 = (v0 + v5 + m[SIGMA[s + 8]]) | 0; v15 ^= v0; v15 = (v15 >>> 16) | (v15 << 16);
    v10 = (v10 + v15) | 0; v5 ^= v10; v5 = (v5 >>> 12) | (v5 << 20);
    v0 = (v0 + v5 + m[SIGMA[s + 9]]) | 0; v15 ^= v0; v15 = (v15 >>> 8) | (v15 << 24);
    v10 = (v10 + v15) | 0; v5 ^= v10; v5 = (v5 >>> 7) | (v5 << 25);
    v1 = (v1 + v6 + m[SIGMA[s + 10]]) | 0; v12 ^= v1; v12 = (v12 >>> 16) | (v12 << 16);
    v11 = (v11 + v12) | 0; v6 ^= v11; v6 = (v6 >>> 12) | (v6 << 20);
    v1 = (v1 + v6 + m[SIGMA[s + 11]]) | 0; v12 ^= v1; v12 = (v12 >>> 8) | (v12 << 24);
    v11 = (v11 + v12) | 0; v6 ^= v11; v6 = (v6 >>> 7) | (v6 << 25);
    v2 = (v2 + v7 + m[SIGMA[s + 12]]) | 0; v13 ^= v2; v13 = (v13 >>> 16) | (v13 << 16);
    v8 = (v8 + v13) | 0; v7 ^= v8; v7 = (v7 >>> 12) | (v7 << 20);
    v2 = (v2 + v7 + m[SIGMA[s + 13]]) | 0; v13 ^= v2; v13 = (v13 >>> 8) | (v13 << 24);
    v8 = (v8 + v13) | 0; v7 ^= v8; v7 = (v7 >>> 7) | (v7 << 25);
    v3 = (v3 + v4 + m[SIGMA[s + 14]]) | 0; v14 ^= v3; v14 = (v14 >>> 16) | (v14 << 16);
    v9 = (v9 + v14) | 0; v4 ^= v9; v4 = (v4 >>> 12) | (v4 << 20);
    v3 = (v3 + v4 + m[SIGMA[s + 15]]) | 0; v14 ^= v3; v14 = (v14 >>> 8) | (v14 << 24);
    v9 = (v9 + v14) | 0; v4 ^= v9; v4 = (v4 >>> 7) | (v4 << 25);
  }
  state[0] ^= v0 ^ v8; state[1] ^= v1 ^ v9; state[2] ^= v2 ^ v10; state[3] ^= v3 ^ v11;
  state[4] ^= v4 ^ v12; state[5] ^= v5 ^ v13; state[6] ^= v6 ^ v14; state[7] ^= v7 ^ v15;
}

/** Loads up to 64 bytes of `data` from `at` into `m`, zero-padded. */
function load(data: Uint8Array, at: number, end: number): void {
  if (end - at >= BLOCK) {
    for (let i = 0, p = at; i < 16; i++, p += 4) m[i] = data[p] | (data[p + 1] << 8) | (data[p + 2] << 16) | (data[p + 3] << 24);
    return;
  }
  m.fill(0);
  for (let p = at; p < end; p++) m[(p - at) >> 2] |= data[p] << (((p - at) & 3) * 8);
}

export class KeyedMac {
  /** The state after the key block. */
  private readonly keyed = new Int32Array(8);
  /** The zero-padded key block, for the one case where it is also the last block (empty data). */
  private readonly keyBlock = new Uint8Array(BLOCK);
  private readonly parameter: number;

  /** `key`: 1 to 32 bytes (WireGuard: 32 for mac1, 16 for a cookie). Copied. */
  constructor(key: Uint8Array) {
    if (key.length < 1 || key.length > 32) throw new RangeError(`a BLAKE2s key has 1 to 32 bytes, got ${key.length}`);
    this.keyBlock.set(key);
    // Parameter block: digest length, key length, fanout 1, depth 1.
    this.parameter = 0x01010000 ^ (key.length << 8) ^ OUT_BYTES;
    this.keyed.set(IV);
    this.keyed[0] ^= this.parameter;
    load(this.keyBlock, 0, BLOCK);
    compress(this.keyed, BLOCK, false);
  }

  /** The 16-byte MAC of `data` (a new array). */
  mac(data: Uint8Array): Uint8Array {
    this.run(data);
    return result.slice();
  }

  /** Whether `data`'s MAC equals the 16 bytes of `expected` at `offset`. Constant time in the bytes compared. */
  verify(data: Uint8Array, expected: Uint8Array, offset: number): boolean {
    this.run(data);
    return constantTimeEqual(result, expected.subarray(offset, offset + OUT_BYTES));
  }

  /** Wipes the key material (the object must not be used afterwards). */
  destroy(): void {
    this.keyed.fill(0);
    this.keyBlock.fill(0);
  }

  private run(data: Uint8Array): void {
    const length = data.length;
    if (length === 0) {
      h.set(IV);
      h[0] ^= this.parameter;
      load(this.keyBlock, 0, BLOCK);
      compress(h, BLOCK, true);
    } else {
      h.set(this.keyed);
      let at = 0;
      while (length - at > BLOCK) {
        load(data, at, length);
        at += BLOCK;
        compress(h, BLOCK + at, false);
      }
      load(data, at, length);
      compress(h, BLOCK + length, true);
    }
    for (let i = 0; i < 4; i++) {
      const w = h[i];
      result[4 * i] = w; result[4 * i + 1] = w >>> 8; result[4 * i + 2] = w >>> 16; result[4 * i + 3] = w >>> 24;
    }
    m.fill(0);
    h.fill(0);
  }
}
