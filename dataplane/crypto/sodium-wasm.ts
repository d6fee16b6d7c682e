/**
 * Provider "sodium-wasm": libsodium compiled to WebAssembly (npm libsodium-wrappers).
 *
 * Why: a fallback for machines without the system libsodium. It is several times faster than the
 * portable JavaScript provider for AEAD and X25519 and brings XChaCha20-Poly1305, but every call
 * copies inputs into the WebAssembly heap and the result back out, so it is slower than calling
 * the native library through FFI. Like native libsodium it has no BLAKE2s (BLAKE2b only), so it
 * offers no hashes group.
 *
 * libsodium-wrappers reports failures (bad tag, low-order point) by throwing; this file turns them
 * into the null results primitives.ts requires. Loading never throws.
 */

import {
  AEAD_NONCE_SIZE, KEY_SIZE, TAG_SIZE, XAEAD_NONCE_SIZE,
  type Aead, type CryptoProvider, type Dh, type Random, type XAead,
} from './primitives.ts';

type Sodium = typeof import('libsodium-wrappers').default;

function requireLength(what: string, value: Uint8Array, expected: number): void {
  if (!(value instanceof Uint8Array)) throw new TypeError(`sodium-wasm: ${what} must be a Uint8Array`);
  if (value.length !== expected) {
    throw new RangeError(`sodium-wasm: ${what} must be ${expected} bytes, got ${value.length}`);
  }
}

/** The wrappers return fresh arrays, so copying into `out` afterwards makes exact aliasing safe. */
function deliver(result: Uint8Array, out: Uint8Array | undefined, op: string): Uint8Array {
  if (out === undefined) return result;
  if (out.length < result.length) {
    throw new RangeError(`sodium-wasm: ${op} output buffer needs ${result.length} bytes, got ${out.length}`);
  }
  out.set(result, 0);
  return out.length === result.length ? out : out.subarray(0, result.length);
}

function makeAead(s: Sodium): Aead {
  return {
    seal(key, nonce, plaintext, ad, out) {
      requireLength('ChaCha20-Poly1305 key', key, KEY_SIZE);
      requireLength('ChaCha20-Poly1305 nonce', nonce, AEAD_NONCE_SIZE);
      if (out !== undefined && out.length < plaintext.length + TAG_SIZE) {
        throw new RangeError(`sodium-wasm: seal output buffer needs ${plaintext.length + TAG_SIZE} bytes, got ${out.length}`);
      }
      return deliver(s.crypto_aead_chacha20poly1305_ietf_encrypt(plaintext, ad ?? null, null, nonce, key), out, 'seal');
    },
    open(key, nonce, sealed, ad, out) {
      requireLength('ChaCha20-Poly1305 key', key, KEY_SIZE);
      requireLength('ChaCha20-Poly1305 nonce', nonce, AEAD_NONCE_SIZE);
      if (sealed.length < TAG_SIZE) return null;
      if (out !== undefined && out.length < sealed.length - TAG_SIZE) {
        throw new RangeError(`sodium-wasm: open output buffer needs ${sealed.length - TAG_SIZE} bytes, got ${out.length}`);
      }
      let pt: Uint8Array;
      try {
        pt = s.crypto_aead_chacha20poly1305_ietf_decrypt(null, sealed, ad ?? null, nonce, key);
      } catch {
        return null; // "ciphertext cannot be decrypted using that key"
      }
      return deliver(pt, out, 'open');
    },
  };
}

function makeXAead(s: Sodium): XAead {
  return {
    xseal(key, nonce, plaintext, ad) {
      requireLength('XChaCha20-Poly1305 key', key, KEY_SIZE);
      requireLength('XChaCha20-Poly1305 nonce', nonce, XAEAD_NONCE_SIZE);
      return s.crypto_aead_xchacha20poly1305_ietf_encrypt(plaintext, ad ?? null, null, nonce, key);
    },
    xopen(key, nonce, sealed, ad) {
      requireLength('XChaCha20-Poly1305 key', key, KEY_SIZE);
      requireLength('XChaCha20-Poly1305 nonce', nonce, XAEAD_NONCE_SIZE);
      if (sealed.length < TAG_SIZE) return null;
      try {
        return s.crypto_aead_xchacha20poly1305_ietf_decrypt(null, sealed, ad ?? null, nonce, key);
      } catch {
        return null;
      }
    },
  };
}

/** The compiled module under the wrappers: its heap and the raw C functions. */
interface SodiumModule {
  HEAPU8: Uint8Array;
  _malloc(size: number): number;
  _crypto_scalarmult(q: number, n: number, p: number): number;
  _crypto_scalarmult_base(q: number, n: number): number;
}

/**
 * X25519 on the raw module rather than the wrappers: the wrappers copy the private key into a
 * heap block and free it without clearing it, which leaves every private key used (each
 * handshake's ephemeral key among them) and every shared secret in free heap memory until
 * something happens to overwrite it. Here one block, allocated once, holds the private key, the
 * public key and the result, and is zeroed after every call.
 */
function makeDh(s: Sodium): Dh {
  const m = (s as unknown as { libsodium: SodiumModule }).libsodium;
  const block = m._malloc(3 * KEY_SIZE);
  if (block === 0) throw new Error('sodium-wasm: _malloc failed');
  const n = block, p = block + KEY_SIZE, q = block + 2 * KEY_SIZE;
  // m.HEAPU8 is read at each use: the heap's buffer is replaced when it grows.
  const clear = () => m.HEAPU8.fill(0, block, block + 3 * KEY_SIZE);
  const result = (): Uint8Array => m.HEAPU8.slice(q, q + KEY_SIZE);
  return {
    publicKey(privateKey) {
      requireLength('X25519 private key', privateKey, KEY_SIZE);
      try {
        m.HEAPU8.set(privateKey, n);
        if (m._crypto_scalarmult_base(q, n) !== 0) throw new Error('sodium-wasm: crypto_scalarmult_base failed');
        return result();
      } finally {
        clear();
      }
    },
    sharedSecret(privateKey, publicKey) {
      requireLength('X25519 private key', privateKey, KEY_SIZE);
      requireLength('X25519 public key', publicKey, KEY_SIZE);
      try {
        m.HEAPU8.set(privateKey, n);
        m.HEAPU8.set(publicKey, p);
        // -1 for a small-order point (an all-zero result).
        return m._crypto_scalarmult(q, n, p) === 0 ? result() : null;
      } finally {
        clear();
      }
    },
  };
}

function makeRandom(s: Sodium): Random {
  return {
    randomBytes(n) {
      if (!Number.isSafeInteger(n) || n < 0) throw new RangeError(`sodium-wasm: randomBytes length must be a non-negative integer, got ${n}`);
      return n === 0 ? new Uint8Array(0) : s.randombytes_buf(n);
    },
  };
}

export interface SodiumWasmLoad {
  provider?: CryptoProvider;
  reason?: string;
}

let loaded: Promise<SodiumWasmLoad> | undefined;

/** Instantiates the WebAssembly module once per process; never rejects. */
export function loadSodiumWasm(): Promise<SodiumWasmLoad> {
  loaded ??= (async (): Promise<SodiumWasmLoad> => {
    try {
      const s = (await import('libsodium-wrappers')).default;
      await s.ready;
      return {
        provider: { name: 'sodium-wasm', aead: makeAead(s), xaead: makeXAead(s), dh: makeDh(s), random: makeRandom(s) },
      };
    } catch (err) {
      return { reason: err instanceof Error ? err.message : String(err) };
    }
  })();
  return loaded;
}
