/**
 * Where transport keys live: slots in shared memory, so that threads other than the main thread
 * can seal and open under a keypair without receiving a copy of its keys (docs/data-workers.md,
 * step 1; today only the main thread uses the slots, through Keypair).
 *
 * A slot holds a keypair's send and receive keys, its replay window (replay.ts: the main thread
 * and a receiving thread check counters against the same one), its send counter (the nonce the
 * next packet sealed under it gets: a 64-bit word every sealing thread reserves from with one
 * Atomics.add, so no two packets ever share a nonce), and four int32 words:
 *
 *   STATE       holds (low 24 bits) | RETIRED | ZEROED
 *   GENERATION  bumped each time the slot is given to a new keypair
 *   PEER        while a receiving thread may deliver what it opens under this keypair itself: the
 *               number of the keypair's peer (the main thread allows it once the keypair is
 *               confirmed, and takes it back before the keypair expires); else -1
 *
 * The lifetime rule of keypair.ts, in one word that every thread changes only with Atomics:
 * - a holder (queued work, a thread in the middle of sealing or opening) counts in STATE;
 * - retiring sets RETIRED; nobody can take a new hold on a retired slot (tryHold);
 * - the keys are zeroed by whoever leaves STATE at exactly RETIRED with no hold: the retirer when
 *   nothing held the slot, else the last releaser. Both are read-modify-writes of STATE, so exactly
 *   one of them sees it, and no key is zeroed while a hold is counted;
 * - zeroing ends with ZEROED (RETIRED | ZEROED = FREE); only a FREE slot is given to a new keypair,
 *   and the main thread writes the new keys and generation before it clears STATE, so a hold taken
 *   afterwards reads complete keys.
 * A thread that knows a keypair by (slot, generation) holds it with tryHold, which fails for a
 * retired keypair and for a slot that has since been reused (the generation differs), so it never
 * reads a zeroed key or another keypair's key.
 *
 * Slots come in chunks of CHUNK_SLOTS, each one SharedArrayBuffer, added as the table fills; a
 * thread that is handed a slot number needs the chunk's buffer, which never moves.
 */

import { REPLAY_WINDOW_BYTES, ReplayWindow } from './replay.ts';

/** Slots per chunk (one SharedArrayBuffer of CHUNK_BYTES). */
export const CHUNK_SLOTS = 256;
const WORDS_PER_SLOT = 4;
const STATE = 0;
const GENERATION = 1;
const PEER = 2;
const KEY_SIZE = 32;
/** Bytes of key material per slot: the send key, then the receive key. */
const KEYS_PER_SLOT = 2 * KEY_SIZE;
const WORDS_BYTES = CHUNK_SLOTS * WORDS_PER_SLOT * 4;
const KEYS_BYTES = CHUNK_SLOTS * KEYS_PER_SLOT;
/** Where slot i's replay window starts (8-aligned: it holds a float64). */
const replayOffset = (i: number) => WORDS_BYTES + KEYS_BYTES + i * REPLAY_WINDOW_BYTES;
/** Where the send counters start: one 64-bit word per slot (8-aligned, after the replay windows). */
const NONCES_OFFSET = WORDS_BYTES + KEYS_BYTES + CHUNK_SLOTS * REPLAY_WINDOW_BYTES;
export const CHUNK_BYTES = NONCES_OFFSET + CHUNK_SLOTS * 8;

export const HOLDS_MASK = 0x00ff_ffff;
export const RETIRED = 0x0100_0000;
export const ZEROED = 0x0200_0000;
/** A slot no keypair uses: retired and zeroed. */
export const FREE = RETIRED | ZEROED;

/** One chunk's views (any thread can build them from the buffer: chunkViews). */
export interface KeyChunk {
  readonly buffer: SharedArrayBuffer;
  readonly words: Int32Array;
  readonly keys: Uint8Array;
  /** Per slot, the send counter (see above). */
  readonly nonces: BigInt64Array;
}

export function chunkViews(buffer: SharedArrayBuffer): KeyChunk {
  if (!(buffer instanceof SharedArrayBuffer) || buffer.byteLength !== CHUNK_BYTES) {
    throw new RangeError(`keypair table: a chunk is a SharedArrayBuffer of ${CHUNK_BYTES} bytes`);
  }
  return {
    buffer,
    words: new Int32Array(buffer, 0, CHUNK_SLOTS * WORDS_PER_SLOT),
    keys: new Uint8Array(buffer, WORDS_BYTES, KEYS_BYTES),
    nonces: new BigInt64Array(buffer, NONCES_OFFSET, CHUNK_SLOTS),
  };
}

function newChunk(): KeyChunk {
  const chunk = chunkViews(new SharedArrayBuffer(CHUNK_BYTES));
  for (let i = 0; i < CHUNK_SLOTS; i++) chunk.words[i * WORDS_PER_SLOT + STATE] = FREE;
  return chunk;
}

