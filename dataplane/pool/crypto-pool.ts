/**
 * Where transport encryption runs: a pool of worker threads (piscina), or inline on the main
 * thread. Both seal/open whole batches in place; the device awaits the returned promises per
 * peer in order, so packets leave and arrive in the order they came.
 */
import { availableParallelism } from 'node:os';
import { Piscina } from 'piscina';
import type { Crypto } from '../crypto/primitives.ts';
import { openBatch, sealBatch } from './batch-crypto.ts';
import type { PacketBatch } from './packet-batch.ts';
import type { CryptoTask } from './crypto-worker.ts';

export interface CryptoPool {
  readonly threads: number;
  /** Settles once every worker has loaded (workers load their modules asynchronously). */
  readonly ready?: Promise<void>;
  seal(batch: PacketBatch, key: Uint8Array, receiverIndex: number, mtu: number): Promise<unknown>;
  open(batch: PacketBatch, key: Uint8Array): Promise<unknown>;
  close(): Promise<void>;
}

/** Runs the batch work on the calling thread (threads = 0). */
export class InlineCryptoPool implements CryptoPool {
  readonly threads = 0;
  private static readonly done = Promise.resolve();
  constructor(private readonly crypto: Crypto) {}
  seal(batch: PacketBatch, key: Uint8Array, receiverIndex: number, mtu: number): Promise<unknown> {
    sealBatch(this.crypto, key, receiverIndex, mtu, batch);
    return InlineCryptoPool.done;
  }
  open(batch: PacketBatch, key: Uint8Array): Promise<unknown> {
    openBatch(this.crypto, key, batch);
    return InlineCryptoPool.done;
  }
  async close(): Promise<void> {}
}

export class WorkerCryptoPool implements CryptoPool {
  private readonly piscina: Piscina;
  readonly ready: Promise<void>;

  constructor(readonly threads: number = availableParallelism()) {
    if (!Number.isInteger(threads) || threads < 1) throw new Error(`crypto worker threads must be >= 1, got ${threads}`);
    this.piscina = new Piscina({
      filename: new URL('./crypto-worker-entry.mjs', import.meta.url).href,
      minThreads: threads,
      maxThreads: threads,
      idleTimeout: Infinity,
    });
    // One empty task per worker: each runs only once its worker has loaded the crypto module.
    // Terminating a worker in the middle of loading a native addon (koffi) aborts the process,
    // so close() waits for this too.
    const empty = { data: new SharedArrayBuffer(0), lengths: new SharedArrayBuffer(0), counters: new SharedArrayBuffer(0), slotSize: 0, count: 0 };
    this.ready = Promise.all(Array.from({ length: threads }, () => this.piscina.run({ op: 'seal', key: new Uint8Array(32), receiverIndex: 0, mtu: 0, ...empty } satisfies CryptoTask)))
      .then(() => {}, () => {});
  }

  private run(batch: PacketBatch, op: 'seal' | 'open', key: Uint8Array, receiverIndex: number, mtu: number): Promise<unknown> {
    const task: CryptoTask = {
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

  get queueDepth(): number {
    return this.piscina.queueSize;
  }

  async close(): Promise<void> {
    await this.ready;
    await this.piscina.destroy();
  }
}

/**
 * Small batches on the main thread, large ones in the workers. A round trip to a worker costs
 * on the order of 100 µs (more when it has to wake up), while sealing one packet inline costs
 * 2-3 µs: for interactive traffic (a ping, a DNS query, TCP ACKs) the workers only add latency,
 * and for bulk transfers they add parallelism. Per-peer order is kept by the pipelines either way.
 */
export class SplitCryptoPool implements CryptoPool {
  readonly ready: Promise<void> | undefined;
  private readonly inline: InlineCryptoPool;

  constructor(crypto: Crypto, private readonly workers: CryptoPool, private readonly inlineBelow = SMALL_BATCH) {
    this.inline = new InlineCryptoPool(crypto);
    this.ready = workers.ready;
  }

  get threads(): number {
    return this.workers.threads;
  }

  seal(batch: PacketBatch, key: Uint8Array, receiverIndex: number, mtu: number): Promise<unknown> {
    return (batch.count < this.inlineBelow ? this.inline : this.workers).seal(batch, key, receiverIndex, mtu);
  }

  open(batch: PacketBatch, key: Uint8Array): Promise<unknown> {
    return (batch.count < this.inlineBelow ? this.inline : this.workers).open(batch, key);
  }

  close(): Promise<void> {
    return this.workers.close();
  }
}

/** Batches with fewer packets than this are sealed or opened on the main thread (SplitCryptoPool). */
export const SMALL_BATCH = 8;
