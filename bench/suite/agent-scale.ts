/**
 * The agent-scale run: one real `roamguard agent` (which starts its real `roamguard wg`) in a
 * network namespace of a lab World, our API-compatible server holding N simulated Nodes
 * (agent-scale-cluster.ts), and churn at a set rate. The data plane is observed only through its
 * control socket (`get=1`, polled), the API server counts the agent's requests, and the agent's
 * own debug line per reconcile pass (`reconciled`: ms, CPU ms, full or not, UAPI operations,
 * bytes and ms) gives the cost of each pass.
 *
 * Phases: populate N Nodes → start the agent (start-up: until the data plane holds exactly what
 * the Nodes say) → steady state (no changes; requests, CPU, passes) → churn (`rate` changes/s
 * for `churnSeconds`: each change timed from its commit in the API server to the first `get=1`
 * that shows it) → settle (every change landed, and the data plane's peer set and allowed IPs
 * equal what the Nodes say: nothing lost, nothing left over, nothing duplicated).
 *
 * Timings are resolved to one poll (`pollIntervalMs` plus one `get=1`); a change counts as
 * landed when the `get=1` that showed it had completed, so latencies are on the high side.
 */
import { createWriteStream } from 'node:fs';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { Endpoint } from '../../dataplane/net/endpoint.ts';
import { formatPrefix } from '../../dataplane/net/ip.ts';
import { keyToBase64 } from '../../dataplane/noise/keys.ts';
import type { DeviceSnapshot } from '../../dataplane/uapi/uapi-protocol.ts';
import { World } from '../../lab/world.ts';
import { Scope, WG_SOCKET_DIR, type NsProcess } from '../../test/system/netns.ts';
import { prng } from '../../test/helpers/prng.ts';
import {
  CHANGE_KINDS, SimulatedCluster, compareCanonical, comparePeerSets, isEmptyDifference,
  type Change, type ChangeKind, type PeerSetDifference, type SeenPeer,
} from './agent-scale-cluster.ts';
import { cpuSeconds, memoryStatus } from './procfs.ts';
import { maximum, median, percentile } from './stats.ts';
import { uapiGet } from './uapi-client.ts';

export interface AgentScaleSettings {
  /** Simulated Nodes besides the agent's own. */
  nodes: number;
  /** Every natEvery-th simulated node is behind NAT (0 = none). */
  natEvery: number;
  /** Seconds without changes, measured. */
  steadySeconds: number;
  /** Changes per second during churn, and for how long. */
  churnRate: number;
  churnSeconds: number;
  /** Pause between two `get=1` of the observer. */
  pollIntervalMs: number;
  /** The agent's RESYNC_INTERVAL, s. */
  resyncIntervalS: number;
  startTimeoutMs: number;
  settleTimeoutMs: number;
  /** Extra environment for the agent (e.g. settings under test). */
  agentEnv?: Record<string, string>;
  /** Seed of the churn's choices (reproducible runs). */
  seed?: number;
  /** A file that gets the agent's whole log (for looking into single passes). */
  agentLog?: string;
}

export const AGENT_SCALE_DEFAULTS: Omit<AgentScaleSettings, 'nodes'> = {
  natEvery: 10, steadySeconds: 30, churnRate: 10, churnSeconds: 30, pollIntervalMs: 1000, resyncIntervalS: 10,
  startTimeoutMs: 300_000, settleTimeoutMs: 60_000,
};

/** One reconcile pass as the agent logged it. */
export interface PassRecord {
  wallMs: number;
  ms: number;
  full: boolean;
  cpuMs: number;
  peers?: number;
  uapiOperations?: number;
  uapiBytesSent?: number;
  uapiBytesReceived?: number;
  uapiMs?: number;
  /** The agent's steps (local, mesh, read, plan, set, observe, routes, nft), ms. */
  steps: Record<string, number>;
}

