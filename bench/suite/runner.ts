/**
 * Runs the benchmark suite: one topology (two namespaces joined by one veth pair), then each
 * subject in turn on it: iperf3 server in B, tunnel start up to a first ping, an unrecorded
 * priming transfer, the ping series, the iperf3 runs (with CPU, queue and drop figures), peak
 * RSS, stop. Every subject has a scope of its own that is cleaned up before the next starts;
 * the topology's scope is cleaned up at the end, also on failure. Ctrl-C and SIGTERM are handled
 * by the namespace helpers' last-resort cleanup (processes by pid, then the namespaces).
 */
import { spawnSync } from 'node:child_process';
import { availableParallelism, cpus, hostname, loadavg, release, totalmem } from 'node:os';
import {
  Scope, createPair, which, type PairTopology,
} from '../../test/system/netns.ts';
import { difference, linkCounters, sampleQueues, udpCounters, type Counters, type QueueSample } from './counters.ts';
import { cpuSeconds, foreignCpu, formatTop, memoryStatus, namedNetnsInode, snapshotAllProcesses } from './procfs.ts';
import type { BenchOptions } from './options.ts';
import type { BenchMeta, BenchResults, RunRecord, SubjectResult, SubjectSummary } from './results.ts';
import { maximum, median, minimum } from './stats.ts';
import { LISTEN_PORT, SUBJECTS, TUNNEL_MTU, bunBinary, startSubject, unavailableReason, type RunningSubject, type SubjectSpec } from './subjects.ts';
import { iperf, ping, startIperfServer, type IperfRun } from './tools.ts';

export type Progress = (line: string) => void;

interface Step {
  subject: SubjectSpec;
  kind: 'start' | 'prime' | 'ping' | 'iperf';
  run?: number;
  reverse?: boolean;
  /** Expected seconds, for the time-left estimate. */
  seconds: number;
}

