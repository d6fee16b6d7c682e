/**
 * The shared memory between WorkerCryptoPool (crypto-pool.ts, main thread) and its worker threads
 * (crypto-worker.ts): no message is posted per task. Each worker has
 *
 *   control  CONTROL_INTS int32: SUBMITTED (main), COMPLETED (worker), WORKER_WAITING, STATE
 *   tasks    TASK_SLOTS descriptors of TASK_BYTES each, a ring indexed by sequence & (TASK_SLOTS - 1)
 *
 * and the pool has one `shared` int32 pair: DONE (every worker adds 1 per finished task) and
 * MAIN_WAITING (the main thread waits on DONE with Atomics.waitAsync; a worker notifies only
 * when it swaps that flag from 1 to 0, as in the TUN ring: tun/ring.ts).
 *
 * A descriptor holds the operation, the batch (by the id under which the pool registered its
 * shared memory with the worker, once, over a MessagePort the worker reads synchronously), the
 * slot count, the receiver index and MTU (seal), and the 32-byte key itself: keys travel as 32
 * bytes of shared memory, not as a cloned message per task. The worker writes the status back
 * and zeroes the key before it reports the task done. The main thread reuses a descriptor only
 * after its task was reported done, and writes it before publishing SUBMITTED, so each side sees
 * complete descriptors (Atomics are sequentially consistent).
 *
 * Why no wake-up is lost (both directions are the same Dekker pattern, and Atomics are SC):
 * - main -> worker: the main thread stores SUBMITTED, then loads WORKER_WAITING; the worker
 *   stores WORKER_WAITING = 1, then loads SUBMITTED (and Atomics.wait compares it again under
 *   the engine's lock). One of them sees the other's store: either the worker does not park,
 *   or the main thread notifies.
 * - worker -> main: a worker adds to DONE, then loads MAIN_WAITING; the main thread stores
 *   MAIN_WAITING = 1, then Atomics.waitAsync compares DONE with the count it last handled
 *   (under the engine's lock, V8 and JSC alike). Either waitAsync returns at once, or the worker
 *   sees the flag; it notifies only if its exchange took the flag from 1 to 0, so of several
 *   workers one notifies, and a stale flag costs a spurious wake-up only.
 * Counters wrap modulo 2^32 (| 0) and are only compared for equality or subtracted.
 * test/unit/handoff-stress.test.ts drives 10^6 tasks through this with random pauses on both
 * sides and proves it would see a lost wake-up; the pool's watchdog (dataplane/watchdog.ts)
 * is the second line of defence, for what an engine or a future change might still lose.
 */

export const CONTROL_INTS = 8;
/** Tasks submitted to this worker (sequence numbers modulo 2^32); the worker waits on it. */
export const SUBMITTED = 0;
/** Tasks this worker has finished. */
export const COMPLETED = 1;
/** 1 while the worker is (about to be) parked on SUBMITTED: the main thread then notifies. */
export const WORKER_WAITING = 2;
/** Worker life cycle, see the STATE_* values. */
export const STATE = 3;

export const STATE_BOOTING = 0;
/** The worker has loaded its crypto providers and takes tasks. */
export const STATE_READY = 1;
/** The main thread asks the worker to finish (after the tasks already submitted). */
export const STATE_STOP = 2;
/** The worker has ended its loop. */
export const STATE_STOPPED = 3;
/** The worker could not load its crypto providers. */
export const STATE_FAILED = 4;

export const SHARED_INTS = 2;
export const DONE = 0;
export const MAIN_WAITING = 1;

export const TASK_SLOTS = 256;
export const TASK_BYTES = 64;
/** int32 fields of a descriptor (index within the descriptor's 16 words). */
export const T_OP = 0;
export const T_BATCH = 1;
export const T_COUNT = 2;
export const T_RECEIVER = 3;
export const T_MTU = 4;
/** Written by the worker: 0 = done, -1 = failed (unknown batch, provider error). */
export const T_STATUS = 5;
/** Byte offset of the key within a descriptor. */
export const T_KEY = 32;

export const OP_SEAL = 1;
export const OP_OPEN = 2;

/** What a worker gets as workerData (plus, under Node, the tsx trampoline's fields). */
export interface CryptoWorkerConfig {
  control: SharedArrayBuffer;
  tasks: SharedArrayBuffer;
  shared: SharedArrayBuffer;
  /** The worker's end of the channel on which batches are registered (transferred). */
  port: import('node:worker_threads').MessagePort;
  /** Faults for tests only (never set by the daemon): see WorkerFaults. */
  faults?: WorkerFaults;
}

/**
 * Deliberate faults, for the tests that prove the stress test and the watchdog catch what they
 * claim to catch. Never set outside tests.
 */
export interface WorkerFaults {
  /** After this many tasks, stop taking tasks (park for good): a wedged worker. */
  stallAfter?: number;
  /** Before a task, with this probability, pause for up to 0.2 ms (the stress test's random delays). */
  pauseChance?: number;
}

/** A batch's shared memory, registered with every worker once. */
export interface BatchRegistration {
  id: number;
  data: SharedArrayBuffer;
  lengths: SharedArrayBuffer;
  counters: SharedArrayBuffer;
  slotSize: number;
}

/** The pool forgets a batch (it was garbage-collected on the main thread). */
export interface BatchRelease {
  release: number;
}
