/**
 * The UDP rate sweep's search, apart from iperf3 so it can be tested with a fake measurement: find
 * the highest send rate whose loss stays under a threshold, in a bounded number of probes.
 *
 * Doubling from a starting rate until a probe fails (or stepping down until one passes), then
 * bisecting (geometric midpoint) between the highest passing and the lowest failing rate until
 * they are within `precision` of each other. A probe counts at the rate its sender actually
 * reached, and the step down goes no higher than what arrived (an overloaded path tells
 * roughly what it carries). It stops early when a passing probe's sender could not reach the
 * asked rate (the sender, not the path, is the limit: going higher only measures the sender
 * again) and when the probe budget is spent. The answer is the passing probe with the highest
 * received rate.
 */

/** What one probe at a rate gave. */
export interface RateProbe {
  /** The rate asked for, bits per second. */
  targetBps: number;
  /** The rate the sender achieved. */
  sentBps: number;
  /** The rate that arrived. */
  receivedBps: number;
  /** Lost share of what was sent, 0..1. */
  lossFraction: number;
  /** Set when the measurement itself failed (counts as a failed probe). */
  error?: string;
}

export interface SweepOptions {
  /** First rate tried, bits per second. */
  startBps: number;
  /** Never probe below or above these. */
  minBps: number;
  maxBps: number;
  /** A probe passes when its loss is below this (0.01 = 1 %). */
  maxLoss: number;
  /** Probe budget, the first one included. */
  maxProbes: number;
  /** Stop bisecting once failing / passing rate ≤ 1 + precision (0.1 = within 10 %). */
  precision: number;
  /** A passing probe whose sender reached less than this share of the target is sender-limited. Default 0.9. */
  senderShortfall?: number;
}

export type SweepStop =
  /** Passing and failing rates are within the precision. */
  | 'converged'
  /** A passing probe's sender fell short of the target rate. */
  | 'sender-limited'
  /** The maximum rate passed. */
  | 'max-rate'
  /** The minimum rate failed. */
  | 'min-rate'
  /** The probe budget ran out. */
  | 'probe-limit';

export interface SweepResult<P extends RateProbe> {
  /** The passing probe with the highest received rate; undefined when none passed. */
  best?: P;
  /** Every probe in the order it ran. */
  probes: P[];
  /** Highest passing and lowest failing target rate (undefined when never seen). */
  passingBps?: number;
  failingBps?: number;
  stoppedBy: SweepStop;
}

/** Does `probe` pass with loss threshold `maxLoss`? */
export function probePasses(probe: RateProbe, maxLoss: number): boolean {
  return probe.error === undefined && Number.isFinite(probe.lossFraction) && probe.lossFraction < maxLoss;
}

/** The rate a probe really tested: what the sender reached when it fell short of the target. */
export function effectiveRate(probe: RateProbe): number {
  return Number.isFinite(probe.sentBps) && probe.sentBps > 0 && probe.sentBps < probe.targetBps ? probe.sentBps : probe.targetBps;
}

/** Validates the options (throws on nonsense, so a bad call fails before any probe runs). */
function check(o: SweepOptions): void {
  if (!(o.minBps > 0) || !(o.maxBps >= o.minBps)) throw new RangeError(`sweep: need 0 < minBps ≤ maxBps, got ${o.minBps}, ${o.maxBps}`);
  if (!(o.startBps > 0)) throw new RangeError(`sweep: startBps must be positive, got ${o.startBps}`);
  if (!Number.isInteger(o.maxProbes) || o.maxProbes < 1) throw new RangeError(`sweep: maxProbes must be a whole number ≥ 1, got ${o.maxProbes}`);
  if (!(o.precision > 0)) throw new RangeError(`sweep: precision must be positive, got ${o.precision}`);
  if (!(o.maxLoss > 0 && o.maxLoss <= 1)) throw new RangeError(`sweep: maxLoss must be in (0, 1], got ${o.maxLoss}`);
}

/**
 * Runs the search with `measure(rateBps)`; `onProbe` sees each probe as it completes (progress).
 * Makes at most `maxProbes` calls, one at a time.
 */
export async function sweepRate<P extends RateProbe>(
  measure: (rateBps: number) => Promise<P>,
  options: SweepOptions,
  onProbe?: (probe: P, index: number) => void,
): Promise<SweepResult<P>> {
  check(options);
  const shortfall = options.senderShortfall ?? 0.9;
  const clamp = (r: number) => Math.min(options.maxBps, Math.max(options.minBps, r));
  const probes: P[] = [];
  let best: P | undefined;
  let passing: number | undefined;
  let failing: number | undefined;
  let rate = clamp(options.startBps);
  let stoppedBy: SweepStop = 'probe-limit';

  while (probes.length < options.maxProbes) {
    const probe = await measure(rate);
    probes.push(probe);
    onProbe?.(probe, probes.length - 1);
    if (probePasses(probe, options.maxLoss)) {
      if (!best || probe.receivedBps > best.receivedBps) best = probe;
      passing = Math.max(passing ?? 0, effectiveRate(probe));
      if (probe.sentBps < shortfall * rate) { stoppedBy = 'sender-limited'; break; }
      if (failing === undefined) {
        if (rate >= options.maxBps) { stoppedBy = 'max-rate'; break; }
        rate = clamp(rate * 2);
        continue;
      }
    } else {
      failing = Math.min(failing ?? Infinity, effectiveRate(probe));
      if (passing === undefined) {
        if (rate <= options.minBps) { stoppedBy = 'min-rate'; break; }
        const arrived = Number.isFinite(probe.receivedBps) && probe.receivedBps > 0 ? probe.receivedBps : Infinity;
        rate = clamp(Math.min(rate / 2, arrived));
        continue;
      }
    }
    // Both bounds known: bisect.
    if (failing! / passing! <= 1 + options.precision) { stoppedBy = 'converged'; break; }
    rate = clamp(Math.sqrt(passing! * failing!));
  }
  return { best, probes, passingBps: passing, failingBps: failing, stoppedBy };
}
