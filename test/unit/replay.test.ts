import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { REJECT_AFTER_MESSAGES_SAFE, REPLAY_WINDOW_BYTES, REPLAY_WINDOW_SIZE, ReplayWindow } from '../../dataplane/session/replay.ts';
import { startWorker } from '../../dataplane/sys/threads.ts';
import { prng } from '../helpers/prng.ts';
import type { ReplayWorkerConfig } from './replay-worker.ts';

const W = 8128; // stated independently of the module so a changed constant fails the tests
const MAX = Number.MAX_SAFE_INTEGER;

test('exported constants', () => {
  assert.equal(REPLAY_WINDOW_SIZE, W);
  assert.equal(REJECT_AFTER_MESSAGES_SAFE, MAX);
});

/** Runs [counter, expected] steps on one fresh window, naming the failing step. */
function runScript(steps: Array<[counter: number, expected: boolean, why: string]>, limit?: number): void {
  const window = new ReplayWindow();
  steps.forEach(([counter, expected, why], i) => {
    const got = limit === undefined ? window.check(counter) : window.check(counter, limit);
    assert.equal(got, expected, `step ${i + 1}: check(${counter}) should be ${expected} (${why})`);
  });
}

describe('ReplayWindow scripted cases', () => {
  test('in order, duplicates and late packets inside the window', () => {
    runScript([
      [0, true, 'counter 0 is valid on a fresh window'],
      [0, false, 'duplicate'],
      [1, true, 'next'],
      [1, false, 'duplicate'],
      [9, true, 'skip ahead'],
      [8, true, 'late but unseen'],
      [7, true, 'late but unseen'],
      [7, false, 'duplicate of a late one'],
      [9, false, 'duplicate of the highest'],
      [2, true, 'gap filled'],
      [10, true, 'forward again'],
    ]);
  });

  test('exact window edge: W back is accepted, W + 1 back is rejected', () => {
    const high = W + 1;
    runScript([
      [0, true, 'first'],
      [1, true, 'second'],
      [high, true, 'forward by W + 1'],
      [high - 1, true, 'one back'],
      [high - 1, false, 'duplicate'],
      [1, false, 'exactly W back but already seen'],
      [2, true, 'W − 1 back, unseen'],
      [0, false, 'W + 1 back: too old (and seen)'],
      [high + 16, true, 'forward by 16'],
      [3, false, 'W + 14 back, never seen: too old'],
      [high + 16 - W, true, 'exactly W back, unseen'],
      [high + 16 - W, false, 'duplicate at the edge'],
      [high + 16 - W - 1, false, 'W + 1 back, unseen: too old'],
    ]);
  });

  test('the edge holds at every alignment of the highest counter', () => {
    // The ring is kept in 32-bit words; the edge must not depend on where in a word `highest` falls.
    for (const base of [W, W + 1, W + 31, W + 32, W + 33, 8192, 8192 + 63, 3 * 8192 + 17, 1_000_000_007, 2 ** 40 + 5]) {
      const window = new ReplayWindow();
      assert.equal(window.check(base), true, `highest ${base}`);
      assert.equal(window.check(base - W - 1), false, `highest ${base}: W + 1 back`);
      assert.equal(window.check(base - W), true, `highest ${base}: W back`);
      assert.equal(window.check(base - W), false, `highest ${base}: W back again`);
      assert.equal(window.check(base - W + 1), true, `highest ${base}: W − 1 back`);
    }
  });

  test('far jumps forward clear the whole ring', () => {
    const jump = 4 * (W + 1);
    runScript([
      [5, true, 'first'],
      [W + 17, true, 'forward'],
      [jump, true, 'far jump'],
      [jump - (W - 1), true, 'inside the new window'],
      [10, false, 'far behind'],
      [jump - W, true, 'exactly W back'],
      [jump - (W + 1), false, 'W + 1 back'],
      [jump - (W - 2), true, 'inside, unseen'],
      [jump + 1 - W, false, 'seen a moment ago'],
      [0, false, 'far behind'],
    ]);
  });

  test('bits of counters one ring (8192) apart do not leak into each other', () => {
    const window = new ReplayWindow();
    for (let c = 0; c < 8192; c++) assert.equal(window.check(c), true, `fill ${c}`);
    // Each of these shares a ring slot with an accepted counter 8192 lower.
    for (let c = 8192; c < 8192 + 100; c++) assert.equal(window.check(c), true, `next ring ${c}`);
    // Still inside the window and already seen:
    for (let c = 8191; c > 8191 + 100 - W; c -= 97) assert.equal(window.check(c), false, `seen ${c}`);
    // A partial jump of 1000 counters: the words it moves across are cleared, older ones are kept.
    assert.equal(window.check(9291), true);
    for (let c = 8292; c < 9291; c++) assert.equal(window.check(c), true, `after partial jump ${c}`);
    assert.equal(window.check(9291 - W), false, 'at the edge and seen during the fill');
    // A jump of more than a ring: everything in the new window is fresh.
    const far = 100_000;
    assert.equal(window.check(far), true);
    for (let c = far - W; c < far; c++) assert.equal(window.check(c), true, `after far jump ${c}`);
    for (let c = far - W; c <= far; c++) assert.equal(window.check(c), false, `replayed ${c}`);
  });

  test('bulk fills forward and backward', () => {
    let window = new ReplayWindow();
    for (let c = 1; c <= W; c++) assert.equal(window.check(c), true, `forward ${c}`);
    assert.equal(window.check(0), true, '0 is exactly W behind');
    assert.equal(window.check(0), false, 'and only once');

    window = new ReplayWindow();
    for (let c = 1; c <= W + 1; c++) assert.equal(window.check(c), true, `forward ${c}`);
    assert.equal(window.check(0), false, '0 is W + 1 behind');

    window = new ReplayWindow();
    for (let c = W + 1; c >= 1; c--) assert.equal(window.check(c), true, `backward ${c}`);
    assert.equal(window.check(0), false, '0 is W + 1 behind');
    for (let c = 1; c <= W + 1; c++) assert.equal(window.check(c), false, `replay ${c}`);

    window = new ReplayWindow();
    for (let c = W; c >= 0; c--) assert.equal(window.check(c), true, `backward ${c}`);
    for (let c = 0; c <= W; c++) assert.equal(window.check(c), false, `replay ${c}`);
  });

  test('counters at and above the default limit are rejected', () => {
    runScript([
      [MAX, false, 'the limit itself'],
      [MAX - 1, true, 'just below the limit'],
      [MAX, false, 'the limit itself'],
      [MAX - 1, false, 'duplicate'],
      [MAX - 2, true, 'late, unseen'],
      [MAX + 1, false, '2^53: not a safe integer'],
      [MAX + 3, false, 'above 2^53'],
      [2 ** 64, false, 'a 64-bit counter decoded into a number'],
      [MAX - 2, false, 'duplicate'],
      [MAX - 3, true, 'late, unseen'],
      [MAX - 1 - W, true, 'exactly W back from the highest'],
      [MAX - 2 - W, false, 'W + 1 back'],
      [0, false, 'far behind'],
    ]);
  });

  test('an explicit limit', () => {
    runScript([
      [100, false, 'at the limit'],
      [101, false, 'above the limit'],
      [99, true, 'below'],
      [99, false, 'duplicate'],
      [98, true, 'below, unseen'],
    ], 100);
    const window = new ReplayWindow();
    assert.equal(window.check(MAX - 1, 2 ** 64), true, 'a larger limit cannot lift the safe-integer bound');
    assert.equal(window.check(MAX, 2 ** 64), false);
    assert.equal(window.check(MAX + 1, 2 ** 64), false);
    assert.equal(window.check(0, 0), false, 'limit 0 rejects everything');
  });

  test('values that are not counters are rejected without changing state', () => {
    const window = new ReplayWindow();
    for (const bad of [-1, -0.5, 1.5, NaN, Infinity, -Infinity]) assert.equal(window.check(bad), false, String(bad));
    assert.equal(window.check(0), true, 'the window is still fresh');
    assert.equal(window.check(1), true);
  });

  test('reset forgets everything', () => {
    const window = new ReplayWindow();
    assert.equal(window.check(50_000), true);
    assert.equal(window.check(0), false);
    window.reset();
    assert.equal(window.check(0), true);
    assert.equal(window.check(50_000), true);
    assert.equal(window.check(50_000), false);
  });
});

