/**
 * Crypto providers keep no copy of an ephemeral private key. Handshakes run on a Crypto whose DH
 * group is the provider under test; afterwards the provider must hold no private key it was not
 * told is a static key (node:crypto's KeyObject cache), and no copy of any private key or shared
 * secret may be left in its memory (sodium-wasm's WebAssembly heap). Static keys announced with
 * replaceStaticKey are kept, boundedly, and forgotten on replacement.
 */
import { before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { Crypto, CryptoProvider } from '../../dataplane/crypto/primitives.ts';
import { loadProviders, selectCrypto } from '../../dataplane/crypto/select.ts';
import { heldPrivateKeyCount } from '../../dataplane/crypto/node-crypto.ts';
import {
  Handshake, consumeInitiation, consumeResponse, createInitiation, createResponse, deriveSessionKeys, precomputeStaticStatic,
} from '../../dataplane/noise/noise-protocol.ts';
import { generatePrivateKey } from '../../dataplane/noise/keys.ts';

let base: Crypto;
let providers: CryptoProvider[];
before(async () => {
  base = await selectCrypto();
  providers = (await loadProviders()).filter((p) => p.error === undefined).map((p) => p.provider);
});

/** `base` with the DH group of `provider`; every ephemeral key and DH result it makes is recorded. */
function withDh(provider: CryptoProvider) {
  const dh = provider.dh!;
  const privateKeys: Uint8Array[] = [];
  const secrets: Uint8Array[] = [];
  const crypto: Crypto = {
    ...base,
    publicKey: (k) => dh.publicKey(k),
    sharedSecret: (k, p) => {
      privateKeys.push(Uint8Array.from(k));
      const s = dh.sharedSecret(k, p);
      if (s) secrets.push(Uint8Array.from(s));
      return s;
    },
    ...(dh.replaceStaticKey ? { replaceStaticKey: (n: Uint8Array | undefined, p: Uint8Array | undefined) => dh.replaceStaticKey!(n, p) } : {}),
  };
  return { crypto, privateKeys, secrets };
}

/** Runs `count` complete handshakes between two fixed identities on `crypto`. */
function handshakes(crypto: Crypto, count: number, announce: boolean): void {
  const make = () => {
    const staticPrivate = generatePrivateKey(base);
    if (announce) crypto.replaceStaticKey?.(staticPrivate, undefined);
    return { crypto, staticPrivate, staticPublic: crypto.publicKey(staticPrivate) };
  };
  const i = make(), r = make();
  const iHs = new Handshake(r.staticPublic), rHs = new Handshake(i.staticPublic);
  precomputeStaticStatic(i, iHs);
  precomputeStaticStatic(r, rHs);
  for (let n = 0; n < count; n++) {
    const init = createInitiation(i, iHs, n + 1, Date.now() + n * 1000);
    assert.ok(init instanceof Uint8Array);
    assert.ok(typeof consumeInitiation(r, init, n * 1000, 20, () => ({ peer: 0, handshake: rHs })) !== 'string');
    const resp = createResponse(r, rHs, n + 1);
    assert.ok(resp instanceof Uint8Array);
    assert.equal(consumeResponse(i, iHs, resp), true);
    assert.ok(typeof deriveSessionKeys(crypto, iHs) !== 'string');
    assert.ok(typeof deriveSessionKeys(crypto, rHs) !== 'string');
  }
  if (announce) {
    crypto.replaceStaticKey?.(undefined, i.staticPrivate);
    crypto.replaceStaticKey?.(undefined, r.staticPrivate);
  }
}

describe('crypto providers keep no ephemeral private key', () => {
  test('node:crypto: no private key is held after handshakes unless announced as static, and then boundedly', () => {
    const provider = providers.find((p) => p.name === 'node:crypto' && p.dh !== undefined);
    assert.ok(provider, 'node:crypto offers X25519 on Node 20 and Bun (both runtimes CI runs)');
    const { crypto } = withDh(provider);
    assert.equal(heldPrivateKeyCount(), 0);
    handshakes(crypto, 20, false);
    assert.equal(heldPrivateKeyCount(), 0, 'ephemeral (and unannounced static) keys are not cached');
    handshakes(crypto, 20, true);
    assert.equal(heldPrivateKeyCount(), 0, 'announced static keys are forgotten when replaced');

    const keys = Array.from({ length: 10 }, () => generatePrivateKey(base));
    for (const k of keys) crypto.replaceStaticKey!(k, undefined);
    assert.ok(heldPrivateKeyCount() <= 4, `bounded (${heldPrivateKeyCount()})`);
    for (const k of keys) crypto.replaceStaticKey!(undefined, k);
    assert.equal(heldPrivateKeyCount(), 0);
    // A cached static key still gives the right answers.
    const [a, b] = [generatePrivateKey(base), generatePrivateKey(base)];
    crypto.replaceStaticKey!(a, undefined);
    assert.deepEqual(crypto.sharedSecret(a, crypto.publicKey(b)), base.sharedSecret(b, base.publicKey(a)));
    crypto.replaceStaticKey!(b, a);
    assert.equal(heldPrivateKeyCount(), 1);
    crypto.replaceStaticKey!(undefined, b);
  });

  test('sodium-wasm: no private key or shared secret is left anywhere in the WebAssembly heap', async () => {
    const provider = providers.find((p) => p.name === 'sodium-wasm');
    assert.ok(provider, 'sodium-wasm (libsodium-wrappers) is a dependency, so it is always available');
    const sodium = (await import('libsodium-wrappers')).default as unknown as { libsodium: { HEAPU8: Uint8Array } };
    const { crypto, privateKeys, secrets } = withDh(provider);
    handshakes(crypto, 10, false);
    assert.ok(privateKeys.length >= 40 && secrets.length >= 40);
    const heap = Buffer.from(sodium.libsodium.HEAPU8.buffer);
    const found = [...privateKeys, ...secrets].filter((k) => heap.indexOf(k) >= 0);
    assert.equal(found.length, 0, `${found.length} of ${privateKeys.length + secrets.length} private keys and DH results found in the heap`);
  });
});
