/**
 * WireGuard keys: 32-byte Curve25519 keys, written as base64 (wg's files and CLI) or lowercase
 * hex (the control socket protocol).
 */
import type { Crypto } from '../crypto/primitives.ts';

export const KEY_LENGTH = 32;

/** Curve25519 private-key clamping, as every WireGuard implementation stores keys. */
export function clampPrivateKey(key: Uint8Array): Uint8Array {
  const out = Uint8Array.from(key);
  out[0] &= 248;
  out[31] = (out[31] & 127) | 64;
  return out;
}

export function generatePrivateKey(crypto: Pick<Crypto, 'randomBytes'>): Uint8Array {
  const random = crypto.randomBytes(KEY_LENGTH);
  const key = clampPrivateKey(random);
  random.fill(0); // the unclamped copy is (nearly) the key too
  return key;
}

/** Overwrites secrets that are no longer used with zeros (null and undefined are skipped). */
export function wipe(...secrets: (Uint8Array | null | undefined)[]): void {
  for (const secret of secrets) secret?.fill(0);
}

export function isZeroKey(key: Uint8Array): boolean {
  let acc = 0;
  for (let i = 0; i < key.length; i++) acc |= key[i];
  return acc === 0;
}

/** Constant-time equality of two byte strings of the same length. */
export function constantTimeEqual(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  let acc = 0;
  for (let i = 0; i < a.length; i++) acc |= a[i] ^ b[i];
  return acc === 0;
}

export function keyToBase64(key: Uint8Array): string {
  return Buffer.from(key.buffer, key.byteOffset, key.byteLength).toString('base64');
}

export function keyFromBase64(text: string): Uint8Array {
  const trimmed = text.trim();
  if (!/^[A-Za-z0-9+/]{43}=$/.test(trimmed)) throw new Error('a key must be 32 bytes in base64 (44 characters ending in "=")');
  return new Uint8Array(Buffer.from(trimmed, 'base64'));
}

export function keyToHex(key: Uint8Array): string {
  return Buffer.from(key.buffer, key.byteOffset, key.byteLength).toString('hex');
}

export function keyFromHex(text: string): Uint8Array {
  if (!/^[0-9a-fA-F]{64}$/.test(text)) throw new Error('a key must be 32 bytes in hex (64 hex digits)');
  return new Uint8Array(Buffer.from(text, 'hex'));
}

/** A short, non-secret label for a public key in logs: the first 8 base64 characters. */
export function shortKey(publicKey: Uint8Array): string {
  return keyToBase64(publicKey).slice(0, 8);
}
