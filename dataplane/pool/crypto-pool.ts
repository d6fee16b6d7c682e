/**
 * Where outbound transport encryption runs: a pool of worker threads, or inline on the main
 * thread. Both seal whole batches in place; the device awaits the returned promises per peer in
 * order, so packets leave in the order they came. (Inbound messages are opened where they are
 * received: the UDP reader thread, device/receive.ts.)
 *
 * The worker pool passes no message per task: task descriptors (operation, batch id, count, key)
 * go through a ring in shared memory per worker, completions come back as a shared counter the
 * main thread waits on with Atomics.waitAsync (task-ring.ts), and a batch's shared memory is sent
 * to the workers once, the first time the batch is used. Against the piscina pool it replaced
 * (one structured-cloned message per task) this removed the clone of every task (its three
 * SharedArrayBuffers and the key) and piscina's own bookkeeping, about a fifth of the main
 * thread's time under load.
 */
import { availableParallelism } from 'node:os';
import { MessageChannel, type MessagePort, type Worker } from 'node:worker_threads';
import { startWorker } from '../sys/threads.ts';
import type { Crypto } from '../crypto/primitives.ts';
import type { SelectOptions } from '../crypto/select.ts';
import type { CryptoWorkerData } from './crypto-worker.ts';
import { sealBatch } from './batch-crypto.ts';
import type { PacketBatch } from './packet-batch.ts';
import {
  COMPLETED, CONTROL_INTS, DONE, MAIN_WAITING, OP_SEAL, SHARED_INTS, STATE_FAILED, WORKER_LOST_WAKEUPS,
  SUBMITTED, TASK_BYTES, TASK_SLOTS, T_BATCH, T_COUNT, T_KEY, T_MTU, T_OP, T_RECEIVER, T_STATUS,
  type BatchRegistration, type CryptoWorkerConfig, type WorkerFaults,
} from './task-ring.ts';
import { CONSUMER_WAITING, STATE, STATE_BOOTING, publish, requestStop, seqAdd, seqDistance } from '../ring/shared-ring.ts';
import { awaitBooted, awaitChange } from '../ring/ring-wait.ts';
import { StallWatch, WATCH_INTERVAL_MS, type Liveness, type StallHandler } from '../watchdog.ts';

export interface CryptoPool {
  readonly threads: number;
  /** Settles once every worker has loaded (workers load their modules asynchronously). */
  readonly ready?: Promise<void>;
  seal(batch: PacketBatch, key: Uint8Array, receiverIndex: number, mtu: number): Promise<unknown>;
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
  async close(): Promise<void> {}
}

/** A wait for completions also ends after this long (the backstop, see ring/ring-wait.ts). */
const WAIT_BACKSTOP_MS = 20;

/** How long close() waits for a worker to finish its queue and end before terminating it. */
const STOP_TIMEOUT_MS = 5000;
/**
 * Tasks one worker may hold, ring and backlog together (wireguard-go bounds each of its queues at
 * 1024 elements). Past it submissions are refused (CryptoPoolError 'queue-full'): a worker that
 * cannot keep up, or has stopped, must cost dropped packets, not unbounded memory.
 */
export const QUEUE_LIMIT = 1024;
/** More replacements than this within RESTART_WINDOW_MS: the pool gives up (onFatal). */
const MAX_RESTARTS = 5;
const RESTART_WINDOW_MS = 60_000;
/** A worker that has not loaded its crypto providers by then will not (onFatal). */
const BOOT_TIMEOUT_MS = 60_000;

/** Why the pool refused or failed a task: the drop reason the pipelines count it under. */
export class CryptoPoolError extends Error {
  constructor(message: string, readonly reason: 'queue-full' | 'crypto-worker-failed') {
    super(message);
  }
}

