/**
 * ChaCha20-Poly1305 over runs of slots (dataplane/crypto/aead-slots.ts): every provider's slot
 * forms (openssl-ffi's own in C, the others' the reference loop) against single-message seals by
 * the portable provider, round trips, forgeries, and arguments out of bounds, which must be
 * refused without a byte written outside the run.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { loadProviders } from '../../dataplane/crypto/select.ts';
import { withSlots } from '../../dataplane/crypto/aead-slots.ts';
import { TAG_SIZE, writeCounterNonce, type SlotAead } from '../../dataplane/crypto/primitives.ts';
import { prng } from '../helpers/prng.ts';

const providers = await loadProviders();
const portable = withSlots(providers.find((p) => p.provider.name === 'portable')!.provider.aead!);

const STRIDE = 1600;
const OFFSET = 16;

interface Run {
  data: Uint8Array;
  lengths: Int32Array;
  counters: Float64Array;
  count: number;
  plaintexts: Uint8Array[];
}

function randomRun(seed: number, count: number): Run {
  const rand = prng(seed);
  const data = new Uint8Array(count * STRIDE + 7); // a tail the run must never touch
  data.fill(0xee);
  const lengths = new Int32Array(count);
  const counters = new Float64Array(count);
  const plaintexts: Uint8Array[] = [];
  for (let i = 0; i < count; i++) {
    const length = i === 0 ? 0 : Math.floor(rand() * (STRIDE - OFFSET - TAG_SIZE + 1));
    const plaintext = Uint8Array.from({ length }, () => Math.floor(rand() * 256));
    data.set(plaintext, i * STRIDE + OFFSET);
    lengths[i] = length;
    // Small counters, ones past 2^32 (the nonce's high word) and the largest exact double.
    counters[i] = i === 1 ? 2 ** 53 - 1 : i % 3 === 0 ? 2 ** 32 + Math.floor(rand() * 1e9) : Math.floor(rand() * 1e6);
    plaintexts.push(plaintext);
  }
  return { data, lengths, counters, count, plaintexts };
}

const key = Uint8Array.from({ length: 32 }, (_, i) => i * 7 + 1);

for (const { provider, error } of providers) {
  if (!provider.aead) continue;
  describe(`aead slots: ${provider.name}${error ? ` (${error})` : ''}`, () => {
    const aead: SlotAead = withSlots(provider.aead!);

    test('sealing a run equals sealing each message alone; opening it gives the plaintexts back', () => {
      for (const seed of [1, 2, 3]) {
        const run = randomRun(seed, 24);
        aead.sealSlots(key, run.data, STRIDE, OFFSET, run.count, run.lengths, run.counters);
        assert.deepEqual(Array.from(run.lengths), run.plaintexts.map((p) => p.length), 'sealing leaves the lengths as they were');
        for (let i = 0; i < run.count; i++) {
          const alone = portable.seal(key, writeCounterNonce(run.counters[i]), run.plaintexts[i], undefined);
          const start = i * STRIDE + OFFSET;
          assert.deepEqual(run.data.subarray(start, start + alone.length), alone, `slot ${i}`);
        }
        assert.ok(run.data.subarray(run.count * STRIDE).every((b) => b === 0xee), 'nothing past the run was written');
        const sealed = Int32Array.from(run.lengths, (n) => n + TAG_SIZE);
        aead.openSlots(key, run.data, STRIDE, OFFSET, run.count, sealed, run.counters);
        assert.deepEqual(Array.from(sealed), run.plaintexts.map((p) => p.length));
        for (let i = 0; i < run.count; i++) {
          const start = i * STRIDE + OFFSET;
          assert.deepEqual(run.data.subarray(start, start + run.plaintexts[i].length), run.plaintexts[i], `slot ${i} opened`);
        }
      }
    });

    test('a forged, truncated or wrongly counted message fails alone; the others still open', () => {
      const run = randomRun(9, 8);
      aead.sealSlots(key, run.data, STRIDE, OFFSET, run.count, run.lengths, run.counters);
      const sealed = Int32Array.from(run.lengths, (n) => n + TAG_SIZE);
      run.data[2 * STRIDE + OFFSET] ^= 1; // slot 2: a flipped ciphertext (or tag) bit
      sealed[3] = TAG_SIZE - 1; // slot 3: shorter than a tag
      const counters = Float64Array.from(run.counters);
      counters[4] += 1; // slot 4: replayed under another counter
      aead.openSlots(key, run.data, STRIDE, OFFSET, run.count, sealed, counters);
      assert.deepEqual([sealed[2], sealed[3], sealed[4]], [-1, -1, -1]);
      for (const i of [0, 1, 5, 6, 7]) assert.equal(sealed[i], run.plaintexts[i].length, `slot ${i} still opens`);
    });

    test('a run that does not fit its buffer, or a message longer than its slot, is refused', () => {
      const run = randomRun(4, 4);
      assert.throws(() => aead.sealSlots(key, run.data, STRIDE, OFFSET, 5, new Int32Array(5), new Float64Array(5)), /do not fit/);
      assert.throws(() => aead.sealSlots(key, run.data, STRIDE, STRIDE + 1, 1, run.lengths, run.counters), /offset/);
      assert.throws(() => aead.openSlots(key, run.data, 0, OFFSET, 1, run.lengths, run.counters), /stride/);
      const lengths = Int32Array.from(run.lengths);
      lengths[1] = STRIDE - OFFSET - TAG_SIZE + 1; // its tag would spill into slot 2
      const slot2 = run.data.slice(2 * STRIDE, 3 * STRIDE);
      assert.throws(() => aead.sealSlots(key, run.data, STRIDE, OFFSET, run.count, lengths, run.counters), RangeError);
      assert.deepEqual(run.data.subarray(2 * STRIDE, 3 * STRIDE), slot2, 'slot 2 untouched');
      const fresh = randomRun(5, 4);
      aead.sealSlots(key, fresh.data, STRIDE, OFFSET, fresh.count, fresh.lengths, fresh.counters);
      const tooLong = Int32Array.from(fresh.lengths, (n) => n + TAG_SIZE);
      tooLong[0] = STRIDE - OFFSET + 1;
      aead.openSlots(key, fresh.data, STRIDE, OFFSET, fresh.count, tooLong, fresh.counters);
      assert.equal(tooLong[0], -1, 'a message past its slot is not opened');
      for (let i = 1; i < fresh.count; i++) assert.equal(tooLong[i], fresh.plaintexts[i].length, `slot ${i} still opens`);
    });
  });
}
