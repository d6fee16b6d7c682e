/**
 * Known-answer tests for every crypto provider available in this runtime, for every primitive group
 * each one claims, plus the runtime selection.
 *
 * Runs under `node --import tsx --test` and under `bun test` (both understand node:test). The
 * vectors live in fixtures/vectors/*.json, each with its source. Where no official vector exists
 * (keyed BLAKE2s with a 16-byte output) the fixture values come from an independent implementation
 * and are re-derived here with a small RFC 7693 reference implementation, which is itself checked
 * against the official keyed KAT lines first.
 */

import { test, describe } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, existsSync } from 'node:fs';
import { loadProviders, selectCrypto, PROVIDER_NAMES } from '../../dataplane/crypto/select.ts';
import { OPENSSL_AEAD_LIBRARY } from '../../dataplane/crypto/openssl-ffi.ts';
import { loadDataplaneSettings } from '../../dataplane/settings.ts';
import { writeCounterNonce, type CryptoProvider, type Hashes } from '../../dataplane/crypto/primitives.ts';

// --- helpers ------------------------------------------------------------------------------------

function fixture<T>(name: string): T {
  return JSON.parse(readFileSync(new URL(`../../fixtures/vectors/${name}`, import.meta.url), 'utf8')) as T;
}

function hex(s: string): Uint8Array {
  assert.equal(s.length % 2, 0, `odd-length hex string: ${s}`);
  return Uint8Array.from(Buffer.from(s, 'hex'));
}

function toHex(b: Uint8Array | null): string | null {
  return b === null ? null : Buffer.from(b.buffer, b.byteOffset, b.length).toString('hex');
}

const ascii = (s: string) => new TextEncoder().encode(s);
const counting = (n: number) => Uint8Array.from({ length: n }, (_, i) => i & 0xff);

function concat(...parts: Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let off = 0;
  for (const p of parts) { out.set(p, off); off += p.length; }
  return out;
}

/** Deterministic pseudo-random bytes (xorshift32) so differential tests are reproducible. */
function pseudoRandom(seed: number): (n: number) => Uint8Array {
  let x = seed >>> 0 || 1;
  return (n) => {
    const out = new Uint8Array(n);
    for (let i = 0; i < n; i++) {
      x ^= x << 13; x >>>= 0; x ^= x >>> 17; x ^= x << 5; x >>>= 0;
      out[i] = x & 0xff;
    }
    return out;
  };
}

// --- an independent BLAKE2s (RFC 7693), used only to cross-check providers -------------------

