/**
 * TUN offloads: the kernel and the daemon exchange TCP "super-packets" of up to 64 KiB instead of
 * one packet per MTU, each prefixed by a struct virtio_net_hdr (IFF_VNET_HDR, TUNSETOFFLOAD with
 * TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6). This is what makes a userspace tunnel cheap per byte: one
 * read(2) brings what would be ~45 packets, one write(2) injects ~45 received segments, and the
 * kernel's TCP on both ends handles one large buffer instead of many small ones (and sends far
 * fewer ACKs).
 *
 * Reading (the TUN reader thread, reader-worker.ts): a packet with gso_type NONE is passed on
 * as it is, after completing its checksum when the kernel left it partial (NEEDS_CSUM: the
 * checksum field holds the pseudo-header sum; the rest is summed here). A TCP super-packet
 * (gso_type TCPV4/TCPV6) is cut into gso_size segments, as the kernel's own GSO would: the headers
 * are copied, the IPv4 total length, ID (incremented per segment) and header checksum or the
 * IPv6 payload length are set, the sequence number advances, FIN and PSH stay on the last
 * segment only, CWR on the first only, and every segment gets its full TCP checksum. The peer
 * thus receives ordinary MTU-sized packets: the protocol on the wire does not change.
 *
 * Writing (LinuxTun.write, main thread): the packets of one call are coalesced per TCP flow, as
 * the kernel's GRO would: consecutive in-order segments of one connection with identical headers
 * apart from sequence number and length (same addresses, ports, ACK number, TCP options, TTL/hop
 * limit, TOS/traffic class, only ACK and a final PSH set, equal sizes but for a shorter last one,
 * at most 64 KiB) become one packet written with a TCPV4/TCPV6 header and NEEDS_CSUM, its TCP
 * checksum field set to the pseudo-header sum (the kernel's CHECKSUM_PARTIAL convention).
 * Everything else is written unchanged, one packet per write, in order; packets of different flows
 * may overtake each other, those of one flow never do.
 *
 * Checksums before merging: NEEDS_CSUM tells the receiving stack that the checksum is the
 * sender's job and still to be done, so it never verifies the merged bytes; the IPv4 header
 * checksum of a merged packet is recomputed here too. A segment whose checksums are wrong (an
 * authenticated peer can send one: WireGuard authenticates the tunnel, not the inner packet) would
 * thus be laundered into a packet the kernel accepts. So every segment's IPv4 header checksum and
 * TCP checksum (pseudo-header included) is verified before it is merged, as wireguard-go's GRO
 * does; one that fails is written on its own, unchanged, for the kernel to check and drop, and
 * ends its flow's run there (order within a flow is kept). The first segment of a run is only
 * verified once a second one could join it: a packet written alone is the kernel's to check.
 *
 * All helpers here are pure functions over byte arrays (unit-tested in test/unit/tun-offload.test.ts);
 * the two that copy payloads take the copy to use (sys/copy-bytes.ts: Node's copies between
 * shared buffers are slow unless done by address).
 * virtio_net_hdr fields are in host byte order (little-endian on x86-64 and AArch64), as a TUN
 * device without TUNSETVNETLE uses on those hosts.
 */

import { copyBySet, type CopyBytes } from '../sys/copy-bytes.ts';

/** sizeof(struct virtio_net_hdr): the TUN default vnet header size. */
export const VNET_HDR_SIZE = 10;
export const VNET_F_NEEDS_CSUM = 1;
export const GSO_NONE = 0;
export const GSO_TCPV4 = 1;
export const GSO_UDP = 3;
export const GSO_TCPV6 = 4;
export const GSO_UDP_L4 = 5;
export const GSO_ECN = 0x80;

