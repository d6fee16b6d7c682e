/**
 * Batch sealing and opening in worker threads and inline: byte-identical to the core's
 * single-packet path, in place, per-slot failure reporting.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import type { Crypto } from '../../dataplane/crypto/primitives.ts';
import { InlineCryptoPool, SMALL_BATCH, SplitCryptoPool, WorkerCryptoPool, type CryptoPool } from '../../dataplane/pool/crypto-pool.ts';
import { BatchPool, slotSizeForMtu, type PacketBatch } from '../../dataplane/pool/packet-batch.ts';
import { openTransport, sealTransportInPlace } from '../../dataplane/session/transport.ts';
import { paddedLength } from '../../dataplane/noise/messages.ts';

let crypto: Crypto;
let workers: WorkerCryptoPool;
before(async () => {
  crypto = await selectCrypto();
  workers = new WorkerCryptoPool(2);
});
after(async () => { await workers?.close(); });

const MTU = 1420;

function fill(batch: PacketBatch, sizes: number[], firstCounter: number): Uint8Array[] {
  const plaintexts: Uint8Array[] = [];
  sizes.forEach((size, i) => {
    const p = crypto.randomBytes(size);
    plaintexts.push(p);
    batch.slot(i).set(p, 16);
    batch.lengths[i] = size;
    batch.counters[i] = firstCounter + i;
  });
  batch.count = sizes.length;
  return plaintexts;
}

describe('crypto pools', () => {
  for (const name of ['workers', 'inline'] as const) {
    test(`${name}: a sealed batch matches single-packet sealing and opens back`, async () => {
      const pool: CryptoPool = name === 'workers' ? workers : new InlineCryptoPool(crypto);
      const batches = new BatchPool(slotSizeForMtu(MTU));
      const key = crypto.randomBytes(32);
      const sizes = [0, 1, 15, 16, 17, 100, 1279, 1419, 1420];
      const batch = batches.acquire();
      const plaintexts = fill(batch, sizes, 2 ** 40);
      await pool.seal(batch, key, 0xabcdef01, MTU);
      sizes.forEach((size, i) => {
        const reference = new Uint8Array(slotSizeForMtu(MTU));
        reference.set(plaintexts[i], 16);
        const len = sealTransportInPlace(crypto, key, 0xabcdef01, 2 ** 40 + i, reference, size, MTU);
        assert.ok(typeof len === 'number', 'a random key is not refused');
        assert.equal(batch.lengths[i], len, `length of slot ${i}`);
        assert.deepEqual(batch.slot(i).subarray(0, len), reference.subarray(0, len), `bytes of slot ${i}`);
      });
      batch.slot(3)[20] ^= 1; // tamper one slot
      sizes.forEach((size, i) => {
        const opened = openTransport(crypto, key, 2 ** 40 + i, batch.slot(i).subarray(0, batch.lengths[i]));
        if (i === 3) { assert.equal(opened, null, 'tampered slot fails alone'); return; }
        assert.ok(opened instanceof Uint8Array && opened.length >= size);
        assert.deepEqual(opened.subarray(0, size), plaintexts[i]);
      });
    });
  }

  test('workers: many batches in flight complete, each with its own results', async () => {
    const pool = workers;
    const batches = new BatchPool(slotSizeForMtu(MTU));
    const key = crypto.randomBytes(32);
    const jobs = Array.from({ length: 20 }, (_, j) => {
      const batch = batches.acquire();
      fill(batch, Array.from({ length: 64 }, () => 1000 + j), j * 64);
      return { batch, done: pool.seal(batch, key, j, MTU) };
    });
    await Promise.all(jobs.map((j) => j.done));
    for (const [j, { batch }] of jobs.entries()) {
      assert.equal(batch.slot(0)[4], j, 'receiver index written');
      assert.equal(batch.lengths[63], 16 + paddedLength(1000 + j, MTU) + 16);
    }
  });

  test('workers: more batches in flight than the task rings hold wait in order and all complete; queueDepth drains', async () => {
    const batches = new BatchPool(slotSizeForMtu(MTU));
    const key = crypto.randomBytes(32);
    const count = 700; // more than 2 workers x 256 ring slots
    const jobs = Array.from({ length: count }, (_, j) => {
      const batch = batches.acquire();
      fill(batch, [10 + (j % 50)], j);
      return { batch, done: workers.seal(batch, key, j, MTU) };
    });
    assert.ok(workers.queueDepth > 0);
    await Promise.all(jobs.map((j) => j.done));
    for (const [j, { batch }] of jobs.entries()) {
      assert.equal(new DataView(batch.data.buffer).getUint32(4, true), j, `batch ${j} sealed with its own receiver index`);
      assert.equal(batch.lengths[0], 16 + paddedLength(10 + (j % 50), MTU) + 16);
    }
    assert.equal(workers.queueDepth, 0);
  });


  test('split pool: small batches are sealed at once on this thread, large ones in the workers', async () => {
    // Record which batches reach the worker pool. (Checking whether a batch is "not sealed
    // yet" right after the call races a fast worker thread.)
    const handed: PacketBatch[] = [];
    const recording: CryptoPool = {
      ready: workers.ready,
      get threads() { return workers.threads; },
      seal: (b, k, r, m) => { handed.push(b); return workers.seal(b, k, r, m); },
      close: () => Promise.resolve(),
    };
    const split = new SplitCryptoPool(crypto, recording);
    const batches = new BatchPool(slotSizeForMtu(MTU));
    const key = crypto.randomBytes(32);
    const small = batches.acquire();
    fill(small, Array.from({ length: SMALL_BATCH - 1 }, () => 100), 0);
    const smallDone = split.seal(small, key, 1, MTU);
    assert.equal(small.lengths[0], 16 + 112 + 16, 'sealed before the call returned');
    await smallDone;
    assert.deepEqual(handed, [], 'the small batch never reached a worker');
    const large = batches.acquire();
    fill(large, Array.from({ length: SMALL_BATCH }, () => 100), 0);
    await split.seal(large, key, 1, MTU);
    assert.equal(handed.length, 1, 'the large batch went to the workers');
    assert.equal(handed[0], large);
    assert.equal(large.lengths[0], 16 + 112 + 16);
  });
});
