/**
 * The receiver-index map in shared memory: our 32-bit index → the keypair-table slot and
 * generation of the keypair it stands for (docs/data-workers.md). The main thread's IndexTable
 * stays the one place that decides indices; this is its mirror for threads that open transport
 * datagrams without asking the main thread. Handshake indices are not in it: a thread that finds
 * no keypair hands the datagram to the main thread as it is.
 *
 * Layout of one buffer: a header (SEQ, COUNT, TOMBSTONES, MOVED), then `capacity` entries of four
 * int32 (TAG, INDEX, SLOT, GENERATION), open addressing with linear probing, capacity a power of 2.
 *
 * Readers never lock. The main thread makes SEQ odd before it changes anything and even again
 * after (a seqlock); a reader that saw SEQ odd, or changed, during its lookup looks again. A
 * lookup only finds where a keypair lives: the reader still takes a hold with the generation
 * (keypair-table.ts tryHold), which refuses a keypair retired or replaced since.
 *
 * Growing. Above half full the main thread builds a buffer twice the size, then sets MOVED in the
 * old one (under the seqlock), having first handed the new buffer to each reader's thread (through
 * whatever channel that thread has: `onMove`); from then on it writes only the new one. A reader
 * that sees MOVED takes the new buffer from its channel and looks again, so it does not trust a
 * lookup in a buffer that stopped receiving changes. Deleted entries leave tombstones, which a rebuild in
 * place (under the seqlock) clears once they are a quarter of the buffer.
 */

const SEQ = 0;
const COUNT = 1;
const TOMBSTONES = 2;
const MOVED = 3;
const HEADER_INTS = 4;
const ENTRY_INTS = 4;
const TAG = 0;
const INDEX = 1;
const SLOT = 2;
const GENERATION = 3;
const EMPTY = 0;
const FULL = 1;
const TOMBSTONE = 2;

export const INITIAL_CAPACITY = 1024;

/** A lookup's answer: where the keypair lives. */
export interface IndexedSlot {
  slot: number;
  generation: number;
}

function bufferFor(capacity: number): SharedArrayBuffer {
  return new SharedArrayBuffer((HEADER_INTS + capacity * ENTRY_INTS) * 4);
}

function capacityOf(words: Int32Array): number {
  return (words.length - HEADER_INTS) / ENTRY_INTS;
}

/** The first probe position of `index` (indices are random, the multiply spreads any pattern anyway). */
function home(index: number, mask: number): number {
  return Math.imul(index, 0x9e3779b1) >>> 0 & mask;
}

/**
 * The probe: the entry position holding `index`, or -1. Plain reads: the caller brackets it with
 * the seqlock (readers) or is the only writer (the main thread).
 */
function find(words: Int32Array, index: number): number {
  const mask = capacityOf(words) - 1;
  for (let i = home(index, mask), probes = 0; probes <= mask; i = (i + 1) & mask, probes++) {
    const at = HEADER_INTS + i * ENTRY_INTS;
    const tag = words[at + TAG];
    if (tag === EMPTY) return -1;
    if (tag === FULL && words[at + INDEX] === (index | 0)) return at;
  }
  return -1;
}

/** Main thread only: keeps the map equal to IndexTable's keypair entries. */
export class SharedIndexMap {
  private words: Int32Array;
  /** How each reader's thread is handed a new buffer. */
  private readonly movers = new Set<(buffer: SharedArrayBuffer) => void>();

  constructor(capacity = INITIAL_CAPACITY) {
    if (capacity < 4 || (capacity & (capacity - 1)) !== 0) throw new RangeError('shared index map: the capacity is a power of 2, at least 4');
    this.words = new Int32Array(bufferFor(capacity));
  }

  /** The buffer a new reader starts with. */
  get buffer(): SharedArrayBuffer {
    return this.words.buffer as SharedArrayBuffer;
  }

  get size(): number {
    return this.words[COUNT];
  }

  get capacity(): number {
    return capacityOf(this.words);
  }

  /**
   * Registers a reader to be told of a new buffer when the map grows (its thread's side gets the
   * buffer through `deliver`, e.g. a MessagePort). Returns the function that unregisters it.
   */
  onMove(deliver: (buffer: SharedArrayBuffer) => void): () => void {
    this.movers.add(deliver);
    return () => this.movers.delete(deliver);
  }