const PROTO_TCP = 6;
const PROTO_UDP = 17;
const TCP_FIN = 0x01;
const TCP_SYN = 0x02;
const TCP_RST = 0x04;
const TCP_PSH = 0x08;
const TCP_ACK = 0x10;
const TCP_CWR = 0x80;
/** Largest read with a vnet header: the header and the largest GSO packet (64 KiB), with room to spare. */
export const VNET_READ_SIZE = VNET_HDR_SIZE + 2 * 65536;
/** Largest IP packet a coalesced write may make (the IPv4 total length field). */
export const MAX_COALESCED = 65535;

/** A parsed struct virtio_net_hdr. */
export interface VnetHeader {
  flags: number;
  gsoType: number;
  hdrLen: number;
  gsoSize: number;
  csumStart: number;
  csumOffset: number;
}

export function readVnetHeader(buf: Uint8Array, offset: number, into: VnetHeader): VnetHeader {
  into.flags = buf[offset];
  into.gsoType = buf[offset + 1];
  into.hdrLen = buf[offset + 2] | (buf[offset + 3] << 8);
  into.gsoSize = buf[offset + 4] | (buf[offset + 5] << 8);
  into.csumStart = buf[offset + 6] | (buf[offset + 7] << 8);
  into.csumOffset = buf[offset + 8] | (buf[offset + 9] << 8);
  return into;
}

export function writeVnetHeader(
  buf: Uint8Array, offset: number,
  flags: number, gsoType: number, hdrLen: number, gsoSize: number, csumStart: number, csumOffset: number,
): void {
  buf[offset] = flags;
  buf[offset + 1] = gsoType;
  buf[offset + 2] = hdrLen & 0xff;
  buf[offset + 3] = hdrLen >>> 8;
  buf[offset + 4] = gsoSize & 0xff;
  buf[offset + 5] = gsoSize >>> 8;
  buf[offset + 6] = csumStart & 0xff;
  buf[offset + 7] = csumStart >>> 8;
  buf[offset + 8] = csumOffset & 0xff;
  buf[offset + 9] = csumOffset >>> 8;
}

// --- the Internet checksum (RFC 1071) ------------------------------------------------------------

/** A Uint32Array over the whole of `buffer`, for {@link sum16}'s fast path. */
export function wordsOf(buffer: ArrayBufferLike): Uint32Array {
  return new Uint32Array(buffer, 0, buffer.byteLength >>> 2);
}

/**
 * The ones'-complement sum (not folded) of bytes [start, end) of `b` as big-endian 16-bit words.
 * When `words` views `b.buffer` from byte 0 (see {@link wordsOf}) and the range starts 4-byte
 * aligned in the buffer, it adds whole 32-bit words (2^16 ≡ 1 modulo 2^16 - 1, so the halves
 * need not be split), several times faster; the result is the same. The sums are float64s,
 * exact for ranges of up to 16 MiB (packets are at most 64 KiB).
 */
export function sum16(b: Uint8Array, start: number, end: number, words?: Uint32Array): number {
  let i = start;
  let total = 0;
  const absolute = b.byteOffset + start;
  if (words !== undefined && (absolute & 3) === 0 && end - start >= 16) {
    let k = absolute >>> 2;
    const count = (end - start) >>> 2;
    const stop = k + count;
    const stop4 = stop - 3;
    // Two accumulators: each add waits only for its own chain.
    let s0 = 0;
    let s1 = 0;
    for (; k < stop4; k += 4) {
      s0 += words[k] + words[k + 1];
      s1 += words[k + 2] + words[k + 3];
    }
    for (; k < stop; k++) s0 += words[k];
    // Little-endian words hold each big-endian 16-bit pair byte-swapped; the ones'-complement sum
    // commutes with byte swapping (RFC 1071, 2.B), so swap the folded sum back.
    const folded = fold(s0 + s1);
    total = ((folded & 0xff) << 8) | (folded >>> 8);
    i = start + count * 4;
  }
  const pairs = end - 1;
  for (; i < pairs; i += 2) total += (b[i] << 8) | b[i + 1];
  if (i < end) total += b[i] << 8;
  return total;
}

