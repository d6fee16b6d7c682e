/**
 * Runs the benchmark suite: one topology (two namespaces joined by one veth pair), then each
 * subject in turn on it: iperf3 server in B, tunnel start up to a first ping, an unrecorded
 * priming transfer, the one-stream iperf3 runs (with CPU, queue and drop figures), the
 * parallel-stream runs, the UDP rate sweep, peak RSS, stop. Then the idle ping in rounds over
 * every subject (each started afresh, primed, one series; see plan), the
 * microbenchmarks (a child process per runtime) and the scale run (one daemon, many peers).
 * Every subject has a scope of its own that is cleaned up before the next starts; the
 * topology's scope is cleaned up at the end, also on failure. Ctrl-C and SIGTERM are handled by
 * the namespace helpers' last-resort cleanup (processes by pid, then the namespaces).
 */
import { join } from 'node:path';
import { spawnSync } from 'node:child_process';
import { availableParallelism, cpus, hostname, loadavg, release, totalmem } from 'node:os';
import {
  Scope, createPair, which, type NsProcess, type PairTopology,
} from '../../test/system/netns.ts';
import { difference, linkCounters, sampleQueues, udpCounters, type Counters, type QueueSample } from './counters.ts';
import { cpuSeconds, cpuSplit, foreignCpu, formatTop, memoryStatus, namedNetnsInode, snapshotAllProcesses, threadCpu } from './procfs.ts';
import { runMicro, microSeconds } from './micro.ts';
import type { BenchOptions } from './options.ts';
import { estimateSecondsLeft, formatDuration } from './progress.ts';
import { IDLE_CPU_WINDOW_MS, type BenchMeta, type BenchResults, type MicroSection, type RunRecord, type SubjectResult, type SubjectSummary } from './results.ts';
import { runScale, scaleSeconds } from './scale.ts';
import { measureStartup } from './startup.ts';
import { maximum, median, minimum } from './stats.ts';
import { LISTEN_PORT, SUBJECTS, TUNNEL_MTU, bunBinary, requireCompiled, startSubject, unavailableReason, type RunningSubject, type SubjectSpec } from './subjects.ts';
import { sweepRate } from './sweep.ts';
import { iperf, iperfUdp, mergePings, ping, startIperfServer, type IperfRun, type PingResult, type UdpProbe } from './tools.ts';
import { WIREGUARD_GO_MODERN, hasWireGuardGoModern } from '../../test/system/userspace-wg.ts';

export type Progress = (line: string) => void;

export interface Step {
  /** What the step belongs to: a subject's label, `microbenchmarks` or `scale run`. */
  label: string;
  subject?: SubjectSpec;
  kind: 'startup' | 'start' | 'prime' | 'ping' | 'iperf' | 'parallel' | 'udp' | 'micro' | 'scale';
  run?: number;
  reverse?: boolean;
  runtime?: 'node' | 'bun';
  /** Expected seconds, for the time-left estimate. */
  seconds: number;
}

/** UDP sweep limits: never below 10 Mbit/s, never above 40 Gbit/s, 1 % loss, within 10 %. */
export const UDP_SWEEP = { minBps: 10e6, maxBps: 40e9, maxLoss: 0.01, precision: 0.1, fallbackStartBps: 200e6 };

/** Expected seconds to start a subject's tunnel up to its first ping. */
function startSeconds(subject: SubjectSpec): number {
  return subject.kind === 'raw' ? 0.1 : subject.kind === 'roamguard' ? 3 : 1.5;
}

/** `items` turned left by `by` places: round r of the idle ping starts with the r-th subject. */
function rotated<T>(items: readonly T[], by: number): T[] {
  if (items.length === 0) return [];
  const k = by % items.length;
  return [...items.slice(k), ...items.slice(0, k)];
}

