/**
 * Reading one TUN queue into its ring: every packet that is ready goes into the next free slot,
 * a round of them is offered to the ReaderSender (reader-sender.ts), which seals and sends those
 * it may in place and writes each slot's record, and only then are the slots published. A round
 * the sender took whole leaves only books for the main thread: they go to the shared table
 * (sent-books.ts) and the round's slots are used again at once. Where the table is busy or full,
 * the round is published with its records instead, without ringing (publishQuietly) unless a
 * quarter of the ring waits: the main thread takes them at its next wake-up or its wait's
 * backstop, as it takes the table.
 *
 * With a vnet header (IFF_VNET_HDR, see offload.ts) each read lands in a private buffer first
 * (vnet-read.ts): a TCP super-packet is split into segments, one ring slot each (waiting for room
 * in the ring when needed), and a partial checksum the kernel left is completed, so the main
 * thread only ever sees whole MTU-sized packets.
 *
 * Two threads read a queue, never at once (queue-token.ts): the queue's own thread
 * (reader-worker.ts) and, while that one sleeps, the UDP reader right after it wrote to the queue
 * (reply-reader.ts). Each has its own QueueDrain over the same ring; the one that takes the queue
 * calls resume() first, since the other may have filled slots meanwhile. Between two drains the
 * ring holds nothing half-done: drain() ends with its round published or booked.
 */
import { DEVICE_GONE_ERRNOS, EAGAIN, EINTR, type Libc } from '../sys/libc.ts';
import { PACKET_OFFSET, READ_ERRORS, SEAL_ROOM, SEND_ERRORS, SEND_MTU, type RingViews } from './ring.ts';
import { READ_SEQ, WRITE_SEQ, awaitRoom, publish, publishQuietly, ringFull, seqAdd, seqDistance } from '../ring/shared-ring.ts';
import type { ReaderSender } from './reader-sender.ts';
import type { SentBooks } from './sent-books.ts';
import { VNET_READ_SIZE, wordsOf } from './offload.ts';
import { VNET_READ_REFUSED, VNET_READ_STOPPED, VnetReader, type SlotSink } from './vnet-read.ts';
import { copierFor } from '../sys/copy-bytes.ts';

/** Packets read before the round is offered to the sender and published: a bound on the first one's wait. */
const ROUND_PACKETS = 64;

/** drain(): the queue is empty (or the read limit was reached, or the ring is full). */
export const DRAINED = 0;
/** drain(): a stop was requested while it waited for room. */
export const DRAIN_STOPPED = -1;

export interface QueueDrainParts {
  libc: Libc;
  /** The queue's descriptor (non-blocking). */
  fd: number;
  ring: RingViews;
  slots: number;
  slotSize: number;
  /** Seals and sends what it may; without one every packet is left for the main thread. */
  sender?: ReaderSender;
  /** With `sender`: where the books of rounds sent whole go. */
  books?: SentBooks;
  /** Every read starts with a vnet header (IFF_VNET_HDR). */
  vnetHeader?: boolean;
}

export class QueueDrain {
  /** The next slot to fill. */
  private write: number;
  /** The first slot of the round not yet published. */
  private roundStart: number;
  private readonly mask: number;
  /** Per slot, where its packet goes (PACKET_OFFSET in, SEAL_ROOM left after it). */
  private readonly slotViews: Uint8Array[] = [];
  private readonly room: number;
  private readonly sink: SlotSink;
  /** With a vnet header: reads land in its private buffer and are copied or split into slots. */
  private readonly vnet: VnetReader | undefined;
  /** Reads that brought something, since this drain was made. */
  reads = 0;
  /** Set by the sink when a super-packet's later segments had to wait for room. */
  private waited = false;

  constructor(private readonly parts: QueueDrainParts) {
    const { ring, slots, slotSize } = parts;
    this.mask = slots - 1;
    this.room = slotSize - PACKET_OFFSET - SEAL_ROOM;
    for (let i = 0; i < slots; i++) this.slotViews.push(ring.data.subarray(i * slotSize + PACKET_OFFSET, i * slotSize + PACKET_OFFSET + this.room));
    this.write = this.roundStart = Atomics.load(ring.header, WRITE_SEQ);
    this.vnet = parts.vnetHeader === true ? new VnetReader(this.room, wordsOf(ring.data.buffer), copierFor(parts.libc)) : undefined;
    // The slots of one read: the first is known to be free; a super-packet's later segments wait
    // for room when the ring fills.
    this.sink = {
      slot: () => {
        if (ringFull(this.write, Atomics.load(ring.header, READ_SEQ), slots)) {
          if (!this.waitForRoom()) return undefined;
          this.waited = true;
        }
        return this.slotViews[this.write & this.mask];
      },
      filled: (length) => {
        ring.lengths[this.write & this.mask] = length;
        this.write = seqAdd(this.write, 1);
      },
    };
  }

