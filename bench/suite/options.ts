/** Command-line options of `roamguard bench`. */
import { join, resolve } from 'node:path';
import { MAX_SCALE_PEERS } from './scale-types.ts';
import { ROAMGUARD_BIN, SUBJECTS, TUNNEL_MTU } from './subjects.ts';

export interface BenchOptions {
  /** Measured seconds per iperf3 TCP run (after the warm-up). */
  duration: number;
  /** Warm-up seconds omitted from each iperf3 TCP result (`iperf3 -O`). */
  omit: number;
  /** Seconds of an unrecorded iperf3 transfer before a tunnel's measurements (JIT, worker start-up); 0 = none. */
  prime: number;
  /** iperf3 runs per subject and test; the median is reported. */
  runs: number;
  /** Echo requests per idle-ping series (the measured ones). */
  pings: number;
  /**
   * Echo requests before each series's measured ones, after the prime: a data thread that the
   * prime's flow did not reach is still being optimized by V8 for its first 1.5-3 s of pings. Their
   * median is reported beside the figure, as what a just-started daemon answers in.
   */
  pingWarmup: number;
  /** Seconds between echo requests. */
  pingInterval: number;
  /** Also measure B→A (`iperf3 -R`). */
  reverse: boolean;
  /** The TCP test with several streams (`iperf3 -P streams`). */
  parallel: boolean;
  streams: number;
  /** The UDP rate sweep. */
  udp: boolean;
  /** UDP payload bytes per datagram. */
  udpSize: number;
  /** Seconds per UDP probe, and the most probes per subject. */
  udpProbeSeconds: number;
  udpProbes: number;
  /** Starts of each tunnel daemon alone, timed to its control socket's first answer, then idle RSS (0 = none). */
  startups: number;
  /** Idle milliseconds after each start before the RSS is read. */
  startupIdleMs: number;
  /** Microbenchmarks (crypto, handshakes, allowed IPs, heap per peer) in child processes. */
  micro: boolean;
  /** The scale run (one daemon, `peers` peers, control socket timings, handshakes). */
  scale: boolean;
  peers: number;
  /** Initiations per second in the scale run; 0 = all at once. */
  scaleRate: number;
  /** `get=1` round trips per scale measurement. */
  getSamples: number;
  quick: boolean;
  /** Subject ids, in run order. */
  subjects: string[];
  /** `--baseline DIR`: the checkout whose bin/roamguard the *-baseline subjects run. */
  baseline?: string;
  /** `--wireguard-go-modern PATH`: the wireguard-go binary of the reference subject (default: beside the checkout). */
  wireguardGoModern?: string;
  /** Where the JSON, Markdown and SVG results go; undefined = do not save. */
  outDir: string | undefined;
}

export const DEFAULT_OUT_DIR = join(ROAMGUARD_BIN, '..', '..', 'bench', 'results');
/** Subjects of a `--quick` run without --only: the main comparison, without the --threads 0 variant. */
export const QUICK_SUBJECTS = ['raw', 'node', 'bun', 'wireguard-go-modern', 'wireguard-go'];
/** The largest UDP payload that fits the tunnel MTU without fragmenting (IPv4 + UDP headers). */
export const MAX_UDP_SIZE = TUNNEL_MTU - 28;

