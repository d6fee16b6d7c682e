/**
 * The worker side of test/unit/keypair-table.test.ts's send-nonce race: reserves nonces of one
 * slot, 1 to 3 at a time, until it has `reservations` ranges, and counts each nonce it got in
 * `taken` (one int32 per nonce, Atomics.add). Two of these race on the same slot.
 */
import { workerData } from 'node:worker_threads';
import { chunkViews, reserveSendNonces } from '../../dataplane/session/keypair-table.ts';
import { prng } from '../helpers/prng.ts';

export interface NonceWorkerConfig {
  chunk: SharedArrayBuffer;
  index: number;
  reservations: number;
  taken: SharedArrayBuffer;
  /** Int32: [0] set to 1 by the main thread starts both workers at once. */
  start: SharedArrayBuffer;
  seed: number;
}

const config = workerData as NonceWorkerConfig | undefined;
if (config && config.chunk instanceof SharedArrayBuffer) {
  const chunk = chunkViews(config.chunk);
  const taken = new Int32Array(config.taken);
  const random = prng(config.seed);
  Atomics.wait(new Int32Array(config.start), 0, 0);
  for (let r = 0; r < config.reservations; r++) {
    const count = 1 + Math.floor(random() * 3);
    const first = reserveSendNonces(chunk, config.index, count);
    for (let n = first; n < first + count && n < taken.length; n++) Atomics.add(taken, n, 1);
  }
}
