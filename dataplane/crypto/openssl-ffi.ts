/**
 * Provider "openssl-ffi": ChaCha20-Poly1305 from the system OpenSSL 3 (libcrypto.so.3), through
 * a small C function built at install time (native/openssl-aead.c, scripts/build-native.mjs) and
 * called through a foreign function interface: koffi on Node, bun:ffi on Bun. AEAD only.
 *
 * Why: on the project's machine OpenSSL seals a 1420-byte packet in about half the time the
 * system libsodium takes (measured in C: 1.02 against 1.94 µs), and the AEAD is most of what the
 * crypto workers spend (docs/performance.md). The C function makes OpenSSL's four calls per
 * operation in one FFI call; made one by one from JavaScript they cost the gain back.
 *
 * Loading never throws: when the library was not built (no C compiler at install), or OpenSSL or
 * the FFI module is missing, the loader returns a reason and no provider, and select.ts moves on
 * to libsodium-ffi.
 */
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { KEY_SIZE, TAG_SIZE, type Aead, type CryptoProvider } from './primitives.ts';
import { checkSlotRun } from './aead-slots.ts';
import type { BunFfi } from '../sys/libc.ts';
import { isBun } from '../sys/threads.ts';
import { aeadOverFfi, requireLength } from './ffi-aead.ts';

/** The built library, beside its source (scripts/build-native.mjs writes it there). */
export const OPENSSL_AEAD_LIBRARY = fileURLToPath(new URL('./native/openssl-aead.so', import.meta.url));

/**
 * The C functions (native/openssl-aead.c), argument order as in C: key, nonce, in, length, ad,
 * ad length, out. Pointers are typed arrays (passed without copying, byteOffset honoured) or null.
 */
interface Symbols {
  /** out = ciphertext ‖ tag; 0, or -1 when OpenSSL failed. */
  rg_chacha20poly1305_seal(key: Uint8Array, nonce: Uint8Array, input: Uint8Array, length: number, ad: Uint8Array | null, adLength: number, out: Uint8Array): number;
  /** input = ciphertext ‖ tag, `length` without the tag; 0 when the tag verifies, else -1 and out zeroed. */
  rg_chacha20poly1305_open(key: Uint8Array, nonce: Uint8Array, input: Uint8Array, length: number, ad: Uint8Array | null, adLength: number, out: Uint8Array): number;
  /** The batch forms (key, data, data length, stride, offset, count, lengths, counters): 0, or -1 when out of bounds or OpenSSL failed. */
  rg_chacha20poly1305_seal_slots(key: Uint8Array, data: Uint8Array, dataLength: number, stride: number, offset: number, count: number, lengths: Int32Array, counters: Float64Array): number;
  rg_chacha20poly1305_open_slots(key: Uint8Array, data: Uint8Array, dataLength: number, stride: number, offset: number, count: number, lengths: Int32Array, counters: Float64Array): number;
}

const KOFFI_PROTOTYPES = [
  'int rg_chacha20poly1305_seal(const uint8_t *key, const uint8_t *nonce, const uint8_t *input, unsigned int length, const uint8_t *ad, unsigned int ad_length, uint8_t *out)',
  'int rg_chacha20poly1305_open(const uint8_t *key, const uint8_t *nonce, const uint8_t *input, unsigned int length, const uint8_t *ad, unsigned int ad_length, uint8_t *out)',
  'int rg_chacha20poly1305_seal_slots(const uint8_t *key, _Inout_ uint8_t *data, unsigned int data_length, unsigned int stride, unsigned int offset, unsigned int count, const int32_t *lengths, const double *counters)',
  'int rg_chacha20poly1305_open_slots(const uint8_t *key, _Inout_ uint8_t *data, unsigned int data_length, unsigned int stride, unsigned int offset, unsigned int count, _Inout_ int32_t *lengths, const double *counters)',
];

