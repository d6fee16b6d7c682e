/**
 * The ring protocol every thread hand-off uses (dataplane/ring/shared-ring.ts, ring-wait.ts), on a
 * bare ring whose payload is one int32 per slot, under Node and Bun (`npx bun test`):
 *
 * - sequence numbers across the int32 wrap-around;
 * - the doorbell, step by step on one thread: the two orders in which the consumer's flag and the
 *   producer's publish can meet, neither losing the wake-up;
 * - real threads (shared-ring-worker.ts): a producer thread pushing items to the main thread, as
 *   the reader threads do, with a ring of 16 slots (so both sides often wait: for items and for
 *   room), starting just below
 *   2^31 so the sequence numbers wrap. The main thread's waits have no backstop: a lost wake-up
 *   stalls the test, and a stall of STALL_BOUND_MS fails it. The runtimes themselves drop a
 *   waitAsync wake-up now and then (ring-wait.ts): a stall after the producer took the flag (so it
 *   notified) is counted as such and waited out, and only RUNTIME_DROPS_ALLOWED of them pass.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import {
  CONSUMER_WAITING, READ_SEQ, STATE, STATE_BOOTING, STATE_RUNNING, STATE_STOPPED, STATE_STOP_REQUESTED, WRITE_SEQ, awaitStopped, beginRunning,
  finishWorker, publish, release, requestStop, ringFull, seqAdd, seqDistance, FAILED, LAST_ERRNO, RING_HEADER_INTS,
} from '../../dataplane/ring/shared-ring.ts';
import {
  READER_WAIT_BACKSTOP_MAX_MS, READER_WAIT_BACKSTOP_MS, WaitBackstop, awaitBooted, awaitChange, settleWaits,
} from '../../dataplane/ring/ring-wait.ts';
import { STALL_MS } from '../../dataplane/watchdog.ts';
import { startWorker } from '../../dataplane/sys/threads.ts';
import { TEST_HEADER_INTS, type RingWorkerConfig } from './shared-ring-worker.ts';

const STALL_BOUND_MS = 3000;
/** How long a ring thread may take to begin its loop (a boot, not a hand-off). */
const BOOT_BOUND_MS = 60_000;
/** Wake-ups the runtime may drop in one run (Bun 1.4.5 dropped at most one per 10^6 tasks). */
const RUNTIME_DROPS_ALLOWED = 2;
const SLOTS = 16;
const ITEMS = 200_000;
/** Just below 2^31: the first items' sequence numbers are positive, the later ones negative. */
const NEAR_WRAP = 2 ** 31 - 1000;

/** The promise's value, or 'stalled' when it has not settled within `ms`. */
async function within<T>(promise: Promise<T>, ms: number): Promise<T | 'stalled'> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<'stalled'>((resolve) => { timer = setTimeout(() => resolve('stalled'), ms); });
  try {
    return await Promise.race([promise, late]);
  } finally {
    clearTimeout(timer);
  }
}

function newRing(start: number): { buffer: SharedArrayBuffer; header: Int32Array; payload: Int32Array } {
  const buffer = new SharedArrayBuffer((TEST_HEADER_INTS + SLOTS) * 4);
  const header = new Int32Array(buffer, 0, TEST_HEADER_INTS);
  Atomics.store(header, WRITE_SEQ, start);
  Atomics.store(header, READ_SEQ, start);
  return { buffer, header, payload: new Int32Array(buffer, TEST_HEADER_INTS * 4, SLOTS) };
}

/**
 * Starts the other end of the ring in a thread and resolves once its loop runs: the stall bounds
 * below measure the hand-off, not the thread's boot (which, with the sources transpiled on load,
 * takes seconds on a machine that also runs the other runtime's tests).
 */
