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
import type { Tun, TunStats } from './tun.ts';
import { validateInterfaceName } from './tun.ts';

export interface MemoryTunOptions {
  /** Largest batch handed to the handler at once (the Linux ring holds 256). Default 256. */
  maxBatch?: number;
}

export class MemoryTun implements Tun {
  readonly name: string;
  readonly stats: TunStats = { readPackets: 0, writePackets: 0, writeErrors: 0, readErrors: 0 };
  /** Copies of the packets written to the "kernel", in order. Tests may clear it. */
  written: Uint8Array[] = [];

  private currentMtu: number;
  private readonly maxBatch: number;
  private queue: Uint8Array[] = [];
  private queueHead = 0;
  private readonly batch: Uint8Array[] = [];
  private onPackets: ((packets: Uint8Array[], count: number) => void) | undefined;
  private readonly closeHandlers: Array<() => void> = [];
  private scheduled = false;
  private closed = false;
  private deleted = false;
  private readonly writeListeners: Array<(packet: Uint8Array) => void> = [];

  constructor(name = 'rgmem0', mtu = 1420, options: MemoryTunOptions = {}) {
    validateInterfaceName(name);
    checkMtu(mtu);
    this.name = name;
    this.currentMtu = mtu;
    this.maxBatch = options.maxBatch ?? 256;
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
      this.onPackets(this.batch, count);
    } finally {
      this.batch.fill(EMPTY, 0, count); // views are valid only during the call
      this.schedule();
    }
  };
}

const EMPTY = new Uint8Array(0);

function checkMtu(mtu: number): void {
  if (!Number.isInteger(mtu) || mtu < 68 || mtu > 65535) throw new RangeError(`MTU must be an integer in 68..65535, got ${mtu}`);
}