export const USAGE = `roamguard bench [--quick] [--only LIST] [--duration S] [--runs N] [--pings N] [--ping-warmup N] [--prime S]
                [--streams N | --no-parallel] [--udp-size B] [--udp-probes N | --no-udp]
                [--startups N] [--peers N] [--scale-rate N] [--no-scale] [--no-micro] [--reverse]
                [--baseline DIR] [--wireguard-go-modern PATH] [--out DIR | --no-save]

Builds two network namespaces joined by a veth pair and measures, one after the other on that
same link: the raw link (the ceiling), roamguard under Node.js and Bun, upstream's newest
wireguard-go (../shared/anchors/wireguard-go-modern beside the checkout: the reference of every
ratio) and Debian's (each tunnel runs the same implementation on both sides). Per subject: iperf3 TCP with one stream and
with 4 parallel streams, A→B, median of N runs (Gbit/s, retransmits); a UDP sweep at a fixed
datagram size for the highest rate with under 1 % loss (Mbit/s, packets/s); ping RTT median and
p99; CPU seconds of both tunnel processes (all threads) per GB carried; peak RSS (VmHWM); and,
from starts of one daemon alone, the time until its control socket answers, its idle RSS and
what staying idle costs it (CPU time and thread wake-ups a second).
Then microbenchmarks under Node and Bun in child processes (AEAD MB/s per crypto provider at
64/512/1420 B, handshakes/s on one core, allowed-IPs lookups/s with 1, 1 000 and 100 000
prefixes, heap per peer) and a scale run: one roamguard daemon with 1 000 peers (its RSS, the
control socket's set and get=1 times, and 1 000 simulated peers handshaking with it at once).
Prints Markdown tables and saves them with the raw figures and an SVG bar chart of the
throughput as bench/results/<date>-<host>.{json,md,svg}. Needs root; removes everything it
created afterwards, also on Ctrl-C. Full run: about 6 minutes on 2 cores; --quick: under 2.

  --quick          a short subset: ${QUICK_SUBJECTS.join(', ')}; one run of 3 s per TCP test;
                   50 pings after 50 warm-up echoes; UDP probes of 1 s, at most 5; 2 starts per daemon, 1.5 s idle;
                   shorter microbenchmarks (IPv4 only);
                   10 get=1 samples (explicit options still win)
  --only LIST      comma-separated subjects, in this order (default: ${SUBJECTS.filter((s) => s.byDefault).map((s) => s.id).join(',')})
                   known: ${SUBJECTS.map((s) => s.id).join(', ')}
  --duration S     measured seconds per iperf3 TCP run, after a 1 s warm-up (default 5)
  --runs N         iperf3 runs per subject and TCP test, and idle-ping rounds over all subjects
                   (each a fresh, primed tunnel per subject); medians are reported (default 3)
  --pings N        echo requests per idle-ping series, 10 ms apart (default 200)
  --ping-warmup N  echo requests before each series's measured ones, after the prime: a data
                   thread the prime did not reach is still being optimized for its first 1.5-3 s
                   of pings; their median is reported too, as the fresh-start figure (default 200;
                   0 = the series starts right after the prime)
  --prime S        unrecorded iperf3 transfer of S s before each tunnel's measurements, so the
                   first run does not pay for JIT and worker start-up (default 2; 0 = none)
  --streams N      parallel TCP streams of the second TCP test (default 4)
  --no-parallel    skip the parallel-stream TCP test
  --udp-size B     UDP payload bytes per datagram, at most ${MAX_UDP_SIZE} (default 1200)
  --udp-probes N   most iperf3 UDP probes per subject (default 8, of 2 s each)
  --no-udp         skip the UDP sweep
  --startups N     starts of each tunnel daemon alone in a namespace, timed from the spawn to the
                   first complete answer of its control socket to get=1, then 2 s idle: its RSS;
                   then 2 s more: its CPU time and thread wake-ups a second
                   (default 3; medians reported; 0 = none)
  --no-micro       skip the microbenchmarks
  --peers N        peers of the scale run (default 1000, at most ${MAX_SCALE_PEERS})
  --scale-rate N   initiations per second of the simulated peers (default 0: all at once)
  --no-scale       skip the scale run
  --reverse        also measure B→A with one stream (iperf3 -R)
  --out DIR        directory for the results (default bench/results)
  --baseline DIR   the checkout (e.g. a worktree of main before a change) that the subjects
                   node-baseline and bun-baseline run, for before/after figures in one run
  --wireguard-go-modern PATH
                   the wireguard-go binary of the wireguard-go-modern subject, the reference of
                   the ratios (default ../shared/anchors/wireguard-go-modern beside the checkout;
                   without one the ratios are against Debian's wireguard-go, and the report says so)
  --no-save        print only, write no files`;