/** Folds a ones'-complement sum to 16 bits. */
export function fold(sum: number): number {
  while (sum > 0xffff) sum = (sum & 0xffff) + Math.floor(sum / 65536);
  return sum;
}

/** The pseudo-header sum (not folded) of an IPv4 or IPv6 packet for a transport protocol and length. */
export function pseudoHeaderSum(packet: Uint8Array, v6: boolean, protocol: number, length: number, words?: Uint32Array): number {
  const addresses = v6 ? sum16(packet, 8, 40, words) : sum16(packet, 12, 20, words);
  return addresses + protocol + (length & 0xffff) + Math.floor(length / 65536);
}

function ipv4HeaderChecksum(p: Uint8Array, headerLength: number): void {
  p[10] = 0;
  p[11] = 0;
  const checksum = ~fold(sum16(p, 0, headerLength)) & 0xffff;
  p[10] = checksum >>> 8;
  p[11] = checksum & 0xff;
}

function readU32(b: Uint8Array, i: number): number {
  return ((b[i] << 24) | (b[i + 1] << 16) | (b[i + 2] << 8) | b[i + 3]) >>> 0;
}

function writeU32(b: Uint8Array, i: number, v: number): void {
  b[i] = v >>> 24;
  b[i + 1] = (v >>> 16) & 0xff;
  b[i + 2] = (v >>> 8) & 0xff;
  b[i + 3] = v & 0xff;
}

/**
 * Completes a partial checksum (VNET_F_NEEDS_CSUM on a packet that is not to be segmented): the
 * field at csumStart + csumOffset holds the pseudo-header sum; the sum over [csumStart, length) is
 * folded, inverted and stored there. Returns false when the offsets do not fit the packet.
 */
export function completeChecksum(p: Uint8Array, length: number, csumStart: number, csumOffset: number, words?: Uint32Array): boolean {
  const field = csumStart + csumOffset;
  if (field + 2 > length || csumStart >= length) return false;
  let checksum = ~fold(sum16(p, csumStart, length, words)) & 0xffff;
  // UDP transmits a computed zero as all ones (zero means "no checksum"); TCP's field is at 16.
  if (checksum === 0 && csumOffset === 6) checksum = 0xffff;
  p[field] = checksum >>> 8;
  p[field + 1] = checksum & 0xff;
  return true;
}

// --- splitting a TCP super-packet (TSO, read side) --------------------------------------------------

/** How one TCP super-packet is cut; filled by {@link planSegments}. */
export interface SegmentPlan {
  v6: boolean;
  /** Offset of the TCP header (the IP header length, with IPv6 extension headers). */
  l4: number;
  /** IP + TCP header bytes copied into every segment. */
  headerLength: number;
  /** Payload bytes per segment (the last may have fewer). */
  segmentSize: number;
  payloadLength: number;
  segments: number;
  firstSeq: number;
  firstId: number;
  flags: number;
}

export function newSegmentPlan(): SegmentPlan {
  return { v6: false, l4: 0, headerLength: 0, segmentSize: 0, payloadLength: 0, segments: 0, firstSeq: 0, firstId: 0, flags: 0 };
}

/**
 * Checks a GSO packet (the bytes after the vnet header) and fills `plan`. Returns false for what
 * this cannot split (not TCP, headers out of bounds, a zero segment size): the caller drops it.
 */
