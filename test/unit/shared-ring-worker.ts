/**
 * The worker side of test/unit/shared-ring.test.ts: a thread that runs one end of a bare ring
 * (ring/shared-ring.ts) whose payload is one int32 per slot, the item's number: as the producer,
 * it pushes `items` numbers (the main thread consumes them and counts those out of order).
 */
import { workerData } from 'node:worker_threads';
import {
  RING_HEADER_INTS, WRITE_SEQ, awaitRoom, beginRunning, finishWorker, publish, seqAdd,
} from '../../dataplane/ring/shared-ring.ts';

export interface RingWorkerConfig {
  role: 'producer';
  buffer: SharedArrayBuffer;
  slots: number;
  items: number;
}

/** Header word that stays 0: the worker's random pauses wait on it. */
export const PAUSE = RING_HEADER_INTS;
export const TEST_HEADER_INTS = RING_HEADER_INTS + 1;

function run(config: RingWorkerConfig): void {
  const header = new Int32Array(config.buffer, 0, TEST_HEADER_INTS);
  const payload = new Int32Array(config.buffer, TEST_HEADER_INTS * 4, config.slots);
  const mask = config.slots - 1;
  let state = 12345;
  /** Now and then a pause of up to 0.2 ms, so that either side sometimes finds the other asleep. */
  const maybePause = () => {
    state = (state * 1664525 + 1013904223) >>> 0;
    if (state < 2 ** 32 / 100) Atomics.wait(header, PAUSE, 0, (state % 200) / 1000);
  };

  if (beginRunning(header)) {
    if (config.role === 'producer') {
      let write = Atomics.load(header, WRITE_SEQ);
      for (let i = 0; i < config.items; i++) {
        if (!awaitRoom(header, write, config.slots)) break;
        payload[write & mask] = i;
        write = seqAdd(write, 1);
        publish(header, write);
        maybePause();
      }
    }
    finishWorker(header, 0);
  }
}

const config = workerData as RingWorkerConfig | undefined;
if (config && config.buffer instanceof SharedArrayBuffer) run(config);
