/**
 * IP addresses and prefixes as bytes: 4 bytes for IPv4, 16 for IPv6.
 * Parsing is strict (no names, no zones, no IPv4 shorthand) and throws a descriptive error;
 * use these only on configuration input, never per packet.
 */
import { isIPv4, isIPv6 } from 'node:net';

export type IpFamily = 4 | 6;

export function parseIp(text: string): Uint8Array {
  if (isIPv4(text)) {
    const out = new Uint8Array(4);
    const parts = text.split('.');
    for (let i = 0; i < 4; i++) out[i] = Number(parts[i]);
    return out;
  }
  if (isIPv6(text) && !text.includes('%')) return parseIpv6(text);
  throw new Error(`not a numeric IP address: ${JSON.stringify(text)}`);
}

function parseIpv6(text: string): Uint8Array {
  const out = new Uint8Array(16);
  let head = text;
  let tail = '';
  const gap = text.indexOf('::');
  if (gap >= 0) { head = text.slice(0, gap); tail = text.slice(gap + 2); }
  const groups = (s: string): number[] => {
    if (s === '') return [];
    const words: number[] = [];
    for (const piece of s.split(':')) {
      if (piece.includes('.')) {
        const v4 = parseIp(piece);
        words.push((v4[0] << 8) | v4[1], (v4[2] << 8) | v4[3]);
      } else {
        words.push(parseInt(piece, 16));
      }
    }
    return words;
  };
  const h = groups(head);
  const t = groups(tail);
  for (let i = 0; i < h.length; i++) { out[2 * i] = h[i] >> 8; out[2 * i + 1] = h[i] & 0xff; }
  for (let i = 0; i < t.length; i++) {
    const w = 8 - t.length + i;
    out[2 * w] = t[i] >> 8; out[2 * w + 1] = t[i] & 0xff;
  }
  return out;
}

/** Formats 4 or 16 bytes as an address; IPv6 in RFC 5952 form (lowercase, longest zero run as ::). */
export function formatIp(bytes: Uint8Array): string {
  if (bytes.length === 4) return `${bytes[0]}.${bytes[1]}.${bytes[2]}.${bytes[3]}`;
  if (bytes.length !== 16) throw new Error(`an IP address has 4 or 16 bytes, got ${bytes.length}`);
  if (isIpv4Mapped(bytes)) return `::ffff:${bytes[12]}.${bytes[13]}.${bytes[14]}.${bytes[15]}`;
  const words: number[] = [];
  for (let i = 0; i < 16; i += 2) words.push((bytes[i] << 8) | bytes[i + 1]);
  let bestStart = -1, bestLen = 0;
  for (let i = 0; i < 8;) {
    if (words[i] !== 0) { i++; continue; }
    let j = i;
    while (j < 8 && words[j] === 0) j++;
    if (j - i > bestLen && j - i >= 2) { bestStart = i; bestLen = j - i; }
    i = j;
  }
  const hex = (ws: number[]) => ws.map((w) => w.toString(16)).join(':');
  if (bestStart < 0) return hex(words);
  return `${hex(words.slice(0, bestStart))}::${hex(words.slice(bestStart + bestLen))}`;
}

/** ::ffff:a.b.c.d — an IPv4 address seen through a dual-stack IPv6 socket. */
export function isIpv4Mapped(bytes: Uint8Array): boolean {
  if (bytes.length !== 16 || bytes[10] !== 0xff || bytes[11] !== 0xff) return false;
  for (let i = 0; i < 10; i++) if (bytes[i] !== 0) return false;
  return true;
}

export function familyOf(bytes: Uint8Array): IpFamily {
  if (bytes.length === 4) return 4;
  if (bytes.length === 16) return 6;
  throw new Error(`an IP address has 4 or 16 bytes, got ${bytes.length}`);
}

/** An IP prefix such as 10.0.0.0/8; `address` is masked to the prefix length. */
export interface Prefix {
  readonly address: Uint8Array;
  readonly bits: number;
}

export function parsePrefix(text: string): Prefix {
  const slash = text.indexOf('/');
  const address = parseIp(slash < 0 ? text : text.slice(0, slash));
  const max = address.length * 8;
  let bits = max;
  if (slash >= 0) {
    const b = text.slice(slash + 1);
    if (!/^\d{1,3}$/.test(b) || Number(b) > max) throw new Error(`bad prefix length in ${JSON.stringify(text)}`);
    bits = Number(b);
  }
  return { address: maskAddress(address, bits), bits };
}

export function formatPrefix(prefix: Prefix): string {
  return `${formatIp(prefix.address)}/${prefix.bits}`;
}

/** A copy of `address` with every bit after the first `bits` cleared. */
export function maskAddress(address: Uint8Array, bits: number): Uint8Array {
  if (!Number.isInteger(bits) || bits < 0 || bits > address.length * 8) {
    throw new RangeError(`prefix length ${bits} is out of range for a ${address.length * 8}-bit address`);
  }
  const out = Uint8Array.from(address);
  for (let i = 0; i < out.length; i++) {
    const keep = Math.max(0, Math.min(8, bits - i * 8));
    out[i] &= (0xff << (8 - keep)) & 0xff;
  }
  return out;
}