/** The drop reason for a rejected seal (anything that is not a CryptoPoolError is a worker failure). */
export function dropReasonOf(err: unknown): 'queue-full' | 'crypto-worker-failed' {
  return err instanceof CryptoPoolError ? err.reason : 'crypto-worker-failed';
}

export interface WorkerPoolOptions {
  /**
   * How each worker picks its AEAD provider, as the main thread picked its own (ROAMGUARD_CRYPTO,
   * ROAMGUARD_LIBSODIUM from dataplane/settings.ts): workers get it through workerData, they
   * never read the environment. Default: the measured order.
   */
  crypto?: Pick<SelectOptions, 'only' | 'libsodium'>;
  /** A stall was detected (once per episode; the device logs it). */
  onStall?: StallHandler;
  /** A worker died or was restarted; its in-flight tasks failed. */
  onWorkerLost?: (message: string) => void;
  /**
   * Workers keep dying (or one never starts): the pool cannot do its job. Default: the error is
   * thrown from a microtask, an uncaught exception that ends the process non-zero, so that its
   * supervisor restarts it rather than leave a data plane that answers `wg show` and forwards nothing.
   */
  onFatal?: (err: Error) => void;
  /** The stall watchdog (default on); tests of the bare ring protocol turn it off. */
  watchdog?: boolean;
  /** Per-worker task bound (default QUEUE_LIMIT). */
  queueLimit?: number;
  /** Test-only faults, by worker index, for the first generation of workers (see WorkerFaults). */
  faults?: readonly (WorkerFaults | undefined)[];
  /**
   * Test only: the Nth wake-up (counting from 1) that a worker's notify brings the parked main
   * thread is thrown away, exactly as if that notify had been lost. Proves that the stress test
   * and the watchdog see a lost wake-up.
   */
  loseWakeUp?: number;
  /** Test only: the first sequence number of every counter (e.g. just below 2^31, to cross the wrap-around). */
  startSequence?: number;
}

interface Pending {
  resolve: (count: number) => void;
  reject: (err: Error) => void;
  count: number;
}

interface Backlogged extends Pending {
  op: number;
  batch: PacketBatch;
  /** A copy of the key (the caller's key may be wiped before the task reaches the ring); zeroed once used. */
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
  /** Tasks this worker was given since it started (how the work spreads: workerTasks). */
  given = 0;
  /** Promises of the tasks in the ring, in ring order (a queue from `head`). */
  pending: Pending[] = [];
  head = 0;
  /** Tasks waiting for room in the ring (at most queueLimit - TASK_SLOTS). */
  backlog: Backlogged[] = [];
  /** Takes new tasks (false once it died, was retired or the pool closed). */
  alive = true;
  /** Its tasks were failed and it was replaced (or is being). */
  retired = false;
  /** Batches whose shared memory this worker has been sent. */
  readonly known = new WeakSet<PacketBatch>();
  /** Settles once the worker has loaded (or failed to). */
  started: Promise<void> = Promise.resolve();
  readonly watch: StallWatch;

  constructor(readonly index: number, shared: SharedArrayBuffer, faults: WorkerFaults | undefined, start = 0, crypto: WorkerPoolOptions['crypto'] = {}) {
    // The worker starts from COMPLETED: both sides begin at `start` (0 but in the wrap-around test).
    this.submitted = this.seen = start;
    Atomics.store(this.control, SUBMITTED, start);
    Atomics.store(this.control, COMPLETED, start);
    const { port1, port2 } = new MessageChannel();
    this.port = port1;
    const config: CryptoWorkerConfig = { control: this.control.buffer as SharedArrayBuffer, tasks: this.tasks, shared, port: port2, faults };
    const entry = new URL(`./crypto-worker${import.meta.url.endsWith('.ts') ? '.ts' : '.js'}`, import.meta.url);
    this.thread = startWorker(entry, { ...config, crypto: { ...crypto } } satisfies CryptoWorkerData, [port2]);
    this.exited = new Promise((resolve) => this.thread.once('exit', () => resolve()));
    this.watch = new StallWatch(`crypto worker ${index}`);
  }

