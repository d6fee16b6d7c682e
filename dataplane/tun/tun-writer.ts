/**
 * Writing IP packets to a TUN device, in the device's format: with a virtio-net header before
 * each write when the descriptors have IFF_VNET_HDR, and, when the kernel took TSO, the TCP
 * packets of one flow coalesced into one super-packet (offload.ts). Each write goes through the
 * descriptor of the queue its flow belongs to (flow-queue.ts), which keeps the flow's packets in
 * the other direction on that queue's reader. LinuxTun writes through one of these on the main
 * thread, the UDP reader thread through its own (on its own dups of the descriptors:
 * docs/data-workers.md step 2b); each keeps its own scratch buffers, so neither waits for the other.
 */
import type { Libc } from '../sys/libc.ts';
import { copierFor, type CopyBytes } from '../sys/copy-bytes.ts';
import { flowQueue } from './flow-queue.ts';
import { MAX_COALESCED, VNET_HDR_SIZE, coalesceAndWrite } from './offload.ts';

export class TunPacketWriter {
  private buffer: Uint8Array | undefined;
  private done = new Uint8Array(256);
  private readonly copy: CopyBytes;
  /** Per queue, 1 once a write went through it (the caller clears them): where a reply may wait (reply-reader.ts). */
  readonly touched: Uint8Array;

  /** `fds`: one descriptor per queue of the device, in queue order. */
  constructor(private readonly libc: Libc, private readonly fds: readonly number[], private readonly vnetHeader: boolean, private readonly offloads: number) {
    if (fds.length === 0) throw new RangeError('a TUN writer needs at least one descriptor');
    this.copy = copierFor(libc);
    this.touched = new Uint8Array(fds.length);
  }

  /** Writes the first `count` packets; returns how many the kernel took (each coalesced segment counts). Never throws for a refused packet. */
  write(packets: readonly Uint8Array[], count: number): number {
    if (!this.vnetHeader) {
      let written = 0;
      for (let i = 0; i < count; i++) {
        const packet = packets[i];
        const queue = flowQueue(packet, 0, packet.length, this.fds.length);
        this.touched[queue] = 1;
        if (packet.length > 0 && this.libc.write(this.fds[queue], packet, packet.length) === packet.length) written++;
      }
      return written;
    }
    // Coalesced per TCP flow when the kernel takes TSO; a vnet header on every write in any case.
    // A lone packet takes the same path as a batch: one path stays warm in the JIT, where a
    // separate one for single packets ran unoptimized on an idle ping after a bulk transfer.
    // Shared, as the rings the packets come from are: copy-bytes.ts copies between shared buffers by address under Node.
    const buffer = (this.buffer ??= new Uint8Array(new SharedArrayBuffer(VNET_HDR_SIZE + MAX_COALESCED)));
    if (this.done.length < count) this.done = new Uint8Array(Math.max(count, 2 * this.done.length));
    return this.offloads !== 0
      ? coalesceAndWrite(packets, count, buffer, this.done, this.writeOne, this.copy)
      : this.writeEach(packets, count, buffer);
  }

  /** One write(2) of `length` bytes of `buffer` (a vnet header, then the packet), through its flow's queue. */
  private readonly writeOne = (buffer: Uint8Array, length: number): boolean => {
    const fds = this.fds;
    const queue = fds.length === 1 ? 0 : flowQueue(buffer, VNET_HDR_SIZE, length - VNET_HDR_SIZE, fds.length);
    this.touched[queue] = 1;
    return this.libc.write(fds[queue], buffer, length) === length;
  };

  /** Each packet alone, behind an empty vnet header (GSO_NONE, checksum complete). */
  private writeEach(packets: readonly Uint8Array[], count: number, buffer: Uint8Array): number {
    let written = 0;
    buffer.fill(0, 0, VNET_HDR_SIZE);
    for (let i = 0; i < count; i++) {
      const packet = packets[i];
      const length = packet.length;
      if (length === 0 || length > buffer.length - VNET_HDR_SIZE) continue;
      this.copy(buffer, VNET_HDR_SIZE, packet, 0, length);
      if (this.writeOne(buffer, VNET_HDR_SIZE + length)) written++;
    }
    return written;
  }
}