const STEP_NAMES = ['local', 'mesh', 'read', 'plan', 'set', 'observe', 'routes', 'nft'] as const;

export interface PassSummary {
  passes: number;
  full: number;
  medianMs: number;
  maxMs: number;
  medianCpuMs: number;
  /** Per pass: control-socket bytes (sent + received), operations, ms; medians. */
  medianUapiBytes: number;
  medianUapiOperations: number;
  medianUapiMs: number;
  /** Full passes alone (the periodic resync). */
  fullMedianMs: number;
  fullMedianCpuMs: number;
  /** Mean ms per pass of each step. */
  meanStepMs: Record<string, number>;
}

export interface WindowFigures {
  seconds: number;
  /** The agent's API requests in the window, per minute, by kind (list, watch, get, patch, other). */
  apiRequestsPerMinute: Record<string, number>;
  apiRequestsPerMinuteTotal: number;
  /** Node writes (PATCH/PUT) by the agent, per minute. */
  apiWritesPerMinute: number;
  /** CPU of the agent and of the data plane, seconds per second (1 = one core). */
  agentCpu: number;
  dataplaneCpu: number;
  passes: PassSummary;
  /** The machine's 1-minute load average at the end of the window (other work competes for the cores). */
  loadAverage: number;
}

export interface AgentScaleResult {
  nodes: number;
  natNodes: number;
  settings: AgentScaleSettings;
  startup: {
    /** From the agent's spawn to its "ready" line. */
    readyMs: number;
    /** From the spawn until a `get=1` showed exactly the peers the Nodes describe. */
    configuredMs: number;
    /** The first (full) pass that configured the peers, as the agent logged it. */
    firstPass?: PassRecord;
  };
  rss: { agentBytes: number; agentPeakBytes: number; dataplaneBytes: number; dataplanePeakBytes: number };
  wgShowMs: number;
  observerGet: { medianMs: number; maxMs: number; bytes: number };
  steady: WindowFigures;
  churn: WindowFigures & {
    changes: number;
    byKind: Record<string, number>;
    landed: number;
    /** Commit in the API server → first `get=1` showing it, ms (resolved to one poll: on the high side). */
    latency: { medianMs: number; p99Ms: number; maxMs: number };
    /** Change → the agent's set for it was answered (from the agent's log): the data plane had it. */
    applied: { count: number; medianMs: number; p99Ms: number; maxMs: number };
    /** The slowest changes to reach the data plane: what they were and when (ms after the churn began). */
    slowest: Array<{ kind: string; atMs: number; appliedMs: number }>;
  };
  final: PeerSetDifference & { expectedPeers: number; seenPeers: number };
  /** Changes that never reached the data plane within the settle time. */
  lost: Array<{ kind: ChangeKind; node: string }>;
  notes: string[];
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));


/** The data plane's peers in the model's terms (canonical text). */
export function seenPeers(snapshot: DeviceSnapshot): Map<string, SeenPeer> {
  const out = new Map<string, SeenPeer>();
  for (const p of snapshot.peers) {
    out.set(keyToBase64(p.publicKey), {
      allowedIps: p.allowedIps.map(formatPrefix).sort(compareCanonical),
      endpoint: p.endpoint ? (p.endpoint as Endpoint).toString() : undefined,
    });
  }
  return out;
}

/** Polls `get=1` until stopped; hands every snapshot to `onSnapshot` with the time it completed. */
class Observer {
  private stopped = false;
  private readonly done: Promise<void>;
  readonly getMs: number[] = [];
  bytes = 0;
  lastError: Error | undefined;
  latest: Map<string, SeenPeer> | undefined;

  constructor(socket: string, pollIntervalMs: number, onSnapshot: (peers: Map<string, SeenPeer>, sentAt: number, at: number) => void) {
    this.done = (async () => {
      while (!this.stopped) {
        const sentAt = performance.now();
        try {
          const g = await uapiGet(socket);
          const at = performance.now();
          this.getMs.push(g.ms);
          this.bytes = g.bytes;
          this.latest = seenPeers(g.snapshot);
          onSnapshot(this.latest, sentAt, at);
        } catch (err) {
          this.lastError = err as Error;
        }
        await sleep(pollIntervalMs);
      }
    })();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    await this.done;
  }
}