/** Every step of a run with its expected duration, in order (exported for tests). */
export function plan(specs: readonly SubjectSpec[], opts: BenchOptions, microRuntimes: ReadonlyArray<'node' | 'bun'>): Step[] {
  const steps: Step[] = [];
  const iperfSeconds = opts.duration + opts.omit + 0.7;
  for (const subject of specs) {
    const label = subject.label;
    if (subject.kind !== 'raw' && opts.startups > 0) {
      steps.push({ label, subject, kind: 'startup', seconds: opts.startups * ((opts.startupIdleMs + IDLE_CPU_WINDOW_MS) / 1000 + (subject.kind === 'roamguard' ? 1 : 0.3)) });
    }
    steps.push({ label, subject, kind: 'start', seconds: startSeconds(subject) });
    if (subject.kind !== 'raw' && opts.prime > 0) steps.push({ label, subject, kind: 'prime', seconds: opts.prime + 0.7 });
    for (let r = 1; r <= opts.runs; r++) steps.push({ label, subject, kind: 'iperf', run: r, seconds: iperfSeconds });
    if (opts.reverse) for (let r = 1; r <= opts.runs; r++) steps.push({ label, subject, kind: 'iperf', run: r, reverse: true, seconds: iperfSeconds });
    if (opts.parallel) for (let r = 1; r <= opts.runs; r++) steps.push({ label, subject, kind: 'parallel', run: r, seconds: iperfSeconds });
    // A sweep rarely needs its whole probe budget; a probe costs about 0.8 s more than its length.
    if (opts.udp) steps.push({ label, subject, kind: 'udp', seconds: Math.ceil(opts.udpProbes * 0.8) * (opts.udpProbeSeconds + 0.8) });
  }
  // The idle ping, in rounds after every subject's block: each round starts every subject afresh,
  // primes it and takes one series, the order turned by one each round. This machine's wake-up
  // latency changes in modes that last from seconds to minutes, for every implementation alike; a
  // subject measured in a block of its own could sit in one mode and its comparison in another.
  for (let r = 1; r <= opts.runs; r++) {
    for (const subject of rotated(specs, r - 1)) {
      const prime = subject.kind !== 'raw' && opts.prime > 0 ? opts.prime + 0.7 : 0;
      const echoes = (opts.pingWarmup > 0 ? opts.pingWarmup * opts.pingInterval + 0.3 : 0) + opts.pings * opts.pingInterval + 0.3;
      steps.push({ label: subject.label, subject, kind: 'ping', run: r, seconds: startSeconds(subject) + prime + echoes });
    }
  }
  if (opts.micro) for (const runtime of microRuntimes) steps.push({ label: 'microbenchmarks', kind: 'micro', runtime, seconds: microSeconds(opts.quick) });
  if (opts.scale) steps.push({ label: 'scale run', kind: 'scale', seconds: scaleSeconds(opts.quick) });
  return steps;
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/**
 * Samples the queues around both tunnel ends once a second from `startMs` until stopped.
 * Returns a function that stops the sampling and resolves with the samples.
 */
function startQueueSampler(topo: PairTopology, subject: RunningSubject, startMs: number): () => Promise<Array<Record<string, QueueSample>>> {
  const samples: Array<Record<string, QueueSample>> = [];
  let running = true;
  let wake!: () => void;
  const stopped = new Promise<void>((resolve) => { wake = resolve; });
  const pause = (ms: number) => Promise.race([sleep(ms), stopped]);
  const loop = (async () => {
    await pause(startMs);
    while (running) {
      const sample: Record<string, QueueSample> = {};
      for (const p of subject.processes) sample[p.side.toUpperCase()] = await sampleQueues(p.side === 'a' ? topo.a : topo.b, p.ifname, LISTEN_PORT);
      if (running) samples.push(sample);
      await pause(1000);
    }
  })();
  return async () => { running = false; wake(); await loop; return samples; };
}

function summarizeQueues(result: SubjectResult, samples: Array<Record<string, QueueSample>>): void {
  if (samples.length === 0) return;
  const series: Record<string, number[]> = {};
  const rb: Record<string, number> = {};
  for (const sample of samples) {
    for (const [side, q] of Object.entries(sample)) {
      (series[`tun ${side} qdisc`] ??= []).push(q.qdiscBacklogBytes);
      (series[`udp ${side} Recv-Q`] ??= []).push(q.udpRecvQueueBytes);
      rb[side] = Math.max(rb[side] ?? 0, q.udpReceiveBufferBytes);
    }
  }
  result.queues = Object.fromEntries(Object.entries(series).map(([k, v]) => [k, { median: median(v), max: maximum(v) }]));
  result.udpReceiveBuffer = rb;
}


function version(cmd: string, args: string[], pattern: RegExp = /\S.*/): string {
  const r = spawnSync(cmd, args, { encoding: 'utf8', timeout: 10_000 });
  const text = `${r.stdout ?? ''}\n${r.stderr ?? ''}`;
  return r.status === 0 ? (pattern.exec(text)?.[0] ?? '?').trim() : 'unavailable';
}

function collectVersions(wireguardGoModern: string): Record<string, string> {
  const versions: Record<string, string> = {
    node: version('node', ['--version']),
    iperf3: version('iperf3', ['--version'], /iperf [\d.]+/),
    'wireguard-tools': version('wg', ['--version'], /v[\d.]+/),
  };
  const bun = bunBinary();
  versions.bun = bun ? version(bun, ['--version']) : 'not installed';
  versions['wireguard-go'] = which('wireguard-go') ? version('wireguard-go', ['--version'], /v[\d.]+/) : 'not installed';
  versions['wireguard-go-modern'] = hasWireGuardGoModern(wireguardGoModern) ? version(wireguardGoModern, ['--version'], /v[\d.]+/) : 'not found';
  return versions;
}

/** The tunnel processes' CPU seconds by side (empty for the raw link). */
function cpuBySide(subject: RunningSubject): Record<string, number> {
  const out: Record<string, number> = {};
  for (const p of subject.processes) out[p.side] = cpuSeconds(p.pid);
  return out;
}

/** The figures of a subject's runs (exported for tests). */
export function summarize(result: SubjectResult, kind: string): SubjectSummary {
  const forward = result.runs.filter((r) => r.direction === 'a-to-b');
  const backward = result.runs.filter((r) => r.direction === 'b-to-a');
  const gbps = forward.map((r) => r.gbps);
  const summary: SubjectSummary = {
    gbps: median(gbps), gbpsMin: minimum(gbps), gbpsMax: maximum(gbps),
    retransmits: median(forward.map((r) => r.retransmits)),
    loadedRttMs: median(forward.map((r) => r.iperf.tcpRttMs.mean).filter(Number.isFinite)),
    foreignCpuLoad: 0,
  };
  if (backward.length > 0) {
    summary.reverseGbps = median(backward.map((r) => r.gbps));
    summary.reverseRetransmits = median(backward.map((r) => r.retransmits));
  }
  if (result.ping) {
    summary.rttMedianMs = result.ping.medianMs;
    summary.rttP99Ms = result.ping.p99Ms;
    summary.pingLoss = 1 - result.ping.received / result.ping.sent;
  }
  if (result.pingFresh) summary.rttFreshMedianMs = result.pingFresh.medianMs;
  if (kind !== 'raw' && result.runs.length > 0) {
    const cpu = result.runs.reduce((s, r) => s + r.tunnelCpuSeconds, 0);
    const bytes = result.runs.reduce((s, r) => s + r.totalBytes, 0);
    const wall = result.runs.reduce((s, r) => s + r.wallSeconds, 0);
    summary.cpuSecondsPerGB = bytes > 0 ? cpu / (bytes / 1e9) : Number.NaN;
    summary.cpuPercent = wall > 0 ? (100 * cpu) / wall : Number.NaN;
    const split = result.runs.filter((r) => r.tunnelCpuSplit !== undefined);
    const splitBytes = split.reduce((s, r) => s + r.totalBytes, 0);
    if (splitBytes > 0) {
      summary.userCpuSecondsPerGB = split.reduce((s, r) => s + r.tunnelCpuSplit!.user, 0) / (splitBytes / 1e9);
      summary.kernelCpuSecondsPerGB = split.reduce((s, r) => s + r.tunnelCpuSplit!.system, 0) / (splitBytes / 1e9);
      summary.busiestThreadPercent = median(split.filter((r) => r.wallSeconds > 0).map((r) => (100 * r.tunnelCpuSplit!.busiestThread) / r.wallSeconds));
    }
  }
  if (result.processes.length > 0) summary.peakRssBytes = Math.max(...result.processes.map((p) => p.peakRssBytes));
  const starts = result.startup?.samples ?? [];
  if (starts.length > 0) {
    summary.startupMs = median(starts.map((x) => x.readyMs));
    summary.startupMsMin = minimum(starts.map((x) => x.readyMs));
    summary.startupMsMax = maximum(starts.map((x) => x.readyMs));
    summary.idleRssBytes = median(starts.map((x) => x.idleRssBytes));
    summary.idleThreads = median(starts.map((x) => x.threads));
    summary.idleCpuMsPerSecond = median(starts.map((x) => x.idleCpuMsPerSecond));
    summary.idleRunsPerSecond = median(starts.map((x) => x.idleRunsPerSecond));
  }
  const all = [...result.runs, ...(result.parallelRuns ?? [])];
  const wall = all.reduce((s, r) => s + r.wallSeconds, 0);
  summary.foreignCpuLoad = wall > 0 ? all.reduce((s, r) => s + r.foreignCpuSeconds, 0) / wall : 0;
  const parallel = result.parallelRuns ?? [];
  if (parallel.length > 0) {
    const p = parallel.map((r) => r.gbps);
    summary.parallelStreams = parallel[0].streams;
    summary.parallelGbps = median(p);
    summary.parallelGbpsMin = minimum(p);
    summary.parallelGbpsMax = maximum(p);
    summary.parallelRetransmits = median(parallel.map((r) => r.retransmits));
    const bytes = parallel.reduce((s, r) => s + r.totalBytes, 0);
    if (kind !== 'raw' && bytes > 0) summary.parallelCpuSecondsPerGB = parallel.reduce((s, r) => s + r.tunnelCpuSeconds, 0) / (bytes / 1e9);
  }
  if (result.udp) {
    summary.udpPayloadBytes = result.udp.payloadBytes;
    summary.udpStoppedBy = result.udp.stoppedBy;
    const best = result.udp.best;
    if (best) {
      summary.udpMbps = best.receivedBps / 1e6;
      summary.udpPps = best.receivedPps;
      summary.udpLoss = best.lossFraction;
    }
  }
  return summary;
}

/** Kernel counters of the topology and the subject's interfaces, keyed by what they describe. */
async function readCounters(topo: PairTopology, subject: RunningSubject): Promise<Record<string, Counters>> {
  const out: Record<string, Counters> = {
    'udp A': await udpCounters(topo.a),
    'udp B': await udpCounters(topo.b),
    'veth A': await linkCounters(topo.a, topo.linkA.ifname),
    'veth B': await linkCounters(topo.b, topo.linkB.ifname),
  };
  for (const p of subject.processes) out[`tun ${p.side.toUpperCase()}`] = await linkCounters(p.side === 'a' ? topo.a : topo.b, p.ifname);
  return out;
}

interface Context {
  topo: PairTopology;
  opts: BenchOptions;
  ownNetns: Set<number>;
  step: (s: Step, detail?: string) => void;
  progress: Progress;
}

/**
 * One timed iperf3 TCP run with the tunnel processes' CPU time and other processes' CPU time
 * around it; warns when other processes competed for the cores.
 */
async function timedTcpRun(
  ctx: Context, scope: Scope, subject: RunningSubject, watch: NsProcess[], options: { reverse?: boolean; streams: number; sampleQueues?: Array<Record<string, QueueSample>> },
): Promise<RunRecord> {
  const { topo, opts } = ctx;
  const everyoneBefore = snapshotAllProcesses();
  const before = cpuBySide(subject);
  const threadsBefore = subject.processes.map((p) => threadCpu(p.pid));
  const stopSampling = options.sampleQueues && subject.processes.length > 0 ? startQueueSampler(topo, subject, opts.omit * 1000 + 500) : undefined;
  const t0 = performance.now();
  let r: IperfRun, wallSeconds = 0, after: Record<string, number> = {}, everyoneAfter = everyoneBefore;
  let threadsAfter: Array<ReturnType<typeof threadCpu>> = [];
  try {
    r = await iperf(scope, topo.a, subject.target, { seconds: opts.duration, omitSeconds: opts.omit, reverse: options.reverse, parallel: options.streams }, watch);
    wallSeconds = (performance.now() - t0) / 1000;
    after = cpuBySide(subject);
    threadsAfter = subject.processes.map((p) => threadCpu(p.pid));
    everyoneAfter = snapshotAllProcesses();
  } finally {
    if (stopSampling) options.sampleQueues!.push(...await stopSampling());
  }
  const foreign = foreignCpu(everyoneBefore, everyoneAfter, ctx.ownNetns, process.pid);
  const bySide: Record<string, number> = {};
  for (const side of Object.keys(after)) bySide[side] = after[side] - (before[side] ?? 0);
  if (foreign.seconds > 0.1 * wallSeconds) {
    ctx.progress(`  warning: other processes used ${foreign.seconds.toFixed(1)} CPU-s during this ${wallSeconds.toFixed(0)} s run (${formatTop(foreign.top)}): figures are low`);
  }
  for (const p of subject.processes) {
    if (!p.process.running) throw new Error(`${p.process.label} exited during the measurement\n${p.process.describe()}`);
  }
  return {
    direction: options.reverse ? 'b-to-a' : 'a-to-b',
    streams: options.streams,
    gbps: r.bitsPerSecond / 1e9,
    retransmits: r.retransmits,
    totalBytes: r.totalBytes,
    wallSeconds,
    tunnelCpuSeconds: Object.values(bySide).reduce((a, b) => a + b, 0),
    tunnelCpuBySide: bySide,
    ...(subject.processes.length > 0 ? { tunnelCpuSplit: cpuSplit(threadsBefore, threadsAfter) } : {}),
    foreignCpuSeconds: foreign.seconds,
    foreignTop: foreign.top,
    iperf: r,
  };
}

const mbit = (bps: number) => (bps >= 1e9 ? `${(bps / 1e9).toFixed(2)} Gbit/s` : `${(bps / 1e6).toFixed(0)} Mbit/s`);

/** The UDP sweep of one subject, starting from half its one-stream TCP rate. */
async function udpSweep(ctx: Context, scope: Scope, subject: RunningSubject, watch: NsProcess[], result: SubjectResult): Promise<void> {
  const { opts, topo } = ctx;
  const tcp = median(result.runs.filter((r) => r.direction === 'a-to-b').map((r) => r.gbps * 1e9));
  const startBps = Number.isFinite(tcp) && tcp > 0 ? Math.max(UDP_SWEEP.minBps, tcp / 2) : UDP_SWEEP.fallbackStartBps;
  const sweep = await sweepRate(
    async (bps) => {
      const probe = await iperfUdp(scope, topo.a, subject.target, { seconds: opts.udpProbeSeconds, bitsPerSecond: bps, payloadBytes: opts.udpSize }, watch);
      await sleep(300); // let the queues drain before the next probe
      return probe;
    },
    { startBps, minBps: UDP_SWEEP.minBps, maxBps: UDP_SWEEP.maxBps, maxLoss: UDP_SWEEP.maxLoss, maxProbes: opts.udpProbes, precision: UDP_SWEEP.precision },
    (p: UdpProbe, i) => ctx.progress(`    UDP probe ${i + 1}/${opts.udpProbes}: asked ${mbit(p.targetBps)}, sent ${mbit(p.sentBps)}, received ${mbit(p.receivedBps)}, loss ${(p.lossFraction * 100).toFixed(2)} %${p.error ? ` (${p.error})` : ''}`),
  );
  result.udp = {
    payloadBytes: opts.udpSize, probeSeconds: opts.udpProbeSeconds, maxLoss: UDP_SWEEP.maxLoss, startBps,
    probes: sweep.probes, best: sweep.best, passingBps: sweep.passingBps, failingBps: sweep.failingBps, stoppedBy: sweep.stoppedBy,
  };
}

/**
 * One idle-ping series: the subject started afresh, primed like its block, `opts.pingWarmup`
 * echoes (the fresh-start answers), then the `opts.pings` measured ones.
 */
async function pingSeries(spec: SubjectSpec, ctx: Context): Promise<{ fresh?: PingResult; measured: PingResult }> {
  const { topo, opts } = ctx;
  const scope = new Scope();
  try {
    const primed = spec.kind !== 'raw' && opts.prime > 0;
    if (primed) await startIperfServer(scope, topo.b);
    const subject = await startSubject(scope, topo, spec);
    if (primed) await iperf(scope, topo.a, subject.target, { seconds: opts.prime, omitSeconds: 0 }, subject.processes.map((p) => p.process));
    const fresh = opts.pingWarmup > 0 ? await ping(topo.a, subject.target, opts.pingWarmup, opts.pingInterval) : undefined;
    return { fresh, measured: await ping(topo.a, subject.target, opts.pings, opts.pingInterval) };
  } finally {
    await scope.cleanup();
  }
}

async function measureSubject(spec: SubjectSpec, result: SubjectResult, ctx: Context, steps: Step[]): Promise<void> {
  const { topo, opts, step } = ctx;
  const mine = steps.filter((s) => s.subject === spec);
  const take = (kind: Step['kind']) => mine.filter((s) => s.kind === kind);
  const scope = new Scope();
  try {
    for (const s of take('startup')) {
      step(s, `${opts.startups} starts of one daemon alone: time until its control socket answers, RSS after ${opts.startupIdleMs / 1000} s idle, then ${IDLE_CPU_WINDOW_MS / 1000} s of idle CPU and wake-ups`);
      // Its own scope: every daemon of this step is stopped before the tunnel starts.
      const startupScope = new Scope();
      try {
        result.startup = await measureStartup(startupScope, topo.a, spec, opts.startups, opts.startupIdleMs);
      } finally {
        await startupScope.cleanup();
      }
    }
    step(take('start')[0], spec.kind === 'raw' ? 'start' : 'starting both sides, configuring with wg, first handshake');
    // A server per subject: a run broken by a dead tunnel cannot leave it busy for the next one.
    await startIperfServer(scope, topo.b);
    const subject = await startSubject(scope, topo, spec);
    Object.assign(result.info, subject.info);
    const watch = subject.processes.map((p) => p.process);

    for (const s of take('prime')) {
      step(s, `priming transfer, ${opts.prime} s, not recorded`);
      result.primeGbps = (await iperf(scope, topo.a, subject.target, { seconds: opts.prime, omitSeconds: 0 }, watch)).bitsPerSecond / 1e9;
    }

    const countersBefore = await readCounters(topo, subject);
    const queueSamples: Array<Record<string, QueueSample>> = [];
    for (const s of take('iperf')) {
      step(s, `iperf3 TCP 1 stream ${s.reverse ? 'B→A' : 'A→B'} run ${s.run}/${opts.runs}, ${opts.duration} s + ${opts.omit} s warm-up`);
      result.runs.push(await timedTcpRun(ctx, scope, subject, watch, { reverse: s.reverse, streams: 1, sampleQueues: s.reverse ? undefined : queueSamples }));
    }
    summarizeQueues(result, queueSamples);
    const countersAfter = await readCounters(topo, subject);
    for (const key of Object.keys(countersAfter)) result.counters[key] = difference(countersBefore[key] ?? {}, countersAfter[key]);

    for (const s of take('parallel')) {
      step(s, `iperf3 TCP ${opts.streams} streams A→B run ${s.run}/${opts.runs}, ${opts.duration} s + ${opts.omit} s warm-up`);
      (result.parallelRuns ??= []).push(await timedTcpRun(ctx, scope, subject, watch, { streams: opts.streams }));
    }

    for (const s of take('udp')) {
      step(s, `UDP sweep, ${opts.udpSize} B datagrams, highest rate with < ${UDP_SWEEP.maxLoss * 100} % loss, up to ${opts.udpProbes} probes of ${opts.udpProbeSeconds} s`);
      await udpSweep(ctx, scope, subject, watch, result);
      for (const p of subject.processes) {
        if (!p.process.running) throw new Error(`${p.process.label} exited during the UDP sweep\n${p.process.describe()}`);
      }
    }

    for (const p of subject.processes) {
      const m = memoryStatus(p.pid);
      result.processes.push({ side: p.side, comm: p.comm, pid: p.pid, ifname: p.ifname, peakRssBytes: m.peakRssBytes, threads: m.threads });
    }
    result.status = 'ok';
  } finally {
    await scope.cleanup();
  }
}

/** Runs the suite; `progress` receives one line per step. Throws only when the topology fails. */
export async function runBench(opts: BenchOptions, command: string, progress: Progress): Promise<BenchResults> {
  const started = new Date();
  const specs = opts.subjects.map((id) => SUBJECTS.find((s) => s.id === id)!)
    .map((spec) => spec.fromBaseline && opts.baseline ? { ...spec, bin: join(opts.baseline, 'bin', 'roamguard') } : spec)
    .map((spec) => spec.build === 'modern' && opts.wireguardGoModern ? { ...spec, bin: opts.wireguardGoModern } : spec);
  const results: SubjectResult[] = specs.map((spec) => ({
    id: spec.id, label: spec.label, kind: spec.kind, status: 'skipped', info: {}, runs: [], processes: [], counters: {},
  }));
  // A stale checkout is a mistake to fix, not a subject to skip: stop before measuring anything.
  for (const spec of specs) if (unavailableReason(spec) === undefined) requireCompiled(spec);
  const runnable: SubjectSpec[] = [];
  specs.forEach((spec, i) => {
    const reason = unavailableReason(spec);
    if (reason) {
      results[i].note = reason;
      progress(`note: ${spec.label}: ${reason}`);
    } else runnable.push(spec);
  });

  const microRuntimes: Array<'node' | 'bun'> = bunBinary() ? ['node', 'bun'] : ['node'];
  if (opts.micro && !bunBinary()) progress('note: microbenchmarks: bun is not installed (npm install bun): Node only');
  const steps = plan(runnable, opts, microRuntimes);
  const total = steps.length;
  const t0 = performance.now();
  const step = (s: Step, detail?: string) => {
    const index = steps.indexOf(s);
    const plannedDone = steps.slice(0, index).reduce((sum, x) => sum + x.seconds, 0);
    const plannedLeft = steps.slice(index).reduce((sum, x) => sum + x.seconds, 0);
    const left = estimateSecondsLeft(plannedLeft, plannedDone, (performance.now() - t0) / 1000);
    progress(`[${String(index + 1).padStart(String(total).length)}/${total}] ${s.label}: ${detail ?? s.kind} (${total - index - 1} steps, ~${formatDuration(left)} left)`);
  };

  const versions = collectVersions(opts.wireguardGoModern ?? WIREGUARD_GO_MODERN);
  const loadAverage = loadavg().map((l) => Math.round(l * 100) / 100);
  const topologyScope = new Scope();
  let foreignLoadBefore = 0;
  let micro: MicroSection | undefined;
  let scale: BenchResults['scale'];
  let scaleError: string | undefined;
  try {
    progress('setting up: two namespaces and a veth pair');
    const topo = await createPair(topologyScope);
    const ownNetns = new Set([namedNetnsInode(topo.a.name), namedNetnsInode(topo.b.name)]);

    // Is anything else using the CPUs? On a small machine that changes every figure.
    const quietBefore = snapshotAllProcesses();
    await new Promise((resolve) => setTimeout(resolve, 1000));
    const quiet = foreignCpu(quietBefore, snapshotAllProcesses(), ownNetns, process.pid);
    foreignLoadBefore = Math.round(quiet.seconds * 100) / 100;
    if (quiet.seconds > 0.1) {
      progress(`warning: the machine is busy: other processes used ${(quiet.seconds * 100).toFixed(0)} % of a core over the last second (${formatTop(quiet.top)}); load average ${loadAverage.join(' ')}. The figures will be low and noisy.`);
    }
    const ctx: Context = { topo, opts, ownNetns, step, progress };

    for (const spec of runnable) {
      const result = results[specs.indexOf(spec)];
      try {
        await measureSubject(spec, result, ctx, steps);
      } catch (err) {
        result.status = 'failed';
        result.note = (err as Error).message;
        progress(`FAILED: ${spec.label}: ${(err as Error).message.split('\n')[0]}`);
      }
    }

    const pings = new Map<SubjectSpec, Array<{ fresh?: PingResult; measured: PingResult }>>();
    for (const s of steps.filter((x) => x.kind === 'ping')) {
      const spec = s.subject!;
      if (results[specs.indexOf(spec)].status !== 'ok') continue; // its block failed: nothing to compare
      const warmup = opts.pingWarmup > 0 ? `${opts.pingWarmup} warm-up echoes, ` : '';
      step(s, `idle ping round ${s.run}/${opts.runs}: ${spec.kind === 'raw' ? '' : `started afresh, primed ${opts.prime} s, `}${warmup}${opts.pings} pings ${opts.pingInterval * 1000} ms apart`);
      try {
        const series = await pingSeries(spec, ctx);
        pings.set(spec, [...(pings.get(spec) ?? []), series]);
      } catch (err) {
        progress(`note: ${spec.label}: idle ping round ${s.run} failed: ${(err as Error).message.split('\n')[0]}`);
      }
    }

    for (const spec of runnable) {
      const result = results[specs.indexOf(spec)];
      const series = pings.get(spec);
      if (series !== undefined) {
        result.ping = mergePings(series.map((x) => x.measured));
        const fresh = series.flatMap((x) => (x.fresh ? [x.fresh] : []));
        if (fresh.length > 0) result.pingFresh = mergePings(fresh);
      }
      if (result.runs.length > 0 || result.parallelRuns || result.udp) result.summary = summarize(result, spec.kind);
    }

    for (const s of steps.filter((x) => x.kind === 'micro')) {
      const runtime = s.runtime!;
      step(s, `${runtime}: AEAD per provider, handshakes/s, allowed-IPs lookups, heap per peer (child process)`);
      micro ??= { runtimes: [], failures: [] };
      const microScope = new Scope();
      try {
        micro.runtimes.push(await runMicro(microScope, topo.a, runtime, { quick: opts.quick, peers: opts.peers }, progress));
      } catch (err) {
        micro.failures.push({ runtime, error: (err as Error).message });
        progress(`FAILED: microbenchmarks (${runtime}): ${(err as Error).message.split('\n')[0]}`);
      } finally {
        await microScope.cleanup();
      }
    }

    for (const s of steps.filter((x) => x.kind === 'scale')) {
      step(s, `one roamguard daemon, ${opts.peers} peers: RSS, set and get=1 times, ${opts.peers} simulated peers handshaking`);
      try {
        scale = await runScale(topo, {
          peers: opts.peers, getSamples: opts.getSamples, rate: opts.scaleRate, timeoutMs: opts.quick ? 25_000 : 40_000,
        }, progress);
      } catch (err) {
        scaleError = (err as Error).message;
        progress(`FAILED: scale run: ${scaleError.split('\n')[0]}`);
      }
    }
  } finally {
    progress('tearing down: tunnel processes, the iperf3 server, the veth pair, the namespaces');
    await topologyScope.cleanup();
  }

  const finished = new Date();
  const meta: BenchMeta = {
    command,
    started: started.toISOString(),
    finished: finished.toISOString(),
    elapsedSeconds: Math.round((finished.getTime() - started.getTime()) / 100) / 10,
    host: hostname(),
    kernel: release(),
    cpu: cpus()[0]?.model ?? 'unknown',
    cores: availableParallelism(),
    memoryBytes: totalmem(),
    versions,
    options: {
      duration: opts.duration, omit: opts.omit, prime: opts.prime, runs: opts.runs, pings: opts.pings, pingWarmup: opts.pingWarmup, pingInterval: opts.pingInterval,
      reverse: opts.reverse, quick: opts.quick, subjects: opts.subjects,
      parallel: opts.parallel, streams: opts.streams, udp: opts.udp, udpSize: opts.udpSize, udpProbeSeconds: opts.udpProbeSeconds, udpProbes: opts.udpProbes,
      startups: opts.startups, startupIdleMs: opts.startupIdleMs, micro: opts.micro, scale: opts.scale, peers: opts.peers, scaleRate: opts.scaleRate, getSamples: opts.getSamples,
    },
    foreignLoadBefore,
    loadAverage,
    topology: `two network namespaces joined by a veth pair (MTU 1500); tunnels with MTU ${TUNNEL_MTU}, one peer each side; iperf3 client in A, server in B`,
  };
  const out: BenchResults = { meta, subjects: results };
  if (micro) out.micro = micro;
  if (scale) out.scale = scale;
  if (scaleError) out.scaleError = scaleError;
  return out;
}
