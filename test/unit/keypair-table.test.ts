/**
 * The keypair table (dataplane/session/keypair-table.ts): transport keys in shared memory, held,
 * retired and zeroed with one atomic state word per slot.
 *
 * - Examples: a retired keypair's keys are zeroed at once or by the last release, never while a
 *   hold is counted; a stale (slot, generation) cannot hold a reused slot; slots are reused.
 * - A model-based test drives the table through random interleavings of the main thread
 *   (allocate, retire, hold, release) and simulated workers that learned (slot, generation) at
 *   any time, stale ones included (tryHold, read the keys, release), and checks every slot's bytes
 *   and state against a model after each step.
 * - Real threads: workers hold, read and release keypairs the main thread keeps allocating and
 *   retiring, and check that every key they read under a hold is intact and is the keypair's own.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import {
  CHUNK_SLOTS, FREE, HOLDS_MASK, KeypairTable, RETIRED, chunkViews, holdUnlessZeroed, release, reserveSendNonces, sendNoncesReserved,
  slotKey, slotState, tryHold, type KeySlot,
} from '../../dataplane/session/keypair-table.ts';
import { startWorker } from '../../dataplane/sys/threads.ts';
import { prng } from '../helpers/prng.ts';
import { ENTRY_INTS, keyPattern, type TableWorkerConfig } from './keypair-table-worker.ts';
import type { NonceWorkerConfig } from './nonce-worker.ts';
import { once } from 'node:events';

const SOAK = process.env.ROAMGUARD_SOAK === '1';

const isZero = (bytes: Uint8Array) => bytes.every((b) => b === 0);

function keysOf(seed: number): { send: Uint8Array; receive: Uint8Array } {
  return { send: keyPattern(seed, 0), receive: keyPattern(seed, 1) };
}

describe('keypair table: examples', () => {
  test('a keypair retired with no hold is zeroed at once and its slot is reused under a new generation', () => {
    const table = new KeypairTable();
    const { send, receive } = keysOf(1);
    const a = table.allocate(send, receive);
    assert.deepEqual(slotKey(a.chunk, a.index, 0), send);
    assert.deepEqual(slotKey(a.chunk, a.index, 1), receive);
    table.retire(a);
    assert.equal(slotState(a.chunk, a.index), FREE);
    assert.ok(isZero(slotKey(a.chunk, a.index, 0)) && isZero(slotKey(a.chunk, a.index, 1)));
    const b = table.allocate(keysOf(2).send, keysOf(2).receive);
    assert.equal(b.slot, a.slot, 'the free slot is reused');
    assert.notEqual(b.generation, a.generation);
    assert.equal(tryHold(a.chunk, a.index, a.generation), false, 'the old keypair cannot be held through the reused slot');
    assert.equal(slotState(b.chunk, b.index), 0, 'and the failed attempt left no hold behind');
  });

  test('a held keypair keeps its keys through retirement; the last release zeroes them', () => {
    const table = new KeypairTable();
    const { send, receive } = keysOf(3);
    const k = table.allocate(send, receive);
    assert.ok(tryHold(k.chunk, k.index, k.generation));
    assert.ok(holdUnlessZeroed(k.chunk, k.index, k.generation));
    table.retire(k);
    assert.equal(tryHold(k.chunk, k.index, k.generation), false, 'no new hold on a retired keypair');
    assert.ok(holdUnlessZeroed(k.chunk, k.index, k.generation), 'its owner may still hold it for queued work');
    release(k.chunk, k.index);
    release(k.chunk, k.index);
    assert.deepEqual(slotKey(k.chunk, k.index, 0), send, 'one hold left: the keys stay');
    assert.equal(slotState(k.chunk, k.index), RETIRED | 1);
    release(k.chunk, k.index);
    assert.equal(slotState(k.chunk, k.index), FREE);
    assert.ok(isZero(slotKey(k.chunk, k.index, 0)) && isZero(slotKey(k.chunk, k.index, 1)));
    assert.equal(holdUnlessZeroed(k.chunk, k.index, k.generation), false, 'zeroed keys cannot be held');
    const next = table.allocate(send, receive);
    assert.equal(next.slot, k.slot, 'the table finds the slot its last holder freed');
  });

  test('a release without a hold is refused and changes nothing', () => {
    const table = new KeypairTable();
    const k = table.allocate(keysOf(4).send, keysOf(4).receive);
    assert.throws(() => release(k.chunk, k.index), /release without a hold/);
    assert.equal(slotState(k.chunk, k.index), 0);
    table.retire(k);
    assert.throws(() => release(k.chunk, k.index), /release without a hold/);
    assert.equal(slotState(k.chunk, k.index), FREE);
  });

  test('the table grows by a chunk only when every slot is in use, and reuses slots after that', () => {
    const table = new KeypairTable();
    const live: KeySlot[] = [];
    for (let i = 0; i <= CHUNK_SLOTS; i++) live.push(table.allocate(keysOf(i).send, keysOf(i).receive));
    assert.equal(table.capacity, 2 * CHUNK_SLOTS);
    assert.equal(new Set(live.map((k) => k.slot)).size, live.length, 'every live keypair has its own slot');
    for (let round = 0; round < 20 * CHUNK_SLOTS; round++) {
      table.retire(live.shift()!);
      live.push(table.allocate(keysOf(round).send, keysOf(round).receive));
    }
    assert.equal(table.capacity, 2 * CHUNK_SLOTS);
  });

  test('keys of the wrong size are refused with a clear error', () => {
    assert.throws(() => new KeypairTable().allocate(new Uint8Array(31), new Uint8Array(32)), /keys are 32 bytes/);
  });
});

/** What the model knows of one allocation. */
interface Known {
  at: KeySlot;
  keys?: { send: Uint8Array; receive: Uint8Array };
  seed: number;
  retired: boolean;
  /** Holds the model counts (main and workers). */
  holds: number;
  zeroed: boolean;
}

