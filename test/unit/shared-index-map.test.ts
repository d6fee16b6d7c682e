/**
 * The receiver-index map in shared memory (dataplane/session/shared-index-map.ts), the mirror of
 * IndexTable's keypair entries that other threads read without a lock.
 *
 * - Examples: set, replace, delete, growth with a reader moved to the new buffer, tombstones.
 * - A model-based test: random inserts, replacements and deletes against a Map, with readers
 *   that joined at different sizes, checked after every step (growth and in-place rebuilds
 *   included).
 * - Real threads: a worker looks up indices while the main thread inserts, deletes and grows the
 *   map, and never gets a torn or mixed answer.
 * - IndexTable keeps it equal to its keypair entries.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { MessageChannel } from 'node:worker_threads';
import { IndexMapReader, SharedIndexMap, type IndexedSlot } from '../../dataplane/session/shared-index-map.ts';
import { IndexTable } from '../../dataplane/session/index-table.ts';
import { Keypair } from '../../dataplane/session/keypair.ts';
import { KeypairTable } from '../../dataplane/session/keypair-table.ts';
import { startWorker } from '../../dataplane/sys/threads.ts';
import { prng } from '../helpers/prng.ts';
import { ALTERNATES, expectedFor, indexAt, type MapWorkerConfig } from './shared-index-map-worker.ts';

const SOAK = process.env.ROAMGUARD_SOAK === '1';

/** A reader on this thread, handed new buffers through a queue (a worker uses a MessagePort). */
function localReader(map: SharedIndexMap): IndexMapReader {
  const queue: SharedArrayBuffer[] = [];
  map.onMove((buffer) => queue.push(buffer));
  return new IndexMapReader(map.buffer, () => queue.shift());
}

const look = (reader: IndexMapReader, index: number): IndexedSlot | undefined => {
  const found = reader.lookup(index, { slot: -1, generation: -1 });
  return found && { ...found };
};

describe('shared index map: examples', () => {
  test('set, replace and delete are what a reader sees', () => {
    const map = new SharedIndexMap();
    const reader = localReader(map);
    assert.equal(look(reader, 0xdeadbeef), undefined);
    map.set(0xdeadbeef, 5, 1);
    assert.deepEqual(look(reader, 0xdeadbeef), { slot: 5, generation: 1 });
    map.set(0xdeadbeef, 9, 4);
    assert.deepEqual(look(reader, 0xdeadbeef), { slot: 9, generation: 4 });
    assert.equal(map.size, 1);
    map.delete(0xdeadbeef);
    assert.equal(look(reader, 0xdeadbeef), undefined);
    assert.equal(map.size, 0);
    map.delete(0xdeadbeef); // gone already: nothing happens
    map.set(0, 1, 1); // index 0 is an index like any other
    assert.deepEqual(look(reader, 0), { slot: 1, generation: 1 });
  });

  test('growing hands readers the new buffer; they find every entry in it', () => {
    const map = new SharedIndexMap(4);
    const early = localReader(map);
    for (let i = 0; i < 1000; i++) map.set(indexAt(i), i, i + 1);
    assert.ok(map.capacity >= 2048, `grew to ${map.capacity}`);
    const late = localReader(map); // joined after the growth: starts on the current buffer
    for (let i = 0; i < 1000; i++) {
      assert.deepEqual(look(early, indexAt(i)), { slot: i, generation: i + 1 });
      assert.deepEqual(look(late, indexAt(i)), { slot: i, generation: i + 1 });
    }
  });

  test('deletes leave tombstones that a rebuild in place clears, without growing', () => {
    const map = new SharedIndexMap(64);
    const reader = localReader(map);
    for (let round = 0; round < 2000; round++) {
      map.set(indexAt(round), round, 1);
      if (round >= 8) map.delete(indexAt(round - 8));
    }
    assert.equal(map.capacity, 64, 'eight live entries never need more than 64');
    assert.equal(map.size, 8);
    for (let i = 1992; i < 2000; i++) assert.deepEqual(look(reader, indexAt(i)), { slot: i, generation: 1 });
    assert.equal(look(reader, indexAt(1991)), undefined);
  });

  test('a capacity that is not a power of 2 is refused with a clear error', () => {
    assert.throws(() => new SharedIndexMap(100), /power of 2/);
  });
});

describe('shared index map: model-based', () => {
  for (const seed of [0x1dec01, 0x1dec02]) {
    test(`seed ${seed.toString(16)}: every reader's answer equals a Map's after every step`, () => {
      const rand = prng(seed);
      const map = new SharedIndexMap(8);
      const model = new Map<number, IndexedSlot>();
      const readers = [localReader(map)];
      // A small pool of indices (so entries are replaced and re-added), spread like random ones.
      const pool = Array.from({ length: 600 }, (_, i) => indexAt(i * 13));
      let peak = 0;
      const steps = SOAK ? 1_000_000 : 30_000;
      for (let step = 0; step < steps; step++) {
        const index = pool[Math.floor(rand() * pool.length)];
        // Phases of growth and shrinking, so the map both grows and rebuilds in place.
        const inserting = Math.floor(step / 5000) % 2 === 0 ? 0.65 : 0.3;
        if (rand() < inserting) {
          const value = { slot: Math.floor(rand() * 4096), generation: 1 + Math.floor(rand() * 1000) };
          map.set(index, value.slot, value.generation);
          model.set(index, value);
        } else {
          map.delete(index);
          model.delete(index);
        }
        if (rand() < 0.01) readers.push(localReader(map)); // a thread joining now
        peak = Math.max(peak, model.size);
        assert.equal(map.size, model.size, `step ${step}: size`);
        for (let probe = 0; probe < 4; probe++) {
          const asked = probe === 0 ? index : pool[Math.floor(rand() * pool.length)];
          const reader = readers[Math.floor(rand() * readers.length)];
          assert.deepEqual(look(reader, asked), model.get(asked), `step ${step}: index ${asked}`);
        }
      }
      assert.ok(peak > 300, `the map held up to ${peak} entries`);
      assert.ok(map.capacity <= 4 * 1024, `capacity ${map.capacity} stays in proportion to the ${peak} entries it held`);
      for (const index of pool) assert.deepEqual(look(readers[0], index), model.get(index));
    });
  }
});