/** A peer the agent added, updated or removed, as its log says (written once the data plane answered the set). */
interface PeerActionRecord { wallMs: number; node?: string; keyPrefix?: string }

/**
 * When the data plane had `change`: the first peer action the agent logged for it at or after the
 * change (wall clock; the agent logs an action once its `set` was answered, and the data plane
 * answers a set once applied). Undefined when none was logged.
 */
function appliedAt(change: Change, actions: readonly PeerActionRecord[]): number | undefined {
  const changedAt = performance.timeOrigin + change.at;
  const prefix = change.removedKey?.slice(0, 8);
  const found = actions.find((a) => a.wallMs >= Math.floor(changedAt) && (prefix !== undefined ? a.keyPrefix === prefix : a.node === change.node));
  return found === undefined ? undefined : found.wallMs - changedAt;
}

/** Follows the agent's JSON log for its `reconciled` lines and its peer actions. */
function followPasses(agent: NsProcess, passes: PassRecord[], lines: string[], logFile?: string, actions: PeerActionRecord[] = []): void {
  const reader = createInterface({ input: agent.child.stderr! });
  const log = logFile === undefined ? undefined : createWriteStream(logFile);
  reader.on('close', () => log?.end());
  reader.on('line', (line) => {
    log?.write(`${line}\n`);
    if (!line.startsWith('{')) return;
    let record: Record<string, unknown>;
    try { record = JSON.parse(line) as Record<string, unknown>; } catch { return; }
    if (record.msg === 'ready: the Node list is synced and the mesh is configured') lines.push(line);
    if (record.msg === 'added a peer' || record.msg === 'updated a peer') actions.push({ wallMs: Date.parse(String(record.time)), node: String(record.node) });
    if (record.msg === 'removed a peer whose key no Node carries') actions.push({ wallMs: Date.parse(String(record.time)), keyPrefix: String(record.key) });
    if (record.msg !== 'reconciled') return;
    passes.push({
      wallMs: Date.parse(String(record.time)), ms: Number(record.ms), full: record.full === true, cpuMs: Number(record.cpuMs),
      peers: record.peers as number | undefined, uapiOperations: record.uapiOperations as number | undefined,
      uapiBytesSent: record.uapiBytesSent as number | undefined, uapiBytesReceived: record.uapiBytesReceived as number | undefined,
      uapiMs: record.uapiMs as number | undefined,
      steps: Object.fromEntries(STEP_NAMES.map((n) => [n, Number(record[`${n}Ms`] ?? 0)])),
    });
  });
}

function summarizePasses(passes: readonly PassRecord[]): PassSummary {
  const full = passes.filter((p) => p.full);
  return {
    passes: passes.length,
    full: full.length,
    medianMs: median(passes.map((p) => p.ms)),
    maxMs: maximum(passes.map((p) => p.ms)),
    medianCpuMs: median(passes.map((p) => p.cpuMs)),
    medianUapiBytes: median(passes.map((p) => (p.uapiBytesSent ?? 0) + (p.uapiBytesReceived ?? 0))),
    medianUapiOperations: median(passes.map((p) => p.uapiOperations ?? 0)),
    medianUapiMs: median(passes.map((p) => p.uapiMs ?? 0)),
    fullMedianMs: median(full.map((p) => p.ms)),
    fullMedianCpuMs: median(full.map((p) => p.cpuMs)),
    meanStepMs: Object.fromEntries(STEP_NAMES.map((n) => [n, passes.length === 0 ? 0 : passes.reduce((sum, p) => sum + (p.steps[n] ?? 0), 0) / passes.length])),
  };
}

