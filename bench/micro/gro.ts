/**
 * The TUN write path's GRO (dataplane/tun/offload.ts coalesceAndWrite) on its own: batches of
 * decrypted TCP segments of one flow, as the receive pipeline hands them to LinuxTun.write, are
 * coalesced into super-packets; the write callback does nothing, so what is timed is the header
 * checks, the checksum verification of every merged segment and the copy into the write buffer.
 * The segments lie in 2048-byte slots of one buffer, as the packet pool lays them out.
 *
 *   node --import tsx bench/micro/gro.ts [--segments N] [--mss M] [--ms T] [--runs R]
 *
 * Prints segments per second and the payload rate. Compare two builds of offload.ts by running
 * it on each (the figure depends on the machine; only the ratio means something).
 */
import {
  GSO_TCPV4, MAX_COALESCED, VNET_HDR_SIZE, coalesceAndWrite, newSegmentPlan, planSegments, wordsOf, writeSegment,
} from '../../dataplane/tun/offload.ts';
import { opsPerSecond, runtimeLabel } from './measure.ts';

function arg(name: string, fallback: number): number {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? Number(process.argv[i + 1]) : fallback;
}

const segments = arg('segments', 44);
const mss = arg('mss', 1448);
const SLOT = 2048;

/** `segments` in-order IPv4 TCP segments (timestamps option) of `mss` payload bytes each, valid checksums. */
function buildSegments(): Uint8Array[] {
  const header = 20 + 32;
  const big = new Uint8Array(header + segments * mss);
  big.set([0x45, 0, 0, 0, 0x12, 0x34, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2]);
  big.set([0x9c, 0x40, 0x14, 0x51, 0, 0, 0, 1, 0, 0, 3, 9, 0x80, 0x10, 0x01, 0xf5, 0, 0, 0, 0, 1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2], 20);
  for (let i = header; i < big.length; i++) big[i] = (i * 7) & 0xff;
  const plan = newSegmentPlan();
  const vnet = { flags: 0, gsoType: GSO_TCPV4, hdrLen: header, gsoSize: mss, csumStart: 20, csumOffset: 16 };
  if (!planSegments(big, big.length, vnet, plan)) throw new Error('cannot plan the segments');
  const pool = new Uint8Array(SLOT * segments);
  const words = wordsOf(pool.buffer);
  const out: Uint8Array[] = [];
  for (let i = 0; i < plan.segments; i++) {
    const slot = pool.subarray(i * SLOT, (i + 1) * SLOT);
    out.push(slot.subarray(0, writeSegment(big, plan, i, slot, words)));
  }
  return out;
}

const packets = buildSegments();
const buffer = new Uint8Array(VNET_HDR_SIZE + MAX_COALESCED);
const done = new Uint8Array(packets.length);
let writes = 0;
const write = (_b: Uint8Array, _length: number): boolean => {
  writes++;
  return true;
};
coalesceAndWrite(packets, packets.length, buffer, done, write);
const writesPerBatch = writes;
const batchesPerSecond = opsPerSecond(() => {
  if (coalesceAndWrite(packets, packets.length, buffer, done, write) !== packets.length) throw new Error('a segment was not taken');
}, 200, { measureMs: arg('ms', 1000), runs: arg('runs', 5) });
const perSecond = batchesPerSecond * packets.length;
console.log(JSON.stringify({
  runtime: runtimeLabel(),
  segmentsPerBatch: packets.length,
  mss,
  writesPerBatch,
  segmentsPerSecond: Math.round(perSecond),
  payloadGbitPerSecond: Number(((perSecond * mss * 8) / 1e9).toFixed(2)),
}));