// ---- randomized differential test ----


/** The rule written out directly: remember every accepted counter in a Set. */
class NaiveReplayModel {
  private readonly seen = new Set<number>();
  private highest = 0;
  check(counter: number, limit: number): boolean {
    if (!Number.isSafeInteger(counter) || counter < 0 || counter >= limit || counter >= MAX) return false;
    if (counter > this.highest) this.highest = counter;
    else if (this.highest - counter > W) return false;
    if (this.seen.has(counter)) return false;
    this.seen.add(counter);
    return true;
  }
  /** Counters more than W behind are rejected by the window rule anyway; drop them to bound memory. */
  prune(): void {
    for (const c of this.seen) if (this.highest - c > W) this.seen.delete(c);
  }
}

function runDifferential(seed: number): void {
  const random = prng(seed);
  const int = (n: number) => Math.floor(random() * n);
  const window = new ReplayWindow();
  const model = new NaiveReplayModel();
  let highest = 0;
  const recent: number[] = [];
  // Start somewhere random, sometimes near the top of the safe range so the limit is exercised.
  const origin = [0, int(2 ** 32), MAX - 200_000, 2 ** 31 - 5000][int(4)];
  highest = origin;
  const limit = random() < 0.3 ? origin + 60_000 + int(60_000) : MAX;
  for (let step = 0; step < 60_000; step++) {
    const r = random();
    let counter: number;
    if (r < 0.45) counter = highest + 1 + int(3); // ordinary traffic
    else if (r < 0.7) counter = highest - int(W + 200); // reordering, some beyond the window
    else if (r < 0.8) counter = recent.length > 0 ? recent[int(recent.length)] : highest; // replays
    else if (r < 0.88) counter = highest - W - 1 + int(3); // right at the edge
    else if (r < 0.95) counter = highest + int(300); // small jumps
    else if (r < 0.99) counter = highest + int(40_000); // jumps past the whole ring
    else counter = highest + 8192 * (1 + int(3)) + int(3) - 1; // jumps of about one or more rings
    if (counter < 0) counter = int(10);
    const expected = model.check(counter, limit);
    const got = window.check(counter, limit);
    if (got !== expected) {
      assert.fail(`step ${step}: check(${counter}) = ${got}, model says ${expected} (highest before: ${highest}, limit ${limit})`);
    }
    if (got) {
      if (counter > highest) highest = counter;
      recent.push(counter);
      if (recent.length > 64) recent.shift();
    }
    if (step % 5000 === 0) model.prune();
  }
}

