/**
 * A batch of packets in shared memory, handed to a crypto worker as a whole.
 *
 * Each slot holds one packet laid out as its datagram: 16 bytes of header room, the payload,
 * padding and the 16-byte tag, so sealing and opening happen in place. Per-slot lengths and
 * counters live in shared typed arrays next to the data; workers write their results there.
 * Batches are reused (see BatchPool), so the steady state allocates nothing per packet.
 */
export const BATCH_CAPACITY = 128;

export class PacketBatch {
  readonly data: Uint8Array;
  /** In: plaintext length (seal) or datagram length (open). Out: datagram length (seal) or plaintext length, -1 = failed (open). */
  readonly lengths: Int32Array;
  /** The nonce counter of each slot; float64 holds every counter below 2^53 exactly. */
  readonly counters: Float64Array;
  count = 0;

  constructor(readonly slotSize: number, readonly capacity = BATCH_CAPACITY) {
    if (slotSize % 16 !== 0) throw new Error(`slot size must be a multiple of 16, got ${slotSize}`);
    this.data = new Uint8Array(new SharedArrayBuffer(slotSize * capacity));
    this.lengths = new Int32Array(new SharedArrayBuffer(4 * capacity));
    this.counters = new Float64Array(new SharedArrayBuffer(8 * capacity));
  }

  get full(): boolean {
    return this.count === this.capacity;
  }

  /** The whole slot `i` (header room + payload + padding + tag). */
  slot(i: number): Uint8Array {
    return this.data.subarray(i * this.slotSize, (i + 1) * this.slotSize);
  }
}

/** Free batches of one slot size, reused instead of allocated. */
export class BatchPool {
  private readonly free: PacketBatch[] = [];

  constructor(readonly slotSize: number) {}

  acquire(): PacketBatch {
    const batch = this.free.pop() ?? new PacketBatch(this.slotSize);
    batch.count = 0;
    return batch;
  }

  release(batch: PacketBatch): void {
    if (this.free.length < 256) this.free.push(batch);
  }
}

/** Slot size for a tunnel MTU: header + MTU-sized payload + worst-case padding + tag, 64-aligned. */
export function slotSizeForMtu(mtu: number): number {
  return Math.ceil((16 + mtu + 15 + 16) / 64) * 64;
}
