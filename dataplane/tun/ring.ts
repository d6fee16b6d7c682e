/**
 * The layout of the packet ring shared by the TUN reader worker (the producer) and the main thread
 * (the consumer): one SharedArrayBuffer holding the ring header (ring/shared-ring.ts, which also
 * holds the protocol) and this ring's words, the length of each slot, and `slots` fixed-size
 * packet slots.
 *
 * Slots are 64 KiB so that any packet the kernel can hand over (MTU up to 65535) fits whole; only
 * the touched part of a slot is ever backed by memory, so the 16 MiB of 256 slots cost about 1 MiB
 * (Node) to 3 MiB (Bun) of resident memory at MTU 1500.
 */
import { FAILED, RING_HEADER_INTS, checkSlots } from '../ring/shared-ring.ts';

/** Set to 1 by the reader when the device is gone (read/poll reported it): the ring's FAILED word. */
export const DEVICE_GONE = FAILED;
/** Failed reads other than EAGAIN/EINTR and "device gone" (the reader increments). */
export const READ_ERRORS = RING_HEADER_INTS;
export const HEADER_INTS = RING_HEADER_INTS + 2;

export const DEFAULT_SLOTS = 256;
export const SLOT_SIZE = 65536;

export interface RingLayout {
  slots: number;
  slotSize: number;
}

export interface RingViews {
  header: Int32Array;
  lengths: Int32Array;
  data: Uint8Array;
}

export function ringBytes(layout: RingLayout): number {
  return (HEADER_INTS + layout.slots) * 4 + layout.slots * layout.slotSize;
}

export function ringViews(buffer: SharedArrayBuffer, layout: RingLayout): RingViews {
  checkSlots(layout.slots);
  const header = new Int32Array(buffer, 0, HEADER_INTS);
  const lengths = new Int32Array(buffer, HEADER_INTS * 4, layout.slots);
  const data = new Uint8Array(buffer, (HEADER_INTS + layout.slots) * 4, layout.slots * layout.slotSize);
  return { header, lengths, data };
}
