/**
 * The packet ring shared by the TUN reader worker (the only producer) and the main thread (the
 * only consumer): one SharedArrayBuffer holding a small header of 32-bit counters, the length of
 * each slot, and `slots` fixed-size packet slots.
 *
 * Sequence numbers count packets and wrap modulo 2^32 (Int32Array arithmetic); the slot of
 * sequence `s` is `s & (slots - 1)`, so `slots` is a power of two. The worker owns WRITE_SEQ, the
 * main thread owns READ_SEQ; `WRITE_SEQ - READ_SEQ` packets are ready. Slots are 64 KiB so that any
 * packet the kernel can hand over (MTU up to 65535) fits whole; only the touched part of a slot is
 * ever backed by memory, so the 16 MiB of 256 slots cost about 1 MiB (Node) to 3 MiB (Bun) of
 * resident memory at MTU 1500.
 */

export const HEADER_INTS = 8;
/** Sequence of the next slot the worker fills; the main thread waits on this index. */
export const WRITE_SEQ = 0;
/** Sequence of the next slot the main thread consumes; the worker waits on it when the ring is full. */
export const READ_SEQ = 1;
/** Worker life cycle, see the STATE_* values. */
export const STATE = 2;
/** Set to 1 by the worker when the device is gone (read/poll reported it); never reset. */
export const DEVICE_GONE = 3;
/** Failed reads other than EAGAIN/EINTR and "device gone" (worker increments). */
export const READ_ERRORS = 4;
/** errno of the failure that ended the reader (0 while it runs or after a normal stop). */
export const LAST_ERRNO = 5;
/**
 * 1 while the main thread is (about to be) parked in Atomics.waitAsync on WRITE_SEQ. The main thread
 * sets it before its waitAsync compares WRITE_SEQ; the worker, after publishing a packet, notifies
 * only when it swaps the flag from 1 to 0. This saves a futex-emulation notify per packet (a lock
 * and a cross-thread task post in the runtime) while no wake-up can be lost: either waitAsync sees
 * the new WRITE_SEQ, or the worker sees the flag.
 */
export const MAIN_WAITING = 6;

/** The worker has not started its loop yet. */
export const STATE_BOOTING = 0;
export const STATE_RUNNING = 1;
/** The main thread asks the worker to stop (and wakes it through the event fd). */
export const STATE_STOP_REQUESTED = 2;
/** The worker no longer touches the file descriptors. */
export const STATE_STOPPED = 3;

export const DEFAULT_SLOTS = 256;
export const SLOT_SIZE = 65536;

export interface RingLayout {
  slots: number;
  slotSize: number;
}

export interface RingViews {
  header: Int32Array;
  lengths: Int32Array;
  data: Uint8Array;
}

export function ringBytes(layout: RingLayout): number {
  return (HEADER_INTS + layout.slots) * 4 + layout.slots * layout.slotSize;
}

export function ringViews(buffer: SharedArrayBuffer, layout: RingLayout): RingViews {
  if (layout.slots <= 0 || (layout.slots & (layout.slots - 1)) !== 0) throw new RangeError(`slots must be a power of two, got ${layout.slots}`);
  const header = new Int32Array(buffer, 0, HEADER_INTS);
  const lengths = new Int32Array(buffer, HEADER_INTS * 4, layout.slots);
  const data = new Uint8Array(buffer, (HEADER_INTS + layout.slots) * 4, layout.slots * layout.slotSize);
  return { header, lengths, data };
}

/**
 * The reader thread's last act, shared by the TUN and UDP readers: record why it stopped (a
 * non-zero errno raises `failureFlag`, e.g. DEVICE_GONE), mark the ring STOPPED, and wake both
 * a main thread waiting in stopReader (STATE) and one waiting for packets (WRITE_SEQ).
 */
export function finishReader(header: Int32Array, errno: number, failureFlag: number): void {
  if (errno !== 0) {
    Atomics.store(header, LAST_ERRNO, errno);
    Atomics.store(header, failureFlag, 1);
  }
  Atomics.store(header, STATE, STATE_STOPPED);
  Atomics.notify(header, STATE);
  Atomics.notify(header, WRITE_SEQ);
}

/**
 * A main-thread wait for packets also ends after this long (sys/threads.ts,
 * lostWakeUpBackstop): an idle ring then costs 10 wake-ups a second, a lost notify 100 ms.
 */
export const RING_WAIT_BACKSTOP_MS = 100;
