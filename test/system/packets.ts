/**
 * ICMP echo packets for tests: IPv4 + ICMP (type 8/0) and IPv6 + ICMPv6 (type 128/129), built
 * with correct checksums and parsed back. These are whole IP packets, the form that travels
 * inside the tunnel.
 *
 * Checksums are the Internet checksum (RFC 1071): the ones' complement of the ones' complement
 * sum of 16-bit big-endian words. The IPv4 header checksum covers the header; the ICMP checksum
 * covers the ICMP message; the ICMPv6 checksum also covers the IPv6 pseudo-header (RFC 8200 §8.1:
 * source, destination, upper-layer length as 32 bits, three zero bytes, next header 58).
 */
import { formatIp, parseIp } from '../../dataplane/net/ip.ts';

export const IPPROTO_ICMP = 1;
export const IPPROTO_ICMPV6 = 58;
export const ICMP_ECHO_REQUEST = 8;
export const ICMP_ECHO_REPLY = 0;
export const ICMPV6_ECHO_REQUEST = 128;
export const ICMPV6_ECHO_REPLY = 129;

export type EchoKind = 'request' | 'reply';

export interface EchoSpec {
  /** Source and destination addresses as text; both IPv4 or both IPv6. */
  src: string;
  dst: string;
  /** ICMP identifier and sequence number (16 bits each). */
  id: number;
  seq: number;
  /** Echo data. Default: empty. */
  payload?: Uint8Array;
  /** TTL / hop limit. Default 64. */
  ttl?: number;
}

export interface EchoPacket {
  family: 4 | 6;
  kind: EchoKind;
  src: string;
  dst: string;
  id: number;
  seq: number;
  ttl: number;
  payload: Uint8Array;
  /** Whether the IPv4 header checksum is right (always true for IPv6, which has none). */
  ipChecksumOk: boolean;
  /** Whether the ICMP / ICMPv6 checksum is right. */
  icmpChecksumOk: boolean;
}

/** Adds 16-bit big-endian words of `data[start, end)` to `sum` (an odd last byte is padded with 0). */
function sumWords(data: Uint8Array, start: number, end: number, sum = 0): number {
  let i = start;
  for (; i + 1 < end; i += 2) sum += (data[i] << 8) | data[i + 1];
  if (i < end) sum += data[i] << 8;
  return sum;
}

function fold(sum: number): number {
  while (sum > 0xffff) sum = (sum & 0xffff) + Math.floor(sum / 0x10000);
  return sum;
}

/**
 * The Internet checksum of `data[start, end)` plus an optional partial sum (e.g. of a
 * pseudo-header). Over data that contains a correct checksum field the result is 0.
 */
export function internetChecksum(data: Uint8Array, start = 0, end = data.length, initial = 0): number {
  return ~fold(sumWords(data, start, end, initial)) & 0xffff;
}

/** Partial (unfolded) sum of the IPv6 pseudo-header for an upper-layer message. */
function ipv6PseudoHeaderSum(src: Uint8Array, dst: Uint8Array, upperLength: number, nextHeader: number): number {
  let sum = sumWords(src, 0, 16) + sumWords(dst, 0, 16);
  sum += Math.floor(upperLength / 0x10000) + (upperLength & 0xffff);
  sum += nextHeader;
  return sum;
}

function addresses(spec: { src: string; dst: string }): { src: Uint8Array; dst: Uint8Array; family: 4 | 6 } {
  const src = parseIp(spec.src);
  const dst = parseIp(spec.dst);
  if (src.length !== dst.length) throw new Error(`mixed address families: ${spec.src} -> ${spec.dst}`);
  return { src, dst, family: src.length === 4 ? 4 : 6 };
}

function checkU16(name: string, value: number): void {
  if (!Number.isInteger(value) || value < 0 || value > 0xffff) throw new RangeError(`${name} must be 0..65535, got ${value}`);
}

/** Builds an ICMP (IPv4) or ICMPv6 (IPv6) echo request or reply as a whole IP packet. */
export function buildEcho(kind: EchoKind, spec: EchoSpec): Uint8Array {
  checkU16('id', spec.id);
  checkU16('seq', spec.seq);
  const payload = spec.payload ?? new Uint8Array(0);
  const ttl = spec.ttl ?? 64;
  const { src, dst, family } = addresses(spec);
  const icmpLength = 8 + payload.length;
  if (family === 4) {
    const total = 20 + icmpLength;
    if (total > 0xffff) throw new RangeError(`packet too large: ${total} bytes`);
    const p = new Uint8Array(total);
    const v = new DataView(p.buffer);
    p[0] = 0x45; // version 4, header length 5 words
    p[1] = 0; // DSCP/ECN
    v.setUint16(2, total);
    v.setUint16(4, (spec.id ^ spec.seq) & 0xffff); // identification: anything; unique enough
    v.setUint16(6, 0x4000); // don't fragment
    p[8] = ttl;
    p[9] = IPPROTO_ICMP;
    p.set(src, 12);
    p.set(dst, 16);
    v.setUint16(10, internetChecksum(p, 0, 20));
    p[20] = kind === 'request' ? ICMP_ECHO_REQUEST : ICMP_ECHO_REPLY;
    p[21] = 0; // code
    v.setUint16(24, spec.id);
    v.setUint16(26, spec.seq);
    p.set(payload, 28);
    v.setUint16(22, internetChecksum(p, 20, total));
    return p;
  }
  const total = 40 + icmpLength;
  if (icmpLength > 0xffff) throw new RangeError(`packet too large: ${total} bytes`);
  const p = new Uint8Array(total);
  const v = new DataView(p.buffer);
  v.setUint32(0, 0x60000000); // version 6, traffic class 0, flow label 0
  v.setUint16(4, icmpLength); // payload length
  p[6] = IPPROTO_ICMPV6;
  p[7] = ttl; // hop limit
  p.set(src, 8);
  p.set(dst, 24);
  p[40] = kind === 'request' ? ICMPV6_ECHO_REQUEST : ICMPV6_ECHO_REPLY;
  p[41] = 0;
  v.setUint16(44, spec.id);
  v.setUint16(46, spec.seq);
  p.set(payload, 48);
  v.setUint16(42, internetChecksum(p, 40, total, ipv6PseudoHeaderSum(src, dst, icmpLength, IPPROTO_ICMPV6)));
  return p;
}