// --- the slot protocol: what every thread does, on one chunk's views ------------------------------

export function slotState(chunk: KeyChunk, i: number): number {
  return Atomics.load(chunk.words, i * WORDS_PER_SLOT + STATE);
}

export function slotGeneration(chunk: KeyChunk, i: number): number {
  return Atomics.load(chunk.words, i * WORDS_PER_SLOT + GENERATION);
}

/** The send key (0) or receive key (1) of slot i: a view, valid while the caller holds the slot. */
export function slotKey(chunk: KeyChunk, i: number, which: 0 | 1): Uint8Array {
  const start = i * KEYS_PER_SLOT + which * KEY_SIZE;
  return chunk.keys.subarray(start, start + KEY_SIZE);
}

/** The peer number a receiving thread may deliver slot i's packets for itself, or -1 (see PEER above). */
export function slotDeliveryPeer(chunk: KeyChunk, i: number): number {
  return Atomics.load(chunk.words, i * WORDS_PER_SLOT + PEER);
}

/** Main thread: lets a receiving thread deliver slot i's packets itself, as peer `peer`'s; -1 takes it back. */
export function setSlotDeliveryPeer(chunk: KeyChunk, i: number, peer: number): void {
  Atomics.store(chunk.words, i * WORDS_PER_SLOT + PEER, peer);
}

/**
 * Reserves `count` consecutive send nonces of slot i and returns the first: the caller seals its
 * packets with first, first + 1, … Any thread may reserve; each gets its own range. The caller
 * checks the limits (REJECT_AFTER_MESSAGES) against sendNoncesReserved before it reserves.
 */
export function reserveSendNonces(chunk: KeyChunk, i: number, count: number): number {
  return Number(Atomics.add(chunk.nonces, i, BigInt(count)));
}

/** How many send nonces of slot i were reserved so far (the next one reserved gets this). */
export function sendNoncesReserved(chunk: KeyChunk, i: number): number {
  return Number(Atomics.load(chunk.nonces, i));
}

/**
 * Slot i's replay window (a new view each call: keep it). Valid for the keypair of a generation
 * while the caller holds the slot or is the main thread that owns the keypair.
 */
export function slotReplayWindow(chunk: KeyChunk, i: number): ReplayWindow {
  return new ReplayWindow(chunk.buffer, replayOffset(i));
}

/**
 * Takes a hold on slot i for the keypair of `generation`. False when that keypair is retired or
 * gone (the slot was reused): then nothing is held and its keys must not be read.
 */
export function tryHold(chunk: KeyChunk, i: number, generation: number): boolean {
  return holdUnless(chunk, i, generation, RETIRED);
}

/**
 * Takes a hold on slot i for the keypair of `generation` even when it is retired, as long as its
 * keys are not zeroed yet: what the keypair's owner does for work it queued before it checks
 * `retired` (Keypair.hold). False when the keys are zeroed or the slot was reused.
 */
export function holdUnlessZeroed(chunk: KeyChunk, i: number, generation: number): boolean {
  return holdUnless(chunk, i, generation, ZEROED);
}

/** Adds a hold unless STATE has the `refused` flag; then checks the hold is on `generation`'s keypair. */
function holdUnless(chunk: KeyChunk, i: number, generation: number, refused: number): boolean {
  const at = i * WORDS_PER_SLOT + STATE;
  for (;;) {
    const state = Atomics.load(chunk.words, at);
    if ((state & refused) !== 0) return false;
    if ((state & HOLDS_MASK) === HOLDS_MASK) throw new RangeError('keypair table: too many holds on one keypair');
    if (Atomics.compareExchange(chunk.words, at, state, state + 1) === state) break;
  }
  // The generation cannot change while we hold the slot; a different one means the keypair we
  // were told about is gone and this slot belongs to a newer one.
  if (slotGeneration(chunk, i) === generation) return true;
  release(chunk, i);
  return false;
}

/** Drops a hold; the last hold on a retired slot zeroes its keys. */
export function release(chunk: KeyChunk, i: number): void {
  const at = i * WORDS_PER_SLOT + STATE;
  const before = Atomics.sub(chunk.words, at, 1);
  if ((before & HOLDS_MASK) === 0) {
    Atomics.add(chunk.words, at, 1); // undo: the count must not wrap into the flags
    throw new Error('keypair table: release without a hold');
  }
  if (before - 1 === RETIRED) zero(chunk, i);
}

/** Marks slot i retired (idempotent); zeroes its keys at once when nothing holds it. */
export function retire(chunk: KeyChunk, i: number): void {
  const before = Atomics.or(chunk.words, i * WORDS_PER_SLOT + STATE, RETIRED);
  if (before === 0) zero(chunk, i); // live, no hold: this call made it RETIRED with no hold
}

