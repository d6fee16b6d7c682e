/**
 * The allowed-IPs hot path: longest-prefix lookups straight from packet headers
 * (lookupPacketDestination) over tables of random prefixes. Half the destinations aim inside an
 * inserted prefix, half are random. Inputs come from a fixed seed so runs compare.
 */
import { AllowedIps } from '../../dataplane/allowedips/allowedips.ts';
import { maskAddress, type Prefix } from '../../dataplane/net/ip.ts';
import { prng } from '../../test/helpers/prng.ts';

/** Table sizes the issue asks for. */
export const TABLE_SIZES: readonly number[] = [1, 1000, 100_000];

interface Peer { readonly id: number }

export interface Workload {
  readonly family: 4 | 6;
  readonly table: AllowedIps<Peer>;
  /** `count` packet headers back to back. */
  readonly packets: Uint8Array;
  readonly count: number;
  readonly headerLength: number;
}

/** A table of `tableSize` random prefixes (of 1 000 peers) and `count` packet headers to look up. */
export function buildWorkload(tableSize: number, family: 4 | 6, seed: number, count = 1 << 18): Workload {
  const random = prng(seed);
  const int = (n: number) => Math.floor(random() * n);
  const byteLength = family === 4 ? 4 : 16;
  const maxBits = byteLength * 8;
  const minBits = family === 4 ? 8 : 16;
  const peers = Array.from({ length: 1000 }, (_, id): Peer => ({ id }));
  const table = new AllowedIps<Peer>();
  const prefixes: Prefix[] = [];
  while (table.size < tableSize) {
    const bits = minBits + int(maxBits - minBits + 1);
    const address = maskAddress(Uint8Array.from({ length: byteLength }, () => int(256)), bits);
    const prefix = { address, bits };
    table.insert(prefix, peers[int(peers.length)]);
    prefixes.push(prefix);
  }
  const headerLength = family === 4 ? 20 : 40;
  const destinationAt = family === 4 ? 16 : 24;
  const packets = new Uint8Array(count * headerLength);
  for (let i = 0; i < count; i++) {
    const at = i * headerLength;
    packets[at] = family === 4 ? 0x45 : 0x60;
    const destination = Uint8Array.from({ length: byteLength }, () => int(256));
    if (i % 2 === 0) {
      // Aim inside an inserted prefix: its bits, random host bits.
      const prefix = prefixes[int(prefixes.length)];
      for (let b = 0; b < prefix.bits; b++) {
        const mask = 0x80 >> (b & 7);
        destination[b >> 3] = (destination[b >> 3] & ~mask) | (prefix.address[b >> 3] & mask);
      }
    }
    packets.set(destination, at + destinationAt);
  }
  return { family, table, packets, count, headerLength };
}

export interface LookupFigure {
  lookupsPerSecond: number;
  /** Share of lookups that found a peer. */
  hitRatio: number;
}

/** Lookups per second over the workload, best of `runs` timed runs of at least `minRunMs` (after one warm-up run). */
export function measureLookups(work: Workload, runs: number, minRunMs: number): LookupFigure {
  const { table, packets, headerLength, count } = work;
  const end = packets.length;
  let best = 0;
  let hitRatio = 0;
  for (let run = 0; run < runs + 1; run++) {
    let lookups = 0;
    let hits = 0;
    const start = performance.now();
    let elapsed = 0;
    do {
      for (let at = 0; at < end; at += headerLength) {
        if (table.lookupPacketDestination(packets, at) !== undefined) hits++;
      }
      lookups += count;
      elapsed = performance.now() - start;
    } while (elapsed < minRunMs);
    if (run > 0) best = Math.max(best, (lookups / elapsed) * 1000); // run 0 warms up the JIT
    hitRatio = hits / lookups;
  }
  return { lookupsPerSecond: best, hitRatio };
}
