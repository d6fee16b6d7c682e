/**
 * The main thread's side of the doorbell (shared-ring.ts): it cannot block, so it raises the
 * waiting flag and parks an Atomics.waitAsync on the counter a worker advances: a reader ring's
 * WRITE_SEQ.
 *
 * The backstop. The runtimes sometimes never resolve an Atomics.waitAsync promise that a notify
 * woke: Bun 1.4.5 in 4 of 10 runs of the stress test of the crypto pool's task rings (since removed:
 * the main thread parked for good with completions waiting, the field's "queue depth frozen,
 * nothing logged" stall), Node 20 once in a clean-clone run of the TUN-ring stress test
 * (ring-stress.test.ts). So every such wait also ends after a short timeout and the caller looks
 * again; the protocol's own flag makes a spurious look harmless.
 */
import { waitAsync } from '../sys/threads.ts';
import { STATE, STATE_BOOTING, WRITE_SEQ } from './shared-ring.ts';

/**
 * The backstop of a reader ring's wait for items: an idle ring then costs 10 wake-ups a second,
 * a lost notify 100 ms.
 */
export const READER_WAIT_BACKSTOP_MS = 100;

/**
 * Waits until `words[seqIndex]` is no longer `seen`, raising `words[waitingIndex]` for the
 * producer's doorbell. Returns the wait's promise (it settles 'ok' or, after `backstopMs`,
 * 'timed-out'), or undefined when the counter had already moved (the flag is lowered again and
 * the caller goes on at once). `backstopMs` undefined waits without one: tests only, to show
 * what a lost wake-up does.
 */
export function awaitChange(words: Int32Array, seqIndex: number, waitingIndex: number, seen: number, backstopMs: number | undefined): Promise<string> | undefined {
  Atomics.store(words, waitingIndex, 1);
  const result = waitAsync(words, seqIndex, seen, backstopMs);
  if (result.async) return result.value;
  Atomics.store(words, waitingIndex, 0);
  return undefined;
}

/**
 * Waits while the ring's worker is still BOOTING (it notifies when it begins, see beginRunning),
 * at most `timeoutMs`: the wait's promise ('ok', 'not-equal' or 'timed-out'), or undefined when
 * the worker is past booting already.
 */
export function awaitBooted(header: Int32Array, timeoutMs: number): Promise<string> | undefined {
  const result = waitAsync(header, STATE, STATE_BOOTING, timeoutMs);
  return result.async ? result.value : undefined;
}

/** Settles the main thread's pending waits on a ring it closes (awaitChange, awaitBooted). */
export function settleWaits(header: Int32Array): void {
  Atomics.notify(header, WRITE_SEQ);
  Atomics.notify(header, STATE);
}
