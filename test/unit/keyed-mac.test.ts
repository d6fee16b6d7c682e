/**
 * KeyedMac (dataplane/noise/keyed-mac.ts), the handshake gate's precomputed-key BLAKE2s MAC,
 * against the crypto provider's `mac` (itself checked against known answers in
 * crypto-vectors.test.ts): every key length, every data length across the block boundaries.
 */
import { before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import type { Crypto } from '../../dataplane/crypto/primitives.ts';
import { KeyedMac } from '../../dataplane/noise/keyed-mac.ts';
import { prng } from '../helpers/prng.ts';
import { randomBytes } from '../helpers/fuzz.ts';

let crypto: Crypto;
before(async () => { crypto = await selectCrypto(); });

const hex = (b: Uint8Array) => Buffer.from(b).toString('hex');

describe('KeyedMac', () => {
  test('equals the provider\'s MAC for keys of 1 to 32 bytes and data of 0 to 200 bytes', () => {
    const rng = prng(0x6ac);
    for (let keyLength = 1; keyLength <= 32; keyLength++) {
      const key = randomBytes(rng, keyLength);
      const mac = new KeyedMac(key);
      for (let length = 0; length <= 200; length++) {
        const data = randomBytes(rng, length);
        assert.equal(hex(mac.mac(data)), hex(crypto.mac(key, data)), `key ${keyLength} bytes, data ${length} bytes`);
      }
    }
  });

  test('verify: true for the MAC at the offset, false for any flipped bit of data or MAC', () => {
    const rng = prng(0x6ad);
    const key = randomBytes(rng, 32);
    const mac = new KeyedMac(key);
    const message = randomBytes(rng, 148);
    message.set(crypto.mac(key, message.subarray(0, 116)), 116);
    assert.equal(mac.verify(message.subarray(0, 116), message, 116), true);
    for (const bit of [0, 7, 8 * 63, 8 * 64, 8 * 115 + 7, 8 * 116, 8 * 131 + 7]) {
      const bad = message.slice();
      bad[bit >> 3] ^= 1 << (bit & 7);
      assert.equal(mac.verify(bad.subarray(0, 116), bad, 116), false, `bit ${bit}`);
    }
  });

  test('rejects keys outside 1..32 bytes', () => {
    assert.throws(() => new KeyedMac(new Uint8Array(0)), RangeError);
    assert.throws(() => new KeyedMac(new Uint8Array(33)), RangeError);
  });
});