const sameBytes = (a: Uint8Array, b: Uint8Array) => a.length === b.length && a.every((v, i) => v === b[i]);
const expectedKeys = (k: Known) => (k.keys ??= keysOf(k.seed));

function runModel(seed: number, steps: number): { tryHoldRefused: number; staleRefused: number; zeroedByRelease: number } {
  const rand = prng(seed);
  const pick = <T>(items: T[]): T => items[Math.floor(rand() * items.length)];
  const table = new KeypairTable();
  const known: Known[] = [];
  /** The allocation that occupies each table slot now. */
  const occupant = new Map<number, Known>();
  const mainHolds: Known[] = [];
  const workers: Array<Known | null> = [null, null, null];
  let nextSeed = 1;
  const seen = { tryHoldRefused: 0, staleRefused: 0, zeroedByRelease: 0 };

  const check = (step: number) => {
    for (const k of occupant.values()) {
      const state = slotState(k.at.chunk, k.at.index);
      const send = slotKey(k.at.chunk, k.at.index, 0);
      const receive = slotKey(k.at.chunk, k.at.index, 1);
      if (k.zeroed) {
        assert.equal(state, FREE, `step ${step}: slot ${k.at.slot} should be free`);
        assert.ok(isZero(send) && isZero(receive), `step ${step}: slot ${k.at.slot} freed with key bytes left`);
      } else {
        assert.equal(state & HOLDS_MASK, k.holds, `step ${step}: slot ${k.at.slot} hold count`);
        assert.equal((state & RETIRED) !== 0, k.retired, `step ${step}: slot ${k.at.slot} retired flag`);
        const expected = expectedKeys(k);
        if (!sameBytes(send, expected.send) || !sameBytes(receive, expected.receive)) {
          assert.fail(`step ${step}: slot ${k.at.slot}'s keys changed while in use`);
        }
      }
    }
  };

  const retireOne = (k: Known) => {
    table.retire(k.at);
    if (!k.retired && !k.zeroed && occupant.get(k.at.slot) === k) {
      k.retired = true;
      if (k.holds === 0) k.zeroed = true;
    }
  };

  const releaseOne = (k: Known) => {
    release(k.at.chunk, k.at.index);
    k.holds--;
    if (k.retired && k.holds === 0) { k.zeroed = true; seen.zeroedByRelease++; }
  };

  for (let step = 0; step < steps; step++) {
    const action = rand();
    if (action < 0.12 || known.length === 0) {
      const s = nextSeed++;
      const { send, receive } = keysOf(s);
      const at = table.allocate(send, receive);
      const before = occupant.get(at.slot);
      assert.ok(before === undefined || before.zeroed, `step ${step}: slot ${at.slot} handed out while its keypair is still in use`);
      const k: Known = { at, seed: s, retired: false, holds: 0, zeroed: false };
      known.push(k);
      occupant.set(at.slot, k);
      // The peer retires its keypairs in time; the model forgets the oldest (still picking it
      // below until then, when its slot may long belong to a newer keypair).
      if (known.length > 64) retireOne(known.shift()!);
    } else if (action < 0.24) {
      retireOne(pick(known)); // stale, retired or live: only a live one changes
    } else if (action < 0.36) {
      const k = pick(known);
      const current = occupant.get(k.at.slot) === k;
      const held = holdUnlessZeroed(k.at.chunk, k.at.index, k.at.generation);
      assert.equal(held, current && !k.zeroed, `step ${step}: holdUnlessZeroed on slot ${k.at.slot}`);
      if (held) { k.holds++; mainHolds.push(k); }
    } else if (action < 0.46 && mainHolds.length > 0) {
      releaseOne(mainHolds.splice(Math.floor(rand() * mainHolds.length), 1)[0]);
    } else {
      const w = Math.floor(rand() * workers.length);
      const holding = workers[w];
      if (holding) {
        // Under its hold, the worker reads the keypair's own keys, intact.
        const expected = expectedKeys(holding);
        assert.ok(sameBytes(slotKey(holding.at.chunk, holding.at.index, 0), expected.send), `step ${step}: worker read a changed key`);
        releaseOne(holding);
        workers[w] = null;
      } else {
        const k = pick(known);
        const current = occupant.get(k.at.slot) === k;
        const held = tryHold(k.at.chunk, k.at.index, k.at.generation);
        assert.equal(held, current && !k.retired, `step ${step}: tryHold on slot ${k.at.slot}`);
        if (held) {
          k.holds++;
          workers[w] = k;
        } else if (current) seen.tryHoldRefused++;
        else seen.staleRefused++;
      }
    }
    check(step);
  }

  // Wind down: every hold released, everything retired: every slot free and zero.
  for (const k of mainHolds) releaseOne(k);
  for (const k of workers) if (k) releaseOne(k);
  for (const k of occupant.values()) {
    table.retire(k.at);
    if (!k.zeroed) { assert.equal(k.holds, 0); k.retired = true; k.zeroed = true; }
  }
  check(steps);
  assert.ok(table.capacity <= 2 * CHUNK_SLOTS, `the table grew to ${table.capacity} slots: freed slots are not being reused`);
  return seen;
}

