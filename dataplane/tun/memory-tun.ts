/**
 * MemoryTun: an in-memory TUN device for tests, with the same behaviour as the Linux one.
 *
 * `inject(packet)` plays the kernel sending a packet into the tunnel: it is copied and queued, and
 * everything injected before the handler runs is delivered as one batch on a later macrotask
 * (setImmediate), the way the Linux device drains its ring — so a test that injects 1000 packets
 * in a loop sees them in order, in large batches, never re-entrantly. Packets injected before
 * `start` wait for it. `written` collects copies of every packet written (the caller may reuse its
 * buffers right after `write`, as with the real device). `deleteInterface()` plays `ip link del`.
 */
import type { SentHandler, Tun, TunSending, TunStats } from './tun.ts';
import { validateInterfaceName } from './tun.ts';
import { PACKET_OFFSET, SEAL_ROOM } from './ring.ts';
import { Endpoint, LocalSource } from '../net/endpoint.ts';
import { formatIp } from '../net/ip.ts';
import { chunkViews, type KeyChunk } from '../session/keypair-table.ts';
import type { SendTarget } from '../session/send-table.ts';
import { LEFT, RECORD_INTS, R_LENGTH, R_OUTCOME, R_PEER, SEALED, TransportSealer } from '../session/transport-sealer.ts';

export interface MemoryTunOptions {
  /** Largest batch handed to the handler at once (the Linux ring holds 256). Default 256. */
  maxBatch?: number;
  /**
   * false: plays a TUN whose reader thread could not load an AEAD provider (LinuxTun.senderFailed):
   * sendOnThread is ignored and every packet takes the core's single-packet path. Default true.
   */
  sealsItself?: boolean;
}

export class MemoryTun implements Tun {
  readonly name: string;
  readonly stats: TunStats = { readPackets: 0, writePackets: 0, writeErrors: 0, readErrors: 0 };
  /** Copies of the packets written to the "kernel", in order. Tests may clear it. */
  written: Uint8Array[] = [];

  private currentMtu: number;
  private readonly maxBatch: number;
  private readonly sealsItself: boolean;
  private queue: Uint8Array[] = [];
  private queueHead = 0;
  private readonly batch: Uint8Array[] = [];
  private onPackets: ((packets: Uint8Array[], count: number) => void) | undefined;
  private readonly closeHandlers: Array<() => void> = [];
  private scheduled = false;
  private closed = false;
  private deleted = false;
  private readonly writeListeners: Array<(packet: Uint8Array) => void> = [];
  /** With sendOnThread: the same sealer a reader thread runs, on this thread (see sealAndSend). */
  private sending: { sealer: TransportSealer; send: (to: Endpoint, datagram: Uint8Array) => void; onSent: SentHandler } | undefined;
  private readonly endpoints = new Map<number, { seq: number; endpoint: Endpoint }>();

  constructor(name = 'rgmem0', mtu = 1420, options: MemoryTunOptions = {}) {
    validateInterfaceName(name);
    checkMtu(mtu);
    this.name = name;
    this.currentMtu = mtu;
    this.maxBatch = options.maxBatch ?? 256;
    this.sealsItself = options.sealsItself ?? true;
    if (!Number.isInteger(this.maxBatch) || this.maxBatch < 1) throw new RangeError(`maxBatch must be a positive integer, got ${this.maxBatch}`);
  }

  get mtu(): number {
    return this.currentMtu;
  }

  setMtu(mtu: number): void {
    checkMtu(mtu);
    if (this.closed) throw new Error(`${this.name}: device is closed`);
    this.currentMtu = mtu;
  }

  /**
   * Seals and sends what the send table allows, as LinuxTun's reader thread does, on this thread
   * and through `sending.send`: the in-memory device tests and the model test go through the same
   * sealer (transport-sealer.ts).
   */
  sendOnThread(sending: TunSending, onSent: SentHandler): void {
    if (sending.send === undefined || !this.sealsItself) return;
    const chunks = new Map<number, KeyChunk>();
    const sealer = new TransportSealer(sending.aead, {
      keyChunk: (c) => {
        let chunk = chunks.get(c);
        if (chunk === undefined && c < sending.keypairs.chunkBuffers.length) chunks.set(c, chunk = chunkViews(sending.keypairs.chunkBuffers[c]));
        return chunk;
      },
      sendChunk: (c) => sending.sendTable.chunkWords(c),
      routes: () => sending.routes.current,
    }, sending.mtu);
    this.sending = { sealer, send: sending.send, onSent };
  }

  sendingMtu(mtu: number): void {
    if (this.sending !== undefined) this.sending.sealer.mtu = mtu;
  }

  /** True for a MemoryTun made with `sealsItself: false` (see MemoryTunOptions). */
  get senderFailed(): boolean {
    return !this.sealsItself;
  }

  /** What the sealer did (sendOnThread), for tests: packets sealed and sent here, left to the handler, refused. */
  get sealerCounts(): { sealed: number; left: number; refused: number } | undefined {
    const sealer = this.sending?.sealer;
    return sealer && { sealed: sealer.sealed, left: sealer.left, refused: sealer.refused };
  }

  start(onPackets: (packets: Uint8Array[], count: number) => void): void {
    if (this.onPackets) throw new Error(`${this.name}: start() was already called`);
    if (this.closed) throw new Error(`${this.name}: device is closed`);
    this.onPackets = onPackets;
    this.schedule();
  }

