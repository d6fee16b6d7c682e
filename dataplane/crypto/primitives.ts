/**
 * The cryptographic primitives WireGuard needs, as one narrow interface.
 *
 * Several providers implement it (portable JavaScript, node:crypto, libsodium through FFI, ...).
 * A provider may implement only some primitives; `select.ts` composes the fastest available
 * implementation of each primitive into one complete `Crypto`. Every provider must pass the same
 * known-answer tests (test/crypto-vectors.test.ts) for every primitive it claims.
 *
 * Conventions (shared by all providers):
 * - Inputs are never modified unless they are also passed as `out`.
 * - `out`, when given, receives the result; it may be the same memory as the input (in-place
 *   seal/open): providers must handle exact aliasing (same buffer, same offset).
 * - Functions that can fail on attacker-controlled input (AEAD open, X25519 with a low-order
 *   point) report failure through their return value, never by throwing.
 */

export const KEY_SIZE = 32;
export const TAG_SIZE = 16;
export const HASH_SIZE = 32;
export const MAC_SIZE = 16;
export const AEAD_NONCE_SIZE = 12;
export const XAEAD_NONCE_SIZE = 24;

export interface Aead {
  /**
   * ChaCha20-Poly1305 (RFC 8439) seal. `nonce` is 12 bytes. Writes ciphertext followed by the
   * 16-byte tag into `out` (length >= plaintext.length + 16) and returns the written view.
   */
  seal(key: Uint8Array, nonce: Uint8Array, plaintext: Uint8Array, ad: Uint8Array | undefined, out?: Uint8Array): Uint8Array;
  /**
   * ChaCha20-Poly1305 open. `sealed` is ciphertext followed by the tag. Returns the plaintext view
   * (written into `out` when given), or null when authentication fails or `sealed` is too short.
   */
  open(key: Uint8Array, nonce: Uint8Array, sealed: Uint8Array, ad: Uint8Array | undefined, out?: Uint8Array): Uint8Array | null;
  /**
   * Optional: seals `count` messages in place, one per slot of `stride` bytes in `data`, each of
   * lengths[i] bytes at `offset` in its slot with the transport nonce of counters[i], the tag
   * after it (aead-slots.ts, whose reference form any provider without its own gets).
   */
  sealSlots?(key: Uint8Array, data: Uint8Array, stride: number, offset: number, count: number, lengths: Int32Array, counters: Float64Array): void;
  /**
   * Optional: opens `count` messages in place, laid out as for sealSlots; lengths[i] (ciphertext
   * and tag) becomes the plaintext length, or -1 when the message does not authenticate.
   */
  openSlots?(key: Uint8Array, data: Uint8Array, stride: number, offset: number, count: number, lengths: Int32Array, counters: Float64Array): void;
}

/** An Aead with both slot forms (what selection hands out: aead-slots.ts withSlots). */
export type SlotAead = Required<Aead>;

export interface XAead {
  /** XChaCha20-Poly1305 seal with a 24-byte nonce (cookie replies only). */
  xseal(key: Uint8Array, nonce: Uint8Array, plaintext: Uint8Array, ad: Uint8Array | undefined): Uint8Array;
  /** XChaCha20-Poly1305 open; null when authentication fails. */
  xopen(key: Uint8Array, nonce: Uint8Array, sealed: Uint8Array, ad: Uint8Array | undefined): Uint8Array | null;
}

export interface Dh {
  /** X25519 public key of a (clamped or not: X25519 clamps internally) private key. */
  publicKey(privateKey: Uint8Array): Uint8Array;
  /** X25519 shared secret, or null when the result is all zero (low-order point). */
  sharedSecret(privateKey: Uint8Array, publicKey: Uint8Array): Uint8Array | null;
  /**
   * Optional. `next` becomes a long-lived private key (a device's static key, used in many DH),
   * which the provider may keep in a prepared form; `previous` is no longer used, and the
   * provider forgets it and wipes its copies. Private keys never announced here (ephemeral
   * ones) must not be kept, in any form, past the call that uses them.
   */
  replaceStaticKey?(next: Uint8Array | undefined, previous: Uint8Array | undefined): void;
}

export interface Hashes {
  /** BLAKE2s-256 of the concatenation of `parts`. */
  hash(...parts: Uint8Array[]): Uint8Array;
  /** HMAC-BLAKE2s-256 (64-byte block) of the concatenation of `parts`. */
  hmac(key: Uint8Array, ...parts: Uint8Array[]): Uint8Array;
  /** Keyed BLAKE2s with a 16-byte output (the whitepaper's MAC; key = BLAKE2s key parameter). */
  mac(key: Uint8Array, data: Uint8Array): Uint8Array;
}

export interface Random {
  randomBytes(n: number): Uint8Array;
}

/** A complete set of primitives, with the provider each one came from (for logs and benchmarks). */
export interface Crypto extends SlotAead, XAead, Dh, Hashes, Random {
  readonly providers: Readonly<Record<PrimitiveName, string>>;
}

export type PrimitiveName = 'aead' | 'xaead' | 'dh' | 'hashes' | 'random';

/** What a provider offers: any subset of the primitive groups, under a name. */
export interface CryptoProvider {
  readonly name: string;
  readonly aead?: Aead;
  readonly xaead?: XAead;
  readonly dh?: Dh;
  readonly hashes?: Hashes;
  readonly random?: Random;
}

/** Writes the WireGuard transport nonce (4 zero bytes, then the 64-bit little-endian counter). */
export function writeCounterNonce(counter: number, nonce: Uint8Array = new Uint8Array(AEAD_NONCE_SIZE)): Uint8Array {
  nonce[0] = nonce[1] = nonce[2] = nonce[3] = 0;
  const lo = counter >>> 0;
  const hi = Math.floor(counter / 0x1_0000_0000) >>> 0;
  nonce[4] = lo & 0xff; nonce[5] = (lo >>> 8) & 0xff; nonce[6] = (lo >>> 16) & 0xff; nonce[7] = lo >>> 24;
  nonce[8] = hi & 0xff; nonce[9] = (hi >>> 8) & 0xff; nonce[10] = (hi >>> 16) & 0xff; nonce[11] = hi >>> 24;
  return nonce;
}