describe('keypair table: model-based, random interleavings of the main thread and workers', () => {
  for (const seed of [0x5eed01, 0x5eed02, 0x5eed03]) {
    test(`seed ${seed.toString(16)}: no key read under a hold is zeroed or foreign, no slot is reused while in use`, () => {
      const seen = runModel(seed, SOAK ? 2_000_000 : 40_000);
      // The interesting interleavings happened.
      assert.ok(seen.tryHoldRefused > 100, `retired keypairs refused holds: ${seen.tryHoldRefused}`);
      assert.ok(seen.staleRefused > 100, `stale (reused-slot) holds refused: ${seen.staleRefused}`);
      assert.ok(seen.zeroedByRelease > 100, `keys zeroed by the last release: ${seen.zeroedByRelease}`);
    });
  }
});

describe('keypair table: real threads', () => {
  test('workers holding keypairs the main thread keeps retiring never see a zeroed or foreign key', async () => {
    const table = new KeypairTable();
    // A directory the workers read (slot, generation, seed) from: 64 entries the main thread
    // keeps replacing, so workers often try keypairs that were just retired or whose slot is reused.
    const ENTRIES = 64;
    const directory = new Int32Array(new SharedArrayBuffer(ENTRIES * ENTRY_INTS * 4 + 16));
    const control = new Int32Array(directory.buffer, ENTRIES * ENTRY_INTS * 4, 4); // [stop, violations, reads under a hold, refused holds]
    const live: Array<{ at: KeySlot; seed: number } | undefined> = new Array(ENTRIES);
    let seed = 1;
    const publish = (e: number) => {
      const s = seed++;
      const { send, receive } = keysOf(s);
      const at = table.allocate(send, receive);
      live[e] = { at, seed: s };
      // A seqlock, so a worker reads (slot, generation, seed) of one keypair, never a mix.
      const base = e * ENTRY_INTS;
      Atomics.add(directory, base, 1);
      Atomics.store(directory, base + 1, at.slot);
      Atomics.store(directory, base + 2, at.generation);
      Atomics.store(directory, base + 3, s);
      Atomics.add(directory, base, 1);
    };
    for (let e = 0; e < ENTRIES; e++) publish(e);
    // 64 keypairs and at most two held by workers fit in one chunk: the table never grows (checked below).
    const config: TableWorkerConfig = { chunks: table.chunkBuffers.slice(), directory: directory.buffer as SharedArrayBuffer, entries: ENTRIES };
    const workers = [0, 1].map(() => startWorker(new URL('./keypair-table-worker.ts', import.meta.url), { ...config }));
    const exited = workers.map((w) => new Promise<number>((resolve, reject) => { w.once('exit', resolve); w.once('error', reject); }));
    const until = performance.now() + (SOAK ? 60_000 : 1500);
    const rand = prng(77);
    let rounds = 0;
    while (performance.now() < until) {
      for (let i = 0; i < 200; i++) {
        const e = Math.floor(rand() * ENTRIES);
        table.retire(live[e]!.at);
        publish(e);
        rounds++;
      }
      assert.equal(table.capacity, config.chunks.length * CHUNK_SLOTS, 'the table grew past the chunks the workers know');
      await new Promise((resolve) => setImmediate(resolve));
    }
    Atomics.store(control, 0, 1);
    await Promise.all(exited);
    assert.equal(Atomics.load(control, 1), 0, 'a worker read a key that was not its keypair\'s while holding it');
    assert.ok(Atomics.load(control, 2) > 1000, `workers read keys under holds: ${Atomics.load(control, 2)}`);
    assert.ok(Atomics.load(control, 3) > 0, `workers were refused holds on retired or reused slots: ${Atomics.load(control, 3)}`);
    assert.ok(rounds > 1000, `the main thread retired and replaced keypairs: ${rounds}`);
    // Everything the workers held is released: retiring what is left zeroes every slot.
    for (const k of live) table.retire(k!.at);
    for (const buffer of config.chunks) {
      const chunk = chunkViews(buffer);
      for (let i = 0; i < CHUNK_SLOTS; i++) assert.equal(slotState(chunk, i), FREE, `slot ${i} left held or unzeroed`);
    }
  });
});

