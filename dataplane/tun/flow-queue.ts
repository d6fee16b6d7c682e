/**
 * Which queue of a multi-queue TUN (IFF_MULTI_QUEUE) a packet is written through.
 *
 * The kernel picks the queue a host's packet is read from by its flow, and it learns from writes:
 * once packets of a flow were written through queue i, the flow's packets in the other direction
 * are read from queue i too (tun.c's automatic steering, with a flow table that forgets after a
 * few seconds). So a writer that sent every flow through one queue would gather every flow with
 * traffic both ways on one reader. Writing each flow through a queue picked from its addresses,
 * protocol and ports keeps the flows spread over the readers, and each flow on one reader in both
 * directions (its order kept). Any stable function of the flow serves; this one is cheap.
 */

/**
 * Protocols whose header starts with the ports: TCP (6) and UDP (17). A table, so that every
 * packet takes the same test: with `protocol === TCP || protocol === UDP`, V8 compiled the second
 * compare only as a bail-out while TCP alone flowed, and threw the optimized writer away at the
 * first ICMP packet after a transfer (seen with --trace-deopt on an idle ping).
 */
const HAS_PORTS = new Uint8Array(256);
HAS_PORTS[6] = 1;
HAS_PORTS[17] = 1;

/** Mixes one 32-bit word into the hash (multiply-rotate; good enough to spread flows). */
function mix(hash: number, word: number): number {
  const h = Math.imul(hash ^ word, 0x9e3779b1);
  return (h << 13) | (h >>> 19);
}

function word(bytes: Uint8Array, at: number): number {
  return (bytes[at] << 24) | (bytes[at + 1] << 16) | (bytes[at + 2] << 8) | bytes[at + 3];
}

/**
 * The queue, in 0..queues-1, for the IP packet at `offset` in `bytes` (`length` bytes). A packet
 * too short to name its flow, or of another protocol, goes by its addresses alone (or queue 0).
 */
export function flowQueue(bytes: Uint8Array, offset: number, length: number, queues: number): number {
  if (queues <= 1 || length < 20) return 0;
  const version = bytes[offset] >> 4;
  let hash = 0;
  let protocol: number;
  let l4: number;
  if (version === 4) {
    for (let at = offset + 12; at < offset + 20; at += 4) hash = mix(hash, word(bytes, at));
    protocol = bytes[offset + 9];
    // Only the first fragment (offset 0) carries the ports; later ones go by addresses.
    const fragment = ((bytes[offset + 6] & 0x1f) << 8) | bytes[offset + 7];
    const mayHavePorts = fragment === 0 && (bytes[offset + 6] & 0x20) === 0;
    l4 = mayHavePorts ? (bytes[offset] & 0x0f) * 4 : -1;
  } else if (version === 6 && length >= 40) {
    for (let at = offset + 8; at < offset + 40; at += 4) hash = mix(hash, word(bytes, at));
    protocol = bytes[offset + 6];
    l4 = 40;
  } else {
    return 0;
  }
  hash = mix(hash, protocol);
  if (HAS_PORTS[protocol] === 1 && l4 > 0 && length >= l4 + 4) hash = mix(hash, word(bytes, offset + l4));
  return (hash >>> 0) % queues;
}
