/**
 * One read from a TUN fd with a vnet header (IFF_VNET_HDR, see offload.ts), turned into ring
 * slots: a whole packet is copied into one slot (its partial checksum completed when the kernel
 * left it to us), a TCP super-packet is split into segments, one slot each. The reader thread
 * (reader-worker.ts) uses it; kept apart from the thread so it is tested on its own. What the
 * kernel hands over is checked: the vnet header and the packet's own headers must agree and fit
 * the bytes read, and nothing may be written past the end of a slot (a whole packet larger than
 * a slot, or a segment size that makes one, is refused). Everything refused is left to the caller to count (READ_ERRORS); nothing here throws
 * on what a read brought.
 */
import {
  GSO_NONE, VNET_F_NEEDS_CSUM, VNET_HDR_SIZE, VNET_READ_SIZE, completeChecksum, newSegmentPlan, planSegments, readVnetHeader, wordsOf,
  writeSegment, type SegmentPlan, type VnetHeader,
} from './offload.ts';
import { copyBySet, type CopyBytes } from '../sys/copy-bytes.ts';

/** Where the packets of one read go: the caller's ring slots. */
export interface SlotSink {
  /** The next free slot (at least the reader's slotSize bytes), or undefined to stop (a stop was requested). */
  slot(): Uint8Array | undefined;
  /** The slot last returned by slot() now holds a packet of `length` bytes. */
  filled(length: number): void;
}

/** VnetReader.ingest: the read was refused (malformed, or too large for a slot); count it. */
export const VNET_READ_REFUSED = 0;
/** VnetReader.ingest: the sink asked to stop before every segment was placed. */
export const VNET_READ_STOPPED = -1;

export class VnetReader {
  /** Read into this, VNET_READ_SIZE bytes at most: the vnet header, then the packet. */
  readonly target: Uint8Array;
  private readonly packet: Uint8Array;
  private readonly scratchWords: Uint32Array;
  private readonly header: VnetHeader = { flags: 0, gsoType: 0, hdrLen: 0, gsoSize: 0, csumStart: 0, csumOffset: 0 };
  private readonly plan: SegmentPlan = newSegmentPlan();

  /**
   * `slotSize`: the size of every slot the sink hands out. `slotWords` (see offload.ts sum16):
   * a 32-bit view of the buffer the slots lie in, for the segments' checksums. `copy`: how bytes
   * move into the slots (sys/copy-bytes.ts).
   */
  constructor(private readonly slotSize: number, private readonly slotWords?: Uint32Array, private readonly copy: CopyBytes = copyBySet) {
    // Reads land 2 bytes in, so that the IP packet after the 10-byte header starts 4-byte
    // aligned (the checksum reads 32-bit words). Shared, as the slots are: copy-bytes.ts copies
    // between shared buffers by address under Node.
    const scratch = new Uint8Array(new SharedArrayBuffer(2 + VNET_READ_SIZE));
    this.target = scratch.subarray(2);
    this.packet = scratch.subarray(2 + VNET_HDR_SIZE);
    this.scratchWords = wordsOf(scratch.buffer);
  }

  /**
   * Places the `n` bytes read into `target` in the sink's slots. Returns the number of packets
   * placed, VNET_READ_REFUSED, or VNET_READ_STOPPED.
   */
  ingest(n: number, sink: SlotSink): number {
    const length = n - VNET_HDR_SIZE;
    if (length <= 0 || n > VNET_READ_SIZE) return VNET_READ_REFUSED;
    const p = this.packet;
    const h = readVnetHeader(this.target, 0, this.header);
    if (h.gsoType === GSO_NONE) {
      if (length > this.slotSize) return VNET_READ_REFUSED;
      if ((h.flags & VNET_F_NEEDS_CSUM) !== 0 && !completeChecksum(p, length, h.csumStart, h.csumOffset, this.scratchWords)) return VNET_READ_REFUSED;
      const slot = sink.slot();
      if (slot === undefined) return VNET_READ_STOPPED;
      this.copy(slot, 0, p, 0, length);
      sink.filled(length);
      return 1;
    }
    const plan = this.plan;
    if (!planSegments(p, length, h, plan) || plan.headerLength + plan.segmentSize > this.slotSize) return VNET_READ_REFUSED;
    for (let i = 0; i < plan.segments; i++) {
      const slot = sink.slot();
      if (slot === undefined) return VNET_READ_STOPPED;
      sink.filled(writeSegment(p, plan, i, slot, this.slotWords, this.copy));
    }
    return plan.segments;
  }
}