async function ringWorker(role: RingWorkerConfig['role'], buffer: SharedArrayBuffer) {
  const config: RingWorkerConfig = { role, buffer, slots: SLOTS, items: ITEMS };
  const worker = startWorker(new URL('./shared-ring-worker.ts', import.meta.url), { ...config });
  const exited = new Promise<number>((resolve) => worker.once('exit', resolve));
  const header = new Int32Array(buffer, 0, RING_HEADER_INTS);
  const deadline = performance.now() + BOOT_BOUND_MS;
  while (Atomics.load(header, STATE) === STATE_BOOTING) {
    assert.ok(performance.now() < deadline, `the ${role} thread did not begin within ${BOOT_BOUND_MS} ms`);
    await awaitBooted(header, 100);
  }
  return { worker, exited };
}

describe('sequence numbers', () => {
  test('wrap from 2^31 - 1 to -2^31 like any other step', () => {
    assert.equal(seqAdd(2 ** 31 - 1, 1), -(2 ** 31));
    assert.equal(seqAdd(-1, 1), 0);
    assert.equal(seqAdd(2 ** 31 - 3, 10), -(2 ** 31) + 7);
    assert.equal(seqDistance(-(2 ** 31) + 7, 2 ** 31 - 3), 10);
    assert.equal(seqDistance(2 ** 31 - 3, -(2 ** 31) + 7), -10, 'behind across the wrap');
    assert.equal(seqDistance(5, 5), 0);
  });

  test('an int32 word holds them: what is stored is what is compared', () => {
    const header = new Int32Array(new SharedArrayBuffer(TEST_HEADER_INTS * 4));
    const write = seqAdd(2 ** 31 - 1, 1);
    Atomics.store(header, WRITE_SEQ, write);
    assert.equal(Atomics.load(header, WRITE_SEQ), write);
  });

  test('full and free across the wrap', () => {
    const read = 2 ** 31 - 4;
    assert.equal(ringFull(seqAdd(read, 15), read, 16), false);
    assert.equal(ringFull(seqAdd(read, 16), read, 16), true);
    assert.equal(ringFull(read, read, 16), false);
    // the slot of a sequence number stays in the ring on both sides of the wrap
    assert.deepEqual([0, 1, 2, 3, 4, 5].map((k) => seqAdd(read, k) & 15), [12, 13, 14, 15, 0, 1]);
  });
});

describe('the doorbell', () => {
  test('a parked main thread is woken by the publish that follows', async () => {
    const { header } = newRing(7);
    const woken = awaitChange(header, WRITE_SEQ, CONSUMER_WAITING, 7, undefined);
    assert.ok(woken, 'nothing published: the main thread parks');
    assert.equal(Atomics.load(header, CONSUMER_WAITING), 1);
    publish(header, 8);
    assert.equal(Atomics.load(header, CONSUMER_WAITING), 0, 'the producer took the flag, so it notified');
    assert.equal(await within(woken, STALL_BOUND_MS), 'ok');
  });

  test('a publish between raising the flag and parking: the wait returns at once', () => {
    const { header } = newRing(-1);
    Atomics.store(header, CONSUMER_WAITING, 1); // the consumer's first step ...
    publish(header, 0); // ... then the producer publishes and takes the flag (nobody to notify yet) ...
    assert.equal(Atomics.load(header, CONSUMER_WAITING), 0);
    // ... then the consumer compares: it sees the new sequence number and does not park.
    assert.equal(awaitChange(header, WRITE_SEQ, CONSUMER_WAITING, -1, undefined), undefined);
    assert.equal(Atomics.load(header, CONSUMER_WAITING), 0, 'and lowers its flag again');
  });

  test('without a waiting consumer a publish leaves the flag alone', () => {
    const { header } = newRing(0);
    publish(header, 1);
    assert.equal(Atomics.load(header, WRITE_SEQ), 1);
    assert.equal(Atomics.load(header, CONSUMER_WAITING), 0);
  });

  test("a quiet ring's backstop doubles up to its cap; anything arriving brings it back", () => {
    const backstop = new WaitBackstop();
    assert.equal(backstop.next(5), READER_WAIT_BACKSTOP_MS, 'the first wait');
    const quiet = [1, 2, 3, 4, 5].map(() => backstop.next(5));
    assert.deepEqual(quiet, [200, 400, 400, 400, 400], 'nothing new since the last wait: twice as long, up to the cap');
    assert.equal(backstop.next(6), READER_WAIT_BACKSTOP_MS, 'something arrived');
    assert.equal(backstop.next(6), 2 * READER_WAIT_BACKSTOP_MS);
    // Items published without ringing wait at most for the backstop: never as long as a stall.
    assert.ok(READER_WAIT_BACKSTOP_MAX_MS <= STALL_MS / 2);
  });

  test('a backstop ends a wait nobody notifies', async () => {
    const { header } = newRing(0);
    const woken = awaitChange(header, WRITE_SEQ, CONSUMER_WAITING, 0, 20);
    assert.ok(woken);
    assert.equal(await within(woken, STALL_BOUND_MS), 'timed-out');
  });
});

