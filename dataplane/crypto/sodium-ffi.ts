/**
 * Provider "libsodium-ffi": the system libsodium (Debian: libsodium23) called through a foreign
 * function interface — koffi on Node, bun:ffi on Bun.
 *
 * Why: libsodium's ChaCha20-Poly1305 is hand-vectorised C and, called with the caller's own typed
 * arrays, needs no per-packet cipher object or result buffer — unlike node:crypto, which allocates
 * a cipher object and a fresh Buffer per packet. It also brings XChaCha20-Poly1305, which neither
 * runtime has natively. libsodium has no BLAKE2s (only BLAKE2b), so it offers no hashes group.
 *
 * Loading never throws: when the library (or the FFI module) is missing, the loader returns a
 * reason and no provider, and select.ts moves on.
 *
 * The FFI module is imported lazily and only for the current runtime, so Node never resolves
 * 'bun:ffi' and Bun never loads koffi's native addon.
 */

import {
  AEAD_NONCE_SIZE, KEY_SIZE, TAG_SIZE, XAEAD_NONCE_SIZE,
  type Aead, type CryptoProvider, type Dh, type Random, type XAead,
} from './primitives.ts';
import type { BunFfi } from '../sys/libc.ts';
import { isBun } from '../sys/threads.ts';
import { aeadOverFfi, requireLength as requireLengthOf } from './ffi-aead.ts';

/**
 * The libsodium entry points we use, with their C argument order. Both FFI backends expose exactly
 * this shape, so the provider code below is backend-agnostic and calls the native symbol directly
 * (no wrapper closure on the hot path). Pointers are typed arrays (the FFI passes their memory,
 * honouring byteOffset, without copying) or null; lengths are numbers.
 */
interface SodiumSymbols {
  sodium_init(): number;
  /** int (c, clen_p, m, mlen, ad, adlen, nsec, npub, k) — writes ciphertext ‖ 16-byte tag to c. */
  crypto_aead_chacha20poly1305_ietf_encrypt(c: Uint8Array, clenP: null, m: Uint8Array, mlen: number, ad: Uint8Array | null, adlen: number, nsec: null, npub: Uint8Array, k: Uint8Array): number;
  /** int (m, mlen_p, nsec, c, clen, ad, adlen, npub, k) — -1 when the tag does not verify. */
  crypto_aead_chacha20poly1305_ietf_decrypt(m: Uint8Array, mlenP: null, nsec: null, c: Uint8Array, clen: number, ad: Uint8Array | null, adlen: number, npub: Uint8Array, k: Uint8Array): number;
  crypto_aead_xchacha20poly1305_ietf_encrypt(c: Uint8Array, clenP: null, m: Uint8Array, mlen: number, ad: Uint8Array | null, adlen: number, nsec: null, npub: Uint8Array, k: Uint8Array): number;
  crypto_aead_xchacha20poly1305_ietf_decrypt(m: Uint8Array, mlenP: null, nsec: null, c: Uint8Array, clen: number, ad: Uint8Array | null, adlen: number, npub: Uint8Array, k: Uint8Array): number;
  /** int (q, n, p) — nonzero when the result is all zero / p has small order. */
  crypto_scalarmult(q: Uint8Array, n: Uint8Array, p: Uint8Array): number;
  crypto_scalarmult_base(q: Uint8Array, n: Uint8Array): number;
  randombytes_buf(buf: Uint8Array, size: number): void;
}

/** Candidate names, most specific first; the dynamic loader searches its usual paths for bare names. */
function candidateLibraries(explicit: string | undefined): string[] {
  const names = [
    'libsodium.so.23', // Debian/Ubuntu libsodium23 (the runtime package; no -dev needed)
    'libsodium.so.26',
    'libsodium.so',
    '/usr/lib/x86_64-linux-gnu/libsodium.so.23',
    '/usr/lib/aarch64-linux-gnu/libsodium.so.23',
    '/usr/lib64/libsodium.so.23',
    '/usr/local/lib/libsodium.so',
    'libsodium.dylib',
    '/opt/homebrew/lib/libsodium.dylib',
    '/usr/local/lib/libsodium.dylib',
    'libsodium.dll',
  ];
  // An explicit library (ROAMGUARD_LIBSODIUM, for unusual installs) goes first.
  return explicit ? [explicit, ...names] : names;
}