async function bindWithKoffi(path: string): Promise<Symbols> {
  const koffi = (await import('koffi')).default;
  const lib = koffi.load(path);
  const symbols: Record<string, unknown> = {};
  for (const proto of KOFFI_PROTOTYPES) {
    const fn = lib.func(proto);
    symbols[fn.info.name] = fn;
  }
  return symbols as unknown as Symbols;
}


async function bindWithBunFfi(path: string): Promise<Symbols> {
  const specifier = 'bun:ffi'; // computed: keeps TypeScript and bundlers from resolving it under Node
  const ffi = (await import(specifier)) as BunFfi;
  const args = ['ptr', 'ptr', 'ptr', 'u32', 'ptr', 'u32', 'ptr'];
  const slotArgs = ['ptr', 'ptr', 'u32', 'u32', 'u32', 'u32', 'ptr', 'ptr'];
  return ffi.dlopen(path, {
    rg_chacha20poly1305_seal: { args, returns: 'i32' },
    rg_chacha20poly1305_open: { args, returns: 'i32' },
    rg_chacha20poly1305_seal_slots: { args: slotArgs, returns: 'i32' },
    rg_chacha20poly1305_open_slots: { args: slotArgs, returns: 'i32' },
  }).symbols as unknown as Symbols;
}

/**
 * One FFI call per seal or open, and one per run of slots (native/openssl-aead.c); the C side
 * zeroes a failed open's output and checks every slot against the buffer's length.
 */
function makeAead(s: Symbols): Aead {
  const seal = s.rg_chacha20poly1305_seal;
  const open = s.rg_chacha20poly1305_open;
  const sealSlots = s.rg_chacha20poly1305_seal_slots;
  const openSlots = s.rg_chacha20poly1305_open_slots;
  const one = aeadOverFfi('openssl-ffi', {
    seal: (key, nonce, plaintext, ad, out) => seal(key, nonce, plaintext, plaintext.length, ad, ad === null ? 0 : ad.length, out) === 0,
    open: (key, nonce, sealed, ad, out) => open(key, nonce, sealed, sealed.length - TAG_SIZE, ad, ad === null ? 0 : ad.length, out) === 0,
  });
  return {
    ...one,
    sealSlots(key, data, stride, offset, count, lengths, counters) {
      requireLength('openssl-ffi', 'ChaCha20-Poly1305 key', key, KEY_SIZE);
      checkSlotRun(data, stride, offset, count, lengths, counters);
      if (count > 0 && sealSlots(key, data, data.length, stride, offset, count, lengths, counters) !== 0) {
        throw new RangeError('openssl-ffi: sealing the slots failed (a message and its tag do not fit its slot, a bad counter, or the library failed)');
      }
    },
    openSlots(key, data, stride, offset, count, lengths, counters) {
      requireLength('openssl-ffi', 'ChaCha20-Poly1305 key', key, KEY_SIZE);
      checkSlotRun(data, stride, offset, count, lengths, counters);
      if (count > 0) openSlots(key, data, data.length, stride, offset, count, lengths, counters);
    },
  };
}

export interface OpensslFfiLoad {
  /** Absent when the library was not built or cannot be loaded. */
  provider?: CryptoProvider;
  /** Why the provider is absent. */
  reason?: string;
}

let loaded: Promise<OpensslFfiLoad> | undefined;

/** Loads the library once per process (or thread); never rejects. */
export function loadOpensslFfi(): Promise<OpensslFfiLoad> {
  loaded ??= (async (): Promise<OpensslFfiLoad> => {
    if (!existsSync(OPENSSL_AEAD_LIBRARY)) return { reason: `${OPENSSL_AEAD_LIBRARY} was not built (it needs a C compiler and libcrypto.so.3 at install: node scripts/build-native.mjs)` };
    try {
      const symbols = isBun ? await bindWithBunFfi(OPENSSL_AEAD_LIBRARY) : await bindWithKoffi(OPENSSL_AEAD_LIBRARY);
      return { provider: { name: 'openssl-ffi', aead: makeAead(symbols) } };
    } catch (err) {
      return { reason: err instanceof Error ? err.message : String(err) };
    }
  })();
  return loaded;
}
