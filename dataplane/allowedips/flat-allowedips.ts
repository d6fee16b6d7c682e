/**
 * The allowed-IPs tries (allowedips.ts) flattened into one Int32Array in shared memory, for the
 * threads that route or check packets without the main thread (docs/data-workers.md, steps 2b
 * and 3). The main thread builds one with AllowedIps.flatten after each change and publishes it;
 * a published table never changes, so a reader needs no lock: it reads whichever version it was
 * handed. Peers are numbers here (whatever the publisher's `numberOf` gave them); -1 is none.
 *
 * Layout: a header (FLAT_HEADER_INTS words: the IPv4 root, the IPv6 root, the node count), then
 * the nodes, FLAT_NODE_INTS words each: the prefix as four big-endian words with their masks, the
 * branch word and shift, the peer, the two children (node numbers, -1 for none). The lookups walk
 * it exactly as AllowedIps walks its objects (test/unit/flat-allowedips.test.ts checks both give
 * the same answer for random tables and addresses).
 */

export const FLAT_ROOT4 = 0;
export const FLAT_ROOT6 = 1;
export const FLAT_NODES = 2;
export const FLAT_HEADER_INTS = 4;

export const F_W0 = 0;
export const F_M0 = 1;
export const F_W1 = 2;
export const F_M1 = 3;
export const F_W2 = 4;
export const F_M2 = 5;
export const F_W3 = 6;
export const F_M3 = 7;
export const F_BRANCH_WORD = 8;
export const F_BRANCH_SHIFT = 9;
export const F_PEER = 10;
export const F_CHILD0 = 11;
export const F_CHILD1 = 12;
export const FLAT_NODE_INTS = 13;

/** The IP header fields a lookup reads: version 4 (header at least 20 bytes, source at 12, destination at 16) or 6 (40, 8, 24). */
export const IPV4_MIN_HEADER = 20;
export const IPV4_SOURCE_OFFSET = 12;
export const IPV4_DESTINATION_OFFSET = 16;
export const IPV6_HEADER = 40;
export const IPV6_SOURCE_OFFSET = 8;
export const IPV6_DESTINATION_OFFSET = 24;

/** Reads four big-endian bytes as a signed 32-bit integer (the tries' word form). */
export function readWord(bytes: Uint8Array, at: number): number {
  return (bytes[at] << 24) | (bytes[at + 1] << 16) | (bytes[at + 2] << 8) | bytes[at + 3];
}

/** The peer number for the source address of the IP packet at `offset` (the inbound check), or -1. */
export function flatLookupSource(flat: Int32Array, packet: Uint8Array, offset: number): number {
  return lookupPacket(flat, packet, offset, IPV4_SOURCE_OFFSET, IPV6_SOURCE_OFFSET);
}

/** The peer number for the destination address of the IP packet at `offset` (routing outbound), or -1. */
export function flatLookupDestination(flat: Int32Array, packet: Uint8Array, offset: number): number {
  return lookupPacket(flat, packet, offset, IPV4_DESTINATION_OFFSET, IPV6_DESTINATION_OFFSET);
}

function lookupPacket(flat: Int32Array, packet: Uint8Array, offset: number, v4At: number, v6At: number): number {
  if (!(offset >= 0) || offset >= packet.length) return -1;
  const version = packet[offset] >>> 4;
  if (version === 4) {
    if (packet.length - offset < IPV4_MIN_HEADER) return -1;
    return flatLookup4(flat, readWord(packet, offset + v4At));
  }
  if (version === 6) {
    if (packet.length - offset < IPV6_HEADER) return -1;
    const at = offset + v6At;
    return flatLookup6(flat, readWord(packet, at), readWord(packet, at + 4), readWord(packet, at + 8), readWord(packet, at + 12));
  }
  return -1;
}

/** Longest-prefix match of an IPv4 address (one big-endian word): the peer number, or -1. */
export function flatLookup4(flat: Int32Array, a0: number): number {
  let node = flat[FLAT_ROOT4];
  let found = -1;
  while (node >= 0) {
    const w = FLAT_HEADER_INTS + node * FLAT_NODE_INTS;
    if (((a0 ^ flat[w + F_W0]) & flat[w + F_M0]) !== 0) break;
    const peer = flat[w + F_PEER];
    if (peer >= 0) found = peer;
    node = ((a0 >>> flat[w + F_BRANCH_SHIFT]) & 1) === 0 ? flat[w + F_CHILD0] : flat[w + F_CHILD1];
  }
  return found;
}

/** Longest-prefix match of an IPv6 address (four big-endian words): the peer number, or -1. */
export function flatLookup6(flat: Int32Array, a0: number, a1: number, a2: number, a3: number): number {
  let node = flat[FLAT_ROOT6];
  let found = -1;
  while (node >= 0) {
    const w = FLAT_HEADER_INTS + node * FLAT_NODE_INTS;
    if ((((a0 ^ flat[w + F_W0]) & flat[w + F_M0]) | ((a1 ^ flat[w + F_W1]) & flat[w + F_M1])
      | ((a2 ^ flat[w + F_W2]) & flat[w + F_M2]) | ((a3 ^ flat[w + F_W3]) & flat[w + F_M3])) !== 0) break;
    const peer = flat[w + F_PEER];
    if (peer >= 0) found = peer;
    const b = flat[w + F_BRANCH_WORD];
    const word = b === 0 ? a0 : b === 1 ? a1 : b === 2 ? a2 : a3;
    node = ((word >>> flat[w + F_BRANCH_SHIFT]) & 1) === 0 ? flat[w + F_CHILD0] : flat[w + F_CHILD1];
  }
  return found;
}
