/**
 * The receive ring of FfiUdpBind: one SharedArrayBuffer shared by the UDP reader worker (the only
 * producer, udp-reader-worker.ts) and the main thread (the only consumer, ffi-udp-bind.ts).
 *
 * The ring header and the protocol (sequence numbers, the doorbell, the stop handshake) are
 * ring/shared-ring.ts's; this module lays out what recvmmsg needs, all inside the shared memory so
 * that the kernel writes straight into it:
 *
 *   header   UDP_HEADER_INTS int32 (the ring header, then READ_ERRORS, TRUNCATED and KERNEL_DROPS below)
 *   lengths  int32 per slot: the datagram length, or -1 when it did not fit its slot
 *   names    32 bytes per slot: the source address (struct sockaddr_in or sockaddr_in6, 28 bytes)
 *   segments int32 per slot: with UDP GRO, the size of the datagrams a coalesced slot holds (0 = one datagram)
 *   locals   32 bytes per slot: the local address the datagram arrived on (see LOCAL_WORDS)
 *   controls 128 bytes per slot: the control messages the kernel writes (UDP_GRO's segment size,
 *            SO_RXQ_OVFL's drop count, IP_PKTINFO / IPV6_PKTINFO)
 *   opened   int32 per slot: how many of the slot's datagrams have an outcome record (the reader
 *            opens transport messages in place: session/transport-opener.ts)
 *   records  MAX_RUN outcome records (RECORD_INTS int32 each) per slot
 *   msgs     one struct mmsghdr per slot (64 bytes), built once by the worker
 *   iovecs   one struct iovec per slot (16 bytes): the slot's data
 *   data     `slotSize` bytes per slot, page-aligned
 *
 * Slot i's mmsghdr points at name i and iovec i, and iovec i at data slot i, so one recvmmsg into
 * the mmsghdrs of slots [s, s + n) fills n consecutive slots.
 */
import { IOVEC_SIZE, MMSGHDR_SIZE } from '../sys/libc.ts';
import { FAILED, RING_HEADER_INTS, checkSlots } from '../ring/shared-ring.ts';
import { MAX_RUN, RECORD_INTS } from '../session/transport-opener.ts';

/** Set to 1 by the reader when it ended on an error of its own (poll failed, a socket became unusable). */
export const READER_FAILED = FAILED;
/** Failed receives (a pending socket error, e.g. an ICMP report, is returned once; the reader goes on). */
export const READ_ERRORS = RING_HEADER_INTS;
/** Datagrams larger than a slot (dropped; counted as receive errors). */
export const TRUNCATED = RING_HEADER_INTS + 1;

/**
 * Per socket (in the order of the reader's fds: IPv4, then IPv6), the kernel's count of datagrams
 * it dropped before the reader could take them (SO_RXQ_OVFL: a full receive queue), as the last
 * datagram received reported it: an unsigned 32-bit count, cumulative since the socket was made.
 */
export const KERNEL_DROPS = RING_HEADER_INTS + 2;
/** Set to 1 by a reader that was asked to open transport messages and could not load an AEAD. */
export const OPENER_FAILED = KERNEL_DROPS + 2;
/** Packets the reader wrote to the TUN itself, and those the kernel refused (step 2b delivery). */
export const TUN_WRITTEN = OPENER_FAILED + 1;
export const TUN_WRITE_ERRORS = TUN_WRITTEN + 1;
/** The UDP ring's header: the ring header, READ_ERRORS, TRUNCATED, KERNEL_DROPS for two sockets, OPENER_FAILED, TUN_WRITTEN, TUN_WRITE_ERRORS. */
export const UDP_HEADER_INTS = TUN_WRITE_ERRORS + 1;
/** Outcome records per slot, and int32 per slot's records. */
export const SLOT_RECORDS = MAX_RUN;
export const SLOT_RECORD_INTS = MAX_RUN * RECORD_INTS;

/** Bytes reserved per source address (sizeof(struct sockaddr_in6) = 28, rounded up). */
export const NAME_SIZE = 32;
/**
 * Bytes of control buffer per slot: two CMSG_SPACE(sizeof(int)) = 24 (UDP_GRO and SO_RXQ_OVFL)
 * and CMSG_SPACE(sizeof(struct in6_pktinfo)) = 40 (in_pktinfo: 32), rounded up.
 */
