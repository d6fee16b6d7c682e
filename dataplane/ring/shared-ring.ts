/**
 * The single-producer, single-consumer ring protocol that every thread hand-off of the data plane
 * uses: the TUN readers and the UDP reader (worker -> main thread, tun/ring.ts, bind/udp-ring.ts).
 * Those modules keep only their payload layout; the header words below, the sequence arithmetic, the wake-ups and the
 * worker's life cycle are here, once. The main thread's asynchronous wait is in ring-wait.ts.
 *
 * A ring is a SharedArrayBuffer (or several) whose first RING_HEADER_INTS int32 words are the
 * header below; a ring adds its own words after them. The producer owns WRITE_SEQ, the consumer
 * READ_SEQ; `WRITE_SEQ - READ_SEQ` items are ready and the slot of sequence `s` is
 * `s & (slots - 1)`, so `slots` is a power of two.
 *
 * Sequence numbers count items modulo 2^32, stored in int32 words: they are only compared for
 * equality or subtracted with the result taken modulo 2^32 again (`| 0`), never compared with <
 * or >, so the wrap from 2^31 - 1 to -2^31 is no different from any other step.
 *
 * The doorbell. A consumer that is about to sleep raises its waiting flag first; the producer,
 * after publishing, notifies only when it swaps that flag from 1 to 0. That saves a notify per
 * item (in the runtimes a lock and, for Atomics.waitAsync, a task posted across threads), and no
 * wake-up is lost. Why (the Dekker pattern; Atomics are sequentially consistent):
 * - the producer stores the sequence number, then loads the flag;
 * - the consumer stores the flag = 1, then compares the sequence number with the one it last
 *   handled (Atomics.wait and Atomics.waitAsync compare again under the engine's lock, V8 and
 *   JSC alike, before they park).
 * One of them sees the other's store: either the consumer does not park, or the producer sees
 * the flag and notifies. Only the exchange that took the flag from 1 to 0 notifies, so of several
 * producers signalling one counter one notifies, and a stale flag
 * costs a spurious wake-up only. The consumer is the main thread, in Atomics.waitAsync
 * (ring-wait.ts).
 * test/unit/shared-ring.test.ts shows a skipped notify is caught;
 * ring-stress.test.ts drives 6 × 10^5 items through the real rings with random pauses on both sides.
 * The runtimes themselves drop a wake-up now and then, which is why the main thread's waits
 * (ring-wait.ts) have a backstop, and
 * the watchdog (dataplane/watchdog.ts) is the second line of defence for what an engine or a
 * future change might still lose.
 *
 * A producer waiting for room parks on READ_SEQ without a flag: a consumer releases slots once per
 * batch, so it notifies unconditionally (release), and the wait is bounded (ROOM_WAIT_MS).
 *
 * The worker's life cycle (STATE): the main thread creates the ring BOOTING; the worker moves it
 * to RUNNING when its loop begins (beginRunning). To stop it the main thread asks with
 * STOP_REQUESTED (requestStop), or marks a worker that has not begun STOPPED right away, so it
 * returns without touching anything; the worker answers STOPPED as its last act (finishWorker),
 * after which the main thread may close what the worker used.
 */

/** Sequence of the next slot the producer fills; a waiting consumer parks on it. */
export const WRITE_SEQ = 0;
/** Sequence of the next slot the consumer takes; a producer waiting for room parks on it. */
export const READ_SEQ = 1;
/** The worker's life cycle, see the STATE_* values. */
export const STATE = 2;
/** Set to 1 by the worker when it ended on an error (finishWorker); never reset. */
export const FAILED = 3;
/** errno of the failure that ended the worker (0 while it runs or after a normal stop). */
export const LAST_ERRNO = 4;
/** 1 while the consumer is (about to be) parked on WRITE_SEQ: the doorbell. */
export const CONSUMER_WAITING = 5;
/** Words of the header; a ring's own words follow. */
export const RING_HEADER_INTS = 6;

/** The worker has not begun its loop yet. */
export const STATE_BOOTING = 0;
export const STATE_RUNNING = 1;
/** The main thread asks the worker to end its loop. */
export const STATE_STOP_REQUESTED = 2;
/** The worker no longer touches the ring or anything it was given. */
export const STATE_STOPPED = 3;

/** The longest a producer waits for room before it looks at STATE again. */
export const ROOM_WAIT_MS = 1000;
/** Between looks at STATE while the main thread waits for a worker to stop. */
const STOP_POLL_MS = 20;

export function checkSlots(slots: number): void {
  if (slots <= 0 || (slots & (slots - 1)) !== 0) throw new RangeError(`slots must be a power of two, got ${slots}`);
}

