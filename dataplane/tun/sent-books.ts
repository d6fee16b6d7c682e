/**
 * The books of what a TUN reader sealed and sent itself (tun/reader-sender.ts), kept in a small
 * shared table instead of in the ring's slots.
 *
 * Why: a round the reader sent whole leaves only books for the main thread (bytes, timers, a
 * refused sticky source). Carried in ring slots, those slots stay taken until the main thread
 * looks, so under load the reader rang it every quarter of the ring just to get its slots back,
 * and waited for room when it came late (measured under Node, one TCP stream: 0.6 s of doorbells
 * and 0.4 s of waiting for room in 11 s of the reader's time). In this table a round's books take
 * one entry per run of one outcome to one peer (merged with an entry already there), and the
 * reader reuses the round's slots at once; the main thread takes the table whenever it looks at
 * the ring anyway (a wake-up for packets, or its wait's backstop).
 *
 * Neither side ever waits for the other: each takes the table with one compare-exchange, and a
 * side that finds it taken does without. The reader then publishes the round's slots with their
 * records as before, and the main thread takes the table at its next look. The same when the
 * table is full or an entry's byte count would pass 2^30.
 */
import { NO_ROOM, RECORD_INTS, R_LENGTH, R_OUTCOME, R_PEER } from '../session/transport-sealer.ts';
import type { SentHandler } from './tun.ts';

const LOCK = 0;
const USED = 1;
const HEADER_INTS = 2;
const E_PEER = 0;
const E_OUTCOME = 1;
const E_DATAGRAMS = 2;
const E_BYTES = 3;
const ENTRY_INTS = 4;
/** Entries of the table: distinct (peer, outcome) pairs between two looks of the main thread. */
export const SENT_BOOK_ENTRIES = 64;
/** An entry's bytes stay below this (an int32 must not overflow while the main thread is away). */
const MAX_ENTRY_BYTES = 2 ** 30;

/** Runs one tryAdd takes (distinct peer and outcome pairs in a round); a round with more is published instead. */
const MAX_ROUND_RUNS = 64;

export const SENT_BOOKS_BYTES = (HEADER_INTS + SENT_BOOK_ENTRIES * ENTRY_INTS) * 4;

export class SentBooks {
  private readonly words: Int32Array;
  /** Scratch for a drain: the entries copied out, handed over after the table is released. */
  private readonly taken = new Int32Array(SENT_BOOK_ENTRIES * ENTRY_INTS);
  /** Scratch for tryAdd: the round's runs (in the entries' layout), and the entry each goes to. */
  private readonly runs = new Int32Array(MAX_ROUND_RUNS * ENTRY_INTS);
  private readonly at = new Int32Array(MAX_ROUND_RUNS);

  constructor(buffer: SharedArrayBuffer) {
    if (buffer.byteLength < SENT_BOOKS_BYTES) throw new RangeError(`sent books need ${SENT_BOOKS_BYTES} bytes, got ${buffer.byteLength}`);
    this.words = new Int32Array(buffer, 0, SENT_BOOKS_BYTES / 4);
  }

  /**
   * The reader's side: adds the books of the `count` records from slot `first` on, wrapping
   * with `mask` (the ring's slots - 1); none LEFT (a round the sender took whole), NO_ROOM records
   * carry no books. Returns false, having added nothing, when the main thread holds the table, or
   * it lacks room.
   */
  tryAdd(records: Int32Array, first: number, count: number, mask: number): boolean {
    // The round's runs first, outside the table (a round is at most a few dozen packets).
    const runs = this.runs;
    let nRuns = 0;
    for (let i = 0; i < count; i++) {
      const r = ((first + i) & mask) * RECORD_INTS;
      const outcome = records[r + R_OUTCOME];
      if (outcome === NO_ROOM) continue;
      const peer = records[r + R_PEER];
      let k = 0;
      while (k < nRuns && (runs[k * ENTRY_INTS + E_PEER] !== peer || runs[k * ENTRY_INTS + E_OUTCOME] !== outcome)) k++;
      if (k === nRuns) {
        if (nRuns * ENTRY_INTS >= runs.length) return false;
        runs[k * ENTRY_INTS + E_PEER] = peer;
        runs[k * ENTRY_INTS + E_OUTCOME] = outcome;
        runs[k * ENTRY_INTS + E_DATAGRAMS] = 0;
        runs[k * ENTRY_INTS + E_BYTES] = 0;
        nRuns++;
      }
      runs[k * ENTRY_INTS + E_DATAGRAMS]++;
      runs[k * ENTRY_INTS + E_BYTES] += records[r + R_LENGTH];
    }
    const w = this.words;
    if (Atomics.compareExchange(w, LOCK, 0, 1) !== 0) return false;
    // Where each run goes (an entry of the same peer and outcome, or a new one), all or nothing.
    const at = this.at;
    let used = w[USED];
    const before = used;
    let fits = true;
    for (let k = 0; k < nRuns && fits; k++) {
      const peer = runs[k * ENTRY_INTS + E_PEER], outcome = runs[k * ENTRY_INTS + E_OUTCOME];
      let e = HEADER_INTS;
      const end = HEADER_INTS + used * ENTRY_INTS;
      while (e < end && (w[e + E_PEER] !== peer || w[e + E_OUTCOME] !== outcome)) e += ENTRY_INTS;
      if (e === end) {
        if (used === SENT_BOOK_ENTRIES) fits = false;
        else {
          w[e + E_PEER] = peer;
          w[e + E_OUTCOME] = outcome;
          w[e + E_DATAGRAMS] = 0;
          w[e + E_BYTES] = 0;
          used++;
        }
      }
      if (fits && w[e + E_BYTES] + runs[k * ENTRY_INTS + E_BYTES] >= MAX_ENTRY_BYTES) fits = false;
      at[k] = e;
    }
    if (fits) {
      for (let k = 0; k < nRuns; k++) {
        w[at[k] + E_DATAGRAMS] += runs[k * ENTRY_INTS + E_DATAGRAMS];
        w[at[k] + E_BYTES] += runs[k * ENTRY_INTS + E_BYTES];
      }
      w[USED] = used;
    } else {
      w[USED] = before; // entries begun for this call are dropped with it
    }
    Atomics.store(w, LOCK, 0);
    return fits;
  }

  /**
   * The main thread's side: hands every entry to `take` (peer, outcome, datagrams, bytes) and
   * empties the table. Returns false, having taken nothing, when the reader holds it.
   */
  tryDrain(take: SentHandler): boolean {
    const w = this.words;
    if (Atomics.compareExchange(w, LOCK, 0, 1) !== 0) return false;
    const used = w[USED];
    const n = used * ENTRY_INTS;
    for (let k = 0; k < n; k++) this.taken[k] = w[HEADER_INTS + k];
    w[USED] = 0;
    Atomics.store(w, LOCK, 0);
    for (let k = 0; k < n; k += ENTRY_INTS) take(this.taken[k + E_PEER], this.taken[k + E_OUTCOME], this.taken[k + E_DATAGRAMS], this.taken[k + E_BYTES]);
    return true;
  }
}