export const CONTROL_SIZE = 128;
/**
 * Per slot, 32-bit words of the local address the datagram arrived on, as the reader copies it
 * from IP_PKTINFO (ipi_spec_dst) or IPV6_PKTINFO (ipi6_addr): words 0..3 the address as the
 * kernel wrote it (IPv4: word 0, the rest 0), word 4 the interface index, word 5 the family
 * (4 or 6; 0 = the datagram came without one).
 */
export const LOCAL_WORDS = 8;
export const LOCAL_IFINDEX = 4;
export const LOCAL_FAMILY = 5;
/**
 * 256 slots of 64 KiB: any UDP datagram, or a UDP GRO run of them, fits whole; only the touched
 * pages of a slot cost memory (with GRO a slot is often full: 16 MiB at most).
 */
export const UDP_RING_SLOTS = 256;
export const UDP_SLOT_SIZE = 65536;

export interface UdpRingLayout {
  slots: number;
  slotSize: number;
}

export interface UdpRingOffsets {
  lengths: number;
  names: number;
  segments: number;
  locals: number;
  controls: number;
  opened: number;
  records: number;
  msgs: number;
  iovecs: number;
  data: number;
  total: number;
}

const align = (n: number, to: number) => Math.ceil(n / to) * to;

export function udpRingOffsets(layout: UdpRingLayout): UdpRingOffsets {
  const { slots, slotSize } = layout;
  checkSlots(slots);
  if (!Number.isInteger(slotSize) || slotSize < 64 || slotSize % 8 !== 0) throw new RangeError(`bad slot size ${slotSize}`);
  const lengths = UDP_HEADER_INTS * 4;
  const names = align(lengths + slots * 4, 64);
  const segments = align(names + slots * NAME_SIZE, 64);
  const locals = align(segments + slots * 4, 64);
  const controls = align(locals + slots * LOCAL_WORDS * 4, 64);
  const opened = align(controls + slots * CONTROL_SIZE, 64);
  const records = align(opened + slots * 4, 64);
  const msgs = align(records + slots * SLOT_RECORD_INTS * 4, 64);
  const iovecs = msgs + slots * MMSGHDR_SIZE;
  const data = align(iovecs + slots * IOVEC_SIZE, 4096);
  return { lengths, names, segments, locals, controls, opened, records, msgs, iovecs, data, total: data + slots * slotSize };
}

export interface UdpRingViews {
  header: Int32Array;
  lengths: Int32Array;
  /** Per slot: the segment size of a coalesced (UDP GRO) slot, else 0. */
  segments: Int32Array;
  /** Per slot, LOCAL_WORDS words: the local address the datagram arrived on. */
  locals: Int32Array;
  /** Per slot: how many outcome records the reader wrote (0: nothing was opened). */
  opened: Int32Array;
  /** Per slot, SLOT_RECORD_INTS words: the outcome records (transport-opener.ts). */
  records: Int32Array;
  /** All source addresses, NAME_SIZE bytes per slot, as bytes and as 16- and 32-bit words. */
  names: Uint8Array;
  names16: Uint16Array;
  names32: Uint32Array;
  offsets: UdpRingOffsets;
}

export function udpRingViews(buffer: SharedArrayBuffer, layout: UdpRingLayout): UdpRingViews {
  const offsets = udpRingOffsets(layout);
  if (buffer.byteLength < offsets.total) throw new RangeError('ring buffer too small for its layout');
  return {
    header: new Int32Array(buffer, 0, UDP_HEADER_INTS),
    lengths: new Int32Array(buffer, offsets.lengths, layout.slots),
    segments: new Int32Array(buffer, offsets.segments, layout.slots),
    locals: new Int32Array(buffer, offsets.locals, layout.slots * LOCAL_WORDS),
    opened: new Int32Array(buffer, offsets.opened, layout.slots),
    records: new Int32Array(buffer, offsets.records, layout.slots * SLOT_RECORD_INTS),
    names: new Uint8Array(buffer, offsets.names, layout.slots * NAME_SIZE),
    names16: new Uint16Array(buffer, offsets.names, (layout.slots * NAME_SIZE) / 2),
    names32: new Uint32Array(buffer, offsets.names, (layout.slots * NAME_SIZE) / 4),
    offsets,
  };
}
