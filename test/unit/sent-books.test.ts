/**
 * The shared table of a TUN reader's books (dataplane/tun/sent-books.ts): what the reader adds is
 * what the main thread takes, entry by entry, and a round the table refuses leaves it as it was.
 *
 * - A model-based test: random rounds (peers, outcomes, NO_ROOM records, wrapping slots) added
 *   and random drains, against a plain map of what was added; every refusal is checked to have
 *   changed nothing.
 * - The table's limits: full with distinct entries (merging still works), an entry's bytes near
 *   2^30.
 * - Two threads: a worker adds rounds as fast as it can while the main thread drains; the totals
 *   taken equal the totals the worker says it added (fails when the table's lock is removed).
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { SENT_BOOKS_BYTES, SENT_BOOK_ENTRIES, SentBooks } from '../../dataplane/tun/sent-books.ts';
import { NO_ROOM, RECORD_INTS, R_LENGTH, R_OUTCOME, R_PEER, SEALED, SOURCE_REFUSED, ZERO_KEY_REFUSED } from '../../dataplane/session/transport-sealer.ts';
import { startWorker } from '../../dataplane/sys/threads.ts';
import type { SentBooksWorkerConfig } from './sent-books-worker.ts';
import { prng } from '../helpers/prng.ts';

const SLOTS = 256;
const MASK = SLOTS - 1;

type Totals = Map<string, { datagrams: number; bytes: number }>;

function drainInto(books: SentBooks, into: Totals): boolean {
  return books.tryDrain((peer, outcome, datagrams, bytes) => {
    const key = `${peer}/${outcome}`;
    const t = into.get(key) ?? { datagrams: 0, bytes: 0 };
    t.datagrams += datagrams;
    t.bytes += bytes;
    into.set(key, t);
  });
}

function record(records: Int32Array, slot: number, outcome: number, peer: number, length: number): void {
  const r = (slot & MASK) * RECORD_INTS;
  records[r + R_OUTCOME] = outcome;
  records[r + R_PEER] = peer;
  records[r + R_LENGTH] = length;
}

describe('sent books', () => {
  test('model: what is added is what is drained, entry by entry; a refused round changes nothing (3 seeds × 4000 steps)', () => {
    for (const seed of [1, 2, 3]) {
      const random = prng(seed);
      const books = new SentBooks(new SharedArrayBuffer(SENT_BOOKS_BYTES));
      const records = new Int32Array(SLOTS * RECORD_INTS);
      const added: Totals = new Map();
      const drained: Totals = new Map();
      let start = 0;
      let refused = 0;
      for (let step = 0; step < 4000; step++) {
        if (random() < 0.15) {
          assert.ok(drainInto(books, drained));
          continue;
        }
        // Many peers now and then, so that the table fills.
        const peers = random() < 0.1 ? 200 : 4;
        const count = 1 + Math.floor(random() * 64);
        const round: Totals = new Map();
        for (let i = 0; i < count; i++) {
          const outcome = [SEALED, SEALED, SEALED, SOURCE_REFUSED, ZERO_KEY_REFUSED, NO_ROOM][Math.floor(random() * 6)];
          const peer = Math.floor(random() * peers);
          const length = outcome === ZERO_KEY_REFUSED || outcome === NO_ROOM ? 0 : 1 + Math.floor(random() * 1500);
          record(records, start + i, outcome, peer, length);
          if (outcome === NO_ROOM) continue;
          const t = round.get(`${peer}/${outcome}`) ?? { datagrams: 0, bytes: 0 };
          t.datagrams++;
          t.bytes += length;
          round.set(`${peer}/${outcome}`, t);
        }
        const before = drainSnapshot(books);
        if (books.tryAdd(records, start & MASK, count, MASK)) {
          for (const [key, t] of round) {
            const a = added.get(key) ?? { datagrams: 0, bytes: 0 };
            a.datagrams += t.datagrams;
            a.bytes += t.bytes;
            added.set(key, a);
          }
        } else {
          refused++;
          assert.deepEqual(drainSnapshot(books), before, 'a refused round leaves the table as it was');
        }
        start = (start + count) & MASK;
      }
      drainInto(books, drained);
      assert.deepEqual(new Map([...drained].sort()), new Map([...added].sort()), `seed ${seed}`);
      assert.ok(refused > 0, 'the table filled now and then');
    }
  });

  test('full with distinct entries: a round of a new pair is refused, one that only merges is taken', () => {
    const books = new SentBooks(new SharedArrayBuffer(SENT_BOOKS_BYTES));
    const records = new Int32Array(SLOTS * RECORD_INTS);
    for (let i = 0; i < SENT_BOOK_ENTRIES; i++) record(records, i, SEALED, i, 100);
    assert.ok(books.tryAdd(records, 0, SENT_BOOK_ENTRIES, MASK));
    record(records, 100, SEALED, 999, 100);
    assert.equal(books.tryAdd(records, 100, 1, MASK), false, 'no room for a new pair');
    record(records, 100, SEALED, 5, 100);
    assert.ok(books.tryAdd(records, 100, 1, MASK), 'merged into peer 5');
    const drained: Totals = new Map();
    drainInto(books, drained);
    assert.equal(drained.size, SENT_BOOK_ENTRIES);
    assert.deepEqual(drained.get(`5/${SEALED}`), { datagrams: 2, bytes: 200 });
    assert.equal(drained.get(`999/${SEALED}`), undefined);
  });

  test('an entry\'s bytes stay below 2^30: the round that would pass it is refused, and taken after a drain', () => {
    const books = new SentBooks(new SharedArrayBuffer(SENT_BOOKS_BYTES));
    const records = new Int32Array(SLOTS * RECORD_INTS);
    for (let i = 0; i < 16; i++) record(records, i, SEALED, 1, 2 ** 26);
    assert.ok(books.tryAdd(records, 0, 15, MASK), '15 × 2^26 < 2^30');
    assert.equal(books.tryAdd(records, 0, 1, MASK), false, 'the 16th would reach 2^30');
    const drained: Totals = new Map();
    drainInto(books, drained);
    assert.ok(books.tryAdd(records, 0, 1, MASK));
    drainInto(books, drained);
    assert.deepEqual(drained.get(`1/${SEALED}`), { datagrams: 16, bytes: 16 * 2 ** 26 });
  });

  test('two threads: every round the reader says the table took is drained exactly once', { timeout: 60_000 }, async () => {
    const peers = 6;
    const config: SentBooksWorkerConfig = { books: new SharedArrayBuffer(SENT_BOOKS_BYTES), control: new SharedArrayBuffer(4 * (3 + peers * 2)), peers };
    const control = new Int32Array(config.control);
    const books = new SentBooks(config.books);
    const drained: Totals = new Map();
    const worker = startWorker(new URL('./sent-books-worker.ts', import.meta.url), { ...config });
    const exited = new Promise<void>((resolve, reject) => { worker.once('exit', () => resolve()); worker.once('error', reject); });
    let busy = 0;
    const until = performance.now() + 1500;
    while (performance.now() < until || Atomics.load(control, 1) < 1000) {
      if (!drainInto(books, drained)) busy++;
      if (performance.now() > until + 20_000) break;
      await new Promise((r) => setImmediate(r));
    }
    Atomics.store(control, 0, 1);
    await exited;
    drainInto(books, drained);
    assert.ok(Atomics.load(control, 1) >= 1000, `the worker added rounds: ${Atomics.load(control, 1)}`);
    for (let p = 0; p < peers; p++) {
      const got = drained.get(`${p}/${SEALED}`) ?? { datagrams: 0, bytes: 0 };
      // The worker's counters are int32 words: bytes compared modulo 2^32.
      assert.deepEqual({ datagrams: got.datagrams, bytes: got.bytes % 2 ** 32 }, { datagrams: Atomics.load(control, 3 + p * 2), bytes: Atomics.load(control, 4 + p * 2) >>> 0 }, `peer ${p} (drains that found the table taken: ${busy}, rounds refused: ${Atomics.load(control, 2)})`);
    }
  });
});

/** The table's contents as a drain would hand them over, without draining (a second view of the same buffer). */
function drainSnapshot(books: SentBooks): string {
  const words = (books as unknown as { words: Int32Array }).words;
  // The lock, the count, and the entries in use (words past them mean nothing).
  return Array.from(words.subarray(0, 2 + words[1] * 4)).join(',');
}