export function planSegments(p: Uint8Array, length: number, h: VnetHeader, plan: SegmentPlan): boolean {
  const type = h.gsoType & ~GSO_ECN;
  if (type !== GSO_TCPV4 && type !== GSO_TCPV6) return false;
  if (length < 20) return false;
  const version = p[0] >> 4;
  const v6 = version === 6;
  if (v6 ? type !== GSO_TCPV6 : (version !== 4 || type !== GSO_TCPV4)) return false;
  const l4 = h.csumStart;
  if (v6 ? (l4 < 40 || (l4 === 40 && p[6] !== PROTO_TCP)) : (l4 !== (p[0] & 15) * 4 || l4 < 20 || p[9] !== PROTO_TCP)) return false;
  if (l4 + 20 > length) return false;
  const tcpHeader = (p[l4 + 12] >> 4) * 4;
  if (tcpHeader < 20) return false;
  const headerLength = l4 + tcpHeader;
  if (headerLength > length || h.gsoSize === 0) return false;
  plan.v6 = v6;
  plan.l4 = l4;
  plan.headerLength = headerLength;
  plan.segmentSize = h.gsoSize;
  plan.payloadLength = length - headerLength;
  plan.segments = Math.max(1, Math.ceil(plan.payloadLength / h.gsoSize));
  plan.firstSeq = readU32(p, l4 + 4);
  plan.firstId = v6 ? 0 : (p[4] << 8) | p[5];
  plan.flags = p[l4 + 13];
  return true;
}

/**
 * Writes segment `i` of the super-packet `p` (planned by planSegments) at the start of `out`, with
 * its headers fixed and its TCP checksum computed; returns the segment's length. `words` (see
 * sum16) speeds up the checksum when it views `out`'s buffer; `copy` moves the payload.
 */
export function writeSegment(p: Uint8Array, plan: SegmentPlan, i: number, out: Uint8Array, words?: Uint32Array, copy: CopyBytes = copyBySet): number {
  const { headerLength, segmentSize, l4, v6 } = plan;
  const start = headerLength + i * segmentSize;
  const size = Math.min(segmentSize, plan.payloadLength - i * segmentSize);
  const length = headerLength + size;
  for (let k = 0; k < headerLength; k++) out[k] = p[k];
  copy(out, headerLength, p, start, start + size);
  if (v6) {
    const payload = length - 40;
    out[4] = payload >>> 8;
    out[5] = payload & 0xff;
  } else {
    out[2] = length >>> 8;
    out[3] = length & 0xff;
    const id = (plan.firstId + i) & 0xffff;
    out[4] = id >>> 8;
    out[5] = id & 0xff;
    ipv4HeaderChecksum(out, l4);
  }
  writeU32(out, l4 + 4, (plan.firstSeq + i * segmentSize) >>> 0);
  let flags = plan.flags;
  if (i < plan.segments - 1) flags &= ~(TCP_FIN | TCP_PSH);
  if (i > 0) flags &= ~TCP_CWR;
  out[l4 + 13] = flags;
  out[l4 + 16] = 0;
  out[l4 + 17] = 0;
  const tcpLength = length - l4;
  const checksum = ~fold(pseudoHeaderSum(out, v6, PROTO_TCP, tcpLength) + sum16(out, l4, length, words)) & 0xffff;
  out[l4 + 16] = checksum >>> 8;
  out[l4 + 17] = checksum & 0xff;
  return length;
}

// --- coalescing TCP segments (GRO, write side) -------------------------------------------------------

/** Where the TCP header starts when `p` is a TCP packet that may be coalesced, else 0. */
function coalescableTcp(p: Uint8Array): number {
  const length = p.length;
  if (length < 40) return 0;
  const version = p[0] >> 4;
  let l4: number;
  if (version === 4) {
    // No IP options, not a fragment, the whole packet.
    if (p[0] !== 0x45 || p[9] !== PROTO_TCP || (p[6] & 0x3f) !== 0 || p[7] !== 0) return 0;
    if (((p[2] << 8) | p[3]) !== length) return 0;
    l4 = 20;
  } else if (version === 6) {
    if (p[6] !== PROTO_TCP || length < 60 || ((p[4] << 8) | p[5]) + 40 !== length) return 0;
    l4 = 40;
  } else {
    return 0;
  }
  const tcpHeader = (p[l4 + 12] >> 4) * 4;
  if (tcpHeader < 20 || l4 + tcpHeader >= length) return 0; // no payload: nothing to coalesce
  const flags = p[l4 + 13];
  if ((flags & TCP_ACK) === 0 || (flags & ~(TCP_ACK | TCP_PSH)) !== 0) return 0;
  return l4;
}