function zero(chunk: KeyChunk, i: number): void {
  chunk.keys.fill(0, i * KEYS_PER_SLOT, (i + 1) * KEYS_PER_SLOT);
  Atomics.or(chunk.words, i * WORDS_PER_SLOT + STATE, ZEROED);
}

// --- the table: the main thread hands out slots ----------------------------------------------------

/** A keypair's place in the table. */
export interface KeySlot {
  readonly chunk: KeyChunk;
  /** Slot number within the chunk. */
  readonly index: number;
  /** Slot number in the whole table (chunk number × CHUNK_SLOTS + index). */
  readonly slot: number;
  readonly generation: number;
}

export class KeypairTable {
  private readonly chunks: KeyChunk[] = [];
  /** Slots known to be FREE. */
  private readonly free: number[] = [];
  /** Slots retired while held: FREE once their last holder (any thread) zeroed them. */
  private retiredHeld: number[] = [];

  /** How each other thread is handed a new chunk (onChunk). */
  private readonly chunkListeners = new Set<(number: number, buffer: SharedArrayBuffer) => void>();

  /** The chunks so far (a thread that uses slot numbers needs chunk slot / CHUNK_SLOTS). */
  get chunkBuffers(): readonly SharedArrayBuffer[] {
    return this.chunks.map((c) => c.buffer);
  }

  /**
   * Hands `deliver` every chunk added from now on, before any of its slots is given out (so
   * before the index map can name one); the chunks so far are chunkBuffers. Returns the
   * unsubscribe.
   */
  onChunk(deliver: (number: number, buffer: SharedArrayBuffer) => void): () => void {
    this.chunkListeners.add(deliver);
    return () => this.chunkListeners.delete(deliver);
  }

  /**
   * Gives a free slot to a new keypair and copies its keys in. The caller zeroes its own copies:
   * from here on the table's are the only ones.
   */
  allocate(sendKey: Uint8Array, receiveKey: Uint8Array): KeySlot {
    if (sendKey.length !== KEY_SIZE || receiveKey.length !== KEY_SIZE) throw new RangeError(`keypair table: keys are ${KEY_SIZE} bytes`);
    const slot = this.takeFreeSlot();
    const chunk = this.chunks[Math.floor(slot / CHUNK_SLOTS)];
    const index = slot % CHUNK_SLOTS;
    const base = index * WORDS_PER_SLOT;
    // The slot is FREE, so no thread can hold it while we fill it; clearing STATE publishes it.
    const generation = (Atomics.load(chunk.words, base + GENERATION) + 1) | 0;
    Atomics.store(chunk.words, base + GENERATION, generation);
    Atomics.store(chunk.words, base + PEER, -1);
    slotKey(chunk, index, 0).set(sendKey);
    slotKey(chunk, index, 1).set(receiveKey);
    slotReplayWindow(chunk, index).reset(); // a new session starts a new counter space
    Atomics.store(chunk.nonces, index, 0n); // and sends from nonce 0
    Atomics.store(chunk.words, base + STATE, 0);
    return { chunk, index, slot, generation };
  }

  /** Retires a keypair's slot; it is reused once zeroed (now, or when its last hold goes). */
  retire(at: KeySlot): void {
    if (slotGeneration(at.chunk, at.index) !== at.generation) return; // long gone
    const before = slotState(at.chunk, at.index);
    if ((before & RETIRED) !== 0) return;
    retire(at.chunk, at.index);
    if ((slotState(at.chunk, at.index) & ZEROED) !== 0) this.free.push(at.slot);
    else this.retiredHeld.push(at.slot);
  }

  /** Slots the table has (it grows by a chunk when none is free). */
  get capacity(): number {
    return this.chunks.length * CHUNK_SLOTS;
  }

  /** Slots of the newest chunk never handed out yet. */
  private unusedTail = 0;

  private takeFreeSlot(): number {
    if (this.free.length === 0 && this.retiredHeld.length > 0) {
      const stillHeld: number[] = [];
      for (const slot of this.retiredHeld) {
        const state = slotState(this.chunks[Math.floor(slot / CHUNK_SLOTS)], slot % CHUNK_SLOTS);
        (state === FREE ? this.free : stillHeld).push(slot);
      }
      this.retiredHeld = stillHeld;
    }
    const reused = this.free.pop();
    if (reused !== undefined) return reused;
    if (this.unusedTail === 0) {
      const chunk = newChunk();
      this.chunks.push(chunk);
      this.unusedTail = CHUNK_SLOTS;
      for (const deliver of this.chunkListeners) deliver(this.chunks.length - 1, chunk.buffer);
    }
    return this.chunks.length * CHUNK_SLOTS - this.unusedTail--;
  }
}