function message(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

// --- koffi (Node) -------------------------------------------------------------------------------

/** C prototypes for koffi; `uint8_t *` parameters accept typed arrays and pass their memory. */
const KOFFI_PROTOTYPES = [
  'int sodium_init(void)',
  'int crypto_aead_chacha20poly1305_ietf_encrypt(uint8_t *c, uint64_t *clen_p, const uint8_t *m, uint64_t mlen, const uint8_t *ad, uint64_t adlen, const uint8_t *nsec, const uint8_t *npub, const uint8_t *k)',
  'int crypto_aead_chacha20poly1305_ietf_decrypt(uint8_t *m, uint64_t *mlen_p, uint8_t *nsec, const uint8_t *c, uint64_t clen, const uint8_t *ad, uint64_t adlen, const uint8_t *npub, const uint8_t *k)',
  'int crypto_aead_xchacha20poly1305_ietf_encrypt(uint8_t *c, uint64_t *clen_p, const uint8_t *m, uint64_t mlen, const uint8_t *ad, uint64_t adlen, const uint8_t *nsec, const uint8_t *npub, const uint8_t *k)',
  'int crypto_aead_xchacha20poly1305_ietf_decrypt(uint8_t *m, uint64_t *mlen_p, uint8_t *nsec, const uint8_t *c, uint64_t clen, const uint8_t *ad, uint64_t adlen, const uint8_t *npub, const uint8_t *k)',
  'int crypto_scalarmult(uint8_t *q, const uint8_t *n, const uint8_t *p)',
  'int crypto_scalarmult_base(uint8_t *q, const uint8_t *n)',
  'void randombytes_buf(uint8_t *buf, size_t size)',
];

async function bindWithKoffi(explicit: string | undefined): Promise<SodiumSymbols> {
  const koffi = (await import('koffi')).default;
  const errors: string[] = [];
  for (const name of candidateLibraries(explicit)) {
    let lib: ReturnType<typeof koffi.load>;
    try {
      lib = koffi.load(name);
    } catch (err) {
      errors.push(`${name}: ${message(err)}`);
      continue;
    }
    const symbols: Record<string, unknown> = {};
    for (const proto of KOFFI_PROTOTYPES) {
      const fn = lib.func(proto);
      symbols[fn.info.name] = fn;
    }
    return symbols as unknown as SodiumSymbols;
  }
  throw new Error(`libsodium not found (${errors.join('; ')})`);
}

// --- bun:ffi (Bun) ------------------------------------------------------------------------------


async function bindWithBunFfi(explicit: string | undefined): Promise<SodiumSymbols> {
  // A computed specifier keeps TypeScript (and any bundler) from resolving bun:ffi under Node.
  const specifier = 'bun:ffi';
  const ffi = (await import(specifier)) as BunFfi;
  const aeadArgs = ['ptr', 'ptr', 'ptr', 'u64', 'ptr', 'u64', 'ptr', 'ptr', 'ptr'];
  const aeadOpenArgs = ['ptr', 'ptr', 'ptr', 'ptr', 'u64', 'ptr', 'u64', 'ptr', 'ptr'];
  const declarations = {
    sodium_init: { args: [], returns: 'i32' },
    crypto_aead_chacha20poly1305_ietf_encrypt: { args: aeadArgs, returns: 'i32' },
    crypto_aead_chacha20poly1305_ietf_decrypt: { args: aeadOpenArgs, returns: 'i32' },
    crypto_aead_xchacha20poly1305_ietf_encrypt: { args: aeadArgs, returns: 'i32' },
    crypto_aead_xchacha20poly1305_ietf_decrypt: { args: aeadOpenArgs, returns: 'i32' },
    crypto_scalarmult: { args: ['ptr', 'ptr', 'ptr'], returns: 'i32' },
    crypto_scalarmult_base: { args: ['ptr', 'ptr'], returns: 'i32' },
    randombytes_buf: { args: ['ptr', 'u64'], returns: 'void' },
  };
  const errors: string[] = [];
  for (const name of candidateLibraries(explicit)) {
    try {
      return ffi.dlopen(name, declarations).symbols as unknown as SodiumSymbols;
    } catch (err) {
      errors.push(`${name}: ${message(err)}`);
    }
  }
  throw new Error(`libsodium not found (${errors.join('; ')})`);
}

// --- the provider -------------------------------------------------------------------------------

const requireLength = (what: string, value: Uint8Array, expected: number): void => requireLengthOf('libsodium-ffi', what, value, expected);

/**
 * Uses the *combined* IETF calls rather than the detached ones: their output layout (ciphertext
 * immediately followed by the tag) is exactly ours, so `out` is passed as-is and no subarray view
 * is created for the tag. libsodium documents exact overlap of input and output as supported.
 * On failed authentication libsodium zeroes the output area: with in-place open the ciphertext is
 * wiped, which is fine because such a packet is dropped anyway.
 */
function makeAead(s: SodiumSymbols): Aead {
  const encrypt = s.crypto_aead_chacha20poly1305_ietf_encrypt;
  const decrypt = s.crypto_aead_chacha20poly1305_ietf_decrypt;
  return aeadOverFfi('libsodium-ffi', {
    seal: (key, nonce, plaintext, ad, out) => encrypt(out, null, plaintext, plaintext.length, ad, ad === null ? 0 : ad.length, null, nonce, key) === 0,
    open: (key, nonce, sealed, ad, out) => decrypt(out, null, null, sealed, sealed.length, ad, ad === null ? 0 : ad.length, nonce, key) === 0,
  });
}

function makeXAead(s: SodiumSymbols): XAead {
  const encrypt = s.crypto_aead_xchacha20poly1305_ietf_encrypt;
  const decrypt = s.crypto_aead_xchacha20poly1305_ietf_decrypt;
  return {
    xseal(key, nonce, plaintext, ad) {
      requireLength('XChaCha20-Poly1305 key', key, KEY_SIZE);
      requireLength('XChaCha20-Poly1305 nonce', nonce, XAEAD_NONCE_SIZE);
      const out = new Uint8Array(plaintext.length + TAG_SIZE);
      const rc = encrypt(out, null, plaintext, plaintext.length, ad ?? null, ad === undefined ? 0 : ad.length, null, nonce, key);
      if (rc !== 0) throw new Error(`libsodium-ffi: crypto_aead_xchacha20poly1305_ietf_encrypt failed (${rc})`);
      return out;
    },
    xopen(key, nonce, sealed, ad) {
      requireLength('XChaCha20-Poly1305 key', key, KEY_SIZE);
      requireLength('XChaCha20-Poly1305 nonce', nonce, XAEAD_NONCE_SIZE);
      if (sealed.length < TAG_SIZE) return null;
      const out = new Uint8Array(sealed.length - TAG_SIZE);
      return decrypt(out, null, null, sealed, sealed.length, ad ?? null, ad === undefined ? 0 : ad.length, nonce, key) === 0 ? out : null;
    },
  };
}

function makeDh(s: SodiumSymbols): Dh {
  return {
    publicKey(privateKey) {
      requireLength('X25519 private key', privateKey, KEY_SIZE);
      const q = new Uint8Array(KEY_SIZE);
      if (s.crypto_scalarmult_base(q, privateKey) !== 0) throw new Error('libsodium-ffi: crypto_scalarmult_base failed');
      return q;
    },
    sharedSecret(privateKey, publicKey) {
      requireLength('X25519 private key', privateKey, KEY_SIZE);
      requireLength('X25519 public key', publicKey, KEY_SIZE);
      const q = new Uint8Array(KEY_SIZE);
      // libsodium returns -1 for a small-order point / all-zero result (and zeroes nothing we keep).
      return s.crypto_scalarmult(q, privateKey, publicKey) === 0 ? q : null;
    },
  };
}

function makeRandom(s: SodiumSymbols): Random {
  return {
    randomBytes(n) {
      if (!Number.isSafeInteger(n) || n < 0) throw new RangeError(`libsodium-ffi: randomBytes length must be a non-negative integer, got ${n}`);
      const out = new Uint8Array(n);
      if (n > 0) s.randombytes_buf(out, n);
      return out;
    },
  };
}

export interface SodiumFfiLoad {
  /** Absent when libsodium or the FFI module is unavailable. */
  provider?: CryptoProvider;
  /** Why the provider is absent. */
  reason?: string;
}

let loaded: Promise<SodiumFfiLoad> | undefined;

/**
 * Loads libsodium once per process (or thread); never rejects. `explicit` (a path or library
 * name) is tried before the usual names; only the first call's value counts.
 */
export function loadSodiumFfi(explicit?: string): Promise<SodiumFfiLoad> {
  loaded ??= (async (): Promise<SodiumFfiLoad> => {
    try {
      const symbols = isBun ? await bindWithBunFfi(explicit) : await bindWithKoffi(explicit);
      // sodium_init: 0 = initialised now, 1 = already initialised, -1 = failure.
      const rc = symbols.sodium_init();
      if (rc < 0) return { reason: `sodium_init failed (${rc})` };
      const provider: CryptoProvider = {
        name: 'libsodium-ffi',
        aead: makeAead(symbols),
        xaead: makeXAead(symbols),
        dh: makeDh(symbols),
        random: makeRandom(symbols),
      };
      return { provider };
    } catch (err) {
      return { reason: message(err) };
    }
  })();
  return loaded;
}
