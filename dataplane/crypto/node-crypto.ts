/**
 * Provider "node:crypto": the runtime's built-in crypto module (OpenSSL 3 on Node, BoringSSL on Bun).
 *
 * What each runtime offers (probed at load, never assumed from the runtime name):
 * - ChaCha20-Poly1305: Node lists 'chacha20-poly1305'; Bun does not (BoringSSL exposes it only
 *   through its EVP_AEAD API, which Bun's node:crypto does not wrap), so Bun gets no aead here.
 * - BLAKE2s-256: createHash('blake2s256') works on both (Bun does not list it in getHashes()
 *   although it supports it, so we probe by calling it).
 * - HMAC-BLAKE2s: createHmac('blake2s256') works on Node; Bun refuses it ("Invalid digest"), so
 *   there we build HMAC (RFC 2104) on top of the native hash.
 * - Keyed BLAKE2s-128 (WireGuard's MAC): neither runtime has it, so `hashes.mac` is portable's
 *   (select.ts reports the hashes group as "node:crypto+portable").
 * - XChaCha20-Poly1305: absent on both; not offered.
 * - X25519: crypto.diffieHellman on KeyObjects built from raw keys (private: RFC 8410 PKCS#8 DER
 *   prefix; public: JWK, see publicKeyObject for why).
 */

import * as nodeCrypto from 'node:crypto';
import type { KeyObject } from 'node:crypto';
import {
  AEAD_NONCE_SIZE, KEY_SIZE, TAG_SIZE,
  type Aead, type CryptoProvider, type Dh, type Hashes, type Random,
} from './primitives.ts';
import { isAllZero, portableProvider } from './portable.ts';

const CIPHER = 'chacha20-poly1305';
const HASH = 'blake2s256';
const HMAC_BLOCK = 64;

function requireLength(what: string, value: Uint8Array, expected: number): void {
  if (!(value instanceof Uint8Array)) throw new TypeError(`node:crypto: ${what} must be a Uint8Array`);
  if (value.length !== expected) {
    throw new RangeError(`node:crypto: ${what} must be ${expected} bytes, got ${value.length}`);
  }
}

/**
 * Returns a plain Uint8Array view of a Buffer's bytes. Callers get the documented type, not a
 * Buffer: Buffer#slice makes a view while Uint8Array#slice copies, and mixing them up is a bug
 * waiting to happen. No bytes are copied.
 */
function plain(buf: Buffer): Uint8Array {
  return new Uint8Array(buf.buffer, buf.byteOffset, buf.length);
}

// --- ChaCha20-Poly1305 --------------------------------------------------------------------------

/**
 * A cipher object per packet is unavoidable with this API (key and nonce are fixed at creation),
 * and update() always returns a fresh Buffer. That fresh buffer is what makes in-place operation
 * safe: the input is fully read before anything is copied into `out`.
 */
function makeAead(): Aead {
  const cipherOptions = { authTagLength: TAG_SIZE } as const;
  return {
    seal(key, nonce, plaintext, ad, out) {
      requireLength('ChaCha20-Poly1305 key', key, KEY_SIZE);
      requireLength('ChaCha20-Poly1305 nonce', nonce, AEAD_NONCE_SIZE);
      const n = plaintext.length;
      const total = n + TAG_SIZE;
      if (out !== undefined && out.length < total) {
        throw new RangeError(`node:crypto: seal output buffer needs ${total} bytes, got ${out.length}`);
      }
      const cipher = nodeCrypto.createCipheriv(CIPHER, key, nonce, cipherOptions);
      if (ad !== undefined && ad.length > 0) cipher.setAAD(ad, { plaintextLength: n });
      const ct = cipher.update(plaintext);
      cipher.final(); // a stream cipher: produces no further bytes, but computes the tag
      const tag = cipher.getAuthTag();
      const dst = out ?? new Uint8Array(total);
      dst.set(ct, 0);
      dst.set(tag, n);
      return dst.length === total ? dst : dst.subarray(0, total);
    },
    open(key, nonce, sealed, ad, out) {
      requireLength('ChaCha20-Poly1305 key', key, KEY_SIZE);
      requireLength('ChaCha20-Poly1305 nonce', nonce, AEAD_NONCE_SIZE);
      if (sealed.length < TAG_SIZE) return null;
      const n = sealed.length - TAG_SIZE;
      if (out !== undefined && out.length < n) {
        throw new RangeError(`node:crypto: open output buffer needs ${n} bytes, got ${out.length}`);
      }
      const decipher = nodeCrypto.createDecipheriv(CIPHER, key, nonce, cipherOptions);
      decipher.setAuthTag(sealed.subarray(n));
      if (ad !== undefined && ad.length > 0) decipher.setAAD(ad, { plaintextLength: n });
      const pt = decipher.update(sealed.subarray(0, n));
      try {
        decipher.final(); // throws when the tag does not verify
      } catch {
        pt.fill(0); // never release unauthenticated plaintext
        return null;
      }
      if (out === undefined) return plain(pt);
      out.set(pt, 0);
      return out.length === n ? out : out.subarray(0, n);
    },
  };
}