describe('the worker life cycle', () => {
  test('a stop before the worker begins: it never runs', () => {
    const { header } = newRing(0);
    assert.equal(requestStop(header), STATE_BOOTING);
    assert.equal(Atomics.load(header, STATE), STATE_STOPPED);
    assert.equal(beginRunning(header), false);
  });

  test('a running worker is asked, answers, and says why it ended', () => {
    const { header } = newRing(0);
    assert.equal(beginRunning(header), true);
    assert.equal(requestStop(header), STATE_RUNNING);
    assert.equal(Atomics.load(header, STATE), STATE_STOP_REQUESTED);
    assert.equal(awaitStopped(header, 30), false, 'not answered yet');
    finishWorker(header, 19);
    assert.equal(awaitStopped(header, 30), true);
    assert.equal(Atomics.load(header, FAILED), 1);
    assert.equal(Atomics.load(header, LAST_ERRNO), 19);
  });
});

describe('real threads, across the wrap-around', () => {
  test(`a producer thread pushes ${ITEMS} items to the main thread, in order, none lost`, async () => {
    const { buffer, header, payload } = newRing(NEAR_WRAP);
    const { exited } = await ringWorker('producer', buffer);
    let read = NEAR_WRAP;
    let taken = 0;
    let outOfOrder = 0;
    let stalled = false;
    let runtimeDrops = 0;
    try {
      while (taken < ITEMS) {
        const write = Atomics.load(header, WRITE_SEQ);
        const count = seqDistance(write, read);
        for (let i = 0; i < count; i++) {
          if (payload[read & (SLOTS - 1)] !== taken) outOfOrder++;
          taken++;
          read = seqAdd(read, 1);
        }
        if (count > 0) {
          release(header, read);
          if (taken % 7 === 0) await new Promise((resolve) => setImmediate(resolve)); // let it fill the ring
          continue;
        }
        const woken = awaitChange(header, WRITE_SEQ, CONSUMER_WAITING, read, undefined);
        if (woken !== undefined && (await within(woken, STALL_BOUND_MS)) === 'stalled') {
          // The producer took the flag, so it notified: the runtime lost that wake-up. Look again.
          if (Atomics.load(header, CONSUMER_WAITING) === 0 && ++runtimeDrops <= RUNTIME_DROPS_ALLOWED) continue;
          stalled = true;
          break;
        }
      }
    } finally {
      requestStop(header);
      settleWaits(header);
    }
    await exited;
    assert.equal(stalled, false, `no wake-up for ${STALL_BOUND_MS} ms with ${taken} of ${ITEMS} items taken: a lost wake-up (${runtimeDrops} waited out)`);
    assert.equal(taken, ITEMS);
    assert.equal(outOfOrder, 0);
    assert.equal(seqDistance(read, NEAR_WRAP), ITEMS);
    assert.ok(read < 0, 'the sequence numbers wrapped');
  });

});
