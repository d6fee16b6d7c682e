/**
 * The ChaCha20-Poly1305 wrapper shared by the providers that reach a C library through the FFI
 * (libsodium-ffi, openssl-ffi): the argument checks with descriptive errors, the output buffer
 * (the caller's, or a new one of the exact size) and the exact-length views returned. Each
 * provider supplies only its two native calls.
 */
import { AEAD_NONCE_SIZE, KEY_SIZE, TAG_SIZE, type Aead } from './primitives.ts';

/** A provider's native calls, made once the inputs are checked and `out` is large enough. */
export interface AeadCalls {
  /** Writes the ciphertext, then the 16-byte tag, into `out` (plaintext.length + 16 bytes); false when the library failed. */
  seal(key: Uint8Array, nonce: Uint8Array, plaintext: Uint8Array, ad: Uint8Array | null, out: Uint8Array): boolean;
  /** Writes the plaintext of `sealed` (ciphertext ‖ tag) into `out`; false when the tag does not verify. */
  open(key: Uint8Array, nonce: Uint8Array, sealed: Uint8Array, ad: Uint8Array | null, out: Uint8Array): boolean;
}

export function requireLength(provider: string, what: string, value: Uint8Array, expected: number): void {
  if (!(value instanceof Uint8Array)) throw new TypeError(`${provider}: ${what} must be a Uint8Array`);
  if (value.length !== expected) throw new RangeError(`${provider}: ${what} must be ${expected} bytes, got ${value.length}`);
}

export function aeadOverFfi(provider: string, calls: AeadCalls): Aead {
  return {
    seal(key, nonce, plaintext, ad, out) {
      requireLength(provider, 'ChaCha20-Poly1305 key', key, KEY_SIZE);
      requireLength(provider, 'ChaCha20-Poly1305 nonce', nonce, AEAD_NONCE_SIZE);
      const total = plaintext.length + TAG_SIZE;
      if (out !== undefined && out.length < total) throw new RangeError(`${provider}: seal output buffer needs ${total} bytes, got ${out.length}`);
      const dst = out ?? new Uint8Array(total);
      if (!calls.seal(key, nonce, plaintext, ad ?? null, dst)) throw new Error(`${provider}: ChaCha20-Poly1305 seal failed in the library`);
      return dst.length === total ? dst : dst.subarray(0, total);
    },
    open(key, nonce, sealed, ad, out) {
      requireLength(provider, 'ChaCha20-Poly1305 key', key, KEY_SIZE);
      requireLength(provider, 'ChaCha20-Poly1305 nonce', nonce, AEAD_NONCE_SIZE);
      if (sealed.length < TAG_SIZE) return null;
      const n = sealed.length - TAG_SIZE;
      if (out !== undefined && out.length < n) throw new RangeError(`${provider}: open output buffer needs ${n} bytes, got ${out.length}`);
      const dst = out ?? new Uint8Array(n);
      if (!calls.open(key, nonce, sealed, ad ?? null, dst)) return null;
      return dst.length === n ? dst : dst.subarray(0, n);
    },
  };
}
