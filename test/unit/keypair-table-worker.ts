/**
 * The worker side of test/unit/keypair-table.test.ts's thread test, and the key pattern both
 * sides use. The worker keeps picking a keypair from the main thread's directory (a seqlocked
 * (slot, generation, seed) per entry), holds it with tryHold, checks both keys against the seed
 * before and after a short pause, and releases it, until told to stop. Counts: keys that did not
 * match (must stay 0), reads under a hold, refused holds.
 */
import { workerData } from 'node:worker_threads';
import { CHUNK_SLOTS, chunkViews, release, slotKey, tryHold } from '../../dataplane/session/keypair-table.ts';

export interface TableWorkerConfig {
  chunks: SharedArrayBuffer[];
  directory: SharedArrayBuffer;
  entries: number;
}

/** Directory entry: [seqlock version, slot, generation, seed]. */
export const ENTRY_INTS = 4;

/** The key `which` (0 send, 1 receive) of the keypair numbered `seed`: never all zeros. */
export function keyPattern(seed: number, which: 0 | 1): Uint8Array {
  const key = new Uint8Array(32);
  for (let i = 0; i < 32; i++) key[i] = ((seed * 31 + i * 7 + which * 101) % 255) + 1;
  return key;
}

function matches(view: Uint8Array, expected: Uint8Array): boolean {
  for (let i = 0; i < 32; i++) if (view[i] !== expected[i]) return false;
  return true;
}

function run(config: TableWorkerConfig): void {
  const chunks = config.chunks.map(chunkViews);
  const directory = new Int32Array(config.directory, 0, config.entries * ENTRY_INTS);
  const control = new Int32Array(config.directory, config.entries * ENTRY_INTS * 4, 4);
  const pause = new Int32Array(new SharedArrayBuffer(4));
  let state = 99991 ^ (Math.random() * 2 ** 31);
  const next = () => (state = (state * 1664525 + 1013904223) >>> 0);
  while (Atomics.load(control, 0) === 0) {
    const base = (next() % config.entries) * ENTRY_INTS;
    const version = Atomics.load(directory, base);
    if ((version & 1) !== 0) continue;
    const slot = Atomics.load(directory, base + 1);
    const generation = Atomics.load(directory, base + 2);
    const seed = Atomics.load(directory, base + 3);
    if (Atomics.load(directory, base) !== version) continue; // torn: try another
    const chunk = chunks[Math.floor(slot / CHUNK_SLOTS)];
    const index = slot % CHUNK_SLOTS;
    if (!tryHold(chunk, index, generation)) {
      Atomics.add(control, 3, 1);
      continue;
    }
    const send = keyPattern(seed, 0);
    const receive = keyPattern(seed, 1);
    let ok = matches(slotKey(chunk, index, 0), send) && matches(slotKey(chunk, index, 1), receive);
    if (next() % 8 === 0) Atomics.wait(pause, 0, 0, 0.05); // hold it a while: the main thread retires meanwhile
    ok &&= matches(slotKey(chunk, index, 0), send) && matches(slotKey(chunk, index, 1), receive);
    release(chunk, index);
    if (!ok) Atomics.add(control, 1, 1);
    Atomics.add(control, 2, 1);
  }
}

if (workerData && (workerData as Partial<TableWorkerConfig>).directory) run(workerData as TableWorkerConfig);