/** Same connection: IP version, addresses and ports (both TCP). */
function sameFlow(a: Uint8Array, b: Uint8Array, l4: number): boolean {
  if (a[0] >> 4 !== b[0] >> 4) return false;
  if (l4 === 20) {
    if (b[9] !== PROTO_TCP) return false;
    for (let k = 12; k < 24; k++) if (a[k] !== b[k]) return false; // addresses, then ports (l4 = 20)
    return (b[0] & 15) === 5;
  }
  if (b[6] !== PROTO_TCP) return false;
  for (let k = 8; k < 44; k++) if (a[k] !== b[k]) return false; // addresses, then ports (l4 = 40)
  return true;
}

/**
 * Whether segment `q` (of the flow of the item whose first packet is `first`) can follow: the same
 * IP header fields but lengths, IDs and checksum, the same TCP header but sequence number, PSH,
 * window and checksum.
 */
function sameHeaders(first: Uint8Array, q: Uint8Array, l4: number): boolean {
  if (l4 === 20) {
    if (first[1] !== q[1] || first[8] !== q[8] || (first[6] & 0x40) !== (q[6] & 0x40)) return false; // TOS, TTL, DF
  } else {
    if (first[0] !== q[0] || first[1] !== q[1] || first[2] !== q[2] || first[3] !== q[3] || first[7] !== q[7]) return false; // class, flow label, hop limit
  }
  const tcpHeader = (first[l4 + 12] >> 4) * 4;
  if ((q[l4 + 12] >> 4) * 4 !== tcpHeader) return false;
  for (let k = l4 + 8; k < l4 + 12; k++) if (first[k] !== q[k]) return false; // ACK number
  for (let k = l4 + 20; k < l4 + tcpHeader; k++) if (first[k] !== q[k]) return false; // options
  return true;
}

/**
 * The 32-bit view of the buffer the last verified packet lay in (packets of one batch normally
 * share one pool buffer), so that {@link segmentChecksumsValid} sums words, not bytes.
 */
let lastBuffer: ArrayBufferLike | undefined;
let lastWords: Uint32Array | undefined;

function wordsFor(buffer: ArrayBufferLike): Uint32Array {
  if (buffer !== lastBuffer || lastWords === undefined || lastWords.length !== buffer.byteLength >>> 2) {
    lastBuffer = buffer;
    lastWords = wordsOf(buffer);
  }
  return lastWords;
}

/**
 * Whether a coalescable TCP segment (TCP header at `l4`: 20 for IPv4 without options, 40 for IPv6
 * without extension headers) carries a correct IPv4 header checksum and a correct TCP checksum:
 * the ones'-complement sum over the header, or over the pseudo-header and the whole TCP segment
 * with its checksum field, folds to 0xffff.
 */
export function segmentChecksumsValid(p: Uint8Array, l4: number): boolean {
  const words = wordsFor(p.buffer);
  const v6 = l4 === 40;
  if (!v6 && fold(sum16(p, 0, 20)) !== 0xffff) return false;
  return fold(pseudoHeaderSum(p, v6, PROTO_TCP, p.length - l4) + sum16(p, l4, p.length, words)) === 0xffff;
}

/** At most this many packets of other flows are looked past when gathering one flow's segments. */
const LOOKAHEAD = 64;

/**
 * Writes `count` IP packets, coalescing TCP segments per flow (see the module comment). `buffer`
 * has room for a vnet header and MAX_COALESCED bytes; `write(buffer, length)` gets each packet
 * to write with its vnet header first (the same buffer again and again: it must be written at
 * once) and returns whether the kernel took it. `done` (a scratch array of at least `count`
 * entries) marks packets already gathered into an earlier write; `copy` moves the bytes. Returns
 * the number of packets the kernel took (counting each coalesced segment).
 */