  get inRing(): number {
    return seqDistance(this.submitted, this.seen);
  }

  get outstanding(): number {
    return this.inRing + this.backlog.length;
  }

  get booting(): boolean {
    return Atomics.load(this.control, STATE) === STATE_BOOTING;
  }
}

export class WorkerCryptoPool implements CryptoPool, Liveness {
  readonly ready: Promise<void>;
  /** Stalls the watchdog detected, worker replacements, and tasks failed because their worker was lost. */
  stalls = 0;
  restarts = 0;
  lostTasks = 0;
  onStall: StallHandler | undefined = undefined;
  private readonly workers: CryptoWorker[] = [];
  private readonly shared = new Int32Array(new SharedArrayBuffer(SHARED_INTS * 4));
  private readonly ids = new WeakMap<PacketBatch, number>();
  private nextId = 0;
  private readonly forget = new FinalizationRegistry<number>((id) => {
    if (this.closed) return;
    for (const w of this.workers) if (w.alive) w.port.postMessage({ release: id });
  });
  private waiting = false;
  /** Identifies the current wait; a wake-up of an abandoned one (see recoverCollection) is ignored. */
  private waitToken = 0;
  /** The DONE count as of the last wake-up. */
  private doneHandled = 0;
  private closed = false;
  private readonly queueLimit: number;
  private readonly restartTimes: number[] = [];
  private readonly watchdog: ReturnType<typeof setInterval> | undefined;
  private fatalError: Error | undefined;
  private wakeUps = 0;
  /** The main thread's waits that ended by their backstop with a notify already sent: wake-ups the runtime lost. */
  lostWakeUps = 0;

  /** The same, of the workers' waits for tasks (shared-ring.ts awaitPublished), counted by each worker. */
  get workerLostWakeUps(): number {
    let lost = 0;
    for (const w of this.workers) lost += Atomics.load(w.control, WORKER_LOST_WAKEUPS);
    return lost;
  }

  constructor(readonly threads: number = availableParallelism(), private readonly options: WorkerPoolOptions = {}) {
    if (!Number.isInteger(threads) || threads < 1) throw new Error(`crypto worker threads must be >= 1, got ${threads}`);
    this.queueLimit = Math.max(TASK_SLOTS, options.queueLimit ?? QUEUE_LIMIT);
    this.onStall = options.onStall;
    if (options.startSequence !== undefined) {
      Atomics.store(this.shared, DONE, options.startSequence | 0);
      this.doneHandled = options.startSequence | 0;
    }
    for (let i = 0; i < threads; i++) this.spawn(i, options.faults?.[i]);
    // Each worker reports READY once it has loaded its crypto providers. Terminating a worker in
    // the middle of loading a native addon (koffi) aborts the process, so close() waits for this.
    this.ready = Promise.all(this.workers.map((w) => w.started)).then(() => {});
    if (options.watchdog !== false) {
      this.watchdog = setInterval(this.watch, WATCH_INTERVAL_MS);
      this.watchdog.unref?.();
    }
  }

  private spawn(index: number, faults: WorkerFaults | undefined): CryptoWorker {
    const w = new CryptoWorker(index, this.shared.buffer as SharedArrayBuffer, faults, (this.options.startSequence ?? 0) | 0, this.options.crypto);
    this.workers[index] = w;
    w.thread.on('error', (err) => this.lost(w, err instanceof Error ? err : new Error(String(err))));
    w.thread.on('exit', (code) => {
      if (!this.closed) this.lost(w, new Error(`crypto worker thread exited (code ${code})`));
    });
    w.started = this.started(w);
    return w;
  }

