/**
 * Seals outbound packets where they were read, before the main thread sees them
 * (docs/data-workers.md, step 3): the sending half of what transport-opener.ts is for receiving.
 * The TUN reader thread is to run it on the slots it fills, in place, and send what it sealed;
 * the main thread then keeps only the books.
 *
 * Per packet: its destination → the peer number in the published allowed-IPs table
 * (flat-allowedips.ts) → that peer's send-table entry (send-table.ts: the keypair to seal with and
 * the endpoint, or nothing, which leaves the packet to the main thread) → a hold on the keypair's
 * slot (keypair-table.ts tryHold: refused once it is retired or its slot reused) → nonces
 * reserved from the slot's counter → ChaCha20-Poly1305 in place → the hold is released.
 * Consecutive packets to one peer are one run: one hold, one reservation and one sealSlots call
 * (batch-seal.ts sealBatch, which writes headers and padding as the protocol says).
 *
 * What it did is written to a record per packet (RECORD_INTS int32):
 *
 *   OUTCOME  LEFT: untouched, for the main thread to route, stage or seal as before (no route,
 *            no entry, no usable keypair here, the nonce limit near, a packet too big for its
 *            slot, a table chunk this thread lacks).
 *            SEALED: the datagram is at the slot's start, LENGTH bytes, for peer PEER.
 *            ZERO_KEY_REFUSED: the key read as all zeros (never under a hold; defence in depth),
 *            nothing sealed: the main thread counts it and drops the packet.
 *   PEER     the peer number (SEALED, ZERO_KEY_REFUSED)
 *   LENGTH   the datagram's length (SEALED)
 *
 * and each run to a SealedRun: its first slot, its packet count, and the entry it was sealed
 * under (endpoint, sticky source), for the sender. Nothing here touches a socket or the clock.
 */
import type { SlotAead } from '../crypto/primitives.ts';
import { REJECT_AFTER_MESSAGES_SAFE } from '../constants.ts';
import { TAG_SIZE, TRANSPORT_HEADER_SIZE, paddedLength } from '../noise/messages.ts';
import { flatLookupDestination } from '../allowedips/flat-allowedips.ts';
import { SLOT_ZERO_KEY, sealBatch, type BatchView } from './batch-seal.ts';
import { CHUNK_SLOTS, release, reserveSendNonces, sendNoncesReserved, slotKey, tryHold, type KeyChunk } from './keypair-table.ts';
import { CHUNK_ENTRIES, CHUNK_SHIFT, newSendTarget, readSendTarget, type SendTarget } from './send-table.ts';
import type { ChunkLookup } from './transport-opener.ts';

export const LEFT = 0;
export const SEALED = 1;
export const ZERO_KEY_REFUSED = 2;
/** Written by the sender (tun/reader-sender.ts): sealed and sent, from an address the kernel picked (the sticky source was refused). */
export const SOURCE_REFUSED = 3;
/** Written by the sender: sealed, then dropped, the socket having no room (counted as a send error, not in the books). */
export const NO_ROOM = 4;

export const RECORD_INTS = 3;
export const R_OUTCOME = 0;
export const R_PEER = 1;
export const R_LENGTH = 2;

/** Packets sealed per run at most (and so per sealSlots call). */
export const MAX_RUN = 64;

/** One run of sealed packets to one peer: slots [first, first + count), sent to `target`'s endpoint. */
export interface SealedRun {
  first: number;
  count: number;
  peer: number;
  /** The entry it was sealed under (a copy: valid until the next sealSlots call). */
  readonly target: SendTarget;
}

/** Where a sealer finds what the main thread publishes for it. */
export interface SealerTables {
  /** The key-table chunk of a chunk number, or undefined when this thread does not have it (yet). */
  keyChunk: ChunkLookup;
  /** The send-table chunk of a chunk number (send-table.ts), or undefined. */
  sendChunk(chunk: number): Int32Array | undefined;
  /** The latest published allowed-IPs table, or undefined: then nothing is sealed here. */
  routes(): Int32Array | undefined;
}

export class TransportSealer {
  private readonly lengths = new Int32Array(MAX_RUN);
  private readonly counters = new Float64Array(MAX_RUN);
  private readonly batch: BatchView = { data: new Uint8Array(0), lengths: this.lengths, counters: this.counters, slotSize: 0, count: 0 };
  /** Per packet of the current call, its peer number or -1 (grown to the largest call). */
  private peers = new Int32Array(MAX_RUN);
  private readonly entry = newSendTarget();
  /** The runs of the last sealSlots call (objects reused). */
  readonly runs: SealedRun[] = [];
  runCount = 0;
  /** Packets sealed, left to the main thread, and refused for a zero key, for tests and diagnostics. */
  sealed = 0;
  left = 0;
  refused = 0;

