/**
 * Where transport encryption runs: a pool of worker threads, or inline on the main thread. Both
 * seal/open whole batches in place; the device awaits the returned promises per peer in order, so
 * packets leave and arrive in the order they came.
 *
 * The worker pool passes no message per task: task descriptors (operation, batch id, count, key)
 * go through a ring in shared memory per worker, completions come back as a shared counter the
 * main thread waits on with Atomics.waitAsync (task-ring.ts), and a batch's shared memory is sent
 * to the workers once, the first time the batch is used. Against a piscina pool this removed
 * the structured clone of every task (its three SharedArrayBuffers and the key) and piscina's own
 * bookkeeping, about a fifth of the main thread's time under load.
 */
import { availableParallelism } from 'node:os';
import { MessageChannel, type MessagePort, type Worker } from 'node:worker_threads';
import { startWorker, waitAsync } from '../sys/threads.ts';
import type { Crypto } from '../crypto/primitives.ts';
import { openBatch, sealBatch } from './batch-crypto.ts';
import type { PacketBatch } from './packet-batch.ts';
import {
  COMPLETED, CONTROL_INTS, DONE, MAIN_WAITING, OP_OPEN, OP_SEAL, SHARED_INTS, STATE, STATE_BOOTING, STATE_FAILED, STATE_STOP,
  SUBMITTED, TASK_BYTES, TASK_SLOTS, T_BATCH, T_COUNT, T_KEY, T_MTU, T_OP, T_RECEIVER, T_STATUS,
  WORKER_WAITING, type BatchRegistration, type CryptoWorkerConfig,
} from './task-ring.ts';

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

/** How long close() waits for a worker to finish its queue and end before terminating it. */
const STOP_TIMEOUT_MS = 5000;

interface Pending {
  resolve: (count: number) => void;
  reject: (err: Error) => void;
  count: number;
}

interface Backlogged extends Pending {
  op: number;
  batch: PacketBatch;
  key: Uint8Array;
  receiverIndex: number;
  mtu: number;
}

/** One worker thread and its side of the shared memory. */
class CryptoWorker {
  readonly control = new Int32Array(new SharedArrayBuffer(CONTROL_INTS * 4));
  readonly tasks = new SharedArrayBuffer(TASK_SLOTS * TASK_BYTES);
  readonly tasks32 = new Int32Array(this.tasks);
  readonly tasks8 = new Uint8Array(this.tasks);
  readonly port: MessagePort;
  readonly thread: Worker;
  readonly exited: Promise<void>;
  /** Tasks written to the ring, and tasks whose completion was handled. */
  submitted = 0;
  seen = 0;
  /** Promises of the tasks in the ring, in ring order (a queue from `head`). */
  pending: Pending[] = [];
  head = 0;
  /** Tasks waiting for room in the ring. */
  backlog: Backlogged[] = [];
  alive = true;

  constructor(shared: SharedArrayBuffer) {
    const { port1, port2 } = new MessageChannel();
    this.port = port1;
    const config: CryptoWorkerConfig = { control: this.control.buffer as SharedArrayBuffer, tasks: this.tasks, shared, port: port2 };
    const entry = new URL(`./crypto-worker${import.meta.url.endsWith('.ts') ? '.ts' : '.js'}`, import.meta.url);
    this.thread = startWorker(entry, { ...config }, [port2]);
    this.exited = new Promise((resolve) => this.thread.once('exit', () => resolve()));
  }

  get outstanding(): number {
    return ((this.submitted - this.seen) | 0) + this.backlog.length;
  }
}

export class WorkerCryptoPool implements CryptoPool {
  readonly ready: Promise<void>;
  private readonly workers: CryptoWorker[] = [];
  private readonly shared = new Int32Array(new SharedArrayBuffer(SHARED_INTS * 4));
  private readonly ids = new WeakMap<PacketBatch, number>();
  private nextId = 0;
  private readonly forget = new FinalizationRegistry<number>((id) => {
    if (this.closed) return;
    for (const w of this.workers) if (w.alive) w.port.postMessage({ release: id });
  });
  private waiting = false;
  /** The DONE count as of the last wake-up. */
  private doneHandled = 0;
  private closed = false;