const B2S_IV = [0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19];
const B2S_SIGMA = [
  [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
  [14, 10, 4, 8, 9, 15, 13, 6, 1, 12, 0, 2, 11, 7, 5, 3],
  [11, 8, 12, 0, 5, 2, 15, 13, 10, 14, 3, 6, 7, 1, 9, 4],
  [7, 9, 3, 1, 13, 12, 11, 14, 2, 6, 5, 10, 4, 0, 15, 8],
  [9, 0, 5, 7, 2, 4, 10, 15, 14, 1, 11, 12, 6, 8, 3, 13],
  [2, 12, 6, 10, 0, 11, 8, 3, 4, 13, 7, 5, 15, 14, 1, 9],
  [12, 5, 1, 15, 14, 13, 4, 10, 0, 7, 6, 3, 9, 2, 8, 11],
  [13, 11, 7, 14, 12, 1, 3, 9, 5, 0, 15, 4, 8, 6, 2, 10],
  [6, 15, 14, 9, 11, 3, 0, 8, 12, 2, 13, 7, 1, 4, 10, 5],
  [10, 2, 8, 4, 7, 6, 1, 5, 15, 11, 9, 14, 3, 12, 13, 0],
];

function referenceBlake2s(data: Uint8Array, outLength: number, key: Uint8Array = new Uint8Array(0)): Uint8Array {
  const h = B2S_IV.slice();
  h[0] ^= 0x01010000 ^ (key.length << 8) ^ outLength; // parameter block: fanout 1, depth 1
  const padded = key.length > 0 ? concat(new Uint8Array(64).fill(0).map((_, i) => key[i] ?? 0), data) : data;
  const blocks = Math.max(1, Math.ceil(padded.length / 64));
  const rotr = (x: number, n: number) => ((x >>> n) | (x << (32 - n))) >>> 0;
  for (let b = 0; b < blocks; b++) {
    const block = new Uint8Array(64);
    block.set(padded.subarray(b * 64, b * 64 + 64));
    const last = b === blocks - 1;
    const counter = last ? padded.length : (b + 1) * 64;
    const m = Array.from({ length: 16 }, (_, i) => (block[4 * i] | (block[4 * i + 1] << 8) | (block[4 * i + 2] << 16) | (block[4 * i + 3] << 24)) >>> 0);
    const v = [...h, ...B2S_IV];
    v[12] = (v[12] ^ counter) >>> 0; // inputs here stay far below 2^32 bytes
    if (last) v[14] = (v[14] ^ 0xffffffff) >>> 0;
    const g = (a: number, bb: number, c: number, d: number, x: number, y: number) => {
      v[a] = (v[a] + v[bb] + x) >>> 0; v[d] = rotr(v[d] ^ v[a], 16);
      v[c] = (v[c] + v[d]) >>> 0; v[bb] = rotr(v[bb] ^ v[c], 12);
      v[a] = (v[a] + v[bb] + y) >>> 0; v[d] = rotr(v[d] ^ v[a], 8);
      v[c] = (v[c] + v[d]) >>> 0; v[bb] = rotr(v[bb] ^ v[c], 7);
    };
    for (const s of B2S_SIGMA) {
      g(0, 4, 8, 12, m[s[0]], m[s[1]]); g(1, 5, 9, 13, m[s[2]], m[s[3]]);
      g(2, 6, 10, 14, m[s[4]], m[s[5]]); g(3, 7, 11, 15, m[s[6]], m[s[7]]);
      g(0, 5, 10, 15, m[s[8]], m[s[9]]); g(1, 6, 11, 12, m[s[10]], m[s[11]]);
      g(2, 7, 8, 13, m[s[12]], m[s[13]]); g(3, 4, 9, 14, m[s[14]], m[s[15]]);
    }
    for (let i = 0; i < 8; i++) h[i] = (h[i] ^ v[i] ^ v[i + 8]) >>> 0;
  }
  const out = new Uint8Array(32);
  h.forEach((w, i) => { out[4 * i] = w; out[4 * i + 1] = w >>> 8; out[4 * i + 2] = w >>> 16; out[4 * i + 3] = w >>> 24; });
  return out.slice(0, outLength);
}

function referenceHmac(key: Uint8Array, data: Uint8Array): Uint8Array {
  const k = key.length > 64 ? referenceBlake2s(key, 32) : key;
  const ipad = new Uint8Array(64).map((_, i) => (k[i] ?? 0) ^ 0x36);
  const opad = new Uint8Array(64).map((_, i) => (k[i] ?? 0) ^ 0x5c);
  return referenceBlake2s(concat(opad, referenceBlake2s(concat(ipad, data), 32)), 32);
}

/** WireGuard's KDF (whitepaper §5.4): an HKDF-style chain over HMAC-BLAKE2s. */
function kdf3(h: Hashes, key: Uint8Array, input: Uint8Array): [Uint8Array, Uint8Array, Uint8Array] {
  const prk = h.hmac(key, input);
  const t0 = h.hmac(prk, new Uint8Array([1]));
  const t1 = h.hmac(prk, t0, new Uint8Array([2]));
  const t2 = h.hmac(prk, t1, new Uint8Array([3]));
  return [t0, t1, t2];
}

// --- fixtures -----------------------------------------------------------------------------------

interface AeadVector { key: string; nonce: string; aad: string; plaintextAscii: string; ciphertext: string; tag: string }
const aeadVector = fixture<AeadVector>('aead-rfc8439.json');
const xaeadVector = fixture<AeadVector>('xchacha20poly1305.json');
const x25519 = fixture<{
  scalarMult: { scalar: string; u: string; output: string }[];
  iterated: { start: string; after1: string; after1000: string };
  diffieHellman: { alicePrivate: string; alicePublic: string; bobPrivate: string; bobPublic: string; shared: string };
  lowOrderPoints: { points: string[] };
}>('x25519-rfc7748.json');
const wg = fixture<{
  kdf: { keyAscii: string; inputAscii: string; t0: string; t1: string; t2: string }[];
  construction: string; identifier: string; ck0: string; h0: string;
}>('wireguard-kdf.json');
const blake2s = fixture<{
  hash256: { vectors: { inputHex: string; digest: string }[] };
  keyed256: { key: string; vectors: { inputLength: number; digest: string }[] };
  mac128: { vectors: { key: string; inputLength?: number; inputAscii?: string; mac: string }[] };
}>('blake2s.json');

const providers = await loadProviders();
const portable = providers.find((p) => p.provider.name === 'portable')!.provider;

// --- the reference implementation is checked before it is trusted -----------------------------

describe('test reference BLAKE2s (RFC 7693)', () => {
  test('matches the official unkeyed and keyed KAT lines', () => {
    for (const v of blake2s.hash256.vectors) assert.equal(toHex(referenceBlake2s(hex(v.inputHex), 32)), v.digest);
    for (const v of blake2s.keyed256.vectors) {
      assert.equal(toHex(referenceBlake2s(counting(v.inputLength), 32, hex(blake2s.keyed256.key))), v.digest, `keyed, length ${v.inputLength}`);
    }
  });
  test('reproduces the 16-byte MAC fixtures (computed elsewhere with CPython)', () => {
    for (const v of blake2s.mac128.vectors) {
      const input = v.inputAscii !== undefined ? ascii(v.inputAscii) : counting(v.inputLength!);
      assert.equal(toHex(referenceBlake2s(input, 16, hex(v.key))), v.mac);
    }
  });
  test('reference HMAC reproduces the first WireGuard KDF vector', () => {
    const v = wg.kdf[0];
    const prk = referenceHmac(ascii(v.keyAscii), ascii(v.inputAscii));
    assert.equal(toHex(referenceHmac(prk, new Uint8Array([1]))), v.t0);
  });
});

// --- per provider -------------------------------------------------------------------------------

describe('provider discovery', () => {
  test('portable and node:crypto are always available', () => {
    const names = providers.map((p) => p.provider.name);
    assert.ok(names.includes('portable'));
    assert.ok(names.includes('node:crypto'));
    for (const n of names) assert.ok((PROVIDER_NAMES as readonly string[]).includes(n), n);
  });
  // The test command installs libsodium23, so its absence is a failure here, not a reason to skip.
  test('libsodium-ffi is found (the Debian library libsodium23 is installed by the test command)', () => {
    assert.ok(existsSync('/usr/lib/x86_64-linux-gnu/libsodium.so.23'), 'libsodium23 is not installed: run scripts/install-system-deps.sh');
    assert.ok(providers.some((p) => p.provider.name === 'libsodium-ffi'));
  });
  // The test command builds the OpenSSL helper (scripts/build-native.mjs --require), so here too
  // its absence is a failure; the daemon elsewhere falls back to libsodium-ffi without it.
  test('openssl-ffi is found (the test command builds dataplane/crypto/native/openssl-aead.so), and the AEAD selection picks it', async () => {
    assert.ok(existsSync(OPENSSL_AEAD_LIBRARY), `${OPENSSL_AEAD_LIBRARY} is not built: run node scripts/build-native.mjs`);
    assert.ok(providers.some((p) => p.provider.name === 'openssl-ffi'));
    assert.equal((await selectCrypto()).providers.aead, 'openssl-ffi');
  });
});

for (const { provider, error } of providers) {
  describe(`provider ${provider.name}`, () => {
    test('passes its own load-time self-test', () => {
      assert.equal(error, undefined);
    });
    if (provider.aead) aeadTests(provider);
    if (provider.xaead) xaeadTests(provider);
    if (provider.dh) dhTests(provider);
    if (provider.hashes) hashTests(provider);
    if (provider.random) randomTests(provider);
  });
}

function aeadTests(p: CryptoProvider): void {
  const a = p.aead!;
  const key = hex(aeadVector.key), nonce = hex(aeadVector.nonce), ad = hex(aeadVector.aad);
  const pt = ascii(aeadVector.plaintextAscii);
  const sealedHex = aeadVector.ciphertext + aeadVector.tag;
  const n = pt.length;

  describe('aead (ChaCha20-Poly1305)', () => {
    test('RFC 8439 §2.8.2: seal gives the full expected ciphertext and tag', () => {
      assert.equal(pt.length, 114);
      assert.equal(toHex(a.seal(key, nonce, pt, ad)), sealedHex);
    });

    test('RFC 8439 §2.8.2: open recovers the plaintext', () => {
      assert.equal(toHex(a.open(key, nonce, hex(sealedHex), ad)), toHex(pt));
    });

    test('any tampering makes open return null', () => {
      const sealed = hex(sealedHex);
      for (const index of [0, 57, n - 1, n, n + 15]) { // ciphertext start/middle/end, tag start/end
        const bad = Uint8Array.from(sealed);
        bad[index] ^= 0x01;
        assert.equal(a.open(key, nonce, bad, ad), null, `flipped byte ${index}`);
      }
      const badAd = Uint8Array.from(ad); badAd[3] ^= 0x80;
      assert.equal(a.open(key, nonce, sealed, badAd), null, 'wrong AAD');
      assert.equal(a.open(key, nonce, sealed, undefined), null, 'missing AAD');
      const badNonce = Uint8Array.from(nonce); badNonce[11] ^= 1;
      assert.equal(a.open(key, badNonce, sealed, ad), null, 'wrong nonce');
      const badKey = Uint8Array.from(key); badKey[0] ^= 1;
      assert.equal(a.open(badKey, nonce, sealed, ad), null, 'wrong key');
      assert.equal(a.open(key, nonce, sealed.subarray(0, sealed.length - 1), ad), null, 'truncated');
      assert.equal(a.open(key, nonce, sealed.subarray(0, 15), ad), null, 'shorter than a tag');
      assert.equal(a.open(key, nonce, new Uint8Array(0), ad), null, 'empty');
    });

    test('in-place seal and open (out aliases the input, at a non-zero offset)', () => {
      const backing = new Uint8Array(16 + n + 16 + 8).fill(0xee);
      const region = backing.subarray(16, 16 + n + 16); // like a packet after its header
      region.set(pt);
      const sealed = a.seal(key, nonce, region.subarray(0, n), ad, region);
      assert.equal(toHex(sealed), sealedHex);
      assert.equal(sealed.buffer, backing.buffer);
      assert.equal(sealed.byteOffset, region.byteOffset);
      const opened = a.open(key, nonce, region, ad, region);
      assert.ok(opened !== null);
      assert.equal(toHex(opened), toHex(pt));
      assert.equal(opened.byteOffset, region.byteOffset);
      assert.ok(backing.subarray(0, 16).every((b) => b === 0xee), 'bytes before the region untouched');
      assert.ok(backing.subarray(16 + n + 16).every((b) => b === 0xee), 'bytes after the region untouched');
    });

    test('separate output buffers larger than needed: exact-length views, the rest untouched', () => {
      const out = new Uint8Array(n + 16 + 10).fill(0xaa);
      const sealed = a.seal(key, nonce, pt, ad, out);
      assert.equal(sealed.length, n + 16);
      assert.equal(sealed.buffer, out.buffer);
      assert.equal(toHex(sealed), sealedHex);
      assert.ok(out.subarray(n + 16).every((b) => b === 0xaa));
      const plain = new Uint8Array(n + 5).fill(0xbb);
      const opened = a.open(key, nonce, sealed, ad, plain);
      assert.ok(opened !== null);
      assert.equal(opened.length, n);
      assert.equal(opened.buffer, plain.buffer);
      assert.equal(toHex(opened), toHex(pt));
      assert.ok(plain.subarray(n).every((b) => b === 0xbb));
    });

    test('inputs are not modified', () => {
      const ptCopy = Uint8Array.from(pt), keyCopy = Uint8Array.from(key), nonceCopy = Uint8Array.from(nonce), adCopy = Uint8Array.from(ad);
      const sealed = a.seal(key, nonce, pt, ad);
      const sealedCopy = Uint8Array.from(sealed);
      a.open(key, nonce, sealed, ad);
      assert.deepEqual([pt, key, nonce, ad, sealed], [ptCopy, keyCopy, nonceCopy, adCopy, sealedCopy]);
    });

    test('empty plaintext, absent AAD equals empty AAD, WireGuard counter nonces', () => {
      const empty = a.seal(key, nonce, new Uint8Array(0), undefined);
      assert.equal(empty.length, 16);
      assert.equal(toHex(a.open(key, nonce, empty, undefined)), '');
      assert.equal(toHex(a.seal(key, nonce, pt, new Uint8Array(0))), toHex(a.seal(key, nonce, pt, undefined)));
      const n1 = writeCounterNonce(1), n2 = writeCounterNonce(2 ** 40 + 5);
      const s1 = a.seal(key, n1, pt, undefined);
      assert.notEqual(toHex(s1), toHex(a.seal(key, n2, pt, undefined)));
      assert.equal(toHex(a.open(key, n1, s1, undefined)), toHex(pt));
      assert.equal(a.open(key, n2, s1, undefined), null);
    });

    test('agrees with portable on pseudo-random inputs of many lengths', () => {
      const rnd = pseudoRandom(0xa11ce);
      for (const len of [0, 1, 15, 16, 17, 63, 64, 65, 255, 256, 1024, 1420, 1500, 4096]) {
        const k = rnd(32), nn = rnd(12), d = rnd(len % 3 === 0 ? 0 : 13), m = rnd(len);
        const mine = a.seal(k, nn, m, d);
        assert.equal(toHex(mine), toHex(portable.aead!.seal(k, nn, m, d)), `length ${len}`);
        assert.equal(toHex(portable.aead!.open(k, nn, mine, d)), toHex(m), `portable opens length ${len}`);
      }
    });

    test('wrong key, nonce or output lengths throw descriptive errors', () => {
      assert.throws(() => a.seal(key.subarray(0, 31), nonce, pt, ad), /key.*32/);
      assert.throws(() => a.seal(key, new Uint8Array(24), pt, ad), /nonce.*12/); // an XChaCha-sized nonce
      assert.throws(() => a.open(key, nonce.subarray(0, 8), hex(sealedHex), ad), /nonce.*12/);
      assert.throws(() => a.seal(key, nonce, pt, ad, new Uint8Array(n + 15)), /output buffer/);
      assert.throws(() => a.open(key, nonce, hex(sealedHex), ad, new Uint8Array(n - 1)), /output buffer/);
    });
  });
}

function xaeadTests(p: CryptoProvider): void {
  const x = p.xaead!;
  const key = hex(xaeadVector.key), nonce = hex(xaeadVector.nonce), ad = hex(xaeadVector.aad);
  const pt = ascii(xaeadVector.plaintextAscii);
  const sealedHex = xaeadVector.ciphertext + xaeadVector.tag;

  describe('xaead (XChaCha20-Poly1305)', () => {
    test('draft-irtf-cfrg-xchacha-03 A.3.1: seal and open', () => {
      const sealed = x.xseal(key, nonce, pt, ad);
      assert.equal(toHex(sealed), sealedHex);
      assert.equal(toHex(x.xopen(key, nonce, sealed, ad)), toHex(pt));
    });
    test('tampering, wrong AAD, wrong nonce and truncation give null', () => {
      const sealed = hex(sealedHex);
      for (const index of [0, pt.length - 1, pt.length, sealed.length - 1]) {
        const bad = Uint8Array.from(sealed); bad[index] ^= 0x40;
        assert.equal(x.xopen(key, nonce, bad, ad), null, `flipped byte ${index}`);
      }
      assert.equal(x.xopen(key, nonce, sealed, undefined), null);
      const badNonce = Uint8Array.from(nonce); badNonce[0] ^= 1; // lands in the HChaCha20 part
      assert.equal(x.xopen(key, badNonce, sealed, ad), null);
      assert.equal(x.xopen(key, nonce, sealed.subarray(0, 10), ad), null);
    });
    test('agrees with portable on a WireGuard-sized cookie reply (16-byte cookie, 16-byte AAD)', () => {
      const rnd = pseudoRandom(0xc00c1e);
      for (let i = 0; i < 8; i++) {
        const k = rnd(32), nn = rnd(24), cookie = rnd(16), mac1 = rnd(16);
        const mine = x.xseal(k, nn, cookie, mac1);
        assert.equal(toHex(mine), toHex(portable.xaead!.xseal(k, nn, cookie, mac1)));
        assert.equal(toHex(portable.xaead!.xopen(k, nn, mine, mac1)), toHex(cookie));
      }
    });
    test('wrong key or nonce lengths throw', () => {
      assert.throws(() => x.xseal(key, nonce.subarray(0, 12), pt, ad), /nonce.*24/);
      assert.throws(() => x.xopen(key.subarray(1), nonce, hex(sealedHex), ad), /key.*32/);
    });
  });
}

function dhTests(p: CryptoProvider): void {
  const d = p.dh!;
  describe('dh (X25519)', () => {
    test('RFC 7748 §5.2 single multiplications (including a u with the top bit set)', () => {
      for (const v of x25519.scalarMult) assert.equal(toHex(d.sharedSecret(hex(v.scalar), hex(v.u))), v.output);
    });
    test('RFC 7748 §5.2 iterated: after 1 and 1000 iterations', () => {
      let k = hex(x25519.iterated.start), u = hex(x25519.iterated.start);
      for (let i = 1; i <= 1000; i++) {
        const r = d.sharedSecret(k, u);
        assert.ok(r !== null, `iteration ${i}`);
        u = k; k = r;
        if (i === 1) assert.equal(toHex(k), x25519.iterated.after1);
      }
      assert.equal(toHex(k), x25519.iterated.after1000);
    });
    test('RFC 7748 §6.1 Alice and Bob: public keys and the shared secret both ways', () => {
      const v = x25519.diffieHellman;
      assert.equal(toHex(d.publicKey(hex(v.alicePrivate))), v.alicePublic);
      assert.equal(toHex(d.publicKey(hex(v.bobPrivate))), v.bobPublic);
      assert.equal(toHex(d.sharedSecret(hex(v.alicePrivate), hex(v.bobPublic))), v.shared);
      assert.equal(toHex(d.sharedSecret(hex(v.bobPrivate), hex(v.alicePublic))), v.shared);
    });
    test('low-order points (all-zero shared secret) give null, never throw', () => {
      const priv = hex(x25519.diffieHellman.alicePrivate);
      for (const point of x25519.lowOrderPoints.points) assert.equal(d.sharedSecret(priv, hex(point)), null, point);
    });
    test('agrees with portable on pseudo-random key pairs; inputs are not modified', () => {
      const rnd = pseudoRandom(0xd1ff1e);
      for (let i = 0; i < 6; i++) {
        const a = rnd(32), b = rnd(32), aCopy = Uint8Array.from(a);
        const bPub = d.publicKey(b);
        assert.equal(toHex(bPub), toHex(portable.dh!.publicKey(b)));
        assert.equal(toHex(d.sharedSecret(a, bPub)), toHex(portable.dh!.sharedSecret(b, portable.dh!.publicKey(a))));
        assert.deepEqual(a, aCopy);
      }
    });
    test('wrong key lengths throw descriptive errors', () => {
      assert.throws(() => d.publicKey(new Uint8Array(31)), /private key.*32/);
      assert.throws(() => d.sharedSecret(new Uint8Array(32).fill(1), new Uint8Array(33)), /public key.*32/);
    });
  });
}

function hashTests(p: CryptoProvider): void {
  const h = p.hashes!;
  describe('hashes (BLAKE2s)', () => {
    test('BLAKE2s-256 of "" and "abc" (RFC 7693 appendix B)', () => {
      for (const v of blake2s.hash256.vectors) assert.equal(toHex(h.hash(hex(v.inputHex))), v.digest);
    });
    test('hash of several parts equals hash of their concatenation', () => {
      const parts = [counting(10), new Uint8Array(0), counting(64), counting(100)];
      assert.equal(toHex(h.hash(...parts)), toHex(h.hash(concat(...parts))));
      assert.equal(toHex(h.hash(...parts)), toHex(referenceBlake2s(concat(...parts), 32)));
    });
    test('WireGuard constants: ck0 = HASH(CONSTRUCTION), h0 = HASH(ck0 ‖ IDENTIFIER)', () => {
      const ck0 = h.hash(ascii(wg.construction));
      assert.equal(wg.construction.length, 37);
      assert.equal(wg.identifier.length, 34);
      assert.equal(toHex(ck0), wg.ck0);
      assert.equal(toHex(h.hash(ck0, ascii(wg.identifier))), wg.h0);
    });
    test('WireGuard KDF1/KDF2/KDF3 vectors (HMAC-BLAKE2s chain)', () => {
      for (const v of wg.kdf) {
        const [t0, t1, t2] = kdf3(h, ascii(v.keyAscii), ascii(v.inputAscii));
        assert.deepEqual([toHex(t0), toHex(t1), toHex(t2)], [v.t0, v.t1, v.t2], `key "${v.keyAscii}"`);
      }
    });
    test('HMAC agrees with the reference, including keys longer than the 64-byte block', () => {
      const rnd = pseudoRandom(0x4d4ac);
      for (const keyLen of [0, 1, 32, 64, 65, 100]) {
        const key = rnd(keyLen), data = rnd(keyLen * 3 + 7);
        assert.equal(toHex(h.hmac(key, data.subarray(0, 5), data.subarray(5))), toHex(referenceHmac(key, data)), `key length ${keyLen}`);
      }
    });
    test('keyed BLAKE2s-128 MAC: fixture vectors', () => {
      for (const v of blake2s.mac128.vectors) {
        const input = v.inputAscii !== undefined ? ascii(v.inputAscii) : counting(v.inputLength!);
        assert.equal(toHex(h.mac(hex(v.key), input)), v.mac, `key ${v.key.length / 2} bytes, input ${input.length} bytes`);
      }
    });
    test('keyed BLAKE2s-128 MAC: agrees with the reference and with portable on pseudo-random inputs', () => {
      const rnd = pseudoRandom(0x3ac);
      for (const [keyLen, dataLen] of [[32, 116], [16, 148], [32, 0], [1, 63], [31, 64], [32, 65], [16, 1000]]) {
        const key = rnd(keyLen), data = rnd(dataLen);
        const mac = h.mac(key, data);
        assert.equal(mac.length, 16);
        assert.equal(toHex(mac), toHex(referenceBlake2s(data, 16, key)), `key ${keyLen}, data ${dataLen}`);
        assert.equal(toHex(mac), toHex(portable.hashes!.mac(key, data)));
      }
    });
    test('MAC key length is checked', () => {
      assert.throws(() => h.mac(new Uint8Array(33), new Uint8Array(1)), /key/);
      assert.throws(() => h.mac(new Uint8Array(0), new Uint8Array(1)), /key/);
    });
  });
}

function randomTests(p: CryptoProvider): void {
  const r = p.random!;
  describe('random', () => {
    test('returns the requested lengths, including 0 and more than 64 KiB', () => {
      for (const n of [0, 1, 32, 65536, 100_000]) assert.equal(r.randomBytes(n).length, n);
    });
    test('output is not constant and looks uniform', () => {
      const a = r.randomBytes(32), b = r.randomBytes(32);
      assert.notEqual(toHex(a), toHex(b));
      const big = r.randomBytes(100_000);
      const ones = big.reduce((n, byte) => n + popcount(byte), 0);
      const ratio = ones / (big.length * 8);
      assert.ok(ratio > 0.49 && ratio < 0.51, `bit ratio ${ratio}`);
    });
    test('bad lengths throw', () => {
      assert.throws(() => r.randomBytes(-1), /length/);
      assert.throws(() => r.randomBytes(1.5), /length/);
    });
  });
}

function popcount(byte: number): number {
  let n = 0;
  for (let b = byte; b; b &= b - 1) n++;
  return n;
}

// --- selection ----------------------------------------------------------------------------------

describe('selectCrypto', () => {
  /** What the daemon passes selectCrypto for ROAMGUARD_CRYPTO=value (dataplane/settings.ts). */
  const forcedBy = (value: string) => ({ only: loadDataplaneSettings({ ROAMGUARD_CRYPTO: value }).crypto });

  test('returns a complete, working Crypto and names a provider for every group', async () => {
    const c = await selectCrypto();
    for (const fn of ['seal', 'open', 'xseal', 'xopen', 'publicKey', 'sharedSecret', 'hash', 'hmac', 'mac', 'randomBytes'] as const) {
      assert.equal(typeof c[fn], 'function', fn);
    }
    for (const group of ['aead', 'xaead', 'dh', 'hashes', 'random'] as const) {
      assert.ok(c.providers[group].split('+').every((n) => (PROVIDER_NAMES as readonly string[]).includes(n)), `${group}: ${c.providers[group]}`);
    }
    assert.equal(toHex(c.seal(hex(aeadVector.key), hex(aeadVector.nonce), ascii(aeadVector.plaintextAscii), hex(aeadVector.aad))), aeadVector.ciphertext + aeadVector.tag);
    assert.equal(toHex(c.xseal(hex(xaeadVector.key), hex(xaeadVector.nonce), ascii(xaeadVector.plaintextAscii), hex(xaeadVector.aad))), xaeadVector.ciphertext + xaeadVector.tag);
    assert.equal(toHex(c.sharedSecret(hex(x25519.diffieHellman.alicePrivate), hex(x25519.diffieHellman.bobPublic))), x25519.diffieHellman.shared);
    assert.equal(toHex(c.hash(ascii(wg.construction))), wg.ck0);
    assert.equal(toHex(c.mac(hex(blake2s.mac128.vectors[0].key), new Uint8Array(0))), blake2s.mac128.vectors[0].mac);
    assert.equal(c.randomBytes(24).length, 24);
    if (c.providers.hashes.startsWith('node:crypto')) assert.equal(c.providers.hashes, 'node:crypto+portable');
  });

  test('never picks portable for a group a faster provider offers', async () => {
    const c = await selectCrypto();
    const offered = (group: 'aead' | 'dh') => providers.some((p) => p.provider.name !== 'portable' && p.provider[group] && !p.error);
    if (offered('aead')) assert.notEqual(c.providers.aead, 'portable');
    if (offered('dh')) assert.notEqual(c.providers.dh, 'portable');
  });

  test('ROAMGUARD_CRYPTO=portable forces portable for everything', async () => {
    const c = await selectCrypto(forcedBy('portable'));
    assert.deepEqual({ ...c.providers }, { aead: 'portable', xaead: 'portable', dh: 'portable', hashes: 'portable', random: 'portable' });
    assert.equal(toHex(c.hash(ascii('abc'))), blake2s.hash256.vectors[1].digest);
  });

  test('ROAMGUARD_CRYPTO=<provider> uses it where it can and portable for the rest', async () => {
    for (const { provider } of providers) {
      const c = await selectCrypto(forcedBy(provider.name));
      for (const group of ['aead', 'xaead', 'dh', 'random'] as const) {
        assert.equal(c.providers[group], provider[group] ? provider.name : 'portable', `${provider.name} ${group}`);
      }
      assert.ok(c.providers.hashes.startsWith(provider.hashes ? provider.name : 'portable'));
    }
  });

  test('prefer puts a provider first; unknown names are rejected', async () => {
    const c = await selectCrypto({ prefer: ['portable'] });
    assert.equal(c.providers.aead, 'portable');
    await assert.rejects(() => selectCrypto({ only: 'no-such-provider' }), /unknown crypto provider/);
    await assert.rejects(() => selectCrypto({ prefer: ['nope'] }), /unknown crypto provider/);
    assert.throws(() => forcedBy('nope'), /^SettingError: ROAMGUARD_CRYPTO="nope" is not valid: expected one of auto, openssl-ffi, libsodium-ffi, /);
  });
});
