/**
 * The watches of the reader rings share one timer (watchdog.ts lookEveryInterval): three timers of
 * their own woke an idle daemon 12 times a second. The stall detection itself is tested where the
 * rings are (ring-stress.test.ts).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { WATCH_INTERVAL_MS, lookEveryInterval } from '../../dataplane/watchdog.ts';

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

test('every watch looks in the same run of one timer, until it stops', async () => {
  const runs: string[][] = [];
  let current: string[] | undefined;
  // A run of the shared timer is one macrotask: the first look of a run opens a record that a
  // microtask closes, so looks on timers of their own would land in records of their own.
  const look = (name: string) => () => {
    if (current === undefined) {
      current = [];
      runs.push(current);
      queueMicrotask(() => { current = undefined; });
    }
    current.push(name);
  };
  // The watches start at different moments. Only the runs after the last one started are judged:
  // a loaded machine (CI runs Bun's tests beside these) may delay a sleep past a run of the timer.
  const stopA = lookEveryInterval(look('a'));
  await sleep(WATCH_INTERVAL_MS / 3);
  const stopB = lookEveryInterval(look('b'));
  await sleep(WATCH_INTERVAL_MS / 3);
  const stopC = lookEveryInterval(look('c'));
  const allStarted = runs.length;
  await sleep(3.5 * WATCH_INTERVAL_MS);
  stopB();
  const before = runs.length;
  await sleep(2 * WATCH_INTERVAL_MS);
  stopA();
  stopC();
  const ended = runs.length;
  await sleep(2 * WATCH_INTERVAL_MS);

  assert.ok(before - allStarted >= 2, `the timer ran (${before - allStarted} runs)`);
  for (const run of runs.slice(0, allStarted)) assert.deepEqual(run, ['a', 'b', 'c'].slice(0, run.length), `the watches started by then, in one run: ${JSON.stringify(runs)}`);
  for (const run of runs.slice(allStarted, before)) assert.deepEqual(run, ['a', 'b', 'c'], `one run looks through every watch: ${JSON.stringify(runs)}`);
  for (const run of runs.slice(before, ended)) assert.deepEqual(run, ['a', 'c'], 'a stopped watch looks no more');
  assert.equal(runs.length, ended, 'with no watch left the timer is gone');
});
