/**
 * The layout of the packet ring shared by the TUN reader worker (the producer) and the main thread
 * (the consumer): one SharedArrayBuffer holding the ring header (ring/shared-ring.ts, which also
 * holds the protocol) and this ring's words, the length of each slot, a record per slot (what the
 * reader did with the packet: session/transport-sealer.ts), and `slots` fixed-size packet slots.
 * A packet lies PACKET_OFFSET bytes into its slot, so that the reader can seal it in place (the
 * transport header goes before it, the padding and tag after it); a packet the reader sealed and
 * sent itself leaves only its record for the main thread's books.
 *
 * Slots hold 64 KiB so that any packet the kernel can hand over (MTU up to 65535) fits whole; only
 * the touched part of a slot is ever backed by memory, so the 16 MiB of 256 slots cost about 1 MiB
 * (Node) to 3 MiB (Bun) of resident memory at MTU 1500.
 */
import { FAILED, RING_HEADER_INTS, checkSlots } from '../ring/shared-ring.ts';
import { RECORD_INTS } from '../session/transport-sealer.ts';

/** Set to 1 by the reader when the device is gone (read/poll reported it): the ring's FAILED word. */
export const DEVICE_GONE = FAILED;
/** Failed reads other than EAGAIN/EINTR and "device gone" (the reader increments). */
export const READ_ERRORS = RING_HEADER_INTS;
/** Datagrams the reader sealed and the kernel refused or had no room for (the reader increments). */
export const SEND_ERRORS = RING_HEADER_INTS + 1;
/** 1 when the reader could not load an AEAD provider: it then seals nothing (the main thread does). */
export const SENDER_FAILED = RING_HEADER_INTS + 2;
/** Which thread reads the queue right now (queue-token.ts). */
export const QUEUE_READER = RING_HEADER_INTS + 3;
/** The MTU the packets sealed from this queue are padded for (the main thread writes it; 0 before). */
export const SEND_MTU = RING_HEADER_INTS + 4;
/**
 * Reads of this queue by the UDP reader that brought a reply (reply-reader.ts increments; a
 * 32-bit count that wraps, read as unsigned).
 */
export const REPLIES_READ = RING_HEADER_INTS + 5;
export const HEADER_INTS = RING_HEADER_INTS + 6;

/** Where a packet starts in its slot: room for the transport header (TRANSPORT_HEADER_SIZE). */
export const PACKET_OFFSET = 16;
/** Room a slot keeps after its packet for sealing in place: padding (up to 15) and the tag (16), rounded up. */
export const SEAL_ROOM = 32;

export const DEFAULT_SLOTS = 256;
/** 64 KiB for the packet (any MTU up to 65535 fits), with PACKET_OFFSET before and SEAL_ROOM after it. */
export const SLOT_SIZE = 65536 + PACKET_OFFSET + SEAL_ROOM;

export interface RingLayout {
  slots: number;
  slotSize: number;
}

export interface RingViews {
  header: Int32Array;
  /** Per slot, the packet's length. */
  lengths: Int32Array;
  /** Per slot, RECORD_INTS words (transport-sealer.ts): LEFT for a packet the main thread handles. */
  records: Int32Array;
  data: Uint8Array;
}

export function ringBytes(layout: RingLayout): number {
  return (HEADER_INTS + layout.slots * (1 + RECORD_INTS)) * 4 + layout.slots * layout.slotSize;
}

export function ringViews(buffer: SharedArrayBuffer, layout: RingLayout): RingViews {
  checkSlots(layout.slots);
  const header = new Int32Array(buffer, 0, HEADER_INTS);
  const lengths = new Int32Array(buffer, HEADER_INTS * 4, layout.slots);
  const records = new Int32Array(buffer, (HEADER_INTS + layout.slots) * 4, layout.slots * RECORD_INTS);
  const data = new Uint8Array(buffer, (HEADER_INTS + layout.slots * (1 + RECORD_INTS)) * 4, layout.slots * layout.slotSize);
  return { header, lengths, records, data };
}