  constructor(private readonly aead: SlotAead, private readonly tables: SealerTables, public mtu: number) {}

  /**
   * Seals what it may of `count` packets in slots of `stride` bytes from `data[0]`: packet i's
   * `lengths[i]` bytes at `i * stride + TRANSPORT_HEADER_SIZE` (the room before it is for the
   * header). Writes a record per packet at `records[i * RECORD_INTS]` and the runs to `runs`
   * (`runCount` of them), in slot order.
   */
  sealSlots(data: Uint8Array, stride: number, lengths: Int32Array, count: number, records: Int32Array): void {
    this.runCount = 0;
    const routes = this.tables.routes();
    // First the destination of every packet: a run is consecutive packets to one peer.
    if (this.peers.length < count) this.peers = new Int32Array(count);
    const peers = this.peers;
    for (let i = 0; i < count; i++) {
      const length = lengths[i];
      const fits = TRANSPORT_HEADER_SIZE + paddedLength(length, this.mtu) + TAG_SIZE <= stride;
      peers[i] = routes === undefined || !fits || length <= 0 ? -1 : flatLookupDestination(routes, data, i * stride + TRANSPORT_HEADER_SIZE);
      records[i * RECORD_INTS + R_OUTCOME] = LEFT;
    }
    let i = 0;
    while (i < count) {
      const peer = peers[i];
      let n = 1;
      while (i + n < count && n < MAX_RUN && peers[i + n] === peer) n++;
      if (peer >= 0) this.sealRun(data, stride, lengths, i, n, peer, records);
      i += n;
    }
    for (let k = 0; k < count; k++) {
      if (records[k * RECORD_INTS + R_OUTCOME] === LEFT) this.left++;
    }
  }

  /** Seals slots [first, first + n), all to `peer`, if its entry and keypair allow. */
  private sealRun(data: Uint8Array, stride: number, lengths: Int32Array, first: number, n: number, peer: number, records: Int32Array): void {
    const words = this.tables.sendChunk(peer >> CHUNK_SHIFT);
    if (words === undefined || !readSendTarget(words, peer & (CHUNK_ENTRIES - 1), this.entry)) return;
    const { keySlot, keyGeneration, remoteIndex } = this.entry;
    const chunk: KeyChunk | undefined = this.tables.keyChunk(Math.floor(keySlot / CHUNK_SLOTS));
    const within = keySlot % CHUNK_SLOTS;
    if (chunk === undefined || !tryHold(chunk, within, keyGeneration)) return;
    try {
      // The limit the main thread checks before it sends (Peer.sendingKeypair); past it, the main
      // thread starts a new session. Nonces reserved and then not used are harmless.
      if (sendNoncesReserved(chunk, within) + n > REJECT_AFTER_MESSAGES_SAFE) return;
      const firstNonce = reserveSendNonces(chunk, within, n);
      if (firstNonce + n > REJECT_AFTER_MESSAGES_SAFE) return;
      const batch = this.batch;
      batch.data = data.subarray(first * stride, (first + n) * stride);
      batch.slotSize = stride;
      batch.count = n;
      for (let k = 0; k < n; k++) {
        this.lengths[k] = lengths[first + k];
        this.counters[k] = firstNonce + k;
      }
      sealBatch(this.aead, slotKey(chunk, within, 0), remoteIndex >>> 0, this.mtu, batch);
      const refused = this.lengths[0] === SLOT_ZERO_KEY;
      for (let k = 0; k < n; k++) {
        const r = (first + k) * RECORD_INTS;
        records[r + R_OUTCOME] = refused ? ZERO_KEY_REFUSED : SEALED;
        records[r + R_PEER] = peer;
        records[r + R_LENGTH] = refused ? 0 : this.lengths[k];
      }
      if (refused) {
        this.refused += n;
        return;
      }
      this.sealed += n;
      this.addRun(first, n, peer);
    } finally {
      release(chunk, within);
    }
  }

  private addRun(first: number, count: number, peer: number): void {
    let run = this.runs[this.runCount];
    if (run === undefined) this.runs.push(run = { first: 0, count: 0, peer: 0, target: newSendTarget() });
    run.first = first;
    run.count = count;
    run.peer = peer;
    const t = run.target as SendTarget;
    const e = this.entry;
    t.seq = e.seq;
    t.keySlot = e.keySlot;
    t.keyGeneration = e.keyGeneration;
    t.remoteIndex = e.remoteIndex;
    t.port = e.port;
    t.family = e.family;
    t.address.set(e.address);
    t.sourceFamily = e.sourceFamily;
    t.sourceIfindex = e.sourceIfindex;
    t.sourceAddress.set(e.sourceAddress);
    this.runCount++;
  }
}