describe('shared index map: real threads', () => {
  test('a worker looking up indices while the main thread inserts, deletes and grows never reads a torn entry', async () => {
    const INDICES = 4096;
    const map = new SharedIndexMap(8);
    const { port1, port2 } = new MessageChannel();
    map.onMove((buffer) => port1.postMessage(buffer));
    const control = new Int32Array(new SharedArrayBuffer(16));
    const config: MapWorkerConfig = { buffer: map.buffer, port: port2, control: control.buffer as SharedArrayBuffer, indices: INDICES };
    const worker = startWorker(new URL('./shared-index-map-worker.ts', import.meta.url), { ...config }, [port2]);
    const exited = new Promise<number>((resolve, reject) => { worker.once('exit', resolve); worker.once('error', reject); });
    const rand = prng(0xabc);
    const until = performance.now() + (SOAK ? 60_000 : 1500);
    let writes = 0;
    const live = new Set<number>();
    let grew = map.capacity;
    while (performance.now() < until) {
      for (let i = 0; i < 500; i++) {
        const index = indexAt(Math.floor(rand() * INDICES));
        if (live.has(index) && rand() < 0.5) {
          map.delete(index);
          live.delete(index);
        } else {
          const { slot, generation } = expectedFor(index);
          map.set(index, slot, generation);
          live.add(index);
        }
        writes++;
      }
      grew = Math.max(grew, map.capacity);
      await new Promise((resolve) => setImmediate(resolve));
    }
    Atomics.store(control, 0, 1);
    await exited;
    port1.close();
    assert.equal(Atomics.load(control, 1), 0, 'the worker read a torn or mixed entry');
    assert.ok(Atomics.load(control, 2) > 1000, `the worker found entries: ${Atomics.load(control, 2)}`);
    assert.ok(grew >= 4096, `the map grew under the worker (capacity ${grew})`);
    assert.ok(writes > 10_000, `the main thread wrote ${writes} times`);
  });

  test('a write that overlaps a lookup makes the reader look again: no answer mixes two writes', async () => {
    const map = new SharedIndexMap();
    const index = indexAt(1);
    map.set(index, ALTERNATES[0].slot, ALTERNATES[0].generation);
    const control = new Int32Array(new SharedArrayBuffer(16));
    const { port1, port2 } = new MessageChannel();
    const config: MapWorkerConfig = { buffer: map.buffer, port: port2, control: control.buffer as SharedArrayBuffer, indices: 1, alternating: index };
    const worker = startWorker(new URL('./shared-index-map-worker.ts', import.meta.url), { ...config }, [port2]);
    const exited = new Promise<number>((resolve, reject) => { worker.once('exit', resolve); worker.once('error', reject); });
    const until = performance.now() + (SOAK ? 30_000 : 1000);
    let flips = 0;
    while (performance.now() < until) {
      for (let i = 0; i < 20_000; i++) {
        const next = ALTERNATES[++flips & 1];
        map.set(index, next.slot, next.generation); // slot, then generation: two plain stores
      }
      await new Promise((resolve) => setImmediate(resolve));
    }
    Atomics.store(control, 0, 1);
    await exited;
    port1.close();
    assert.ok(Atomics.load(control, 2) > 10_000, `the worker's lookups: ${Atomics.load(control, 2)}`);
    assert.equal(Atomics.load(control, 1), 0, 'a lookup returned the slot of one write and the generation of another');
  });
});

describe('IndexTable mirrors its keypair entries', () => {
  test('an index is in the shared map from attachKeypair until delete, with the keypair\'s slot', () => {
    const keypairs = new KeypairTable();
    let next = 100;
    const table = new IndexTable<string>(() => next++);
    const reader = localReader(table.shared);
    const handshake = table.newIndex('peer');
    assert.equal(look(reader, handshake), undefined, 'a handshake index is not in it');
    const keypair = new Keypair({ sendKey: new Uint8Array(32).fill(1), receiveKey: new Uint8Array(32).fill(2), isInitiator: true, localIndex: handshake, remoteIndex: 9 }, 0, keypairs);
    table.attachKeypair(handshake, keypair);
    assert.deepEqual(look(reader, handshake), { slot: keypair.at.slot, generation: keypair.at.generation });
    table.delete(handshake);
    assert.equal(look(reader, handshake), undefined);
    table.attachKeypair(handshake, keypair); // an index no longer registered stays out
    assert.equal(look(reader, handshake), undefined);
  });
});
