/**
 * Opens transport messages where they were received, before the main thread sees them
 * (docs/data-workers.md, step 2a). The UDP reader thread runs it on every datagram it takes from
 * the kernel, in place in its receive ring; MemoryBind runs it on every datagram it carries, so
 * the in-memory device tests go through the same code.
 *
 * Per datagram: the receiver index → the keypair's (slot, generation) in the shared index map
 * (shared-index-map.ts) → a hold on that slot (keypair-table.ts tryHold: refused once the keypair
 * is retired or its slot reused) → ChaCha20-Poly1305 in place under the slot's receive key → the
 * hold is released. What it did is written to an outcome record (four int32 per datagram):
 *
 *   OUTCOME     NOT_OPENED: left as it came (not a transport message, no keypair known here, a
 *               retired one, a key-table chunk this thread has not been handed yet). The main
 *               thread handles it as any datagram: core.receiveDatagram.
 *               OPENED: the plaintext is at TRANSPORT_HEADER_SIZE, LENGTH bytes; the header
 *               (receiver index, counter) is untouched.
 *               AUTH_FAILED: forged or corrupt; its bytes are garbage now. ZERO_KEY_REFUSED: the
 *               key read as all zeros (never under a hold; defence in depth).
 *   LENGTH      the plaintext length (OPENED)
 *   SLOT, GENERATION  the keypair it was opened under
 *
 * Opening authenticates nothing by itself: the main thread still finds the keypair by index,
 * checks that it is the one of (SLOT, GENERATION) and still live, and only then runs the replay
 * window and the rest (core.receiveOpenedTransport). The hold guarantees only that the key was
 * not zeroed or replaced while it was read.
 *
 * Consecutive datagrams under one keypair (a UDP GRO run, mostly) are opened in one openSlots
 * call (aead-slots.ts).
 */
import type { SlotAead } from '../crypto/primitives.ts';
import { MESSAGE_TRANSPORT, TRANSPORT, TRANSPORT_HEADER_SIZE, TRANSPORT_MIN_SIZE, readCounter, readU32 } from '../noise/messages.ts';
import { CHUNK_SLOTS, release, slotKey, tryHold, type KeyChunk } from './keypair-table.ts';
import type { IndexMapReader, IndexedSlot } from './shared-index-map.ts';
import { isZeroKey32 } from './transport.ts';

export const NOT_OPENED = 0;
export const OPENED = 1;
export const AUTH_FAILED = 2;
export const ZERO_KEY_REFUSED = 3;

export const RECORD_INTS = 4;
export const R_OUTCOME = 0;
export const R_LENGTH = 1;
export const R_SLOT = 2;
export const R_GENERATION = 3;

/** Datagrams opened per run at most (UDP GRO coalesces at most 64 datagrams: UDP_GRO_CNT_MAX). */
export const MAX_RUN = 64;

/** What the main thread reads back for one datagram (filled in place, reused). */
export interface OpenedTransport {
  outcome: number;
  length: number;
  slot: number;
  generation: number;
}

/** The key-table chunk of a chunk number, or undefined when this thread does not have it (yet). */
export type ChunkLookup = (chunk: number) => KeyChunk | undefined;

export class TransportOpener {
  private readonly lengths = new Int32Array(MAX_RUN);
  private readonly counters = new Float64Array(MAX_RUN);
  private readonly found: IndexedSlot = { slot: 0, generation: 0 };
  /** Datagrams opened, failed and left alone, for tests and diagnostics. */
  opened = 0;
  failed = 0;
  left = 0;

  constructor(private readonly aead: SlotAead, private readonly chunkAt: ChunkLookup, private readonly indices: IndexMapReader) {}