function plan(specs: SubjectSpec[], opts: BenchOptions): Step[] {
  const steps: Step[] = [];
  const iperfSeconds = opts.duration + opts.omit + 0.7;
  for (const subject of specs) {
    steps.push({ subject, kind: 'start', seconds: subject.kind === 'raw' ? 0.1 : subject.kind === 'roamguard' ? 3 : 1.5 });
    if (subject.kind !== 'raw' && opts.prime > 0) steps.push({ subject, kind: 'prime', seconds: opts.prime + 0.7 });
    steps.push({ subject, kind: 'ping', seconds: opts.pings * opts.pingInterval + 0.3 });
    for (let r = 1; r <= opts.runs; r++) steps.push({ subject, kind: 'iperf', run: r, seconds: iperfSeconds });
    if (opts.reverse) for (let r = 1; r <= opts.runs; r++) steps.push({ subject, kind: 'iperf', run: r, reverse: true, seconds: iperfSeconds });
  }
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

const formatDuration = (s: number) => (s >= 60 ? `${Math.floor(s / 60)}m${String(Math.round(s % 60)).padStart(2, '0')}s` : `${Math.round(s)}s`);

function version(cmd: string, args: string[], pattern: RegExp = /\S.*/): string {
  const r = spawnSync(cmd, args, { encoding: 'utf8', timeout: 10_000 });
  const text = `${r.stdout ?? ''}\n${r.stderr ?? ''}`;
  return r.status === 0 ? (pattern.exec(text)?.[0] ?? '?').trim() : 'unavailable';
}

function collectVersions(): Record<string, string> {
  const versions: Record<string, string> = {
    node: version('node', ['--version']),
    iperf3: version('iperf3', ['--version'], /iperf [\d.]+/),
    'wireguard-tools': version('wg', ['--version'], /v[\d.]+/),
  };
  const bun = bunBinary();
  versions.bun = bun ? version(bun, ['--version']) : 'not installed';
  versions['wireguard-go'] = which('wireguard-go') ? version('wireguard-go', ['--version'], /v[\d.]+/) : 'not installed';
  return versions;
}

/** The tunnel processes' CPU seconds by side (empty for the raw link). */
function cpuBySide(subject: RunningSubject): Record<string, number> {
  const out: Record<string, number> = {};
  for (const p of subject.processes) out[p.side] = cpuSeconds(p.pid);
  return out;
}

function summarize(result: SubjectResult, kind: string): SubjectSummary {
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
  if (kind !== 'raw' && result.runs.length > 0) {
    const cpu = result.runs.reduce((s, r) => s + r.tunnelCpuSeconds, 0);
    const bytes = result.runs.reduce((s, r) => s + r.totalBytes, 0);
    const wall = result.runs.reduce((s, r) => s + r.wallSeconds, 0);
    summary.cpuSecondsPerGB = bytes > 0 ? cpu / (bytes / 1e9) : Number.NaN;
    summary.cpuPercent = wall > 0 ? (100 * cpu) / wall : Number.NaN;
  }
  if (result.processes.length > 0) summary.peakRssBytes = Math.max(...result.processes.map((p) => p.peakRssBytes));
  const wall = result.runs.reduce((s, r) => s + r.wallSeconds, 0);
  summary.foreignCpuLoad = wall > 0 ? result.runs.reduce((s, r) => s + r.foreignCpuSeconds, 0) / wall : 0;
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
  steps: Step[];
  step: (s: Step, detail?: string) => void;
  progress: Progress;
}

async function measureSubject(spec: SubjectSpec, result: SubjectResult, ctx: Context): Promise<void> {
  const { topo, opts, step } = ctx;
  const mine = ctx.steps.filter((s) => s.subject === spec);
  const next = () => mine.shift()!;
  const scope = new Scope();
  try {
    step(next(), spec.kind === 'raw' ? 'start' : 'starting both sides, configuring with wg, first handshake');
    // A server per subject: a run broken by a dead tunnel cannot leave it busy for the next one.
    await startIperfServer(scope, topo.b);
    const subject = await startSubject(scope, topo, spec);
    Object.assign(result.info, subject.info);
    const watch = subject.processes.map((p) => p.process);

    if (spec.kind !== 'raw' && opts.prime > 0) {
      step(next(), `priming transfer, ${opts.prime} s, not recorded`);
      result.primeGbps = (await iperf(scope, topo.a, subject.target, { seconds: opts.prime, omitSeconds: 0 }, watch)).bitsPerSecond / 1e9;
    }

    step(next(), `${opts.pings} pings, ${opts.pingInterval * 1000} ms apart`);
    result.ping = await ping(topo.a, subject.target, opts.pings, opts.pingInterval);

    const countersBefore = await readCounters(topo, subject);
    const queueSamples: Array<Record<string, QueueSample>> = [];
    for (const s of mine) {
      step(s, `iperf3 TCP ${s.reverse ? 'B→A' : 'A→B'} run ${s.run}/${opts.runs}, ${opts.duration} s + ${opts.omit} s warm-up`);
      const everyoneBefore = snapshotAllProcesses();
      const before = cpuBySide(subject);
      const stopSampling = !s.reverse && subject.processes.length > 0 ? startQueueSampler(topo, subject, opts.omit * 1000 + 500) : undefined;
      const t0 = performance.now();
      let r: IperfRun | undefined, wallSeconds = 0, after: Record<string, number> = {}, everyoneAfter = everyoneBefore;
      try {
        r = await iperf(scope, topo.a, subject.target, { seconds: opts.duration, omitSeconds: opts.omit, reverse: s.reverse }, watch);
        wallSeconds = (performance.now() - t0) / 1000;
        after = cpuBySide(subject);
        everyoneAfter = snapshotAllProcesses();
      } finally {
        if (stopSampling) queueSamples.push(...await stopSampling());
      }
      const foreign = foreignCpu(everyoneBefore, everyoneAfter, ctx.ownNetns, process.pid);
      const bySide: Record<string, number> = {};
      for (const side of Object.keys(after)) bySide[side] = after[side] - (before[side] ?? 0);
      result.runs.push({
        direction: s.reverse ? 'b-to-a' : 'a-to-b',
        gbps: r.bitsPerSecond / 1e9,
        retransmits: r.retransmits,
        totalBytes: r.totalBytes,
        wallSeconds,
        tunnelCpuSeconds: Object.values(bySide).reduce((a, b) => a + b, 0),
        tunnelCpuBySide: bySide,
        foreignCpuSeconds: foreign.seconds,
        foreignTop: foreign.top,
        iperf: r,
      } satisfies RunRecord);
      if (foreign.seconds > 0.1 * wallSeconds) {
        ctx.progress(`  warning: other processes used ${foreign.seconds.toFixed(1)} CPU-s during this ${wallSeconds.toFixed(0)} s run (${formatTop(foreign.top)}): figures are low`);
      }
      for (const p of subject.processes) {
        if (!p.process.running) throw new Error(`${p.process.label} exited during the measurement\n${p.process.describe()}`);
      }
    }
    summarizeQueues(result, queueSamples);
    const countersAfter = await readCounters(topo, subject);
    for (const key of Object.keys(countersAfter)) result.counters[key] = difference(countersBefore[key] ?? {}, countersAfter[key]);
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
  const specs = opts.subjects.map((id) => SUBJECTS.find((s) => s.id === id)!);
  const results: SubjectResult[] = specs.map((spec) => ({
    id: spec.id, label: spec.label, kind: spec.kind, status: 'skipped', info: {}, runs: [], processes: [], counters: {},
  }));
  const runnable: SubjectSpec[] = [];
  specs.forEach((spec, i) => {
    const reason = unavailableReason(spec);
    if (reason) {
      results[i].note = reason;
      progress(`note: ${spec.label}: ${reason}`);
    } else runnable.push(spec);
  });

  const steps = plan(runnable, opts);
  const total = steps.length;
  let done = 0;
  const step = (s: Step, detail?: string) => {
    done = steps.indexOf(s) + 1;
    const left = steps.slice(done - 1).reduce((sum, x) => sum + x.seconds, 0);
    progress(`[${String(done).padStart(String(total).length)}/${total}] ${s.subject.label}: ${detail ?? s.kind} (${total - done} steps, ~${formatDuration(left)} left)`);
  };

  const versions = collectVersions();
  const loadAverage = loadavg().map((l) => Math.round(l * 100) / 100);
  const topologyScope = new Scope();
  let foreignLoadBefore = 0;
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
    const ctx: Context = { topo, opts, ownNetns, steps, step, progress };

    for (const spec of runnable) {
      const result = results[specs.indexOf(spec)];
      try {
        await measureSubject(spec, result, ctx);
      } catch (err) {
        result.status = 'failed';
        result.note = (err as Error).message;
        progress(`FAILED: ${spec.label}: ${(err as Error).message.split('\n')[0]}`);
      }
      if (result.runs.length > 0) result.summary = summarize(result, spec.kind);
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
      duration: opts.duration, omit: opts.omit, prime: opts.prime, runs: opts.runs, pings: opts.pings, pingInterval: opts.pingInterval,
      reverse: opts.reverse, quick: opts.quick, subjects: opts.subjects,
    },
    foreignLoadBefore,
    loadAverage,
    topology: `two network namespaces joined by a veth pair (MTU 1500); tunnels with MTU ${TUNNEL_MTU}, one peer each side; iperf3 client in A, server in B`,
  };
  return { meta, subjects: results };
}