function requestKind(r: { method: string; path: string; watch: boolean }): string {
  if (r.method === 'GET') return r.watch ? 'watch' : /^\/api\/v1\/nodes\/[^/]+$/.test(r.path) ? 'get' : r.path === '/api/v1/nodes' ? 'list' : 'other';
  if (r.method === 'PATCH' || r.method === 'PUT') return 'write';
  return 'other';
}

export async function runAgentScale(settings: AgentScaleSettings, progress: (line: string) => void): Promise<AgentScaleResult> {
  const scope = new Scope();
  const notes: string[] = [];
  // Deterministic, so a run's choices can be repeated.
  const random = prng(settings.seed ?? 18);
  try {
    const world = await World.create(scope, { backbone: { name: 'lan', ipv4: '10.77.0.0/24', ipv6: 'fd77::/64' }, keepLogBytes: 512 * 1024 });
    const api = world.api;
    const node = await world.addNode('node-1', 'lan', 1, {
      podCidrs: ['10.244.1.0/24', 'fd00:244:1::/64'],
      env: { LOG_FORMAT: 'json', LOG_LEVEL: 'debug', RESYNC_INTERVAL: String(settings.resyncIntervalS), ...settings.agentEnv },
    });
    progress(`    ${settings.nodes} simulated Nodes in the API server`);
    const cluster = await SimulatedCluster.create(api, { natEvery: settings.natEvery });
    cluster.populate(settings.nodes);
    const natNodes = [...cluster.nodes.values()].filter((n) => n.natEndpoint).length;

    const changes: Array<Change & { landedAt?: number }> = [];
    let configuredAt: number | undefined;
    const socket = join(WG_SOCKET_DIR, `${node.ifname}.sock`);
    const observer = new Observer(socket, settings.pollIntervalMs, (peers, sentAt, at) => {
      if (configuredAt === undefined && isEmptyDifference(comparePeerSets(cluster.expectedPeers(), peers))) configuredAt = at;
      for (const c of changes) if (c.landedAt === undefined && c.at < sentAt && c.landed(peers)) c.landedAt = at;
    });
    scope.defer('stop the data plane observer', () => observer.stop());

    progress(`    starting the agent (it starts its data plane)`);
    const spawnedAt = performance.now();
    const passes: PassRecord[] = [];
    const readyLines: string[] = [];
    const started = world.startAgent(node, {}, { readyTimeoutMs: settings.startTimeoutMs });
    const actions: PeerActionRecord[] = [];
    followPasses(node.agent!, passes, readyLines, settings.agentLog, actions);
    let readyAt: number | undefined;
    void started.then(() => { readyAt = performance.now(); }, () => undefined);
    await started;
    const startDeadline = spawnedAt + settings.startTimeoutMs;
    while (configuredAt === undefined && performance.now() < startDeadline && node.agent?.running) await sleep(50);
    if (configuredAt === undefined) throw new Error(`the data plane did not hold the ${settings.nodes} peers within ${settings.startTimeoutMs} ms\n${node.agent?.describe()}`);
    const agentPid = node.agent!.pid;
    const dataplanePid = await world.dataplanePid(node);
    if (dataplanePid === undefined) throw new Error('cannot find the data plane process');
    const firstPass = passes.find((p) => (p.uapiBytesSent ?? 0) > 1000);
    progress(`    configured after ${((configuredAt - spawnedAt) / 1000).toFixed(1)} s (ready after ${(((readyAt ?? NaN) - spawnedAt) / 1000).toFixed(1)} s)`);

    const window = async (seconds: number, during?: () => Promise<void>): Promise<WindowFigures> => {
      api.clearRequests();
      const fromWall = Date.now();
      const from = performance.now();
      const agentCpu0 = cpuSeconds(agentPid), planeCpu0 = cpuSeconds(dataplanePid);
      if (during) await during(); else await sleep(seconds * 1000);
      const elapsed = (performance.now() - from) / 1000;
      const agentCpu = (cpuSeconds(agentPid) - agentCpu0) / elapsed;
      const dataplaneCpu = (cpuSeconds(dataplanePid) - planeCpu0) / elapsed;
      const byKind: Record<string, number> = {};
      for (const r of api.requests) byKind[requestKind(r)] = (byKind[requestKind(r)] ?? 0) + 1;
      const perMinute = (n: number) => n / (elapsed / 60);
      const toWall = Date.now();
      return {
        seconds: elapsed,
        apiRequestsPerMinute: Object.fromEntries(Object.entries(byKind).map(([k, n]) => [k, perMinute(n)])),
        apiRequestsPerMinuteTotal: perMinute(api.requests.length),
        apiWritesPerMinute: perMinute(byKind.write ?? 0),
        agentCpu, dataplaneCpu,
        passes: summarizePasses(passes.filter((p) => p.wallMs >= fromWall && p.wallMs <= toWall)),
        loadAverage: loadavg()[0],
      };
    };

    // Resources and read-out times with every peer configured.
    const wgShowTimes: number[] = [];
    for (let i = 0; i < 3; i++) {
      const t = performance.now();
      await node.ns.exec('wg', ['show', node.ifname, 'dump']);
      wgShowTimes.push(performance.now() - t);
    }

    progress(`    steady state for ${settings.steadySeconds} s`);
    const steady = await window(settings.steadySeconds);

    progress(`    churn: ${settings.churnRate} changes/s for ${settings.churnSeconds} s`);
    const touched = new Set<string>();
    const total = Math.round(settings.churnRate * settings.churnSeconds);
    const churn = await window(settings.churnSeconds, async () => {
      const t0 = performance.now();
      for (let k = 0; k < total; k++) {
        const due = t0 + (k * 1000) / settings.churnRate;
        const wait = due - performance.now();
        if (wait > 0) await sleep(wait);
        const kind = CHANGE_KINDS[k % CHANGE_KINDS.length];
        const change = cluster.change(kind, touched, random);
        if (change) changes.push(change);
        else notes.push(`no node left for a ${kind} change`);
      }
      const end = t0 + settings.churnSeconds * 1000;
      if (end > performance.now()) await sleep(end - performance.now());
    });

    progress(`    waiting for every change to land`);
    const settleDeadline = performance.now() + settings.settleTimeoutMs;
    let diff = comparePeerSets(cluster.expectedPeers(), observer.latest ?? new Map());
    while (performance.now() < settleDeadline) {
      diff = comparePeerSets(cluster.expectedPeers(), observer.latest ?? new Map());
      if (changes.every((c) => c.landedAt !== undefined) && isEmptyDifference(diff)) break;
      await sleep(200);
    }
    // One fresh look at the end, taken after everything else.
    const last = seenPeers((await uapiGet(socket)).snapshot);
    const expected = cluster.expectedPeers();
    diff = comparePeerSets(expected, last);

    const agentMemory = memoryStatus(agentPid);
    const planeMemory = memoryStatus(dataplanePid);
    await observer.stop();
    if (observer.lastError && observer.getMs.length === 0) notes.push(`get=1 failed: ${observer.lastError.message}`);

    const latencies = changes.filter((c) => c.landedAt !== undefined).map((c) => c.landedAt! - c.at);
    const timed = changes.map((c) => ({ change: c, ms: appliedAt(c, actions) })).filter((t): t is { change: Change; ms: number } => t.ms !== undefined);
    const applied = timed.map((t) => t.ms);
    const churnStart = changes.length > 0 ? Math.min(...changes.map((c) => c.at)) : 0;
    const slowest = [...timed].sort((a, b) => b.ms - a.ms).slice(0, 5)
      .map((t) => ({ kind: t.change.kind, atMs: Math.round(t.change.at - churnStart), appliedMs: Math.round(t.ms) }));
    const byKind: Record<string, number> = {};
    for (const c of changes) byKind[c.kind] = (byKind[c.kind] ?? 0) + 1;
    return {
      nodes: settings.nodes, natNodes, settings,
      startup: { readyMs: (readyAt ?? Number.NaN) - spawnedAt, configuredMs: configuredAt - spawnedAt, firstPass },
      rss: { agentBytes: agentMemory.rssBytes, agentPeakBytes: agentMemory.peakRssBytes, dataplaneBytes: planeMemory.rssBytes, dataplanePeakBytes: planeMemory.peakRssBytes },
      wgShowMs: median(wgShowTimes),
      observerGet: { medianMs: median(observer.getMs), maxMs: maximum(observer.getMs), bytes: observer.bytes },
      steady,
      churn: {
        ...churn, changes: changes.length, byKind, landed: latencies.length,
        latency: { medianMs: median(latencies), p99Ms: percentile(latencies, 99), maxMs: maximum(latencies) },
        applied: { count: applied.length, medianMs: median(applied), p99Ms: percentile(applied, 99), maxMs: maximum(applied) },
        slowest,
      },
      final: { ...diff, expectedPeers: expected.size, seenPeers: last.size },
      lost: changes.filter((c) => c.landedAt === undefined).map((c) => ({ kind: c.kind, node: c.node })),
      notes,
    };
  } finally {
    await scope.cleanup();
  }
}