export function buildEchoRequest(spec: EchoSpec): Uint8Array {
  return buildEcho('request', spec);
}

export function buildEchoReply(spec: EchoSpec): Uint8Array {
  return buildEcho('reply', spec);
}

/**
 * Parses an IP packet that carries an ICMP/ICMPv6 echo request or reply; returns undefined for
 * anything else (other protocols, other ICMP types, IPv4 fragments or options-bearing IPv6
 * extension headers, truncated packets). Checksums are verified and reported, not enforced.
 */
export function parseEcho(packet: Uint8Array): EchoPacket | undefined {
  if (packet.length < 1) return undefined;
  const v = new DataView(packet.buffer, packet.byteOffset, packet.byteLength);
  const version = packet[0] >> 4;
  if (version === 4) {
    if (packet.length < 20) return undefined;
    const ihl = (packet[0] & 0x0f) * 4;
    const total = v.getUint16(2);
    if (ihl < 20 || total < ihl + 8 || total > packet.length) return undefined;
    if (packet[9] !== IPPROTO_ICMP) return undefined;
    if ((v.getUint16(6) & 0x3fff) !== 0) return undefined; // fragment
    const type = packet[ihl];
    if ((type !== ICMP_ECHO_REQUEST && type !== ICMP_ECHO_REPLY) || packet[ihl + 1] !== 0) return undefined;
    return {
      family: 4,
      kind: type === ICMP_ECHO_REQUEST ? 'request' : 'reply',
      src: formatIp(packet.subarray(12, 16)),
      dst: formatIp(packet.subarray(16, 20)),
      id: v.getUint16(ihl + 4),
      seq: v.getUint16(ihl + 6),
      ttl: packet[8],
      payload: packet.slice(ihl + 8, total),
      ipChecksumOk: internetChecksum(packet, 0, ihl) === 0,
      icmpChecksumOk: internetChecksum(packet, ihl, total) === 0,
    };
  }
  if (version === 6) {
    if (packet.length < 48) return undefined;
    const length = v.getUint16(4);
    if (40 + length > packet.length || length < 8) return undefined;
    if (packet[6] !== IPPROTO_ICMPV6) return undefined;
    const type = packet[40];
    if ((type !== ICMPV6_ECHO_REQUEST && type !== ICMPV6_ECHO_REPLY) || packet[41] !== 0) return undefined;
    const src = packet.subarray(8, 24);
    const dst = packet.subarray(24, 40);
    return {
      family: 6,
      kind: type === ICMPV6_ECHO_REQUEST ? 'request' : 'reply',
      src: formatIp(src),
      dst: formatIp(dst),
      id: v.getUint16(44),
      seq: v.getUint16(46),
      ttl: packet[7],
      payload: packet.slice(48, 40 + length),
      ipChecksumOk: true,
      icmpChecksumOk: internetChecksum(packet, 40, 40 + length, ipv6PseudoHeaderSum(src, dst, length, IPPROTO_ICMPV6)) === 0,
    };
  }
  return undefined;
}

function sameBytes(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/**
 * Whether `packet` is a valid echo reply to `request` (an EchoSpec or a built request packet):
 * same family, addresses swapped, same identifier, sequence and payload, correct checksums.
 */
export function isEchoReplyTo(packet: Uint8Array, request: EchoSpec | Uint8Array): boolean {
  const reply = parseEcho(packet);
  if (!reply || reply.kind !== 'reply' || !reply.ipChecksumOk || !reply.icmpChecksumOk) return false;
  let spec: EchoSpec;
  if (request instanceof Uint8Array) {
    const parsed = parseEcho(request);
    if (!parsed || parsed.kind !== 'request') return false;
    spec = parsed;
  } else {
    spec = request;
  }
  const { src, dst } = addresses(spec);
  return (
    reply.family === (src.length === 4 ? 4 : 6) &&
    reply.src === formatIp(dst) &&
    reply.dst === formatIp(src) &&
    reply.id === spec.id &&
    reply.seq === spec.seq &&
    sameBytes(reply.payload, spec.payload ?? new Uint8Array(0))
  );
}

/**
 * The reply to an echo request (as a host would answer it), or undefined if `packet` is not a
 * valid echo request.
 */
export function answerEchoRequest(packet: Uint8Array, ttl = 64): Uint8Array | undefined {
  const req = parseEcho(packet);
  if (!req || req.kind !== 'request' || !req.ipChecksumOk || !req.icmpChecksumOk) return undefined;
  return buildEchoReply({ src: req.dst, dst: req.src, id: req.id, seq: req.seq, payload: req.payload, ttl });
}

export function toHex(bytes: Uint8Array): string {
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString('hex');
}

export function fromHex(hex: string): Uint8Array {
  if (!/^(?:[0-9a-fA-F]{2})*$/.test(hex)) throw new Error('bad hex string');
  return new Uint8Array(Buffer.from(hex, 'hex'));
}
