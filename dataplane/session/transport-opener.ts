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
 * Delivering (docs/data-workers.md step 2b), when the opener has a `delivery` and the main thread
 * lets this keypair's packets be delivered here (its slot names the peer: confirmed, not near
 * expiry): a keepalive, or an inner packet of a valid length whose source the published
 * allowed-IPs table gives to that peer, passes the keypair's replay window (shared with the main
 * thread) and is written by `delivery.write` at the next flush: DELIVERED, or REPLAYED when the
 * window refuses it. The main thread then only keeps the books (timers, counters, the endpoint).
 * A packet that fails a check before the window stays OPENED and takes the main thread's path, so
 * the drop counters do not change.
 *
 * Consecutive datagrams under one keypair (a UDP GRO run, mostly) are opened in one openSlots
 * call (aead-slots.ts).
 */
import type { SlotAead } from '../crypto/primitives.ts';
import { MESSAGE_TRANSPORT, TRANSPORT, TRANSPORT_HEADER_SIZE, TRANSPORT_MIN_SIZE, innerPacketLength, readCounter, readU32 } from '../noise/messages.ts';
import { CHUNK_SLOTS, release, slotDeliveryPeer, slotKey, slotReplayWindow, tryHold, type KeyChunk } from './keypair-table.ts';
import type { ReplayWindow } from './replay.ts';
import { flatLookupSource } from '../allowedips/flat-allowedips.ts';
import type { IndexMapReader, IndexedSlot } from './shared-index-map.ts';
import { isZeroKey32 } from './transport.ts';

export const NOT_OPENED = 0;
export const OPENED = 1;
export const AUTH_FAILED = 2;
export const ZERO_KEY_REFUSED = 3;
/** Opened, checked and written here (a keepalive: nothing to write); LENGTH as for OPENED. */
export const DELIVERED = 4;
/** Opened, then refused by the replay window. */
export const REPLAYED = 5;

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

/** Where a delivering opener gets the routes, and how it writes what it delivers. */
export interface OpenerDelivery {
  /** The latest published allowed-IPs table (flat-allowedips.ts), or undefined: then nothing is delivered here. */
  routes(): Int32Array | undefined;
  /** Writes `count` inner packets (views, valid during the call), in order. */
  write(packets: Uint8Array[], count: number): void;
}

export class TransportOpener {
  private readonly lengths = new Int32Array(MAX_RUN);
  private readonly counters = new Float64Array(MAX_RUN);
  private readonly found: IndexedSlot = { slot: 0, generation: 0 };
  /** Packets delivered since the last flush (views into the datagrams' buffers). */
  private readonly pending: Uint8Array[] = [];
  private pendingCount = 0;
  /** Replay windows by table slot, with the generation they belong to (a view per slot, made once). */
  private readonly windows = new Map<number, { generation: number; window: ReplayWindow }>();
  /** Datagrams opened, failed and left alone, and of the opened ones delivered here, for tests and diagnostics. */
  opened = 0;
  failed = 0;
  left = 0;
  delivered = 0;
  /**
   * Whether openMessage's last message was delivered whole here (every datagram DELIVERED): the
   * main thread then has only books to keep for it, which may wait (udp-reader-worker.ts).
   */
  deliveredWhole = false;
  /** The peer number openMessage's last message was delivered for (meaningful when deliveredWhole). */
  deliveredPeer = -1;

  constructor(
    private readonly aead: SlotAead, private readonly chunkAt: ChunkLookup, private readonly indices: IndexMapReader,
    private readonly delivery?: OpenerDelivery,
  ) {}

  /** Writes what was delivered since the last flush; call before the datagrams' buffers are reused. */
  flush(): void {
    const count = this.pendingCount;
    if (count === 0) return;
    this.pendingCount = 0;
    try {
      this.delivery!.write(this.pending, count);
    } finally {
      this.pending.fill(undefined as unknown as Uint8Array, 0, count);
    }
  }

  /**
   * Opens the datagrams of one received message in place: `length` bytes at `data[start]`, one
   * datagram or (`step` < length, UDP GRO) several of `step` bytes back to back, the last maybe
   * shorter. Writes one record per datagram, up to MAX_RUN, at `records[at]`; returns how many
   * it wrote (datagrams past that are NOT_OPENED).
   */
  openMessage(data: Uint8Array, start: number, length: number, step: number, records: Int32Array, at: number): number {
    if (step <= 0 || step > length) step = length;
    const total = Math.ceil(length / step);
    const count = Math.min(total, MAX_RUN);
    const deliveredBefore = this.delivered;
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
    this.deliveredWhole = total === count && this.delivered - deliveredBefore === count;
    return count;
  }

  private openRun(
    chunk: KeyChunk, within: number, data: Uint8Array, first: number, stride: number, n: number,
    records: Int32Array, at: number, slot: number, generation: number,
  ): void {
    const key = slotKey(chunk, within, 1);
    const zero = isZeroKey32(key);
    const { lengths, counters } = this;
    // Read once, under the hold: whether this keypair's packets may be delivered here.
    const peer = this.delivery === undefined ? -1 : slotDeliveryPeer(chunk, within);
    const routes = peer < 0 ? undefined : this.delivery!.routes();
    for (let k = 0; k < n; k++) {
      const base = first + k * stride;
      lengths[k] = stride - TRANSPORT_HEADER_SIZE;
      counters[k] = readCounter(data, base + TRANSPORT.counter);
    }
    if (!zero) this.aead.openSlots(key, data.subarray(first, first + n * stride), stride, TRANSPORT_HEADER_SIZE, n, lengths, counters);
    for (let k = 0; k < n; k++) {
      const r = at + k * RECORD_INTS;
      const plaintext = lengths[k];
      let outcome = zero ? ZERO_KEY_REFUSED : plaintext < 0 ? AUTH_FAILED : OPENED;
      if (outcome === OPENED && routes !== undefined) {
        outcome = this.deliver(data, first + k * stride + TRANSPORT_HEADER_SIZE, plaintext, counters[k], peer, routes, chunk, within, slot, generation);
      }
      records[r + R_OUTCOME] = outcome;
      records[r + R_LENGTH] = plaintext;
      records[r + R_SLOT] = slot;
      records[r + R_GENERATION] = generation;
      if (plaintext < 0 || zero) this.failed++;
      else this.opened++;
    }
  }

  /** The checks before delivery, in order; DELIVERED (queued for the flush), REPLAYED, or OPENED (left to the main thread). */
  private deliver(
    data: Uint8Array, start: number, plaintext: number, counter: number, peer: number, routes: Int32Array,
    chunk: KeyChunk, within: number, slot: number, generation: number,
  ): number {
    let packet: Uint8Array | undefined;
    if (plaintext > 0) {
      const length = innerPacketLength(data, start, plaintext);
      if (length < 0) return OPENED; // the main thread counts it (bad-inner-packet)
      packet = data.subarray(start, start + length);
      if (flatLookupSource(routes, packet, 0) !== peer) return OPENED; // allowed-ips-mismatch, or a table not published yet
    }
    if (!this.windowOf(chunk, within, slot, generation).check(counter)) return REPLAYED;
    if (packet !== undefined) this.pending[this.pendingCount++] = packet;
    this.delivered++;
    this.deliveredPeer = peer;
    return DELIVERED;
  }

  private windowOf(chunk: KeyChunk, within: number, slot: number, generation: number): ReplayWindow {
    const known = this.windows.get(slot);
    if (known !== undefined && known.generation === generation) return known.window;
    const window = slotReplayWindow(chunk, within);
    this.windows.set(slot, { generation, window });
    return window;
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
