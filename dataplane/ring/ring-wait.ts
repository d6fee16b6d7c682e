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

/** The backstop of a reader ring's wait for items while items keep coming: a lost notify costs 100 ms. */
export const READER_WAIT_BACKSTOP_MS = 100;

/**
 * The longest backstop, reached by a ring that stays quiet. Well below the watchdog's STALL_MS
 * (watchdog.ts): items a reader published without ringing (books of what it delivered or sent
 * itself) wait at most for the backstop, a timer that fires late on a busy thread included, and
 * one second of waiting would count as a stall.
 */
export const READER_WAIT_BACKSTOP_MAX_MS = 400;

/**
 * The backstop of one ring's successive waits. Each wait of a ring that brought nothing since the
 * last one gets twice the backstop (up to READER_WAIT_BACKSTOP_MAX_MS); the first wait after
 * anything arrived gets READER_WAIT_BACKSTOP_MS again. An idle daemon's three rings then wake its
 * main thread about 8 times a second instead of 30; under traffic nothing changes.
 */
export class WaitBackstop {
  private ms = READER_WAIT_BACKSTOP_MS;
  private armedAt: number | undefined;

  /**
   * The backstop for the next wait. `progress`: a count that moves whenever the ring brought
   * anything (its WRITE_SEQ, or a count of what was taken when items also come another way).
   */
  next(progress: number): number {
    this.ms = progress === this.armedAt ? Math.min(2 * this.ms, READER_WAIT_BACKSTOP_MAX_MS) : READER_WAIT_BACKSTOP_MS;
    this.armedAt = progress;
    return this.ms;
  }
}

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
