/**
 * Who reads a TUN queue right now: its own thread (reader-worker.ts) or, while that one sleeps in
 * poll, the UDP reader, which just wrote a packet to the queue and reads the reply the kernel
 * queued during that write (reply-reader.ts). One word of the queue's ring header (QUEUE_READER).
 *
 * One reader at a time keeps a flow's packets in order (a packet read later is also sealed and
 * sent later) and the ring with one producer. The queue's thread holds the queue whenever it is
 * not in poll, so the UDP reader can take it only from a sleeping thread, never the work of a
 * busy one; it only tries, and never waits. The queue's thread, woken while the UDP reader holds
 * the queue, waits for it (a few reads and one send: microseconds), marking that it waits so the
 * UDP reader's release wakes it.
 */
import { QUEUE_READER } from './ring.ts';

/** Nobody reads the queue: its thread sleeps in poll (or is about to, or has not begun). */
const FREE = 0;
const QUEUE_THREAD = 1;
const HELPER = 2;
/** The helper reads, and the queue's thread waits for it to finish. */
const HELPER_AWAITED = 3;

/** The longest the queue's thread sleeps at a time while it waits for the helper (a lost wake-up costs no more). */
const AWAIT_HELPER_MS = 5;

/** The queue's thread takes the queue, waiting while the helper reads it. */
export function takeQueue(header: Int32Array): void {
  for (;;) {
    const was = Atomics.compareExchange(header, QUEUE_READER, FREE, QUEUE_THREAD);
    if (was === FREE) return;
    if (was === HELPER) Atomics.compareExchange(header, QUEUE_READER, HELPER, HELPER_AWAITED);
    Atomics.wait(header, QUEUE_READER, HELPER_AWAITED, AWAIT_HELPER_MS);
  }
}

/** The queue's thread gives the queue up before it sleeps in poll. */
export function leaveQueue(header: Int32Array): void {
  Atomics.store(header, QUEUE_READER, FREE);
}

/** The helper takes the queue if nobody reads it; whether it did. */
export function tryTakeQueueAsHelper(header: Int32Array): boolean {
  return Atomics.compareExchange(header, QUEUE_READER, FREE, HELPER) === FREE;
}

/** The helper gives the queue back, waking the queue's thread if it waits. */
export function leaveQueueAsHelper(header: Int32Array): void {
  if (Atomics.exchange(header, QUEUE_READER, FREE) === HELPER_AWAITED) Atomics.notify(header, QUEUE_READER);
}
