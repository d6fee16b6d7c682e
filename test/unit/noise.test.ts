/**
 * The Noise IKpsk2 handshake step by step, the message codecs and TAI64N timestamps.
 */
import { before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import type { Crypto } from '../../dataplane/crypto/primitives.ts';
import {
  Handshake, HandshakeState, consumeInitiation, consumeResponse, createInitiation, createResponse,
  deriveSessionKeys, kdf1, kdf2, kdf3, noiseInitialValues, precomputeStaticStatic, type NoiseIdentity,
} from '../../dataplane/noise/noise-protocol.ts';
import {
  classifyMessage, innerPacketLength, paddedLength, readCounter, writeCounter,
} from '../../dataplane/noise/messages.ts';
import { TAI64N_SIZE, tai64n, tai64nAfter } from '../../dataplane/noise/tai64n.ts';
import {
  clampPrivateKey, generatePrivateKey, keyFromBase64, keyFromHex, keyToBase64, keyToHex,
} from '../../dataplane/noise/keys.ts';
import { CookieChecker, CookieGenerator } from '../../dataplane/noise/cookie.ts';

let crypto: Crypto;
before(async () => { crypto = await selectCrypto(); });

const hex = (b: Uint8Array) => Buffer.from(b).toString('hex');

function identity(): NoiseIdentity & { staticPrivate: Uint8Array; staticPublic: Uint8Array } {
  const staticPrivate = generatePrivateKey(crypto);
  return { crypto, staticPrivate, staticPublic: crypto.publicKey(staticPrivate) };
}

describe('Noise IKpsk2 handshake, step by step', () => {
  test('initiator and responder reach the same chaining key and hash after each message', () => {
    const i = identity(), r = identity();
    const iHs = new Handshake(r.staticPublic);
    const rHs = new Handshake(i.staticPublic);
    precomputeStaticStatic(i, iHs);
    precomputeStaticStatic(r, rHs);
    assert.equal(hex(iHs.precomputedStaticStatic!), hex(rHs.precomputedStaticStatic!), 'static-static DH agrees');

    const init = createInitiation(i, iHs, 0x11223344, Date.UTC(2026, 0, 1));
    assert.ok(init instanceof Uint8Array && init.length === 148);
    assert.equal(iHs.state, HandshakeState.InitiationCreated);
    const consumed = consumeInitiation(r, init, 0, 20, (key) => (hex(key) === hex(i.staticPublic) ? { peer: 'I', handshake: rHs } : undefined));
    assert.ok(typeof consumed !== 'string', `consumeInitiation failed: ${String(consumed)}`);
    assert.equal(consumed.peer, 'I');
    assert.equal(hex(rHs.hash), hex(iHs.hash));
    assert.equal(hex(rHs.chainKey), hex(iHs.chainKey));
    assert.equal(rHs.remoteIndex, 0x11223344);

    const resp = createResponse(r, rHs, 0x55667788);
    assert.ok(resp instanceof Uint8Array && resp.length === 92);
    assert.equal(consumeResponse(i, iHs, resp), true);
    assert.equal(hex(rHs.hash), hex(iHs.hash));
    assert.equal(hex(rHs.chainKey), hex(iHs.chainKey));
    assert.equal(iHs.remoteIndex, 0x55667788);

    const iKeys = deriveSessionKeys(crypto, iHs);
    const rKeys = deriveSessionKeys(crypto, rHs);
    assert.ok(typeof iKeys !== 'string' && typeof rKeys !== 'string');
    assert.equal(hex(iKeys.sendKey), hex(rKeys.receiveKey));
    assert.equal(hex(iKeys.receiveKey), hex(rKeys.sendKey));
    assert.notEqual(hex(iKeys.sendKey), hex(iKeys.receiveKey));
    assert.equal(iKeys.isInitiator, true);
    assert.equal(rKeys.isInitiator, false);
    assert.equal(iHs.state, HandshakeState.Zeroed, 'secrets wiped after derivation');
    assert.equal(hex(iHs.chainKey), '00'.repeat(32));
  });

  test('a response only completes the handshake it answers (wrong state, tampered, wrong key)', () => {
    const i = identity(), r = identity();
    const iHs = new Handshake(r.staticPublic), rHs = new Handshake(i.staticPublic);
    precomputeStaticStatic(i, iHs); precomputeStaticStatic(r, rHs);
    const init = createInitiation(i, iHs, 1, Date.now()) as Uint8Array;
    consumeInitiation(r, init, 0, 20, () => ({ peer: 1, handshake: rHs }));
    const resp = createResponse(r, rHs, 2) as Uint8Array;
    const tampered = Uint8Array.from(resp); tampered[50] ^= 1;
    assert.equal(consumeResponse(i, iHs, tampered), 'decryption-failed');
    assert.equal(iHs.state, HandshakeState.InitiationCreated, 'a failed response changes nothing');
    assert.equal(consumeResponse(i, iHs, resp), true);
    assert.equal(consumeResponse(i, iHs, resp), 'wrong-state', 'a response is consumed once');
    assert.equal(createResponse(r, new Handshake(i.staticPublic), 3), 'wrong-state');
  });

  test('low-order points are rejected: a zero ephemeral, and a peer whose key is a low-order point', () => {
    const i = identity(), r = identity();
    const iHs = new Handshake(r.staticPublic), rHs = new Handshake(i.staticPublic);
    precomputeStaticStatic(i, iHs); precomputeStaticStatic(r, rHs);
    const init = createInitiation(i, iHs, 1, Date.now()) as Uint8Array;
    const zeroEphemeral = Uint8Array.from(init);
    zeroEphemeral.fill(0, 8, 40);
    assert.equal(consumeInitiation(r, zeroEphemeral, 0, 20, () => ({ peer: 1, handshake: rHs })), 'low-order-point');

    const badPeer = new Handshake(new Uint8Array(32)); // the all-zero point has low order
    precomputeStaticStatic(i, badPeer);
    assert.equal(badPeer.precomputedStaticStatic, null);
    assert.equal(createInitiation(i, badPeer, 2, Date.now()), 'invalid-peer-key');
  });

  test('an initiation for an unknown static key or with a stale timestamp is refused', () => {
    const i = identity(), r = identity();
    const iHs = new Handshake(r.staticPublic), rHs = new Handshake(i.staticPublic);
    precomputeStaticStatic(i, iHs); precomputeStaticStatic(r, rHs);
    const early = createInitiation(i, iHs, 1, Date.UTC(2026, 0, 1, 0, 0, 0)) as Uint8Array;
    const earlyCopy = Uint8Array.from(early);
    const late = Uint8Array.from(createInitiation(i, iHs, 2, Date.UTC(2026, 0, 1, 0, 0, 1)) as Uint8Array);
    assert.equal(consumeInitiation(r, earlyCopy, 0, 20, () => undefined), 'unknown-peer');
    assert.ok(typeof consumeInitiation(r, late, 0, 20, () => ({ peer: 1, handshake: rHs })) !== 'string');
    assert.equal(consumeInitiation(r, earlyCopy, 1000, 20, () => ({ peer: 1, handshake: rHs })), 'replayed-timestamp');
    assert.equal(consumeInitiation(r, late, 2000, 20, () => ({ peer: 1, handshake: rHs })), 'replayed-timestamp');
  });

  test('the initial chaining key and hash match the published constants', () => {
    const v = noiseInitialValues(crypto);
    assert.equal(hex(v.chainKey), '60e26daef327efc02ec335e2a025d2d016eb4206f87277f52d38d1988b78cd36');
    assert.equal(hex(v.hash), '2211b361081ac566691243db458ad5322d9c6c662293e8b70ee19c65ba079ef3');
  });

  test('KDF1/2/3 match the wireguard-go vectors', () => {
    const te = new TextEncoder();
    const [a0, a1, a2] = kdf3(crypto, te.encode('test-key'), te.encode('test-input'));
    assert.equal(hex(a0), '6f0e5ad38daba1bea8a0d213688736f19763239305e0f58aba697f9ffc41c633');
    assert.equal(hex(a1), 'df1194df20802a4fe594cde27e92991c8cae66c366e8106aaa937a55fa371e8a');
    assert.equal(hex(a2), 'fac6e2745a325f5dc5d11a5b165aad08b0ada28e7b4e666b7c077934a4d76c24');
    const [b0, b1] = kdf2(crypto, te.encode('wireguard'), te.encode('wireguard'));
    assert.equal(hex(b0), '491d43bbfdaa8750aaf535e334ecbfe5129967cd64635101c566d4caefda96e8');
    assert.equal(hex(b1), '1e71a379baefd8a79aa4662212fcafe19a23e2b609a3db7d6bcba8f560e3d25f');
    assert.equal(hex(kdf1(crypto, new Uint8Array(0), new Uint8Array(0))),
      '8387b46bf43eccfcf349552a095d8315c4055beb90208fb1be23b894bc2ed5d0');
  });
});

describe('cookies', () => {
  test('mac1 round trip, one-bit tamper, and mac2 bound to the source address', () => {
    const r = identity();
    const checker = new CookieChecker(crypto, r.staticPublic, 120_000);
    const generator = new CookieGenerator(crypto, r.staticPublic, 120_000);
    const msg = crypto.randomBytes(148);
    generator.addMacs(msg, 0);
    assert.ok(checker.checkMac1(msg));
    assert.equal(checker.checkMac2(msg, Uint8Array.of(10, 0, 0, 1), 1000, 0), false, 'no cookie yet');
    for (const bit of [0, 50, 115, 116, 131]) {
      const bad = Uint8Array.from(msg); bad[bit] ^= 1;
      assert.equal(checker.checkMac1(bad), false, `tamper at ${bit}`);
    }
    const reply = checker.createReply(msg, Uint8Array.of(10, 0, 0, 1), 1000, 0);
    assert.ok(generator.consumeReply(reply, 0));
    const msg2 = crypto.randomBytes(148);
    generator.addMacs(msg2, 1);
    assert.ok(checker.checkMac2(msg2, Uint8Array.of(10, 0, 0, 1), 1000, 1));
    assert.equal(checker.checkMac2(msg2, Uint8Array.of(10, 0, 0, 2), 1000, 1), false, 'other address');
    assert.equal(checker.checkMac2(msg2, Uint8Array.of(10, 0, 0, 1), 1001, 1), false, 'other port');
    assert.equal(checker.checkMac2(msg2, Uint8Array.of(10, 0, 0, 1), 1000, 120_001), false, 'secret too old');
    const msg3 = crypto.randomBytes(148);
    generator.addMacs(msg3, 120_001);
    assert.equal(hex(msg3.subarray(132)), '00'.repeat(16), 'stale cookie: mac2 is zero');
  });
});

describe('message codecs', () => {
  test('classify by type and exact length', () => {
    const make = (type: number, len: number) => { const b = new Uint8Array(len); b[0] = type; return b; };
    assert.deepEqual(classifyMessage(make(1, 148)), { ok: true, type: 1 });
    assert.deepEqual(classifyMessage(make(2, 92)), { ok: true, type: 2 });
    assert.deepEqual(classifyMessage(make(3, 64)), { ok: true, type: 3 });
    assert.deepEqual(classifyMessage(make(4, 32)), { ok: true, type: 4 });
    assert.deepEqual(classifyMessage(make(4, 1500)), { ok: true, type: 4 });
    assert.deepEqual(classifyMessage(make(4, 31)), { ok: false, reason: 'too-short' });
    assert.deepEqual(classifyMessage(make(1, 147)), { ok: false, reason: 'bad-length' });
    assert.deepEqual(classifyMessage(make(2, 148)), { ok: false, reason: 'bad-length' });
    assert.deepEqual(classifyMessage(make(3, 92)), { ok: false, reason: 'bad-length' });
    assert.deepEqual(classifyMessage(make(5, 64)), { ok: false, reason: 'unknown-type' });
    assert.deepEqual(classifyMessage(make(0, 64)), { ok: false, reason: 'unknown-type' });
    const reserved = make(4, 64); reserved[3] = 1;
    assert.deepEqual(classifyMessage(reserved), { ok: false, reason: 'unknown-type' });
  });

  test('padding: multiple of 16, never past the MTU, rounding on length % mtu above it', () => {
    assert.equal(paddedLength(0, 1420), 0);
    assert.equal(paddedLength(1, 1420), 16);
    assert.equal(paddedLength(16, 1420), 16);
    assert.equal(paddedLength(17, 1420), 32);
    assert.equal(paddedLength(1400, 1420), 1408);
    assert.equal(paddedLength(1410, 1420), 1420, 'rounding would pass the MTU');
    assert.equal(paddedLength(1419, 1420), 1420, 'capped at the MTU');
    assert.equal(paddedLength(1420, 1420), 1420);
    assert.equal(paddedLength(1421, 1420), 1421 + 15, 'above the MTU: rounds the remainder');
    assert.equal(paddedLength(100, 0), 112, 'no MTU: plain rounding');
  });

  test('inner packet length comes from the IP header; garbage is refused', () => {
    const v4 = new Uint8Array(48); v4[0] = 0x45; v4[3] = 40;
    assert.equal(innerPacketLength(v4, 0, 48), 40);
    const v6 = new Uint8Array(64); v6[0] = 0x60; v6[5] = 8;
    assert.equal(innerPacketLength(v6, 0, 64), 48);
    assert.equal(innerPacketLength(v4, 0, 30), -1, 'claims more than received');
    const v4short = new Uint8Array(20); v4short[0] = 0x45; v4short[3] = 10;
    assert.equal(innerPacketLength(v4short, 0, 20), -1, 'total length below header size');
    assert.equal(innerPacketLength(new Uint8Array(40).fill(0x70), 0, 40), -1, 'version 7');
    assert.equal(innerPacketLength(new Uint8Array(0), 0, 0), -1);
  });

  test('64-bit counters: written little-endian, huge ones read as Infinity', () => {
    const b = new Uint8Array(8);
    writeCounter(b, 0, 2 ** 40 + 5);
    assert.equal(hex(b), '0500000000010000');
    assert.equal(readCounter(b, 0), 2 ** 40 + 5);
    assert.equal(readCounter(Uint8Array.from([0, 0, 0, 0, 0, 0, 0x20, 0]), 0), Infinity);
    assert.equal(readCounter(new Uint8Array(8).fill(0xff), 0), Infinity);
  });
});

describe('TAI64N', () => {
  test('layout: base 2^62 + 10 seconds, big-endian, whitened nanoseconds', () => {
    const t = tai64n(Date.UTC(2026, 0, 1) + 123);
    assert.equal(t.length, TAI64N_SIZE);
    const seconds = BigInt(Date.UTC(2026, 0, 1) / 1000) + (1n << 62n) + 10n;
    assert.equal(hex(t.subarray(0, 8)), seconds.toString(16).padStart(16, '0'));
    const nanos = new DataView(t.buffer, t.byteOffset).getUint32(8);
    assert.equal(nanos & 0xffffff, 0, 'low 24 bits cleared');
    assert.ok(nanos <= 123_000_000 && nanos > 123_000_000 - 0x1000000);
  });

  test('ordering: the same instant is not after; 20 ms later always is', () => {
    for (let ms = 0; ms < 1000; ms += 7) {
      const base = Date.UTC(2026, 5, 1) + ms;
      assert.equal(tai64nAfter(tai64n(base), tai64n(base)), false);
      assert.equal(tai64nAfter(tai64n(base + 20), tai64n(base)), true);
      assert.equal(tai64nAfter(tai64n(base), tai64n(base + 20)), false);
    }
    assert.equal(tai64nAfter(tai64n(Date.UTC(2027, 0, 1)), tai64n(Date.UTC(2026, 11, 31, 23, 59, 59, 999))), true);
  });
});

describe('keys', () => {
  test('clamping, base64 and hex round trips, and descriptive errors', () => {
    const k = clampPrivateKey(new Uint8Array(32).fill(0xff));
    assert.equal(k[0], 0xf8);
    assert.equal(k[31], 0x7f);
    const k2 = clampPrivateKey(new Uint8Array(32));
    assert.equal(k2[31], 0x40);
    const key = generatePrivateKey(crypto);
    assert.deepEqual(keyFromBase64(keyToBase64(key)), key);
    assert.deepEqual(keyFromHex(keyToHex(key)), key);
    assert.throws(() => keyFromBase64('abc'), /32 bytes in base64/);
    assert.throws(() => keyFromHex('zz'), /64 hex digits/);
  });
});

describe('Noise handshake: no secret outlives the step that made it', () => {
  /**
   * A Crypto that remembers every buffer its secret-producing primitives return while recording
   * (hashes, HMACs, so every KDF output, DH results, random bytes, so every ephemeral key).
   */
  function recordingCrypto(inner: Crypto) {
    const made: Uint8Array[] = [];
    let recording = false;
    const seen = <T extends Uint8Array | null>(out: T): T => {
      if (recording && out !== null) made.push(out);
      return out;
    };
    const wrapped: Crypto = {
      ...inner,
      hash: (...parts) => seen(inner.hash(...parts)),
      hmac: (key, ...parts) => seen(inner.hmac(key, ...parts)),
      sharedSecret: (priv, pub) => seen(inner.sharedSecret(priv, pub)),
      randomBytes: (n) => seen(inner.randomBytes(n)),
    };
    noiseInitialValues(wrapped); // computed once per Crypto and kept: not a per-handshake secret
    return { crypto: wrapped, made, record: (on: boolean) => { recording = on; } };
  }

  const zero = (b: Uint8Array) => b.every((x) => x === 0);

  function setup() {
    const rec = recordingCrypto(crypto);
    const make = () => {
      const staticPrivate = generatePrivateKey(crypto);
      return { crypto: rec.crypto, staticPrivate, staticPublic: crypto.publicKey(staticPrivate) };
    };
    const i = make(), r = make();
    const iHs = new Handshake(r.staticPublic), rHs = new Handshake(i.staticPublic);
    const psk = generatePrivateKey(crypto);
    iHs.presharedKey = Uint8Array.from(psk);
    rHs.presharedKey = Uint8Array.from(psk);
    precomputeStaticStatic(i, iHs);
    precomputeStaticStatic(r, rHs);
    const find = (key: Uint8Array) => (hex(key) === hex(i.staticPublic) ? { peer: 'I', handshake: rHs } : undefined);
    return { rec, i, r, iHs, rHs, find };
  }

  /** The handshake's per-attempt secrets (not the configuration: psk, static-static DH). */
  function assertHandshakeZeroed(hs: Handshake, what: string): void {
    assert.ok(zero(hs.hash), `${what}: hash`);
    assert.ok(zero(hs.chainKey), `${what}: chaining key`);
    assert.ok(zero(hs.localEphemeralPrivate), `${what}: ephemeral private key`);
    assert.ok(zero(hs.remoteEphemeral), `${what}: remote ephemeral`);
    assert.equal(hs.state, HandshakeState.Zeroed, what);
  }

  test('a completed handshake leaves nothing but the two session keys: every intermediate is zero', () => {
    const { rec, i, r, iHs, rHs, find } = setup();
    rec.record(true);
    const init = createInitiation(i, iHs, 7, Date.now());
    assert.ok(init instanceof Uint8Array);
    assert.ok(!zero(iHs.localEphemeralPrivate), 'the initiator keeps its ephemeral key until the response');
    assert.ok(typeof consumeInitiation(r, init, 0, 20, find) !== 'string');
    const resp = createResponse(r, rHs, 8);
    assert.ok(resp instanceof Uint8Array);
    assert.ok(zero(rHs.localEphemeralPrivate), 'the responder needs its ephemeral key no longer than the response');
    const rKeys = deriveSessionKeys(rec.crypto, rHs);
    assert.equal(consumeResponse(i, iHs, resp), true);
    assert.ok(zero(iHs.localEphemeralPrivate), 'the initiator\'s ephemeral key goes once the response is consumed');
    const iKeys = deriveSessionKeys(rec.crypto, iHs);
    rec.record(false);
    assert.ok(typeof rKeys !== 'string' && typeof iKeys !== 'string');
    const sessionKeys = new Set([rKeys.sendKey, rKeys.receiveKey, iKeys.sendKey, iKeys.receiveKey]);
    const left = rec.made.filter((b) => !sessionKeys.has(b) && !zero(b));
    assert.ok(rec.made.length > 30, `recorded ${rec.made.length} intermediates`);
    assert.deepEqual(left.map(hex), [], `${left.length} of ${rec.made.length} intermediates were not wiped`);
    assertHandshakeZeroed(iHs, 'initiator');
    assertHandshakeZeroed(rHs, 'responder');
  });

  test('failed and abandoned steps wipe their intermediates too; clear() zeroes what a step kept', () => {
    const { rec, i, r, iHs, rHs, find } = setup();
    rec.record(true);
    const first = createInitiation(i, iHs, 7, Date.now());
    assert.ok(first instanceof Uint8Array);
    const firstEphemeral = Uint8Array.from(iHs.localEphemeralPrivate);
    const init = createInitiation(i, iHs, 9, Date.now() + 1); // a retry replaces the attempt
    assert.ok(init instanceof Uint8Array);
    assert.notEqual(hex(iHs.localEphemeralPrivate), hex(firstEphemeral));
    // An initiation from somebody we do not know, one that does not decrypt, and one from a
    // low-order ephemeral.
    assert.equal(consumeInitiation(r, init, 0, 20, () => undefined), 'unknown-peer');
    const tampered = Uint8Array.from(init);
    tampered[60] ^= 1;
    assert.equal(consumeInitiation(r, tampered, 0, 20, find), 'decryption-failed');
    const lowOrder = Uint8Array.from(init);
    lowOrder.fill(0, 8, 40);
    assert.equal(consumeInitiation(r, lowOrder, 0, 20, find), 'low-order-point');
    assert.ok(typeof consumeInitiation(r, init, 0, 20, find) !== 'string');
    const resp = createResponse(r, rHs, 8);
    assert.ok(resp instanceof Uint8Array);
    const badResp = Uint8Array.from(resp);
    badResp[50] ^= 1; // in the encrypted empty payload
    const before = [hex(iHs.hash), hex(iHs.chainKey), hex(iHs.localEphemeralPrivate)];
    assert.equal(consumeResponse(i, iHs, badResp), 'decryption-failed');
    assert.deepEqual([hex(iHs.hash), hex(iHs.chainKey), hex(iHs.localEphemeralPrivate)], before, 'a failed response changes nothing');
    rec.record(false);
    const left = rec.made.filter((b) => !zero(b));
    assert.deepEqual(left.map(hex), [], `${left.length} of ${rec.made.length} intermediates were not wiped`);
    // What the steps kept lives only in the handshakes' own buffers, which clear() zeroes.
    iHs.clear();
    rHs.clear();
    assertHandshakeZeroed(iHs, 'abandoned initiator');
    assertHandshakeZeroed(rHs, 'abandoned responder');
  });

  test('a recomputed static-static DH wipes the old one', () => {
    const { i, iHs } = setup();
    const old = iHs.precomputedStaticStatic!;
    assert.ok(!zero(old));
    const other = generatePrivateKey(crypto);
    precomputeStaticStatic({ crypto, staticPrivate: other, staticPublic: crypto.publicKey(other) }, iHs);
    assert.ok(zero(old), 'the old DH result is zero');
    assert.ok(!zero(iHs.precomputedStaticStatic!));
    precomputeStaticStatic({ crypto, staticPrivate: undefined, staticPublic: undefined }, iHs);
    assert.equal(iHs.precomputedStaticStatic, null);
    void i;
  });
});