// --- X25519 -------------------------------------------------------------------------------------

// RFC 8410 DER wrapper for raw X25519 private keys; the 32 key bytes follow the prefix.
const PKCS8_PREFIX = Buffer.from('302e020100300506032b656e04220420', 'hex');
const SPKI_PREFIX_LENGTH = 12; // '302a300506032b656e032100', in front of an exported public key

/**
 * Scratch DER buffer, reused so that building a private KeyObject does not allocate a
 * Buffer.concat each time. JavaScript runs these functions to completion, so reuse cannot
 * interleave. It is wiped right after use: the KeyObject keeps its own copy.
 */
const pkcs8Scratch = Buffer.alloc(PKCS8_PREFIX.length + KEY_SIZE);
PKCS8_PREFIX.copy(pkcs8Scratch, 0);

function privateKeyObject(raw: Uint8Array): KeyObject {
  pkcs8Scratch.set(raw, PKCS8_PREFIX.length);
  try {
    return nodeCrypto.createPrivateKey({ key: pkcs8Scratch, format: 'der', type: 'pkcs8' });
  } finally {
    pkcs8Scratch.fill(0, PKCS8_PREFIX.length);
  }
}

/**
 * Public keys are imported as JWK rather than SPKI DER: measured on Node 20 (OpenSSL 3), SPKI
 * decoding manages ~9.6k keys/s against ~74k/s for JWK, which made key import cost more than the
 * scalar multiplication (~23k/s). On Bun both are far faster than the multiplication. Private
 * keys stay on the DER path even though JWK would be faster there too: a JWK needs the secret as
 * a base64 string, which cannot be wiped from the heap; the static-key cache below hides the cost
 * where it matters.
 */
function publicKeyObject(raw: Uint8Array): KeyObject {
  const x = Buffer.from(raw.buffer, raw.byteOffset, raw.length).toString('base64url');
  return nodeCrypto.createPublicKey({ key: { kty: 'OKP', crv: 'X25519', x }, format: 'jwk' });
}

/**
 * The static private keys announced with replaceStaticKey, as KeyObjects: OpenSSL 3's PKCS#8
 * decoder is slow (~2k keys/s on Node 20, ten times slower than the multiplication), and a
 * device's static key takes part in every handshake. A few entries (several devices may share a
 * process); a replaced or evicted key's raw copy is wiped and its KeyObject dropped. Ephemeral
 * keys are never kept: each call builds its KeyObject and lets it go, so no copy of an ephemeral
 * key outlives the call (a handshake decodes its ephemeral key two or three times instead of once).
 */
const STATIC_KEYS = 4;
const staticKeys: { raw: Uint8Array; obj: KeyObject }[] = [];

function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  let diff = 0; // no early exit: the compared bytes are secret
  for (let i = 0; i < a.length; i++) diff |= a[i] ^ b[i];
  return diff === 0;
}

function privateKeyObjectFor(raw: Uint8Array): KeyObject {
  for (const entry of staticKeys) if (sameBytes(entry.raw, raw)) return entry.obj;
  return privateKeyObject(raw);
}

function replaceStaticKey(next: Uint8Array | undefined, previous: Uint8Array | undefined): void {
  if (previous !== undefined) {
    for (let i = staticKeys.length - 1; i >= 0; i--) {
      if (sameBytes(staticKeys[i].raw, previous)) staticKeys.splice(i, 1)[0].raw.fill(0);
    }
  }
  if (next === undefined || next.length !== KEY_SIZE || staticKeys.some((entry) => sameBytes(entry.raw, next))) return;
  staticKeys.unshift({ raw: Uint8Array.from(next), obj: privateKeyObject(next) });
  if (staticKeys.length > STATIC_KEYS) staticKeys.pop()!.raw.fill(0);
}

/** How many private keys this provider holds (tests: only announced static keys, never ephemeral ones). */
export function heldPrivateKeyCount(): number {
  return staticKeys.length;
}

