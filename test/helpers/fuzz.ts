/**
 * Hostile datagrams for the robustness tests: random bytes and mutations of genuine WireGuard
 * messages (bit flips, truncation, extension, swapped receiver indices, impossible counters),
 * plus handshake messages with a correct mac1 for a victim's public key, which reach the
 * expensive path. Everything is drawn from a seeded PRNG so a failure can be replayed.
 *
 * Used in process by test/unit/robustness-*.test.ts and over UDP by the hostile helper process of
 * the system tests (test/system/hostile-peer.ts). No I/O here.
 */
import type { Crypto } from '../../dataplane/crypto/primitives.ts';
import { LABEL_MAC1 } from '../../dataplane/noise/cookie.ts';

export type Rng = () => number;

/** A whole number in [0, n). */
export function randInt(rng: Rng, n: number): number {
  return Math.floor(rng() * n);
}

/** `n` bytes from the PRNG (four per draw). */
export function randomBytes(rng: Rng, n: number): Uint8Array {
  const out = new Uint8Array(n);
  const words = new Uint32Array(out.buffer, 0, n >>> 2);
  for (let i = 0; i < words.length; i++) words[i] = rng() * 0x1_0000_0000;
  for (let i = words.length * 4; i < n; i++) out[i] = rng() * 256;
  return out;
}

/** A copy of `src` with 1..maxFlips single-bit flips at random positions in [from, src.length). */
export function flipBits(rng: Rng, src: Uint8Array, maxFlips = 4, from = 0): Uint8Array {
  const out = src.slice();
  const flips = 1 + randInt(rng, maxFlips);
  let changed = false;
  for (let i = 0; i < flips; i++) {
    const at = from + randInt(rng, out.length - from);
    out[at] ^= 1 << randInt(rng, 8);
  }
  for (let i = 0; i < out.length; i++) if (out[i] !== src[i]) { changed = true; break; }
  if (!changed) out[from] ^= 0x80; // an even number of flips on one bit cancelled out
  return out;
}

/** A strict prefix of `src` (possibly empty). */
export function truncate(rng: Rng, src: Uint8Array): Uint8Array {
  return src.slice(0, randInt(rng, src.length));
}

/** `src` followed by 1..maxExtra random bytes. */
export function extend(rng: Rng, src: Uint8Array, maxExtra = 64): Uint8Array {
  const extra = 1 + randInt(rng, maxExtra);
  const out = new Uint8Array(src.length + extra);
  out.set(src);
  out.set(randomBytes(rng, extra), src.length);
  return out;
}

export function readU32le(buf: Uint8Array, at: number): number {
  return (buf[at] | (buf[at + 1] << 8) | (buf[at + 2] << 16) | (buf[at + 3] << 24)) >>> 0;
}

export function writeU32le(buf: Uint8Array, at: number, value: number): void {
  buf[at] = value; buf[at + 1] = value >>> 8; buf[at + 2] = value >>> 16; buf[at + 3] = value >>> 24;
}

/** The mac1 key for messages to the holder of `publicKey`: HASH("mac1----" ‖ publicKey). */
export function mac1KeyFor(crypto: Crypto, publicKey: Uint8Array): Uint8Array {
  return crypto.hash(LABEL_MAC1, publicKey);
}

/** Writes a correct mac1 (and a zero mac2) into the last 32 bytes of a handshake message. */
export function writeMac1(crypto: Crypto, mac1Key: Uint8Array, message: Uint8Array): Uint8Array {
  const at = message.length - 32;
  message.set(crypto.mac(mac1Key, message.subarray(0, at)), at);
  message.fill(0, at + 16);
  return message;
}

/** Whether the message carries a correct mac1 for `mac1Key`. */
export function hasValidMac1(crypto: Crypto, mac1Key: Uint8Array, message: Uint8Array): boolean {
  if (message.length < 32) return false;
  const at = message.length - 32;
  const expected = crypto.mac(mac1Key, message.subarray(0, at));
  for (let i = 0; i < 16; i++) if (expected[i] !== message[at + i]) return false;
  return true;
}

/** A handshake message of `type` (1: 148 bytes, 2: 92 bytes) with a random body and a correct mac1. */
export function garbageHandshake(crypto: Crypto, rng: Rng, mac1Key: Uint8Array, type: 1 | 2): Uint8Array {
  const message = randomBytes(rng, type === 1 ? 148 : 92);
  message[0] = type; message[1] = 0; message[2] = 0; message[3] = 0;
  return writeMac1(crypto, mac1Key, message);
}

/**
 * Random bytes of a random length in [0, maxLength], shaped at random: fully random, or with a
 * WireGuard type header (1..4, three zero bytes) and often one of the exact message lengths.
 */
export function randomDatagram(rng: Rng, maxLength = 1600): Uint8Array {
  const shaped = rng() < 0.5;
  let length: number;
  if (shaped && rng() < 0.5) length = [148, 92, 64, 32, 48][randInt(rng, 5)];
  else length = randInt(rng, rng() < 0.5 ? 64 : maxLength + 1);
  const out = randomBytes(rng, length);
  if (shaped && length >= 4) {
    out[0] = 1 + randInt(rng, 4); out[1] = 0; out[2] = 0; out[3] = 0;
  }
  return out;
}

/**
 * The drop reason the message-shape check gives a datagram (type byte, three zero bytes, exact
 * length per type), stated independently of dataplane/noise/messages.ts; undefined when the
 * shape is that of a valid message.
 */
export function shapeReason(d: Uint8Array): 'too-short' | 'unknown-type' | 'bad-length' | undefined {
  if (d.length < 32) return 'too-short';
  if (d[1] !== 0 || d[2] !== 0 || d[3] !== 0) return 'unknown-type';
  switch (d[0]) {
    case 1: return d.length === 148 ? undefined : 'bad-length';
    case 2: return d.length === 92 ? undefined : 'bad-length';
    case 3: return d.length === 64 ? undefined : 'bad-length';
    case 4: return undefined;
    default: return 'unknown-type';
  }
}

/** Weighted choice among `[name, weight]` entries. */
export function weighted<T extends string>(rng: Rng, table: ReadonlyArray<readonly [T, number]>): T {
  let total = 0;
  for (const [, w] of table) total += w;
  let x = rng() * total;
  for (const [name, w] of table) {
    x -= w;
    if (x < 0) return name;
  }
  return table[table.length - 1][0];
}