  /**
   * Opens the datagrams of one received message in place: `length` bytes at `data[start]`, one
   * datagram or (`step` < length, UDP GRO) several of `step` bytes back to back, the last maybe
   * shorter. Writes one record per datagram, up to MAX_RUN, at `records[at]`; returns how many
   * it wrote (datagrams past that are NOT_OPENED).
   */
  openMessage(data: Uint8Array, start: number, length: number, step: number, records: Int32Array, at: number): number {
    if (step <= 0 || step > length) step = length;
    const count = Math.min(Math.ceil(length / step), MAX_RUN);
    let i = 0;
    while (i < count) {
      const first = start + i * step;
      const size = Math.min(step, length - i * step);
      const index = transportReceiver(data, first, size);
      const found = index === -1 ? undefined : this.indices.lookup(index, this.found);
      const chunk = found === undefined ? undefined : this.chunkAt(Math.floor(found.slot / CHUNK_SLOTS));
      const within = found === undefined ? 0 : found.slot % CHUNK_SLOTS;
      if (chunk === undefined || !tryHold(chunk, within, found!.generation)) {
        records[at + i * RECORD_INTS + R_OUTCOME] = NOT_OPENED;
        this.left++;
        i++;
        continue;
      }
      const { slot, generation } = found!;
      // The run: this datagram and the following ones of the same receiver index and full size
      // (a shorter one ends a run: the slots of one openSlots call have one stride).
      let n = 1;
      if (size === step) {
        while (i + n < count && n < MAX_RUN) {
          const next = start + (i + n) * step;
          const nextSize = Math.min(step, length - (i + n) * step);
          if (nextSize !== step || transportReceiver(data, next, nextSize) !== index) break;
          n++;
        }
      }
      try {
        this.openRun(chunk, within, data, first, size, n, records, at + i * RECORD_INTS, slot, generation);
      } finally {
        release(chunk, within);
      }
      i += n;
    }
    return count;
  }

  private openRun(
    chunk: KeyChunk, within: number, data: Uint8Array, first: number, stride: number, n: number,
    records: Int32Array, at: number, slot: number, generation: number,
  ): void {
    const key = slotKey(chunk, within, 1);
    const zero = isZeroKey32(key);
    const { lengths, counters } = this;
    for (let k = 0; k < n; k++) {
      const base = first + k * stride;
      lengths[k] = stride - TRANSPORT_HEADER_SIZE;
      counters[k] = readCounter(data, base + TRANSPORT.counter);
    }
    if (!zero) this.aead.openSlots(key, data.subarray(first, first + n * stride), stride, TRANSPORT_HEADER_SIZE, n, lengths, counters);
    for (let k = 0; k < n; k++) {
      const r = at + k * RECORD_INTS;
      const plaintext = lengths[k];
      records[r + R_OUTCOME] = zero ? ZERO_KEY_REFUSED : plaintext < 0 ? AUTH_FAILED : OPENED;
      records[r + R_LENGTH] = plaintext;
      records[r + R_SLOT] = slot;
      records[r + R_GENERATION] = generation;
      if (plaintext < 0 || zero) this.failed++;
      else this.opened++;
    }
  }
}

/**
 * The receiver index of a well-formed transport message of `size` bytes at data[at], else -1.
 * A counter a number cannot hold exactly is left to the main thread too (readCounter: Infinity;
 * the core drops it as 'counter-limit'), so no nonce is ever built from an inexact counter.
 */
function transportReceiver(data: Uint8Array, at: number, size: number): number {
  if (size < TRANSPORT_MIN_SIZE || data[at] !== MESSAGE_TRANSPORT || data[at + 1] !== 0 || data[at + 2] !== 0 || data[at + 3] !== 0) return -1;
  if (readCounter(data, at + TRANSPORT.counter) === Infinity) return -1;
  return readU32(data, at + TRANSPORT.receiver);
}

/** Reads record `i` of `records` (from `at`) into `out`; past `written` records, NOT_OPENED. */
export function readRecord(records: Int32Array, at: number, i: number, written: number, out: OpenedTransport): OpenedTransport {
  if (i >= written) {
    out.outcome = NOT_OPENED;
    return out;
  }
  const r = at + i * RECORD_INTS;
  out.outcome = records[r + R_OUTCOME];
  out.length = records[r + R_LENGTH];
  out.slot = records[r + R_SLOT];
  out.generation = records[r + R_GENERATION];
  return out;
}