describe('keypair table: send nonces', () => {
  test('reserved in consecutive ranges from 0; a reused slot starts again from 0', () => {
    const table = new KeypairTable();
    const first = table.allocate(keyPattern(1, 0), keyPattern(1, 1));
    assert.equal(sendNoncesReserved(first.chunk, first.index), 0);
    assert.equal(reserveSendNonces(first.chunk, first.index, 1), 0);
    assert.equal(reserveSendNonces(first.chunk, first.index, 64), 1);
    assert.equal(reserveSendNonces(first.chunk, first.index, 1), 65);
    assert.equal(sendNoncesReserved(first.chunk, first.index), 66);
    // Past 2^32: the counter is 64 bits wide.
    assert.equal(reserveSendNonces(first.chunk, first.index, 2 ** 33), 66);
    assert.equal(sendNoncesReserved(first.chunk, first.index), 2 ** 33 + 66);
    table.retire(first);
    const again = table.allocate(keyPattern(2, 0), keyPattern(2, 1));
    assert.equal(again.slot, first.slot, 'the freed slot is reused');
    assert.equal(sendNoncesReserved(again.chunk, again.index), 0, 'a new keypair sends from nonce 0');
  });

  test('two threads reserving from one slot at once: every nonce goes to exactly one of them', { timeout: 120_000 }, async () => {
    const table = new KeypairTable();
    const at = table.allocate(keyPattern(3, 0), keyPattern(3, 1));
    const reservations = 200_000;
    const taken = new SharedArrayBuffer(4 * 2 * 3 * reservations);
    const start = new SharedArrayBuffer(4);
    const entry = new URL('./nonce-worker.ts', import.meta.url);
    const workers = [11, 13].map((seed) => startWorker(entry, { chunk: at.chunk.buffer, index: at.index, reservations, taken, start, seed } satisfies NonceWorkerConfig));
    const exited = workers.map((w) => once(w, 'exit'));
    await new Promise((r) => setTimeout(r, 200)); // both parked on `start`
    Atomics.store(new Int32Array(start), 0, 1);
    Atomics.notify(new Int32Array(start), 0);
    await Promise.all(exited);
    const total = sendNoncesReserved(at.chunk, at.index);
    const counts = new Int32Array(taken);
    const wrong: number[] = [];
    for (let n = 0; n < counts.length; n++) if (counts[n] !== (n < total ? 1 : 0)) wrong.push(n);
    assert.deepEqual(wrong.slice(0, 10).map((n) => `nonce ${n}: ${counts[n]}`), [], `${wrong.length} nonces not given out exactly once (of ${total})`);
  });
});
