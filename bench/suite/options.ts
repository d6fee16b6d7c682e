/** Command-line options of `roamguard bench`. */
import { join } from 'node:path';
import { ROAMGUARD_BIN, SUBJECTS } from './subjects.ts';

export interface BenchOptions {
  /** Measured seconds per iperf3 run (after the warm-up). */
  duration: number;
  /** Warm-up seconds omitted from each iperf3 result (`iperf3 -O`). */
  omit: number;
  /** Seconds of an unrecorded iperf3 transfer before a tunnel's measurements (JIT, worker start-up); 0 = none. */
  prime: number;
  /** iperf3 runs per subject and direction; the median is reported. */
  runs: number;
  /** Echo requests per subject. */
  pings: number;
  /** Seconds between echo requests. */
  pingInterval: number;
  /** Also measure B→A (`iperf3 -R`). */
  reverse: boolean;
  quick: boolean;
  /** Subject ids, in run order. */
  subjects: string[];
  /** Where the JSON and Markdown results go; undefined = do not save. */
  outDir: string | undefined;
}

export const DEFAULT_OUT_DIR = join(ROAMGUARD_BIN, '..', '..', 'bench', 'results');

export const USAGE = `roamguard bench [--quick] [--duration S] [--runs N] [--pings N] [--prime S] [--only LIST] [--reverse] [--out DIR | --no-save]

Builds two network namespaces joined by a veth pair and measures, one after the other on that
same link: the raw link (the ceiling), roamguard under Node.js and Bun, and wireguard-go (each
tunnel runs the same implementation on both sides). Per subject: iperf3 TCP, one stream, A→B,
median of N runs (Gbit/s, retransmits); ping RTT median and p99; CPU seconds of both tunnel
processes (all threads) per GB carried; peak RSS (VmHWM). Prints a Markdown table and saves it
with the raw figures as bench/results/<date>-<host>.{json,md}. Needs root; removes everything it
created afterwards, also on Ctrl-C.

  --quick          one run of 3 s per subject and 50 pings (explicit options still win)
  --duration S     measured seconds per iperf3 run, after a 1 s warm-up (default 5)
  --runs N         iperf3 runs per subject; the median is reported (default 3)
  --pings N        echo requests per subject, 10 ms apart (default 200)
  --prime S        unrecorded iperf3 transfer of S s before each tunnel's measurements, so the
                   first run does not pay for JIT and worker start-up (default 2; 0 = none)
  --only LIST      comma-separated subjects, in this order (default: ${SUBJECTS.filter((s) => s.byDefault).map((s) => s.id).join(',')})
                   known: ${SUBJECTS.map((s) => s.id).join(', ')}
  --reverse        also measure B→A (iperf3 -R)
  --out DIR        directory for the results (default bench/results)
  --no-save        print only, write no files`;

export function parseBenchArgs(args: readonly string[]): BenchOptions {
  const opts: BenchOptions = {
    duration: 5, omit: 1, prime: 2, runs: 3, pings: 200, pingInterval: 0.01, reverse: false, quick: false,
    subjects: SUBJECTS.filter((s) => s.byDefault).map((s) => s.id), outDir: DEFAULT_OUT_DIR,
  };
  let duration: number | undefined, runs: number | undefined, pings: number | undefined;
  const nonNegative = (text: string, name: string): number => {
    const n = Number(text);
    if (!Number.isInteger(n) || n < 0) throw new Error(`${name} needs a whole number ≥ 0, got ${JSON.stringify(text)}`);
    return n;
  };
  const value = (i: number, name: string): string => {
    const v = args[i + 1];
    if (v === undefined || v.startsWith('--')) throw new Error(`${name} needs a value`);
    return v;
  };
  const positive = (text: string, name: string, integer: boolean): number => {
    const n = Number(text);
    if (!Number.isFinite(n) || n <= 0 || (integer && !Number.isInteger(n))) throw new Error(`${name} needs a positive ${integer ? 'whole ' : ''}number, got ${JSON.stringify(text)}`);
    return n;
  };
  for (let i = 0; i < args.length; i++) {
    const arg = args[i];
    const [name, inline] = arg.startsWith('--') && arg.includes('=') ? [arg.slice(0, arg.indexOf('=')), arg.slice(arg.indexOf('=') + 1)] : [arg, undefined];
    const take = () => inline ?? value(i++, name);
    switch (name) {
      case '--quick': opts.quick = true; break;
      case '--reverse': opts.reverse = true; break;
      case '--no-save': opts.outDir = undefined; break;
      case '--duration': duration = positive(take(), name, true); break;
      case '--runs': runs = positive(take(), name, true); break;
      case '--pings': pings = positive(take(), name, true); break;
      case '--prime': opts.prime = nonNegative(take(), name); break;
      case '--out': opts.outDir = take(); break;
      case '--only': {
        const ids = take().split(',').map((s) => s.trim()).filter(Boolean);
        const unknown = ids.filter((id) => !SUBJECTS.some((s) => s.id === id));
        if (unknown.length > 0) throw new Error(`unknown subject(s) ${unknown.join(', ')} (known: ${SUBJECTS.map((s) => s.id).join(', ')})`);
        if (ids.length === 0) throw new Error('--only needs at least one subject');
        opts.subjects = ids.filter((id, k) => ids.indexOf(id) === k);
        break;
      }
      default: throw new Error(`unknown argument ${arg} (see roamguard bench --help)`);
    }
  }
  if (opts.quick) { opts.duration = 3; opts.runs = 1; opts.pings = 50; }
  if (duration !== undefined) opts.duration = duration;
  if (runs !== undefined) opts.runs = runs;
  if (pings !== undefined) opts.pings = pings;
  return opts;
}