  constructor(readonly threads: number = availableParallelism()) {
    if (!Number.isInteger(threads) || threads < 1) throw new Error(`crypto worker threads must be >= 1, got ${threads}`);
    for (let i = 0; i < threads; i++) {
      const w = new CryptoWorker(this.shared.buffer as SharedArrayBuffer);
      this.workers.push(w);
      w.thread.on('error', (err) => this.lost(w, err instanceof Error ? err : new Error(String(err))));
      w.thread.on('exit', (code) => {
        if (!this.closed) this.lost(w, new Error(`crypto worker thread exited (code ${code})`));
      });
    }
    // Each worker reports READY once it has loaded its crypto providers. Terminating a worker in
    // the middle of loading a native addon (koffi) aborts the process, so close() waits for this.
    this.ready = Promise.all(this.workers.map((w) => this.started(w))).then(() => {});
  }

  private async started(w: CryptoWorker): Promise<void> {
    for (;;) {
      const state = Atomics.load(w.control, STATE);
      if (state !== STATE_BOOTING || !w.alive) return;
      const waiting = waitAsync(w.control, STATE, STATE_BOOTING, 1000);
      if (waiting.async) await waiting.value;
    }
    if (Atomics.load(w.control, STATE) === STATE_FAILED) this.lost(w, new Error('a crypto worker could not load its crypto providers'));
  }

  seal(batch: PacketBatch, key: Uint8Array, receiverIndex: number, mtu: number): Promise<unknown> {
    return this.submit(OP_SEAL, batch, key, receiverIndex, mtu);
  }

  open(batch: PacketBatch, key: Uint8Array): Promise<unknown> {
    return this.submit(OP_OPEN, batch, key, 0, 0);
  }

  /** Tasks handed to the workers and not finished yet. */
  get queueDepth(): number {
    let n = 0;
    for (const w of this.workers) n += w.outstanding;
    return n;
  }

  private submit(op: number, batch: PacketBatch, key: Uint8Array, receiverIndex: number, mtu: number): Promise<number> {
    let best: CryptoWorker | undefined;
    for (const w of this.workers) if (w.alive && (best === undefined || w.outstanding < best.outstanding)) best = w;
    if (best === undefined || this.closed) return Promise.reject(new Error(this.closed ? 'the crypto pool is closed' : 'no crypto worker is running'));
    const w = best;
    return new Promise<number>((resolve, reject) => {
      const count = batch.count;
      if (((w.submitted - w.seen) | 0) < TASK_SLOTS && w.backlog.length === 0) {
        this.write(w, op, batch, key, receiverIndex, mtu, { resolve, reject, count });
      } else {
        w.backlog.push({ op, batch, key: key.slice(), receiverIndex, mtu, resolve, reject, count });
      }
      this.wait();
    });
  }

  /** Writes a descriptor into the worker's ring and publishes it. */
  private write(w: CryptoWorker, op: number, batch: PacketBatch, key: Uint8Array, receiverIndex: number, mtu: number, pending: Pending): void {
    let id = this.ids.get(batch);
    if (id === undefined) {
      id = ++this.nextId;
      this.ids.set(batch, id);
      this.forget.register(batch, id);
      const registration: BatchRegistration = {
        id,
        data: batch.data.buffer as SharedArrayBuffer,
        lengths: batch.lengths.buffer as SharedArrayBuffer,
        counters: batch.counters.buffer as SharedArrayBuffer,
        slotSize: batch.slotSize,
      };
      for (const other of this.workers) if (other.alive) other.port.postMessage(registration);
    }
    const slot = w.submitted & (TASK_SLOTS - 1);
    const words = slot * (TASK_BYTES / 4);
    const t = w.tasks32;
    t[words + T_OP] = op;
    t[words + T_BATCH] = id;
    t[words + T_COUNT] = batch.count;
    t[words + T_RECEIVER] = receiverIndex | 0;
    t[words + T_MTU] = mtu;
    t[words + T_STATUS] = 0;
    w.tasks8.set(key.subarray(0, 32), slot * TASK_BYTES + T_KEY);
    w.pending.push(pending);
    w.submitted = (w.submitted + 1) | 0;
    Atomics.store(w.control, SUBMITTED, w.submitted);
    if (Atomics.load(w.control, WORKER_WAITING) !== 0) Atomics.notify(w.control, SUBMITTED);
  }