const ms = (v: number) => (Number.isFinite(v) ? (v >= 1000 ? `${(v / 1000).toFixed(2)} s` : `${Math.round(v)} ms`) : '–');
const mib = (b: number) => `${(b / 1048576).toFixed(0)} MiB`;
const kib = (b: number) => `${(b / 1024).toFixed(0)} KiB`;
const rate = (v: number | undefined) => (v === undefined ? '0' : v.toFixed(1));

/** The results as a Markdown table, one column per N. */
export function renderAgentScale(results: readonly AgentScaleResult[], command: string): string {
  const row = (label: string, f: (r: AgentScaleResult) => string) => `| ${label} | ${results.map(f).join(' | ')} |`;
  const lines = [
    `Agent-scale run: \`${command}\``,
    '',
    `| | ${results.map((r) => `N = ${r.nodes}`).join(' | ')} |`,
    `|---|${results.map(() => '---:').join('|')}|`,
    row('simulated Nodes (behind NAT)', (r) => `${r.nodes} (${r.natNodes})`),
    row('start-up: spawn → ready', (r) => ms(r.startup.readyMs)),
    row('start-up: spawn → data plane holds every peer', (r) => ms(r.startup.configuredMs)),
    row('first pass (all peers): time / CPU', (r) => (r.startup.firstPass ? `${ms(r.startup.firstPass.ms)} / ${ms(r.startup.firstPass.cpuMs)}` : '–')),
    row('first pass: UAPI bytes / time', (r) => (r.startup.firstPass ? `${kib((r.startup.firstPass.uapiBytesSent ?? 0) + (r.startup.firstPass.uapiBytesReceived ?? 0))} / ${ms(r.startup.firstPass.uapiMs ?? NaN)}` : '–')),
    row('change → data plane applied it (agent\'s set answered), median', (r) => ms(r.churn.applied.medianMs)),
    row('change → data plane applied it, p99 (max) [changes timed]', (r) => `${ms(r.churn.applied.p99Ms)} (${ms(r.churn.applied.maxMs)}) [${r.churn.applied.count}]`),
    row('slowest changes: kind at s into the churn → ms', (r) => r.churn.slowest.map((x) => `${x.kind}@${(x.atMs / 1000).toFixed(1)} → ${x.appliedMs}`).join(', ')),
    row('change → observer\'s get=1 showed it, median', (r) => ms(r.churn.latency.medianMs)),
    row('change → observer\'s get=1 showed it, p99 (max)', (r) => `${ms(r.churn.latency.p99Ms)} (${ms(r.churn.latency.maxMs)})`),
    row('changes made / landed', (r) => `${r.churn.changes} / ${r.churn.landed}`),
    row('final peer set = Nodes', (r) => (isEmptyDifference(r.final) ? `yes (${r.final.seenPeers} peers)` : `NO: ${r.final.missing.length} missing, ${r.final.extra.length} extra, ${r.final.wrong.length} wrong`)),
    row('full resync pass: time / CPU (median)', (r) => `${ms(r.steady.passes.fullMedianMs)} / ${ms(r.steady.passes.fullMedianCpuMs)}`),
    row('steady: passes/min (full)', (r) => `${rate(r.steady.passes.passes / (r.steady.seconds / 60))} (${rate(r.steady.passes.full / (r.steady.seconds / 60))})`),
    row('steady: pass time / CPU (median)', (r) => `${ms(r.steady.passes.medianMs)} / ${ms(r.steady.passes.medianCpuMs)}`),
    row('steady: mean ms per pass by step', (r) => STEP_NAMES.map((n) => `${n} ${Math.round(r.steady.passes.meanStepMs[n] ?? 0)}`).join(', ')),
    row('steady: UAPI per pass: bytes / ops / time', (r) => `${kib(r.steady.passes.medianUapiBytes)} / ${r.steady.passes.medianUapiOperations} / ${ms(r.steady.passes.medianUapiMs)}`),
    row('steady: agent CPU / data plane CPU (cores)', (r) => `${r.steady.agentCpu.toFixed(3)} / ${r.steady.dataplaneCpu.toFixed(3)}`),
    row('steady: API requests/min (writes)', (r) => `${rate(r.steady.apiRequestsPerMinuteTotal)} (${rate(r.steady.apiWritesPerMinute)})`),
    row('churn: passes/min', (r) => rate(r.churn.passes.passes / (r.churn.seconds / 60))),
    row('churn: pass time / CPU (median)', (r) => `${ms(r.churn.passes.medianMs)} / ${ms(r.churn.passes.medianCpuMs)}`),
    row('churn: mean ms per pass by step', (r) => STEP_NAMES.map((n) => `${n} ${Math.round(r.churn.passes.meanStepMs[n] ?? 0)}`).join(', ')),
    row('churn: UAPI per pass: bytes / ops / time', (r) => `${kib(r.churn.passes.medianUapiBytes)} / ${r.churn.passes.medianUapiOperations} / ${ms(r.churn.passes.medianUapiMs)}`),
    row('churn: agent CPU / data plane CPU (cores)', (r) => `${r.churn.agentCpu.toFixed(3)} / ${r.churn.dataplaneCpu.toFixed(3)}`),
    row('churn: API requests/min (writes)', (r) => `${rate(r.churn.apiRequestsPerMinuteTotal)} (${rate(r.churn.apiWritesPerMinute)})`),
    row('machine load average (1 min): steady / churn', (r) => `${r.steady.loadAverage.toFixed(1)} / ${r.churn.loadAverage.toFixed(1)}`),
    row('agent RSS (peak)', (r) => `${mib(r.rss.agentBytes)} (${mib(r.rss.agentPeakBytes)})`),
    row('data plane RSS (peak)', (r) => `${mib(r.rss.dataplaneBytes)} (${mib(r.rss.dataplanePeakBytes)})`),
    row('`wg show dump` (via ip netns exec)', (r) => ms(r.wgShowMs)),
    row('observer get=1: median / max / size', (r) => `${ms(r.observerGet.medianMs)} / ${ms(r.observerGet.maxMs)} / ${kib(r.observerGet.bytes)}`),
  ];
  const notes = results.flatMap((r) => r.notes.map((n) => `N = ${r.nodes}: ${n}`));
  if (notes.length > 0) lines.push('', ...notes.map((n) => `- ${n}`));
  return `${lines.join('\n')}\n`;
}
