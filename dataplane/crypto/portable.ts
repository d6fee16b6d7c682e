/**
 * Provider "portable": every primitive group in plain JavaScript (@stablelib), plus Web Crypto's
 * getRandomValues for randomness.
 *
 * Why it exists: it runs on any runtime with no native code, so it is the fallback for whatever a
 * faster provider does not offer (notably the keyed BLAKE2s-128 MAC and XChaCha20-Poly1305, which
 * neither Node's nor Bun's node:crypto has). It is also the reference the other providers are
 * compared against in the differential tests. It is the slowest provider; select.ts only uses a
 * group from here when nothing faster passed its self-test.
 */

import { ChaCha20Poly1305 } from '@stablelib/chacha20poly1305';
import { XChaCha20Poly1305 } from '@stablelib/xchacha20poly1305';
import { scalarMult, scalarMultBase } from '@stablelib/x25519';
import { BLAKE2s, hash as blake2sOneShot } from '@stablelib/blake2s';
import { HMAC } from '@stablelib/hmac';
import {
  AEAD_NONCE_SIZE, HASH_SIZE, KEY_SIZE, MAC_SIZE, TAG_SIZE, XAEAD_NONCE_SIZE,
  type Aead, type CryptoProvider, type Dh, type Hashes, type Random, type XAead,
} from './primitives.ts';

// --- argument checks (cheap length comparisons; they guard against programming errors, not
// attacker input, so they throw) ---------------------------------------------------------------

function requireLength(what: string, value: Uint8Array, expected: number): void {
  if (!(value instanceof Uint8Array)) throw new TypeError(`portable: ${what} must be a Uint8Array`);
  if (value.length !== expected) {
    throw new RangeError(`portable: ${what} must be ${expected} bytes, got ${value.length}`);
  }
}

/** Returns the first `n` bytes of `out` (or a fresh array), after checking it is large enough. */
function outputView(out: Uint8Array | undefined, n: number, op: string): Uint8Array {
  if (out === undefined) return new Uint8Array(n);
  if (out.length < n) throw new RangeError(`portable: ${op} output buffer needs ${n} bytes, got ${out.length}`);
  // stablelib insists on an exact-length destination.
  return out.length === n ? out : out.subarray(0, n);
}

// --- ChaCha20-Poly1305 --------------------------------------------------------------------------

/**
 * stablelib's documentation says dst and plaintext "must not overlap", but its implementation is
 * safe for *exact* aliasing: the stream cipher reads src[i] before writing dst[i] block by block,
 * seal authenticates the ciphertext after it is written, and open authenticates before decrypting.
 * Exact aliasing is all primitives.ts requires (the in-place tests cover it).
 */
const aead: Aead = {
  seal(key, nonce, plaintext, ad, out) {
    requireLength('ChaCha20-Poly1305 key', key, KEY_SIZE);
    requireLength('ChaCha20-Poly1305 nonce', nonce, AEAD_NONCE_SIZE);
    const dst = outputView(out, plaintext.length + TAG_SIZE, 'seal');
    return new ChaCha20Poly1305(key).seal(nonce, plaintext, ad, dst);
  },
  open(key, nonce, sealed, ad, out) {
    requireLength('ChaCha20-Poly1305 key', key, KEY_SIZE);
    requireLength('ChaCha20-Poly1305 nonce', nonce, AEAD_NONCE_SIZE);
    if (sealed.length < TAG_SIZE) return null;
    const dst = outputView(out, sealed.length - TAG_SIZE, 'open');
    return new ChaCha20Poly1305(key).open(nonce, sealed, ad, dst);
  },
};

// --- XChaCha20-Poly1305 -------------------------------------------------------------------------

