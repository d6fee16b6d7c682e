/**
 * A crypto worker thread of WorkerCryptoPool (crypto-pool.ts): seals whole PacketBatches
 * in place in shared memory, taking task descriptors from its ring (task-ring.ts) in order. It
 * picks its crypto provider the same way the main thread does, then never returns to its event
 * loop: it parks in Atomics.wait when it has nothing to do, and reads batch registrations from
 * its MessagePort synchronously (receiveMessageOnPort) when a task names a batch it does not know
 * yet. It loads only the AEAD provider (selectAead), chosen as the main thread chooses it.
 * Runs under Node and Bun alike (see sys/threads.ts for how it is started).
 */
import { receiveMessageOnPort, workerData, type MessagePort } from 'node:worker_threads';
import { selectAead, type SelectOptions } from '../crypto/select.ts';
import type { SlotAead } from '../crypto/primitives.ts';
import { sealBatch, type BatchView } from './batch-crypto.ts';
import {
  COMPLETED, WORKER_LOST_WAKEUPS, DONE, MAIN_WAITING, OP_SEAL, STATE_FAILED, SUBMITTED, TASK_BYTES,
  TASK_SLOTS, T_BATCH, T_COUNT, T_KEY, T_MTU, T_OP, T_RECEIVER, T_STATUS,
  type BatchRegistration, type BatchRelease, type CryptoWorkerConfig,
} from './task-ring.ts';
import { STATE, awaitPublished, beginRunning, finishWorker, markConsumed, ringDoorbell, seqAdd, stopRequested } from '../ring/shared-ring.ts';

export function runCryptoWorker(crypto: SlotAead, config: CryptoWorkerConfig): void {
  const control = new Int32Array(config.control);
  const shared = new Int32Array(config.shared);
  const tasks32 = new Int32Array(config.tasks);
  const tasks8 = new Uint8Array(config.tasks);
  const port = config.port as MessagePort;
  const keys: Uint8Array[] = [];
  for (let i = 0; i < TASK_SLOTS; i++) keys.push(tasks8.subarray(i * TASK_BYTES + T_KEY, i * TASK_BYTES + T_KEY + 32));
  const batches = new Map<number, BatchView>();
  const WORDS = TASK_BYTES / 4;
  const mask = TASK_SLOTS - 1;
  const faults = config.faults ?? {};
  let taken = 0;

  /** Applies every registration and release waiting on the port. */
  const drainPort = () => {
    for (;;) {
      const received = receiveMessageOnPort(port);
      if (received === undefined) return;
      const message = received.message as BatchRegistration | BatchRelease;
      if ('release' in message) {
        batches.delete(message.release);
      } else {
        batches.set(message.id, {
          data: new Uint8Array(message.data),
          lengths: new Int32Array(message.lengths),
          counters: new Float64Array(message.counters),
          slotSize: message.slotSize,
          count: 0,
        });
      }
    }
  };

  let next = Atomics.load(control, COMPLETED);
  if (!beginRunning(control)) return; // the pool closed while this worker loaded
  for (;;) {
    if (Atomics.load(control, SUBMITTED) === next) {
      if (stopRequested(control)) break; // the tasks submitted before the request are done
      drainPort(); // releases of collected batches, while idle
      if (awaitPublished(control, next)) Atomics.add(control, WORKER_LOST_WAKEUPS, 1);
      continue;
    }
    if (faults.stallAfter !== undefined && taken++ >= faults.stallAfter) {
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0); // wedged: nobody ever notifies this
    }
    if (faults.pauseChance !== undefined && Math.random() < faults.pauseChance) {
      // A spin, not a timed wait: the pause itself must not be another wake-up to lose.
      const until = performance.now() + Math.random() * 0.2;
      while (performance.now() < until);
    }
    const slot = next & mask;
    const w = slot * WORDS;
    let batch = batches.get(tasks32[w + T_BATCH]);
    if (batch === undefined) {
      drainPort(); // registered just before this task was submitted
      batch = batches.get(tasks32[w + T_BATCH]);
    }
    let status = -1;
    if (batch !== undefined) {
      const key = keys[slot];
      batch.count = tasks32[w + T_COUNT];
      try {
        if (tasks32[w + T_OP] === OP_SEAL) {
          sealBatch(crypto, key, tasks32[w + T_RECEIVER] >>> 0, tasks32[w + T_MTU], batch);
          status = 0;
        }
      } catch {
        status = -1;
      }
      key.fill(0);
    }
    tasks32[w + T_STATUS] = status;
    next = seqAdd(next, 1);
    // COMPLETED before DONE: the main thread reads DONE before it collects.
    markConsumed(control, next);
    Atomics.add(shared, DONE, 1);
    ringDoorbell(shared, DONE, MAIN_WAITING);
  }
  finishWorker(control, 0);
}

/** What the pool hands a worker: the rings, and how to pick the AEAD (the main thread's choice). */
export interface CryptoWorkerData extends CryptoWorkerConfig {
  crypto: Pick<SelectOptions, 'only' | 'libsodium'>;
}

const config = workerData as CryptoWorkerData | undefined;
if (config && config.control instanceof SharedArrayBuffer && config.tasks instanceof SharedArrayBuffer) {
  let crypto: SlotAead | undefined;
  try {
    crypto = await selectAead(config.crypto);
  } catch {
    const control = new Int32Array(config.control);
    Atomics.store(control, STATE, STATE_FAILED);
    Atomics.notify(control, STATE);
  }
  if (crypto) runCryptoWorker(crypto, config);
}