  /** Takes up the ring where the other reader of the queue left it. */
  resume(): void {
    this.write = this.roundStart = Atomics.load(this.parts.ring.header, WRITE_SEQ);
  }

  /** Free slots now. */
  free(): number {
    return this.parts.slots - seqDistance(this.write, Atomics.load(this.parts.ring.header, READ_SEQ));
  }

  /**
   * Waits until the ring has a free slot; false when a stop was requested meanwhile. The kernel
   * queues (and, past txqueuelen, drops) while it waits.
   */
  awaitRoom(): boolean {
    return awaitRoom(this.parts.ring.header, this.write, this.parts.slots);
  }

  /**
   * Reads until the kernel's queue is empty, the ring is full or `maxReads` reads brought
   * something, and publishes (or books) everything read. What the first read brought is sent at
   * once, before the read that finds the queue empty: an idle ping's packet should not wait for a
   * system call that only says there is nothing more (under load the rest of the queue still goes
   * in rounds of up to ROUND_PACKETS). Returns DRAINED, DRAIN_STOPPED or the errno that says the
   * device is gone.
   */
  drain(maxReads: number): number {
    const { libc, fd, ring, slots } = this.parts;
    const vnet = this.vnet;
    const header = ring.header;
    let consumed = Atomics.load(header, READ_SEQ);
    let firstRead = true;
    for (let reads = 0; reads < maxReads;) {
      if (ringFull(this.write, consumed, slots)) {
        consumed = Atomics.load(header, READ_SEQ);
        if (ringFull(this.write, consumed, slots)) break;
      }
      if (seqDistance(this.write, this.roundStart) >= ROUND_PACKETS) this.finishRound();
      const n = vnet ? libc.read(fd, vnet.target, VNET_READ_SIZE) : libc.read(fd, this.slotViews[this.write & this.mask], this.room);
      if (n > 0) {
        reads++;
        this.reads++;
        if (!vnet) {
          ring.lengths[this.write & this.mask] = n;
          this.write = seqAdd(this.write, 1);
        } else {
          this.waited = false;
          const placed = vnet.ingest(n, this.sink);
          if (placed === VNET_READ_STOPPED) return DRAIN_STOPPED; // stop requested while waiting for room
          if (placed === VNET_READ_REFUSED) Atomics.add(header, READ_ERRORS, 1);
          if (this.waited) consumed = Atomics.load(header, READ_SEQ);
        }
        if (firstRead) {
          firstRead = false;
          this.finishRound();
        }
        continue;
      }
      if (n === 0) break;
      const errno = libc.errno();
      if (errno === EAGAIN) break;
      if (errno === EINTR) continue;
      if (DEVICE_GONE_ERRNOS.has(errno)) {
        this.finishRound();
        return errno;
      }
      Atomics.add(header, READ_ERRORS, 1);
      break;
    }
    this.finishRound();
    return DRAINED;
  }

  /** Waits until a slot is free (finishing the round first); false when a stop was requested meanwhile. */
  private waitForRoom(): boolean {
    this.finishRound();
    publish(this.parts.ring.header, this.write); // ring: the main thread must free slots
    return this.awaitRoom();
  }

  /** Offers the round's slots to the sender (in at most two pieces: the ring wraps), then publishes them. */
  private finishRound(): void {
    const count = seqDistance(this.write, this.roundStart);
    if (count <= 0) return;
    const { ring, slots, slotSize, sender, books } = this.parts;
    const { header, lengths, records, data } = ring;
    const mask = this.mask;
    // Whether the sender took every packet of the round (without a sender every record stays
    // LEFT, zero, as the ring was made, and the main thread is rung for them).
    let handled = false;
    if (sender !== undefined) {
      const mtu = Atomics.load(header, SEND_MTU);
      if (mtu > 0) sender.mtu = mtu;
      const first = this.roundStart & mask;
      const head = Math.min(count, slots - first);
      handled = sender.handle(data, slotSize, lengths, records, first, head);
      if (head < count) handled = sender.handle(data, slotSize, lengths, records, 0, count - head) && handled;
      if (sender.sendErrors > 0) {
        Atomics.add(header, SEND_ERRORS, sender.sendErrors);
        sender.sendErrors = 0;
      }
    }
    // Sent whole: the books go to the shared table and the slots are used again at once.
    if (handled && books !== undefined && books.tryAdd(records, this.roundStart & mask, count, mask)) {
      this.write = this.roundStart;
      return;
    }
    this.roundStart = this.write;
    // Only books for the main thread: they wait for its next look, unless a quarter of the ring does.
    if (handled && seqDistance(this.write, Atomics.load(header, READ_SEQ)) < slots / 4) publishQuietly(header, this.write);
    else publish(header, this.write);
  }
}
