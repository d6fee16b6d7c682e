/**
 * The worker side of test/unit/replay.test.ts's thread test: for each of `windows` windows in the
 * shared buffer in turn, checks every counter of 0..count-1 against it, in an order of its own,
 * and counts in `accepted` (one int32 per window and counter, Atomics.add) each counter its window
 * accepted.
 */
import { workerData } from 'node:worker_threads';
import { REPLAY_WINDOW_BYTES, ReplayWindow } from '../../dataplane/session/replay.ts';

export interface ReplayWorkerConfig {
  buffer: SharedArrayBuffer;
  windows: number;
  accepted: SharedArrayBuffer;
  count: number;
  /** 0: ascending, as one stream arrives (both threads then race on the same counters); else the seed of a shuffle. */
  seed: number;
  /** Int32: the main thread sets [0] to 1 to start both workers at once; [1 + w] counts the workers that reached window w. */
  start: SharedArrayBuffer;
}

const config = workerData as ReplayWorkerConfig | undefined;
if (config && config.buffer instanceof SharedArrayBuffer) {
  const accepted = new Int32Array(config.accepted);
  const order = Array.from({ length: config.count }, (_, i) => i);
  let state = config.seed >>> 0;
  for (let i = order.length - 1; state !== 0 && i > 0; i--) {
    state = (state * 1664525 + 1013904223) >>> 0;
    const j = state % (i + 1);
    [order[i], order[j]] = [order[j], order[i]];
  }
  const start = new Int32Array(config.start);
  Atomics.wait(start, 0, 0);
  for (let w = 0; w < config.windows; w++) {
    // A spin barrier per window, so both threads begin each window together.
    Atomics.add(start, 1 + w, 1);
    while (Atomics.load(start, 1 + w) < 2) { /* the other thread is a few operations away */ }
    const window = new ReplayWindow(config.buffer, w * REPLAY_WINDOW_BYTES);
    const base = w * config.count;
    for (const counter of order) if (window.check(counter)) Atomics.add(accepted, base + counter, 1);
  }
}