const xaead: XAead = {
  xseal(key, nonce, plaintext, ad) {
    requireLength('XChaCha20-Poly1305 key', key, KEY_SIZE);
    requireLength('XChaCha20-Poly1305 nonce', nonce, XAEAD_NONCE_SIZE);
    return new XChaCha20Poly1305(key).seal(nonce, plaintext, ad);
  },
  xopen(key, nonce, sealed, ad) {
    requireLength('XChaCha20-Poly1305 key', key, KEY_SIZE);
    requireLength('XChaCha20-Poly1305 nonce', nonce, XAEAD_NONCE_SIZE);
    if (sealed.length < TAG_SIZE) return null;
    return new XChaCha20Poly1305(key).open(nonce, sealed, ad);
  },
};

// --- X25519 -------------------------------------------------------------------------------------

/** Constant-time "is every byte zero" (no early exit on the first non-zero byte). */
export function isAllZero(bytes: Uint8Array): boolean {
  let acc = 0;
  for (let i = 0; i < bytes.length; i++) acc |= bytes[i];
  return acc === 0;
}

/** stablelib clamps the scalar and masks the top bit of the u-coordinate itself (RFC 7748 §5). */
const dh: Dh = {
  publicKey(privateKey) {
    requireLength('X25519 private key', privateKey, KEY_SIZE);
    return scalarMultBase(privateKey);
  },
  sharedSecret(privateKey, publicKey) {
    requireLength('X25519 private key', privateKey, KEY_SIZE);
    requireLength('X25519 public key', publicKey, KEY_SIZE);
    const shared = scalarMult(privateKey, publicKey);
    // A low-order peer point gives an all-zero secret; WireGuard must reject it.
    return isAllZero(shared) ? null : shared;
  },
};

// --- BLAKE2s ------------------------------------------------------------------------------------

const HMAC_BLOCK_SIZE = 64;

const hashes: Hashes = {
  hash(...parts) {
    const h = new BLAKE2s(HASH_SIZE);
    for (const p of parts) h.update(p);
    const out = h.digest();
    h.clean(); // the state has absorbed the (possibly secret) input
    return out;
  },
  hmac(key, ...parts) {
    // HMAC's block size comes from the hash (64 for BLAKE2s), which is what WireGuard specifies.
    // Keys longer than a block are hashed here rather than by @stablelib/hmac: with BLAKE2s,
    // its long-key path calls BLAKE2s#clean(), which wipes the hash's initial state without
    // resetting it, so the result is wrong (found by the HMAC differential test). Pre-hashing is
    // exactly what RFC 2104 prescribes, and WireGuard's own keys (32 bytes) never take this path.
    const h = new HMAC(BLAKE2s, key.length > HMAC_BLOCK_SIZE ? blake2sOneShot(key, HASH_SIZE) : key);
    for (const p of parts) h.update(p);
    const out = h.digest();
    h.clean(); // its saved inner and outer states are keyed: wipe them (h is not used again)
    return out;
  },
  mac(key, data) {
    // WireGuard uses 32-byte keys (mac1) and 16-byte keys (the cookie, for mac2); BLAKE2s takes
    // 1..32. An empty key would silently degrade to an unkeyed hash, so refuse it.
    if (key.length < 1 || key.length > 32) {
      throw new RangeError(`portable: BLAKE2s MAC key must be 1..32 bytes, got ${key.length}`);
    }
    return blake2sOneShot(data, MAC_SIZE, { key });
  },
};

// --- randomness ---------------------------------------------------------------------------------

/** getRandomValues refuses more than 65536 bytes per call, so larger requests are filled in chunks. */
const MAX_RANDOM_CHUNK = 65536;

const random: Random = {
  randomBytes(n) {
    if (!Number.isSafeInteger(n) || n < 0) throw new RangeError(`portable: randomBytes length must be a non-negative integer, got ${n}`);
    const out = new Uint8Array(n);
    for (let off = 0; off < n; off += MAX_RANDOM_CHUNK) {
      globalThis.crypto.getRandomValues(out.subarray(off, Math.min(n, off + MAX_RANDOM_CHUNK)));
    }
    return out;
  },
};

export const portableProvider: CryptoProvider = {
  name: 'portable',
  aead, xaead, dh, hashes, random,
};

export default portableProvider;