  private async started(w: CryptoWorker): Promise<void> {
    const deadline = performance.now() + BOOT_TIMEOUT_MS;
    for (;;) {
      const state = Atomics.load(w.control, STATE);
      if (state !== STATE_BOOTING || !w.alive) break;
      if (performance.now() > deadline) return this.fatal(new Error(`crypto worker ${w.index} did not start within ${BOOT_TIMEOUT_MS} ms`));
      await awaitBooted(w.control, 1000);
    }
    if (Atomics.load(w.control, STATE) === STATE_FAILED) this.lost(w, new Error('a crypto worker could not load its crypto providers'));
    // Tasks may have queued in its ring while it loaded.
    else if (w.outstanding > 0) this.wait();
  }

  seal(batch: PacketBatch, key: Uint8Array, receiverIndex: number, mtu: number): Promise<unknown> {
    return this.submit(OP_SEAL, batch, key, receiverIndex, mtu);
  }

  /** Tasks handed to the workers and not finished yet. */
  get queueDepth(): number {
    let n = 0;
    for (const w of this.workers) n += w.outstanding;
    return n;
  }

  private submit(op: number, batch: PacketBatch, key: Uint8Array, receiverIndex: number, mtu: number): Promise<number> {
    // The least loaded worker that runs; one still loading only when no other runs.
    let best: CryptoWorker | undefined;
    let bestLoad = Infinity;
    for (const w of this.workers) {
      if (!w.alive) continue;
      const load = w.outstanding + (w.booting ? this.queueLimit : 0);
      if (load < bestLoad) { best = w; bestLoad = load; }
    }
    if (best === undefined || this.closed) {
      return Promise.reject(new CryptoPoolError(this.closed ? 'the crypto pool is closed' : 'no crypto worker is running', 'crypto-worker-failed'));
    }
    const w = best;
    if (w.outstanding >= this.queueLimit) return Promise.reject(new CryptoPoolError('every crypto worker queue is full', 'queue-full'));
    return new Promise<number>((resolve, reject) => {
      const count = batch.count;
      if (w.inRing < TASK_SLOTS && w.backlog.length === 0) {
        this.write(w, op, batch, key, receiverIndex, mtu, { resolve, reject, count });
      } else {
        w.backlog.push({ op, batch, key: key.slice(0, 32), receiverIndex, mtu, resolve, reject, count });
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
    }
    if (!w.known.has(batch)) {
      // Sent to each worker the first time it gets the batch (a replacement worker starts with none).
      w.known.add(batch);
      const registration: BatchRegistration = {
        id,
        data: batch.data.buffer as SharedArrayBuffer,
        lengths: batch.lengths.buffer as SharedArrayBuffer,
        counters: batch.counters.buffer as SharedArrayBuffer,
        slotSize: batch.slotSize,
      };
      w.port.postMessage(registration);
    }
    w.given++;
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
    w.submitted = seqAdd(w.submitted, 1);
    publish(w.control, w.submitted);
  }

  /** Waits (asynchronously) for the next completion while tasks are outstanding. */
  private wait(): void {
    if (this.waiting) return;
    this.waiting = true;
    const token = ++this.waitToken;
    // Returns at once when a task finished since the last wake-up took its count.
    const lose = this.options.loseWakeUp !== undefined;
    const woken = awaitChange(this.shared, DONE, MAIN_WAITING, this.doneHandled, lose ? undefined : WAIT_BACKSTOP_MS);
    if (woken === undefined) {
      queueMicrotask(() => { if (token === this.waitToken) this.wake(); });
      return;
    }
    void woken.then((outcome) => {
      if (++this.wakeUps === this.options.loseWakeUp) return; // test only: a lost notify
      if (token !== this.waitToken) return;
      if (outcome === 'timed-out') {
        if (Atomics.load(this.shared, DONE) === this.doneHandled) { this.waiting = false; this.wait(); return; }
        // A worker that swapped MAIN_WAITING to 0 has notified: the runtime dropped that wake-up.
        if (Atomics.load(this.shared, MAIN_WAITING) === 0) this.lostWakeUps++;
      }
      this.wake();
    });
  }

  private wake(): void {
    this.waiting = false;
    // Read before collecting: a worker publishes COMPLETED before it adds to DONE.
    this.doneHandled = Atomics.load(this.shared, DONE);
    let outstanding = 0;
    for (const w of this.workers) {
      this.collect(w);
      outstanding += w.outstanding;
    }
    if (outstanding > 0 && !this.closed) this.wait();
  }

  /** Settles the promises of the worker's finished tasks, in order, and refills its ring from the backlog. */
  private collect(w: CryptoWorker): void {
    if (w.retired) return;
    const completed = Atomics.load(w.control, COMPLETED);
    while (w.seen !== completed) {
      const slot = w.seen & (TASK_SLOTS - 1);
      const status = w.tasks32[slot * (TASK_BYTES / 4) + T_STATUS];
      const pending = w.pending[w.head];
      w.pending[w.head++] = undefined as unknown as Pending;
      w.seen = seqAdd(w.seen, 1);
      if (status === 0) pending.resolve(pending.count);
      else pending.reject(new CryptoPoolError('crypto worker could not process the batch', 'crypto-worker-failed'));
    }
    if (w.head > 1024 && w.head * 2 > w.pending.length) {
      w.pending = w.pending.slice(w.head);
      w.head = 0;
    }
    while (w.backlog.length > 0 && w.inRing < TASK_SLOTS) {
      const b = w.backlog.shift()!;
      this.write(w, b.op, b.batch, b.key, b.receiverIndex, b.mtu, b);
      b.key.fill(0);
    }
  }

  // --- the watchdog --------------------------------------------------------------------------------

  /**
   * Every WATCH_INTERVAL_MS: a worker that holds tasks and whose completions the main thread has
   * not taken for STALL_MS is stalled. Recovery, by what the shared memory shows:
   * - completions are there but were not collected (the main thread's wake-up was lost):
   *   abandon the wait and collect now;
   * - tasks are in the ring and the worker does not finish them: wake it (its wake-up was lost);
   *   if that did not help one STALL_MS later, it is wedged: terminate it, fail its tasks, start
   *   a new one.
   */
  private readonly watch = (): void => {
    if (this.closed) return;
    const now = performance.now();
    for (const w of this.workers) {
      if (!w.alive || w.booting) continue;
      const before = w.watch.stalls;
      const recover = w.watch.check(now, w.outstanding > 0, w.seen, () => this.stateOf(w), this.onStall);
      this.stalls += w.watch.stalls - before;
      if (!recover) continue;
      const completed = Atomics.load(w.control, COMPLETED);
      if (completed !== w.seen || (w.backlog.length > 0 && w.inRing < TASK_SLOTS)) {
        this.recoverCollection();
      } else if (w.watch.attempts <= 1) {
        Atomics.notify(w.control, SUBMITTED);
      } else {
        void this.restart(w, new Error(`crypto worker ${w.index} stopped taking tasks`));
      }
    }
  };

  /** The longest stall in progress (0 = none). */
  /** Per running worker, the tasks (batches) it was given since it started. */
  get workerTasks(): number[] {
    return this.workers.filter((w) => w.alive).map((w) => w.given);
  }

  get stalledMs(): number {
    const now = performance.now();
    let longest = 0;
    for (const w of this.workers) if (w.alive) longest = Math.max(longest, w.watch.stalledMs(now));
    return longest;
  }

  /** What a stall report shows of a worker: depths and sequence numbers, no keys. */
  private stateOf(w: CryptoWorker): Record<string, number | boolean> {
    return {
      submitted: w.submitted,
      collected: w.seen,
      completed: Atomics.load(w.control, COMPLETED),
      inRing: w.inRing,
      backlog: w.backlog.length,
      workerWaiting: Atomics.load(w.control, CONSUMER_WAITING) !== 0,
      done: Atomics.load(this.shared, DONE),
      doneHandled: this.doneHandled,
      mainWaiting: Atomics.load(this.shared, MAIN_WAITING) !== 0,
      waiting: this.waiting,
    };
  }

  /** The main thread's wait went astray: forget it and collect now (wake re-arms a new wait). */
  private recoverCollection(): void {
    this.waitToken++;
    this.wake();
  }

  // --- losing and replacing workers -------------------------------------------------------------------

  /** Fails every task of a worker that is gone (its thread no longer touches their batches). */
  private failTasks(w: CryptoWorker, err: Error): void {
    const failure = new CryptoPoolError(err.message, 'crypto-worker-failed');
    let n = 0;
    for (let i = w.head; i < w.pending.length; i++) {
      const p = w.pending[i];
      if (p) { p.reject(failure); n++; }
    }
    for (const b of w.backlog) {
      b.key.fill(0);
      b.reject(failure);
      n++;
    }
    w.pending = [];
    w.head = 0;
    w.backlog = [];
    w.seen = w.submitted;
    w.tasks8.fill(0); // the keys of the tasks it never finished
    this.lostTasks += n;
  }

  /** A worker died (error or exit): its tasks fail, a new worker takes its place. */
  private lost(w: CryptoWorker, err: Error): void {
    if (w.retired) return;
    w.retired = true;
    w.alive = false;
    this.failTasks(w, err);
    w.port.close();
    if (this.closed) return;
    this.options.onWorkerLost?.(`crypto worker ${w.index} lost: ${err.message}`);
    this.replace(w, err);
  }

  /** A wedged worker: terminated first, so that it cannot touch a batch after its task failed. */
  private async restart(w: CryptoWorker, err: Error): Promise<void> {
    if (w.retired) return;
    w.retired = true;
    w.alive = false;
    await w.thread.terminate().catch(() => 0);
    this.failTasks(w, err);
    w.port.close();
    if (this.closed) return;
    this.options.onWorkerLost?.(`crypto worker ${w.index} restarted: ${err.message}`);
    this.replace(w, err);
  }

  private replace(w: CryptoWorker, err: Error): void {
    const now = performance.now();
    while (this.restartTimes.length > 0 && now - this.restartTimes[0] > RESTART_WINDOW_MS) this.restartTimes.shift();
    if (this.restartTimes.length >= MAX_RESTARTS) {
      return this.fatal(new Error(`crypto workers keep failing (${MAX_RESTARTS} replacements within ${RESTART_WINDOW_MS / 1000} s; last: ${err.message})`));
    }
    this.restartTimes.push(now);
    this.restarts++;
    this.spawn(w.index, undefined);
  }

  private fatal(err: Error): void {
    if (this.fatalError) return;
    this.fatalError = err;
    const onFatal = this.options.onFatal ?? ((e: Error) => queueMicrotask(() => { throw e; }));
    onFatal(err);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    await this.ready;
    this.closed = true;
    if (this.watchdog) clearInterval(this.watchdog);
    // Replacements started meanwhile must have loaded before they may be terminated.
    await Promise.all(this.workers.map((w) => w.started));
    for (const w of this.workers) requestStop(w.control);
    await Promise.all(this.workers.map(async (w) => {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const late = new Promise<'late'>((resolve) => { timer = setTimeout(() => resolve('late'), STOP_TIMEOUT_MS); });
      if ((await Promise.race([w.exited.then(() => 'exited' as const), late])) === 'late') await w.thread.terminate().catch(() => 0);
      clearTimeout(timer);
      this.collect(w);
      w.alive = false;
      if (!w.retired) {
        w.retired = true;
        this.failTasks(w, new Error('the crypto pool is closed'));
      }
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

  close(): Promise<void> {
    return this.workers.close();
  }
}

/** Batches with fewer packets than this are sealed on the main thread (SplitCryptoPool). */
export const SMALL_BATCH = 8;