  /** Waits (asynchronously) for the next completion while tasks are outstanding. */
  private wait(): void {
    if (this.waiting) return;
    this.waiting = true;
    Atomics.store(this.shared, MAIN_WAITING, 1);
    // Returns at once when a task finished since the last wake-up took its count.
    const result = waitAsync(this.shared, DONE, this.doneHandled);
    if (result.async) {
      void result.value.then(this.wake);
    } else {
      Atomics.store(this.shared, MAIN_WAITING, 0);
      queueMicrotask(this.wake);
    }
  }

  private readonly wake = (): void => {
    this.waiting = false;
    // Read before collecting: a worker publishes COMPLETED before it adds to DONE.
    this.doneHandled = Atomics.load(this.shared, DONE);
    let outstanding = 0;
    for (const w of this.workers) {
      this.collect(w);
      outstanding += w.outstanding;
    }
    if (outstanding > 0 && !this.closed) this.wait();
  };

  /** Settles the promises of the worker's finished tasks, in order, and refills its ring from the backlog. */
  private collect(w: CryptoWorker): void {
    const completed = Atomics.load(w.control, COMPLETED);
    while (w.seen !== completed) {
      const slot = w.seen & (TASK_SLOTS - 1);
      const status = w.tasks32[slot * (TASK_BYTES / 4) + T_STATUS];
      const pending = w.pending[w.head];
      w.pending[w.head++] = undefined as unknown as Pending;
      w.seen = (w.seen + 1) | 0;
      if (status === 0) pending.resolve(pending.count);
      else pending.reject(new Error('crypto worker could not process the batch'));
    }
    if (w.head > 1024 && w.head * 2 > w.pending.length) {
      w.pending = w.pending.slice(w.head);
      w.head = 0;
    }
    while (w.backlog.length > 0 && ((w.submitted - w.seen) | 0) < TASK_SLOTS) {
      const b = w.backlog.shift()!;
      this.write(w, b.op, b.batch, b.key, b.receiverIndex, b.mtu, b);
    }
  }

  /** A worker died: its tasks fail, new ones go to the others. */
  private lost(w: CryptoWorker, err: Error): void {
    if (!w.alive) return;
    w.alive = false;
    for (let i = w.head; i < w.pending.length; i++) w.pending[i]?.reject(err);
    for (const b of w.backlog) b.reject(err);
    w.pending = [];
    w.head = 0;
    w.backlog = [];
    w.seen = w.submitted;
  }

  async close(): Promise<void> {
    if (this.closed) return;
    await this.ready;
    this.closed = true;
    for (const w of this.workers) {
      Atomics.store(w.control, STATE, STATE_STOP);
      Atomics.notify(w.control, SUBMITTED);
    }
    await Promise.all(this.workers.map(async (w) => {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const late = new Promise<'late'>((resolve) => { timer = setTimeout(() => resolve('late'), STOP_TIMEOUT_MS); });
      if ((await Promise.race([w.exited.then(() => 'exited' as const), late])) === 'late') await w.thread.terminate().catch(() => 0);
      clearTimeout(timer);
      this.collect(w);
      this.lost(w, new Error('the crypto pool is closed'));
      w.port.close();
    }));
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