  /** Maps `index` to the keypair at (slot, generation), replacing what it mapped to. */
  set(index: number, slot: number, generation: number): void {
    if (this.words[COUNT] + this.words[TOMBSTONES] + 1 > this.capacity / 2) this.resize();
    const words = this.words;
    this.beginWrite();
    let at = find(words, index);
    if (at < 0) {
      const mask = this.capacity - 1;
      for (let i = home(index, mask); ; i = (i + 1) & mask) {
        const candidate = HEADER_INTS + i * ENTRY_INTS;
        const tag = words[candidate + TAG];
        if (tag !== FULL) {
          if (tag === TOMBSTONE) words[TOMBSTONES]--;
          at = candidate;
          break;
        }
      }
      words[COUNT]++;
    }
    words[at + INDEX] = index | 0;
    words[at + SLOT] = slot;
    words[at + GENERATION] = generation;
    words[at + TAG] = FULL;
    this.endWrite();
  }

  delete(index: number): void {
    const words = this.words;
    const at = find(words, index);
    if (at < 0) return;
    this.beginWrite();
    words[at + TAG] = TOMBSTONE;
    words[COUNT]--;
    words[TOMBSTONES]++;
    this.endWrite();
  }

  private beginWrite(): void {
    Atomics.add(this.words, SEQ, 1); // odd: readers look again
  }

  private endWrite(): void {
    Atomics.add(this.words, SEQ, 1);
  }

  /** Rebuilds into a buffer big enough for what is live (twice the size when above a quarter full). */
  private resize(): void {
    const old = this.words;
    const live = old[COUNT];
    const capacity = live + 1 > this.capacity / 4 ? this.capacity * 2 : this.capacity;
    const entries: number[][] = [];
    for (let i = 0; i < this.capacity; i++) {
      const at = HEADER_INTS + i * ENTRY_INTS;
      if (old[at + TAG] === FULL) entries.push([old[at + INDEX], old[at + SLOT], old[at + GENERATION]]);
    }
    if (capacity === this.capacity) {
      // Same size: only tombstones to clear, in place under the seqlock.
      this.beginWrite();
      old.fill(0, HEADER_INTS);
      old[COUNT] = 0;
      old[TOMBSTONES] = 0;
      for (const [index, slot, generation] of entries) insertFresh(old, index, slot, generation);
      this.endWrite();
      return;
    }
    const words = new Int32Array(bufferFor(capacity));
    for (const [index, slot, generation] of entries) insertFresh(words, index, slot, generation);
    this.words = words;
    // Delivered before MOVED is set, so a reader that sees MOVED finds the new buffer waiting.
    // From here on only the new buffer changes.
    for (const deliver of this.movers) deliver(words.buffer as SharedArrayBuffer);
    Atomics.add(old, SEQ, 1);
    Atomics.store(old, MOVED, 1);
    Atomics.add(old, SEQ, 1);
  }
}

function insertFresh(words: Int32Array, index: number, slot: number, generation: number): void {
  const mask = capacityOf(words) - 1;
  let i = home(index, mask);
  while (words[HEADER_INTS + i * ENTRY_INTS + TAG] === FULL) i = (i + 1) & mask;
  const at = HEADER_INTS + i * ENTRY_INTS;
  words[at + INDEX] = index | 0;
  words[at + SLOT] = slot;
  words[at + GENERATION] = generation;
  words[at + TAG] = FULL;
  words[COUNT]++;
}

/**
 * Any thread's view of the map. `nextBuffer` returns the buffer the main thread moved the map to
 * (what it delivered through the reader's channel), or undefined while none has arrived yet.
 */
export class IndexMapReader {
  private words: Int32Array;

  constructor(buffer: SharedArrayBuffer, private readonly nextBuffer: () => SharedArrayBuffer | undefined) {
    this.words = new Int32Array(buffer);
  }

  /** Where the keypair of receiver index `index` lives, or undefined when no keypair has it. */
  lookup(index: number, out: IndexedSlot): IndexedSlot | undefined {
    for (;;) {
      const words = this.words;
      const seq = Atomics.load(words, SEQ);
      if ((seq & 1) === 0) {
        if (Atomics.load(words, MOVED) === 1) {
          const next = this.nextBuffer();
          // Delivered before MOVED was set (SharedIndexMap.resize); should it still be missing,
          // the old buffer's answer is stale, not wrong: the hold's generation check still holds.
          if (next === undefined) return this.probe(words, seq, index, out) ?? undefined;
          this.words = new Int32Array(next);
          continue;
        }
        const found = this.probe(words, seq, index, out);
        if (found !== null) return found;
      }
    }
  }

  /** One probe under the seqlock: the answer, or null when a write overlapped it (look again). */
  private probe(words: Int32Array, seq: number, index: number, out: IndexedSlot): IndexedSlot | undefined | null {
    const at = find(words, index);
    if (at >= 0) {
      out.slot = words[at + SLOT];
      out.generation = words[at + GENERATION];
    }
    if (Atomics.load(words, SEQ) !== seq) return null;
    return at >= 0 ? out : undefined;
  }
}
