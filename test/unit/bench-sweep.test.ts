/**
 * The UDP sweep's search (bench/suite/sweep.ts) against fake paths: a capacity above which the
 * excess is lost, a sender with a top speed, failures, and the probe budget.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { effectiveRate, probePasses, sweepRate, type RateProbe, type SweepOptions } from '../../bench/suite/sweep.ts';

const M = 1e6;

/** A path that carries up to `capacity` and loses the excess; a sender that tops out at `senderMax`. */
function fakePath(capacity: number, senderMax = Infinity) {
  const asked: number[] = [];
  const measure = async (rate: number): Promise<RateProbe> => {
    asked.push(rate);
    const sent = Math.min(rate, senderMax);
    const received = Math.min(sent, capacity);
    return { targetBps: rate, sentBps: sent, receivedBps: received, lossFraction: sent > 0 ? (sent - received) / sent : 1 };
  };
  return { measure, asked };
}

const base: SweepOptions = { startBps: 100 * M, minBps: 10 * M, maxBps: 40_000 * M, maxLoss: 0.01, maxProbes: 12, precision: 0.1 };

describe('sweepRate', () => {
  test('doubles up to the capacity, then bisects to within the precision', async () => {
    const path = fakePath(300 * M);
    const r = await sweepRate(path.measure, base);
    assert.equal(r.stoppedBy, 'converged');
    assert.deepEqual(path.asked.slice(0, 3), [100 * M, 200 * M, 400 * M], 'doubling first');
    assert.ok(r.best, 'a probe passed');
    assert.ok(r.best.receivedBps <= 300 * M * 1.0101, 'the best passing probe is not above the capacity (1 % loss allowed)');
    assert.ok(r.passingBps! >= 300 * M / 1.1, `within 10 % below the capacity, got ${r.passingBps! / M} Mbit/s`);
    assert.ok(r.failingBps! / r.passingBps! <= 1.1);
    assert.equal(r.probes.length, path.asked.length);
  });

  test('a start above the capacity steps down (no higher than what arrived), then bisects', async () => {
    const path = fakePath(120 * M);
    const r = await sweepRate(path.measure, { ...base, startBps: 1000 * M });
    assert.equal(path.asked[0], 1000 * M);
    assert.equal(path.asked[1], 120 * M, 'the second probe asks for what arrived, not just half');
    assert.equal(r.stoppedBy, 'converged');
    assert.ok(r.best && r.best.receivedBps > 120 * M / 1.1);
  });

  test('stops when a passing sender falls short: the sender is the limit', async () => {
    const path = fakePath(10_000 * M, 900 * M);
    const r = await sweepRate(path.measure, { ...base, startBps: 5000 * M });
    assert.equal(r.stoppedBy, 'sender-limited');
    assert.equal(r.probes.length, 1);
    assert.equal(r.best?.receivedBps, 900 * M);
    assert.equal(r.passingBps, 900 * M, 'the passing rate is what the sender reached');
  });

  test('a failing probe whose sender fell short counts at the rate it reached', async () => {
    // Sender tops out at 800, the path carries 500: the first probe fails at an effective 800.
    const path = fakePath(500 * M, 800 * M);
    const r = await sweepRate(path.measure, { ...base, startBps: 4000 * M, maxProbes: 2 });
    assert.equal(r.failingBps, 800 * M);
    assert.equal(path.asked[1], 500 * M, 'steps down to what arrived');
    assert.equal(r.stoppedBy, 'probe-limit');
  });

  test('never makes more probes than the budget, nor leaves [min, max]', async () => {
    for (const capacity of [5 * M, 37 * M, 333 * M, 2500 * M, 90_000 * M]) {
      for (const maxProbes of [1, 3, 5, 8]) {
        const path = fakePath(capacity);
        const r = await sweepRate(path.measure, { ...base, maxProbes });
        assert.ok(path.asked.length <= maxProbes, `capacity ${capacity}, budget ${maxProbes}: ${path.asked.length} probes`);
        assert.ok(path.asked.every((a) => a >= base.minBps && a <= base.maxBps));
        if (r.stoppedBy === 'probe-limit') assert.equal(path.asked.length, maxProbes);
      }
    }
  });

  test('the maximum rate passing ends the search', async () => {
    const path = fakePath(Infinity);
    const r = await sweepRate(path.measure, { ...base, startBps: 1000 * M, maxBps: 4000 * M });
    assert.equal(r.stoppedBy, 'max-rate');
    assert.deepEqual(path.asked, [1000 * M, 2000 * M, 4000 * M]);
    assert.equal(r.best?.receivedBps, 4000 * M);
  });

  test('nothing passes down to the minimum rate', async () => {
    const measure = async (rate: number): Promise<RateProbe> => ({ targetBps: rate, sentBps: rate, receivedBps: rate * 0.9, lossFraction: 0.1 });
    const r = await sweepRate(measure, { ...base, startBps: 80 * M });
    assert.equal(r.stoppedBy, 'min-rate');
    assert.equal(r.best, undefined);
    assert.equal(r.passingBps, undefined);
    assert.equal(r.probes.at(-1)!.targetBps, base.minBps);
  });

  test('a failed measurement counts as a failing probe; the best is the highest received rate', async () => {
    let calls = 0;
    const measure = async (rate: number): Promise<RateProbe> => {
      calls++;
      if (calls === 2) return { targetBps: rate, sentBps: 0, receivedBps: 0, lossFraction: 1, error: 'control connection lost' };
      return { targetBps: rate, sentBps: rate, receivedBps: rate, lossFraction: rate > 150 * M ? 0.5 : 0 };
    };
    const seen: number[] = [];
    const r = await sweepRate(measure, { ...base, maxProbes: 6 }, (_p, i) => seen.push(i));
    assert.equal(r.failingBps !== undefined && r.failingBps <= 200 * M, true);
    assert.deepEqual(seen, r.probes.map((_, i) => i), 'onProbe sees every probe in order');
    const passing = r.probes.filter((p) => probePasses(p, 0.01));
    assert.equal(r.best?.receivedBps, Math.max(...passing.map((p) => p.receivedBps)));
  });

  test('the loss threshold is strict and errors never pass', () => {
    const p = (loss: number, error?: string): RateProbe => ({ targetBps: 1, sentBps: 1, receivedBps: 1, lossFraction: loss, error });
    assert.equal(probePasses(p(0.0099), 0.01), true);
    assert.equal(probePasses(p(0.01), 0.01), false);
    assert.equal(probePasses(p(0, 'x'), 0.01), false);
    assert.equal(probePasses(p(Number.NaN), 0.01), false);
  });

  test('effectiveRate is the sender\'s rate only when it fell short', () => {
    assert.equal(effectiveRate({ targetBps: 100, sentBps: 60, receivedBps: 50, lossFraction: 0.1 }), 60);
    assert.equal(effectiveRate({ targetBps: 100, sentBps: 101, receivedBps: 50, lossFraction: 0.5 }), 100);
    assert.equal(effectiveRate({ targetBps: 100, sentBps: 0, receivedBps: 0, lossFraction: 1 }), 100);
  });

  test('rejects nonsense options before probing', async () => {
    const path = fakePath(100 * M);
    await assert.rejects(sweepRate(path.measure, { ...base, maxProbes: 0 }), RangeError);
    await assert.rejects(sweepRate(path.measure, { ...base, minBps: 0 }), RangeError);
    await assert.rejects(sweepRate(path.measure, { ...base, precision: 0 }), RangeError);
    assert.equal(path.asked.length, 0);
  });
});
