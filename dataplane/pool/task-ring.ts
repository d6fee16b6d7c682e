/**
 * The shared memory between WorkerCryptoPool (crypto-pool.ts, main thread) and its worker threads
 * (crypto-worker.ts): no message is posted per task. Each worker has a ring (ring/shared-ring.ts,
 * which holds the protocol and why no wake-up is lost; here the main thread is the producer):
 *
 *   control  CONTROL_INTS int32: the ring header (SUBMITTED, COMPLETED, STATE, the doorbell)
 *   tasks    TASK_SLOTS descriptors of TASK_BYTES each, a ring indexed by sequence & (TASK_SLOTS - 1)
 *
 * and the pool has one `shared` int32 pair: DONE (every worker adds 1 per finished task) and
 * MAIN_WAITING, the doorbell of the main thread's wait on DONE (ring/ring-wait.ts). The main
 * thread never waits for room in a ring (it keeps a backlog): a worker records COMPLETED without
 * a notify and rings DONE's doorbell instead, and the main thread then collects every worker.
 *
 * A descriptor holds the operation, the batch (by the id under which the pool registered its
 * shared memory with the worker, once, over a MessagePort the worker reads synchronously), the
 * slot count, the receiver index and MTU (seal), and the 32-byte key itself: keys travel as 32
 * bytes of shared memory, not as a cloned message per task. The worker writes the status back
 * and zeroes the key before it reports the task done. The main thread reuses a descriptor only
 * after its task was reported done, and writes it before publishing SUBMITTED, so each side sees
 * complete descriptors (Atomics are sequentially consistent).
 */
import { RING_HEADER_INTS, READ_SEQ, STATE_STOPPED, WRITE_SEQ } from '../ring/shared-ring.ts';

/** Tasks submitted to this worker: the ring's WRITE_SEQ. */
export const SUBMITTED = WRITE_SEQ;
/** Tasks this worker has finished: the ring's READ_SEQ. */
export const COMPLETED = READ_SEQ;
/** Wake-ups of this worker the runtime lost (its wait's backstop found tasks and the doorbell rung). */
export const WORKER_LOST_WAKEUPS = RING_HEADER_INTS;
/** The ring header, then WORKER_LOST_WAKEUPS. */
export const CONTROL_INTS = RING_HEADER_INTS + 1;
/** The ring's STATE, past STOPPED: the worker could not load its crypto providers. */
export const STATE_FAILED = STATE_STOPPED + 1;

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

/** The one operation (inbound messages are opened in the UDP reader thread); a worker fails any other. */
export const OP_SEAL = 1;

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
