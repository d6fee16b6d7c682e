/**
 * Reachability probes inside namespaces (`ping`), shared by the system tests and the demo.
 */
import type { Namespace } from './netns.ts';

export interface PingOptions {
  /** Replies wanted. Default 3. */
  count?: number;
  /** Seconds between requests. Default 0.2. */
  intervalS?: number;
  /** Give up after this many seconds. Default 10. */
  deadlineS?: number;
}

export interface PingResult {
  transmitted: number;
  received: number;
  lossPercent: number;
  output: string;
}

/** `ping` statistics line: "N packets transmitted, M received, …". */
export function parsePingOutput(output: string): PingResult {
  const m = /(\d+) packets transmitted, (\d+) (?:packets )?received/.exec(output);
  if (!m) return { transmitted: 0, received: 0, lossPercent: 100, output };
  const transmitted = Number(m[1]);
  const received = Number(m[2]);
  return { transmitted, received, lossPercent: transmitted === 0 ? 100 : (100 * (transmitted - received)) / transmitted, output };
}

/** Runs `ping -c COUNT -i INTERVAL -w DEADLINE DST` in `ns`; never throws on lost replies. */
export async function ping(ns: Namespace, dst: string, options: PingOptions = {}): Promise<PingResult> {
  const count = options.count ?? 3;
  const deadline = options.deadlineS ?? 10;
  const result = await ns.exec('ping', ['-n', '-c', String(count), '-i', String(options.intervalS ?? 0.2), '-w', String(deadline), dst], {
    allowFailure: true,
    timeoutMs: (deadline + 10) * 1000,
  });
  return parsePingOutput(result.stdout + result.stderr);
}

