/**
 * The crypto worker pool on piscina: one structured-cloned message per batch task. It was the
 * daemon's pool until the shared-memory task rings of WorkerCryptoPool (crypto-pool.ts) replaced
 * it by measurement; it stays selectable (ROAMGUARD_POOL=piscina) as the reference the bench
 * suite compares against (subject `node-piscina`) and as a fallback.
 */
import { availableParallelism } from 'node:os';
import { Piscina } from 'piscina';
import { CryptoPoolError, QUEUE_LIMIT, type CryptoPool } from './crypto-pool.ts';
import type { PacketBatch } from './packet-batch.ts';
import type { PiscinaCryptoTask } from './piscina-worker.ts';
import type { SelectOptions } from '../crypto/select.ts';

export class PiscinaCryptoPool implements CryptoPool {
  private readonly piscina: Piscina;
  readonly ready: Promise<void>;

  constructor(readonly threads: number = availableParallelism(), crypto: Pick<SelectOptions, 'only' | 'libsodium'> = {}) {
    if (!Number.isInteger(threads) || threads < 1) throw new Error(`crypto worker threads must be >= 1, got ${threads}`);
    this.piscina = new Piscina({
      // Compiled, the worker module loads as it is; from the sources, an entry that registers tsx first.
      filename: new URL(import.meta.url.endsWith('.js') ? './piscina-worker.js' : './piscina-worker-entry.mjs', import.meta.url).href,
      minThreads: threads,
      maxThreads: threads,
      idleTimeout: Infinity,
      // How each worker picks its providers (the main thread's settings; workers never read the environment).
      workerData: { ...crypto },
    });
    // One empty task per worker: each completes only once its worker has loaded the crypto
    // module. Terminating a worker while it loads a native addon (koffi) aborts the process, so
    // close() waits for this too.
    const empty = { data: new SharedArrayBuffer(0), lengths: new SharedArrayBuffer(0), counters: new SharedArrayBuffer(0), slotSize: 0, count: 0 };
    this.ready = Promise.all(Array.from({ length: threads }, () => this.piscina.run({ op: 'seal', key: new Uint8Array(32), receiverIndex: 0, mtu: 0, ...empty } satisfies PiscinaCryptoTask)))
      .then(() => {}, () => {});
  }

  private run(batch: PacketBatch, op: 'seal' | 'open', key: Uint8Array, receiverIndex: number, mtu: number): Promise<unknown> {
    // Bounded as the ring pool is (QUEUE_LIMIT per worker); piscina's own queue has no limit.
    if (this.piscina.queueSize >= QUEUE_LIMIT * this.threads) return Promise.reject(new CryptoPoolError('the piscina task queue is full', 'queue-full'));
    const task: PiscinaCryptoTask = {
      op, key, receiverIndex, mtu,
      data: batch.data.buffer as SharedArrayBuffer,
      lengths: batch.lengths.buffer as SharedArrayBuffer,
      counters: batch.counters.buffer as SharedArrayBuffer,
      slotSize: batch.slotSize,
      count: batch.count,
    };
    return this.piscina.run(task);
  }

  seal(batch: PacketBatch, key: Uint8Array, receiverIndex: number, mtu: number): Promise<unknown> {
    return this.run(batch, 'seal', key, receiverIndex, mtu);
  }

  open(batch: PacketBatch, key: Uint8Array): Promise<unknown> {
    return this.run(batch, 'open', key, 0, 0);
  }

  /** Tasks waiting for a worker. */
  get queueDepth(): number {
    return this.piscina.queueSize;
  }

  async close(): Promise<void> {
    await this.ready;
    await this.piscina.destroy();
  }
}