export function coalesceAndWrite(
  packets: readonly Uint8Array[], count: number, buffer: Uint8Array, done: Uint8Array,
  write: (buffer: Uint8Array, length: number) => boolean, copy: CopyBytes = copyBySet,
): number {
  let written = 0;
  done.fill(0, 0, count);
  const H = VNET_HDR_SIZE;
  for (let i = 0; i < count; i++) {
    if (done[i] !== 0) continue;
    const p = packets[i];
    const length = p.length;
    const l4 = coalescableTcp(p);
    if (l4 === 0 || length > MAX_COALESCED) {
      if (length === 0 || length > buffer.length - H) continue; // counted as an error by the caller (written < count)
      writeVnetHeader(buffer, 0, 0, GSO_NONE, 0, 0, 0, 0);
      copy(buffer, H, p, 0, length);
      if (write(buffer, H + length)) written++;
      continue;
    }
    const tcpHeader = (p[l4 + 12] >> 4) * 4;
    const headerLength = l4 + tcpHeader;
    const segmentSize = length - headerLength;
    copy(buffer, H, p, 0, length);
    let total = length;
    let segments = 1;
    let nextSeq = (readU32(p, l4 + 4) + segmentSize) >>> 0;
    let open = (p[l4 + 13] & TCP_PSH) === 0;
    let pushed = !open;
    let skipped = 0;
    for (let j = i + 1; open && j < count && skipped < LOOKAHEAD; j++) {
      if (done[j] !== 0) continue;
      const q = packets[j];
      if (q.length < l4 + 20 || !sameFlow(p, q, l4)) {
        skipped++;
        continue;
      }
      // The next segment of this connection: it joins, or the item ends here (order within a flow).
      if (coalescableTcp(q) !== l4 || !sameHeaders(p, q, l4) || readU32(q, l4 + 4) !== nextSeq) break;
      const size = q.length - headerLength;
      if (size > segmentSize || total + size > MAX_COALESCED) break;
      // Neither a bad first segment nor a bad next one is merged (see the module comment).
      if (segments === 1 && !segmentChecksumsValid(p, l4)) break;
      if (!segmentChecksumsValid(q, l4)) break;
      copy(buffer, H + total, q, headerLength, q.length);
      total += size;
      segments++;
      nextSeq = (nextSeq + size) >>> 0;
      done[j] = 1;
      if ((q[l4 + 13] & TCP_PSH) !== 0) {
        pushed = true;
        open = false;
      }
      if (size < segmentSize) open = false;
    }
    if (segments === 1) {
      writeVnetHeader(buffer, 0, 0, GSO_NONE, 0, 0, 0, 0);
      if (write(buffer, H + length)) written++;
      continue;
    }
    const out = buffer.subarray(H, H + total);
    const v6 = l4 === 40;
    if (v6) {
      const payload = total - 40;
      out[4] = payload >>> 8;
      out[5] = payload & 0xff;
    } else {
      out[2] = total >>> 8;
      out[3] = total & 0xff;
      ipv4HeaderChecksum(out, 20);
    }
    if (pushed) out[l4 + 13] |= TCP_PSH;
    const partial = fold(pseudoHeaderSum(out, v6, PROTO_TCP, total - l4));
    out[l4 + 16] = partial >>> 8;
    out[l4 + 17] = partial & 0xff;
    writeVnetHeader(buffer, 0, VNET_F_NEEDS_CSUM, v6 ? GSO_TCPV6 : GSO_TCPV4, headerLength, segmentSize, l4, 16);
    if (write(buffer, H + total)) written += segments;
  }
  return written;
}

export { PROTO_TCP, PROTO_UDP };
