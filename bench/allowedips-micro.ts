/**
 * Micro-benchmark of the allowed-IPs hot path: longest-prefix lookups straight from packet headers.
 *
 *   node --import tsx bench/allowedips-micro.ts        (or: npx bun bench/allowedips-micro.ts)
 *
 * For tables of 1, 1000 and 100000 random prefixes it times lookupPacketDestination over a buffer
 * of prebuilt packet headers (half aimed inside inserted prefixes, half at random addresses) and
 * prints the best of several runs in lookups per second. Inputs come from a fixed seed so runs
 * compare. The workload lives in bench/micro/allowedips.ts, which `roamguard bench` also runs.
 */
import { TABLE_SIZES, buildWorkload, measureLookups } from './micro/allowedips.ts';
import { runtimeLabel } from './micro/measure.ts';

const RUNS = 7;
const MIN_RUN_MS = 200;

function format(rate: number): string {
  return rate >= 1e6 ? `${(rate / 1e6).toFixed(1)} M/s` : `${(rate / 1e3).toFixed(0)} k/s`;
}

console.log(`allowed-IPs lookupPacketDestination, ${runtimeLabel()}, best of ${RUNS} runs of >= ${MIN_RUN_MS} ms`);
for (const family of [4, 6] as const) {
  for (const size of TABLE_SIZES) {
    const work = buildWorkload(size, family, 0x5eed + size);
    const { lookupsPerSecond, hitRatio } = measureLookups(work, RUNS, MIN_RUN_MS);
    const label = `IPv${family} ${String(size).padStart(6)} prefixes`;
    console.log(`${label}: ${format(lookupsPerSecond).padStart(10)}  (${(hitRatio * 100).toFixed(0)}% matched, ${work.table.nodeCount} nodes)`);
  }
}