const dh: Dh = {
  publicKey(privateKey) {
    requireLength('X25519 private key', privateKey, KEY_SIZE);
    const der = nodeCrypto.createPublicKey(privateKeyObjectFor(privateKey)).export({ format: 'der', type: 'spki' });
    return Uint8Array.from(der.subarray(SPKI_PREFIX_LENGTH));
  },
  sharedSecret(privateKey, publicKey) {
    requireLength('X25519 private key', privateKey, KEY_SIZE);
    requireLength('X25519 public key', publicKey, KEY_SIZE);
    let shared: Buffer;
    try {
      shared = nodeCrypto.diffieHellman({ privateKey: privateKeyObjectFor(privateKey), publicKey: publicKeyObject(publicKey) });
    } catch {
      // Lengths were checked above, so a failure here is the library refusing an all-zero result
      // (OpenSSL: ERR_OSSL_FAILED_DURING_DERIVATION; Bun: ERR_CRYPTO_OPERATION_FAILED).
      return null;
    }
    // Belt and braces: should a library ever return the zero secret instead of throwing.
    return isAllZero(shared) ? null : plain(shared);
  },
  replaceStaticKey,
};

// --- BLAKE2s hash and HMAC ----------------------------------------------------------------------

function hash(...parts: Uint8Array[]): Uint8Array {
  const h = nodeCrypto.createHash(HASH);
  for (const p of parts) h.update(p);
  return plain(h.digest());
}

function nativeHmac(key: Uint8Array, ...parts: Uint8Array[]): Uint8Array {
  const h = nodeCrypto.createHmac(HASH, key);
  for (const p of parts) h.update(p);
  return plain(h.digest());
}

/** RFC 2104 HMAC over the native BLAKE2s, for runtimes whose createHmac lacks blake2s256 (Bun). */
const hmacPad = new Uint8Array(HMAC_BLOCK);
function composedHmac(key: Uint8Array, ...parts: Uint8Array[]): Uint8Array {
  const k = key.length > HMAC_BLOCK ? hash(key) : key;
  hmacPad.fill(0);
  hmacPad.set(k);
  for (let i = 0; i < HMAC_BLOCK; i++) hmacPad[i] ^= 0x36;
  const inner = nodeCrypto.createHash(HASH).update(hmacPad);
  for (const p of parts) inner.update(p);
  const innerDigest = inner.digest();
  for (let i = 0; i < HMAC_BLOCK; i++) hmacPad[i] ^= 0x36 ^ 0x5c;
  const outer = nodeCrypto.createHash(HASH).update(hmacPad).update(innerDigest).digest();
  hmacPad.fill(0);
  innerDigest.fill(0);
  if (k !== key) k.fill(0);
  return plain(outer);
}

// --- randomness ---------------------------------------------------------------------------------

const random: Random = {
  randomBytes(n) {
    if (!Number.isSafeInteger(n) || n < 0) throw new RangeError(`node:crypto: randomBytes length must be a non-negative integer, got ${n}`);
    return nodeCrypto.randomFillSync(new Uint8Array(n));
  },
};

// --- probing ------------------------------------------------------------------------------------

function works(fn: () => unknown): boolean {
  try {
    fn();
    return true;
  } catch {
    return false;
  }
}

/** Which groups this runtime's node:crypto can serve, and how. Exposed for diagnostics. */
export interface NodeCryptoCapabilities {
  aead: boolean;
  hash: boolean;
  nativeHmac: boolean;
  x25519: boolean;
}

export function probeNodeCrypto(): NodeCryptoCapabilities {
  const zeros = new Uint8Array(32);
  return {
    aead: nodeCrypto.getCiphers().includes(CIPHER) &&
      works(() => nodeCrypto.createCipheriv(CIPHER, zeros, zeros.subarray(0, 12), { authTagLength: TAG_SIZE })),
    hash: works(() => nodeCrypto.createHash(HASH).update(zeros).digest()),
    nativeHmac: works(() => nodeCrypto.createHmac(HASH, zeros).update(zeros).digest()),
    x25519: works(() => privateKeyObject(new Uint8Array(32).fill(1))),
  };
}

/**
 * Builds the provider with whichever groups this runtime supports. Correctness is checked later by
 * select.ts's known-answer self-test; this only decides what exists.
 */
export function createNodeCryptoProvider(): CryptoProvider {
  const caps = probeNodeCrypto();
  const hashes: Hashes | undefined = caps.hash
    ? { hash, hmac: caps.nativeHmac ? nativeHmac : composedHmac, mac: portableProvider.hashes!.mac }
    : undefined;
  return {
    name: 'node:crypto',
    ...(caps.aead ? { aead: makeAead() } : {}),
    ...(caps.x25519 ? { dh } : {}),
    ...(hashes ? { hashes } : {}),
    random,
  };
}

