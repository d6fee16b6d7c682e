/**
 * Micro-benchmark of the allowed-IPs hot path: longest-prefix lookups straight from packet headers.
 *
 *   node --import tsx bench/allowedips-micro.ts        (or: npx bun bench/allowedips-micro.ts)
 *
 * For tables of 1, 1000 and 100000 random prefixes it times lookupPacketDestination over a buffer
 * of prebuilt packet headers (half aimed inside inserted prefixes, half at random addresses) and
 * prints the best of several runs in lookups per second. Inputs come from a fixed seed so runs compare.
 */
import { AllowedIps } from '../dataplane/allowedips/allowedips.ts';
import { maskAddress, type Prefix } from '../dataplane/net/ip.ts';
import { prng } from '../test/helpers/prng.ts';

const TABLE_SIZES = [1, 1000, 100_000];
const PACKETS = 1 << 18;
const RUNS = 7;
const MIN_RUN_MS = 200;


interface Peer { readonly id: number }

interface Workload {
  readonly table: AllowedIps<Peer>;
  readonly packets: Uint8Array;
  readonly headerLength: number;
  readonly destinationAt: number;
}

function buildWorkload(tableSize: number, family: 4 | 6, seed: number): Workload {
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
  const packets = new Uint8Array(PACKETS * headerLength);
  for (let i = 0; i < PACKETS; i++) {
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
  return { table, packets, headerLength, destinationAt };
}

/** Returns [lookups per second, hit ratio] for the best of RUNS timed runs. */
function measure(work: Workload): [number, number] {
  const { table, packets, headerLength } = work;
  const end = packets.length;
  let best = 0;
  let hitRatio = 0;
  for (let run = 0; run < RUNS + 1; run++) {
    let lookups = 0;
    let hits = 0;
    const start = performance.now();
    let elapsed = 0;
    do {
      for (let at = 0; at < end; at += headerLength) {
        if (table.lookupPacketDestination(packets, at) !== undefined) hits++;
      }
      lookups += PACKETS;
      elapsed = performance.now() - start;
    } while (elapsed < MIN_RUN_MS);
    if (run > 0) best = Math.max(best, (lookups / elapsed) * 1000); // run 0 warms up the JIT
    hitRatio = hits / lookups;
  }
  return [best, hitRatio];
}

function format(rate: number): string {
  return rate >= 1e6 ? `${(rate / 1e6).toFixed(1)} M/s` : `${(rate / 1e3).toFixed(0)} k/s`;
}

const runtime = typeof (globalThis as { Bun?: unknown }).Bun !== 'undefined' ? 'bun' : `node ${process.version}`;
console.log(`allowed-IPs lookupPacketDestination, ${runtime}, best of ${RUNS} runs of >= ${MIN_RUN_MS} ms`);
for (const family of [4, 6] as const) {
  for (const size of TABLE_SIZES) {
    const work = buildWorkload(size, family, 0x5eed + size);
    const [rate, hitRatio] = measure(work);
    const label = `IPv${family} ${String(size).padStart(6)} prefixes`;
    console.log(`${label}: ${format(rate).padStart(10)}  (${(hitRatio * 100).toFixed(0)}% matched, ${work.table.nodeCount} nodes)`);
  }
}
