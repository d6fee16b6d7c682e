/**
 * The worker side of test/unit/shared-index-map.test.ts's thread test: looks up random indices
 * from the test's range in the shared index map while the main thread inserts, deletes and grows
 * it, taking new buffers from its MessagePort as a data worker would. Every index the main thread
 * ever maps has one fixed (slot, generation) (expectedFor), so any answer that differs is a torn
 * or mixed read. Counts: wrong answers (must stay 0), answers found, lookups.
 */
import { receiveMessageOnPort, workerData, type MessagePort } from 'node:worker_threads';
import { IndexMapReader, type IndexedSlot } from '../../dataplane/session/shared-index-map.ts';

export interface MapWorkerConfig {
  buffer: SharedArrayBuffer;
  port: MessagePort;
  control: SharedArrayBuffer;
  indices: number;
  /**
   * Instead: look up only this index, which the main thread keeps switching between
   * ALTERNATES[0] and ALTERNATES[1]; any other answer (slot of one, generation of the other) is torn.
   */
  alternating?: number;
}

export const ALTERNATES: readonly IndexedSlot[] = [{ slot: 11, generation: 1 }, { slot: 22, generation: 2 }];

/** The one value the test ever maps index i to. */
export function expectedFor(index: number): IndexedSlot {
  return { slot: (index * 7 + 3) & 0xffff, generation: (index ^ 0x5a5a) + 1 };
}

/** The test's receiver indices: spread over the 32-bit range, like random ones. */
export function indexAt(i: number): number {
  return Math.imul(i + 1, 0x2545f491) >>> 0;
}

function run(config: MapWorkerConfig): void {
  const control = new Int32Array(config.control); // [stop, wrong, found, lookups]
  const reader = new IndexMapReader(config.buffer, () => (receiveMessageOnPort(config.port)?.message as SharedArrayBuffer | undefined));
  const out: IndexedSlot = { slot: 0, generation: 0 };
  let state = 12345;
  while (Atomics.load(control, 0) === 0) {
    state = (state * 1664525 + 1013904223) >>> 0;
    const index = config.alternating ?? indexAt(state % config.indices);
    const found = reader.lookup(index, out);
    if (found) {
      const right = config.alternating === undefined
        ? [expectedFor(index)]
        : ALTERNATES;
      if (!right.some((r) => r.slot === found.slot && r.generation === found.generation)) Atomics.add(control, 1, 1);
      Atomics.add(control, 2, 1);
    }
    Atomics.add(control, 3, 1);
  }
  config.port.close();
}

if (workerData && (workerData as Partial<MapWorkerConfig>).control) run(workerData as MapWorkerConfig);