export function parseBenchArgs(args: readonly string[]): BenchOptions {
  const opts: BenchOptions = {
    duration: 5, omit: 1, prime: 2, runs: 3, pings: 200, pingWarmup: 200, pingInterval: 0.01, reverse: false,
    parallel: true, streams: 4, udp: true, udpSize: 1200, udpProbeSeconds: 2, udpProbes: 8,
    startups: 3, startupIdleMs: 2000, micro: true, scale: true, peers: 1000, scaleRate: 0, getSamples: 30, quick: false,
    subjects: SUBJECTS.filter((s) => s.byDefault).map((s) => s.id), outDir: DEFAULT_OUT_DIR,
  };
  const explicit: Partial<Record<'duration' | 'runs' | 'pings' | 'pingWarmup' | 'udpProbes' | 'startups' | 'subjects', number | string[]>> = {};
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
  const atMost = (n: number, max: number, name: string): number => {
    if (n > max) throw new Error(`${name} can be at most ${max}, got ${n}`);
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
      case '--no-parallel': opts.parallel = false; break;
      case '--no-udp': opts.udp = false; break;
      case '--no-micro': opts.micro = false; break;
      case '--no-scale': opts.scale = false; break;
      case '--duration': explicit.duration = positive(take(), name, true); break;
      case '--runs': explicit.runs = positive(take(), name, true); break;
      case '--pings': explicit.pings = positive(take(), name, true); break;
      case '--prime': opts.prime = nonNegative(take(), name); break;
      case '--ping-warmup': explicit.pingWarmup = atMost(nonNegative(take(), name), 10_000, name); break;
      case '--startups': explicit.startups = atMost(nonNegative(take(), name), 20, name); break;
      case '--streams': opts.streams = atMost(positive(take(), name, true), 128, name); if (opts.streams < 2) throw new Error('--streams needs at least 2 (the one-stream test always runs)'); break;
      case '--udp-size': opts.udpSize = atMost(positive(take(), name, true), MAX_UDP_SIZE, name); break;
      case '--udp-probes': explicit.udpProbes = atMost(positive(take(), name, true), 30, name); break;
      case '--peers': opts.peers = atMost(positive(take(), name, true), MAX_SCALE_PEERS, name); break;
      case '--scale-rate': opts.scaleRate = nonNegative(take(), name); break;
      case '--out': opts.outDir = take(); break;
      case '--baseline': opts.baseline = resolve(take()); break;
      case '--wireguard-go-modern': opts.wireguardGoModern = resolve(take()); break;
      case '--only': {
        const ids = take().split(',').map((s) => s.trim()).filter(Boolean);
        const unknown = ids.filter((id) => !SUBJECTS.some((s) => s.id === id));
        if (unknown.length > 0) throw new Error(`unknown subject(s) ${unknown.join(', ')} (known: ${SUBJECTS.map((s) => s.id).join(', ')})`);
        if (ids.length === 0) throw new Error('--only needs at least one subject');
        explicit.subjects = ids.filter((id, k) => ids.indexOf(id) === k);
        break;
      }
      default: throw new Error(`unknown argument ${arg} (see roamguard bench --help)`);
    }
  }
  if (opts.quick) {
    opts.duration = 3; opts.runs = 1; opts.pings = 50; opts.pingWarmup = 50;
    opts.udpProbeSeconds = 1; opts.udpProbes = 5; opts.getSamples = 10;
    opts.startups = 2; opts.startupIdleMs = 1500;
    opts.subjects = QUICK_SUBJECTS.filter((id) => SUBJECTS.some((s) => s.id === id));
  }
  if (explicit.duration !== undefined) opts.duration = explicit.duration as number;
  if (explicit.runs !== undefined) opts.runs = explicit.runs as number;
  if (explicit.pings !== undefined) opts.pings = explicit.pings as number;
  if (explicit.pingWarmup !== undefined) opts.pingWarmup = explicit.pingWarmup as number;
  if (explicit.udpProbes !== undefined) opts.udpProbes = explicit.udpProbes as number;
  if (explicit.startups !== undefined) opts.startups = explicit.startups as number;
  if (explicit.subjects !== undefined) opts.subjects = explicit.subjects as string[];
  return opts;
}