// --- sequence numbers (modulo 2^32) ------------------------------------------------------------

export function seqAdd(seq: number, n: number): number {
  return (seq + n) | 0;
}

/** How far `later` is ahead of `earlier`, across the wrap-around (negative when behind). */
export function seqDistance(later: number, earlier: number): number {
  return (later - earlier) | 0;
}

export function ringFull(write: number, read: number, slots: number): boolean {
  return ((write - read) | 0) >= slots;
}

// --- the producer ----------------------------------------------------------------------------------

/**
 * Notifies the waiter on `words[seqIndex]` if it raised `words[waitingIndex]`, after the caller
 * changed the counter. The load first keeps the common case (nobody waits) free of a write.
 */
export function ringDoorbell(words: Int32Array, seqIndex: number, waitingIndex: number): void {
  if (Atomics.load(words, waitingIndex) !== 0 && Atomics.exchange(words, waitingIndex, 0) !== 0) {
    Atomics.notify(words, seqIndex);
  }
}

/** Makes the slots before `write` visible to the consumer, waking it if it waits. */
export function publish(header: Int32Array, write: number): void {
  Atomics.store(header, WRITE_SEQ, write);
  ringDoorbell(header, WRITE_SEQ, CONSUMER_WAITING);
}

/**
 * Makes the slots before `write` visible without waking the consumer: it takes them at its next
 * look (a later publish that rings, its own reason to look, or its wait's backstop).
 */
export function publishQuietly(header: Int32Array, write: number): void {
  Atomics.store(header, WRITE_SEQ, write);
}

/**
 * A producer thread's wait for a free slot (the caller has published what it filled): true once
 * the slot of `write` is free, false when a stop is requested meanwhile.
 */
export function awaitRoom(header: Int32Array, write: number, slots: number): boolean {
  for (;;) {
    if (Atomics.load(header, STATE) === STATE_STOP_REQUESTED) return false;
    const read = Atomics.load(header, READ_SEQ);
    if (!ringFull(write, read, slots)) return true;
    Atomics.wait(header, READ_SEQ, read, ROOM_WAIT_MS);
  }
}

// --- the consumer ----------------------------------------------------------------------------------

/** Hands the slots before `read` back to the producer, waking it if it waits for room. */
export function release(header: Int32Array, read: number): void {
  Atomics.store(header, READ_SEQ, read);
  Atomics.notify(header, READ_SEQ);
}

// --- the worker's life cycle -----------------------------------------------------------------------

/** The worker's first act: false when the main thread stopped the ring before it began. */
export function beginRunning(header: Int32Array): boolean {
  if (Atomics.compareExchange(header, STATE, STATE_BOOTING, STATE_RUNNING) !== STATE_BOOTING) return false;
  Atomics.notify(header, STATE); // the main thread may wait for the worker to be ready
  return true;
}

/**
 * The main thread asks the worker to stop and returns the state it was in. A worker that has not
 * begun is marked STOPPED (it will see that and return on its own: terminating a worker that is
 * still loading a native addon aborts the process); a running one gets STOP_REQUESTED and is
 * woken from any wait on the ring. A worker blocked elsewhere (poll) the caller wakes itself.
 */
export function requestStop(header: Int32Array): number {
  const previous = Atomics.compareExchange(header, STATE, STATE_BOOTING, STATE_STOPPED);
  if (previous === STATE_BOOTING) return previous;
  Atomics.compareExchange(header, STATE, STATE_RUNNING, STATE_STOP_REQUESTED);
  Atomics.notify(header, READ_SEQ); // a producer waiting for room
  Atomics.notify(header, WRITE_SEQ); // a consumer waiting for items
  return previous;
}

/** Blocks the main thread until the worker answered STOPPED, at most `timeoutMs`; whether it did. */
export function awaitStopped(header: Int32Array, timeoutMs: number): boolean {
  const deadline = performance.now() + timeoutMs;
  let state: number;
  while ((state = Atomics.load(header, STATE)) !== STATE_STOPPED) {
    if (performance.now() >= deadline) return false;
    Atomics.wait(header, STATE, state, STOP_POLL_MS);
  }
  return true;
}

/**
 * The worker's last act: record why it ended (a non-zero errno raises FAILED), mark the ring
 * STOPPED, and wake a main thread waiting for that (awaitStopped) or for items (the consumer).
 */
export function finishWorker(header: Int32Array, errno: number): void {
  if (errno !== 0) {
    Atomics.store(header, LAST_ERRNO, errno);
    Atomics.store(header, FAILED, 1);
  }
  Atomics.store(header, STATE, STATE_STOPPED);
  Atomics.notify(header, STATE);
  Atomics.notify(header, WRITE_SEQ);
}