  write(packets: Uint8Array[], count: number): void {
    if (this.closed) {
      this.stats.writeErrors += count;
      return;
    }
    for (let i = 0; i < count; i++) {
      const packet = packets[i];
      // Like the kernel: an empty packet, or one that is not IPv4/IPv6, is refused.
      const version = packet.length > 0 ? packet[0] >> 4 : 0;
      if (version !== 4 && version !== 6) {
        this.stats.writeErrors++;
        continue;
      }
      const copy = packet.slice();
      this.written.push(copy);
      this.stats.writePackets++;
      for (const listener of this.writeListeners) listener(copy);
    }
  }

  onClose(handler: () => void): void {
    if (this.deleted) {
      setTimeout(handler, 0);
      return;
    }
    this.closeHandlers.push(handler);
  }

  close(): void {
    if (this.closed) return;
    this.closed = true;
    this.queue = [];
    this.queueHead = 0;
  }

  // --- test controls -----------------------------------------------------------------------------------

  /** Queues a copy of `packet` as if the kernel had routed it into the tunnel. Ignored after close. */
  inject(packet: Uint8Array): void {
    if (this.closed) return;
    this.queue.push(packet.slice());
    this.schedule();
  }

  /** Packets injected but not delivered yet. */
  get pending(): number {
    return this.queue.length - this.queueHead;
  }

  /** Calls `listener` with each packet written from now on (a copy, the one also kept in `written`). */
  onWrite(listener: (packet: Uint8Array) => void): void {
    this.writeListeners.push(listener);
  }

  /** Plays `ip link del`: the device closes and the onClose handlers run once. */
  deleteInterface(): void {
    if (this.deleted) return;
    this.deleted = true;
    this.close();
    for (const handler of this.closeHandlers.splice(0)) handler();
  }

  private schedule(): void {
    if (this.scheduled || !this.onPackets || this.pending === 0) return;
    this.scheduled = true;
    setImmediate(this.deliver);
  }

  private readonly deliver = (): void => {
    this.scheduled = false;
    if (this.closed || !this.onPackets) return;
    const count = Math.min(this.pending, this.maxBatch);
    for (let i = 0; i < count; i++) this.batch[i] = this.queue[this.queueHead++];
    if (this.queueHead === this.queue.length) {
      this.queue = [];
      this.queueHead = 0;
    }
    this.stats.readPackets += count;
    try {
      const left = this.sending === undefined ? count : this.sealAndSend(this.batch, count);
      if (left > 0) this.onPackets(this.batch, left);
    } finally {
      this.batch.fill(EMPTY, 0, count); // views are valid only during the call
      this.schedule();
    }
  };

  /**
   * The reader thread's work (tun/reader-sender.ts) on this thread: the packets are laid out in
   * slots as in the ring, sealed where the send table allows and sent; the books go to onSent
   * per run, and what is left is moved to the front of `packets`. Returns how many are left.
   */
  private sealAndSend(packets: Uint8Array[], count: number): number {
    const { sealer, send, onSent } = this.sending!;
    let longest = 0;
    for (let i = 0; i < count; i++) longest = Math.max(longest, packets[i].length);
    const stride = Math.ceil((PACKET_OFFSET + longest + SEAL_ROOM) / 16) * 16;
    const data = new Uint8Array(stride * count);
    const lengths = new Int32Array(count);
    const records = new Int32Array(count * RECORD_INTS);
    for (let i = 0; i < count; i++) {
      data.set(packets[i], i * stride + PACKET_OFFSET);
      lengths[i] = packets[i].length;
    }
    sealer.sealSlots(data, stride, lengths, count, records);
    for (let r = 0; r < sealer.runCount; r++) {
      const run = sealer.runs[r];
      const to = this.endpointOf(run.peer, run.target);
      let bytes = 0;
      for (let k = run.first; k < run.first + run.count; k++) {
        const length = records[k * RECORD_INTS + R_LENGTH];
        send(to, data.subarray(k * stride, k * stride + length));
        bytes += length;
      }
      onSent(run.peer, SEALED, run.count, bytes);
    }
    let left = 0;
    for (let i = 0; i < count; i++) {
      const outcome = records[i * RECORD_INTS + R_OUTCOME];
      if (outcome === LEFT) packets[left++] = packets[i];
      else if (outcome !== SEALED) onSent(records[i * RECORD_INTS + R_PEER], outcome, 1, 0);
    }
    return left;
  }

  private endpointOf(peer: number, target: SendTarget): Endpoint {
    const known = this.endpoints.get(peer);
    if (known !== undefined && known.seq === target.seq) return known.endpoint;
    const v4 = target.family === 4;
    const local = target.sourceFamily === 0 ? undefined
      : new LocalSource(target.sourceAddress.subarray(0, target.sourceFamily === 4 ? 4 : 16), target.sourceIfindex);
    const endpoint = new Endpoint(formatIp(target.address.subarray(0, v4 ? 4 : 16)), target.port, local);
    this.endpoints.set(peer, { seq: target.seq, endpoint });
    return endpoint;
  }
}

const EMPTY = new Uint8Array(0);

function checkMtu(mtu: number): void {
  if (!Number.isInteger(mtu) || mtu < 68 || mtu > 65535) throw new RangeError(`MTU must be an integer in 68..65535, got ${mtu}`);
}