describe('ReplayWindow randomized differential test', () => {
  test('agrees with a Set-based model', () => {
    const envSeed = process.env.REPLAY_SEED;
    const baseSeed = envSeed !== undefined ? Number(envSeed) : (Math.random() * 2 ** 32) >>> 0;
    for (let round = 0; round < 8; round++) {
      const seed = (baseSeed + round) >>> 0;
      try {
        runDifferential(seed);
      } catch (err) {
        const message = `replay differential test failed with seed ${seed} (rerun with REPLAY_SEED=${seed})`;
        console.error(message);
        throw new Error(`${message}: ${(err as Error).message}`, { cause: err });
      }
    }
  });
});

describe('ReplayWindow shared between threads', () => {
  /**
   * Two threads check the same counters against one window, both in ascending order (racing on
   * each counter) or each in an order of its own, as the main thread and a receiving thread may. Every counter is inside the window whatever the order
   * (fewer than REPLAY_WINDOW_SIZE of them), so each must be accepted exactly once in all. Without
   * the lock, two threads that read a ring word before either writes it both accept a counter, and
   * a word zeroed as the window moves can lose a bit the other thread just set.
   */
  test('each counter is accepted exactly once, whichever thread sees it first', { timeout: 120_000 }, async () => {
    const count = 8000;
    const windows = 40;
    const entry = new URL('./replay-worker.ts', import.meta.url);
    for (const [how, seeds] of [['both ascending', [0, 0]], ['each its own order', [7919, 104729]]] as const) {
      const buffer = new SharedArrayBuffer(windows * REPLAY_WINDOW_BYTES);
      const accepted = new SharedArrayBuffer(4 * windows * count);
      const start = new SharedArrayBuffer(4 * (1 + windows));
      const workers = seeds.map((seed) => startWorker(entry, { buffer, windows, accepted, count, seed, start } satisfies ReplayWorkerConfig));
      const exited = workers.map((w) => once(w, 'exit'));
      await new Promise((r) => setTimeout(r, 100)); // both parked on `start`
      Atomics.store(new Int32Array(start), 0, 1);
      Atomics.notify(new Int32Array(start), 0);
      await Promise.all(exited);
      const counts = new Int32Array(accepted);
      const wrong = [...counts.keys()].filter((c) => counts[c] !== 1);
      assert.deepEqual(wrong.slice(0, 10), [], `${how}: counters not accepted exactly once (${wrong.length} of ${windows} × ${count}; e.g. ${wrong.slice(0, 5).map((c) => `window ${Math.floor(c / count)} counter ${c % count}: ${counts[c]}`).join(', ')})`);
    }
  });
});
