/**
 * `roamguard demo`: the NAT world of the scenario suite, built on this machine — an embedded
 * Kubernetes-API-compatible server, cloud nodes, an office NAT with two nodes behind one public
 * address, a home NAT with one node, a pod on each node — with a live table of nodes, peers,
 * endpoints (LAN or NAT mapping), handshakes, transfer and a pod-to-pod reachability matrix.
 *
 * Snapshots are plain data and rendering is a pure function (`renderDemo`), so the table is
 * unit-tested without namespaces.
 */
import { existsSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface, type Interface as ReadlineInterface } from 'node:readline';
import { kubeConfigFor } from './kube-api-server.ts';
import { Scope, which } from './netns.ts';
import { ping } from './probe.ts';
import { DEFAULT_SCENARIO, DEMO_SCENARIOS } from './demo-scenarios.ts';
import { describeRecord } from './demo-recovery.ts';
import { DemoSession } from './demo-session.ts';
import { startDemoWeb, type DemoWeb } from './demo-web.ts';
import type { Pod, WgPeerView, World } from './world.ts';

export interface DemoNode {
  name: string;
  site: string;
  address: string;
  /** Where the rest of the world sees it (its router's public address when NAT'd). */
  publicAddress: string;
  pod: { ipv4: string; ipv6: string };
}

/** `relay`: the endpoint is a relay node's port for the pair (`via` names the node). */
export type PathKind = 'LAN' | 'NAT' | 'public' | 'relay' | 'none';

export interface DemoPeer {
  from: string;
  /** The peer's node, or `?` and the key's first characters when no Node carries that key. */
  to: string;
  endpoint: string;
  path: PathKind;
  /** The relay node when `path` is `relay`. */
  via?: string;
  /** Seconds since the last handshake; undefined = never. */
  handshakeAgeS?: number;
  rxBytes: number;
  txBytes: number;
  /** Bytes per second since the previous snapshot (undefined on the first). */
  rxRate?: number;
  txRate?: number;
}

export interface DemoRouter {
  /** The router's name, which is also its LAN site's name. */
  name: string;
  publicAddress: string;
  lan: string;
}

export interface DemoSnapshot {
  nodes: DemoNode[];
  peers: DemoPeer[];
  /** from → to → [IPv4 ok, IPv6 ok] for pod-to-pod pings. */
  matrix: Record<string, Record<string, [boolean, boolean]>>;
  allGreen: boolean;
  takenAt: Date;
  /** When the probes began (ms since the epoch); takenAt is when they ended. */
  startedAt?: number;
  routers?: DemoRouter[];
  /** Node objects in the API that are no node of the demo (e.g. created with kubectl). */
  apiOnlyNodes?: string[];
}

/** Matrix cells (one per ordered pod pair and family) that failed. */
export function cellsDown(s: DemoSnapshot): number {
  let down = 0;
  for (const row of Object.values(s.matrix)) for (const [v4, v6] of Object.values(row)) down += (v4 ? 0 : 1) + (v6 ? 0 : 1);
  return down;
}

/** Adds per-second rates from the byte counters of the previous snapshot of the same pair. */
export function withRates(next: DemoSnapshot, previous: DemoSnapshot | undefined): DemoSnapshot {
  if (!previous) return next;
  const dt = (next.takenAt.getTime() - previous.takenAt.getTime()) / 1000;
  if (!(dt > 0)) return next;
  const before = new Map(previous.peers.map((p) => [`${p.from}>${p.to}`, p]));
  const rate = (now: number, then: number) => (now >= then ? (now - then) / dt : undefined); // a counter reset (new data plane) has no rate
  return {
    ...next,
    peers: next.peers.map((p) => {
      const old = before.get(`${p.from}>${p.to}`);
      return old ? { ...p, rxRate: rate(p.rxBytes, old.rxBytes), txRate: rate(p.txBytes, old.txBytes) } : p;
    }),
  };
}

export function formatRate(bytesPerSecond: number | undefined): string {
  if (bytesPerSecond === undefined) return '-';
  return `${formatBytes(Math.round(bytesPerSecond))}/s`;
}

export function formatBytes(n: number): string {
  if (n < 1024) return `${n} B`;
  const units = ['KiB', 'MiB', 'GiB', 'TiB'];
  let v = n / 1024, i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${v.toFixed(v < 10 ? 1 : 0)} ${units[i]}`;
}

export function formatAge(s: number | undefined): string {
  if (s === undefined) return 'never';
  if (s < 60) return `${Math.round(s)}s ago`;
  return `${Math.floor(s / 60)}m${String(Math.round(s % 60)).padStart(2, '0')}s ago`;
}

function table(header: string[], rows: string[][]): string[] {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
  const line = (cells: string[]) => cells.map((c, i) => c.padEnd(widths[i])).join('  ').trimEnd();
  return [line(header), ...rows.map(line)];
}

export interface DemoScreenExtras {
  /** Lines after the verdict: the fault log, the fault commands, where kubectl and the page are. */
  after?: string[];
}

/** The whole screen for one snapshot. */
export function renderDemo(s: DemoSnapshot, color = false, extras: DemoScreenExtras = {}): string {
  const green = (t: string) => (color ? `\x1b[32m${t}\x1b[0m` : t);
  const red = (t: string) => (color ? `\x1b[31m${t}\x1b[0m` : t);
  const out: string[] = [];
  out.push(`roamguard demo — ${s.nodes.length} nodes, ${new Set(s.nodes.map((n) => n.site)).size} sites, at ${s.takenAt.toISOString().slice(11, 19)}`);
  out.push('');
  out.push('NODES');
  out.push(...table(['node', 'site', 'address', 'seen from outside as', 'pod IPv4', 'pod IPv6'],
    s.nodes.map((n) => [n.name, n.site, n.address, n.publicAddress, n.pod.ipv4, n.pod.ipv6])));
  out.push('');
  out.push('PEERS (what each node\'s data plane reports)');
  out.push(...table(['from', 'to', 'endpoint', 'path', 'last handshake', 'received', 'sent', 'now (in/out)'],
    s.peers.map((p) => [p.from, p.to, p.endpoint || '(none)', p.path === 'relay' ? `relay via ${p.via ?? '?'}` : p.path, formatAge(p.handshakeAgeS), formatBytes(p.rxBytes), formatBytes(p.txBytes),
      p.rxRate === undefined && p.txRate === undefined ? '-' : `${formatRate(p.rxRate)} ${formatRate(p.txRate)}`])));
  if (s.apiOnlyNodes && s.apiOnlyNodes.length > 0) out.push('', `Node objects without a demo node (made with kubectl?): ${s.apiOnlyNodes.join(', ')}`);
  out.push('');
  out.push('REACHABILITY (pod → pod: IPv4 IPv6)');
  const names = s.nodes.map((n) => n.name);
  const cell = (from: string, to: string) => {
    if (from === to) return ' -  ';
    const [v4, v6] = s.matrix[from]?.[to] ?? [false, false];
    return `${v4 ? green('✓') : red('✗')}  ${v6 ? green('✓') : red('✗')}`;
  };
  const width = Math.max(4, ...names.map((n) => n.length));
  out.push(`${''.padEnd(width)}  ${names.map((n) => n.padEnd(4)).join('  ')}`);
  for (const from of names) out.push(`${from.padEnd(width)}  ${names.map((to) => cell(from, to)).join('  ')}`);
  out.push('');
  out.push(s.allGreen ? green('all pods reach all pods over IPv4 and IPv6') : red('some pods cannot reach each other (✗ above)'));
  if (extras.after && extras.after.length > 0) out.push('', ...extras.after);
  return out.join('\n');
}

/** What a peer's endpoint means: the peer's LAN address, a NAT router's mapping, or a public address. */
export function classifyPath(endpoint: string, peerLanAddress: string, natPublicAddresses: ReadonlySet<string>, peerIsPublic: boolean): PathKind {
  if (!endpoint || endpoint === '(none)') return 'none';
  const host = endpoint.startsWith('[') ? endpoint.slice(1, endpoint.indexOf(']')) : endpoint.slice(0, endpoint.lastIndexOf(':'));
  if (natPublicAddresses.has(host)) return 'NAT';
  if (host === peerLanAddress && !peerIsPublic) return 'LAN';
  return 'public';
}

/** Reads the world: every data plane, and a ping from every pod to every other pod (both families). */
export async function takeSnapshot(world: World, pods: ReadonlyMap<string, Pod>, previous?: DemoSnapshot): Promise<DemoSnapshot> {
  const startedAt = Date.now();
  const natPublic = new Map<string, string>();
  for (const router of world.routers.values()) natPublic.set(router.lan.spec.name, router.wan.ipv4);
  const publicSet = new Set(natPublic.values());
  const nodes: DemoNode[] = world.nodes.map((n) => ({
    name: n.name, site: n.segment.spec.name, address: n.ipv4, publicAddress: natPublic.get(n.segment.spec.name) ?? n.ipv4,
    pod: { ipv4: pods.get(n.name)?.ipv4 ?? '-', ipv6: pods.get(n.name)?.ipv6 ?? '-' },
  }));
  // Peers are named by the Node objects that carry their keys, the demo's own or not.
  const apiNodes = world.api.listNodes();
  const nameByKey = new Map<string, string>();
  for (const n of apiNodes) {
    const key = n.metadata.annotations?.['roamguard.io/public-key'];
    if (key) nameByKey.set(key, n.metadata.name);
  }
  // Relay ports every relay published (roamguard.io/relay-allocations): `ip:port` → relay node.
  const relayPorts = new Map<string, string>();
  for (const n of apiNodes) {
    const relay = world.nodes.find((w) => w.name === n.metadata.name);
    const text = n.metadata.annotations?.['roamguard.io/relay-allocations'];
    if (!relay || !text) continue;
    try {
      for (const ports of Object.values(JSON.parse(text) as Record<string, number[]>)) for (const port of ports) relayPorts.set(`${relay.ipv4}:${port}`, relay.name);
    } catch { /* not JSON: the agents ignore it too */ }
  }
  const now = Date.now() / 1000;
  const peers: DemoPeer[] = [];
  const matrix: DemoSnapshot['matrix'] = {};
  let allGreen = true;
  const probes = world.nodes.flatMap((from) => world.nodes.filter((to) => to !== from).map((to) => ({ from, to })));
  for (const from of world.nodes) matrix[from.name] = {};
  await Promise.all([
    ...world.nodes.map(async (node) => {
      const view = await world.wgPeers(node).catch(() => new Map<string, WgPeerView>());
      for (const [key, p] of view) {
        const otherName = nameByKey.get(key);
        const other = otherName === undefined ? undefined : world.nodes.find((n) => n.name === otherName);
        const via = relayPorts.get(p.endpoint);
        peers.push({
          from: node.name, to: otherName ?? `?${key.slice(0, 8)}`, endpoint: p.endpoint,
          path: via ? 'relay' : other ? classifyPath(p.endpoint, other.ipv4, publicSet, !natPublic.has(other.segment.spec.name)) : classifyPath(p.endpoint, '', publicSet, true),
          ...(via ? { via } : {}),
          handshakeAgeS: p.latestHandshake > 0 ? Math.max(0, now - p.latestHandshake) : undefined,
          rxBytes: p.rx, txBytes: p.tx,
        });
      }
    }),
    // Every probe at once, so a snapshot takes about one probe's deadline even when paths are down.
    ...probes.map(async ({ from, to }) => {
      const src = pods.get(from.name), dst = pods.get(to.name);
      const ok = async (address: string | undefined) => !!src && !!address && (await ping(src.ns, address, { count: 1, deadlineS: 2 }).catch(() => undefined))?.received === 1;
      const [v4, v6] = await Promise.all([ok(dst?.ipv4), ok(dst?.ipv6)]);
      matrix[from.name][to.name] = [v4, v6];
      if (!v4 || !v6) allGreen = false;
    }),
  ]);
  const worldNames = new Set(world.nodes.map((n) => n.name));
  const snapshot: DemoSnapshot = {
    nodes, peers: peers.sort((a, b) => a.from.localeCompare(b.from) || a.to.localeCompare(b.to)), matrix, allGreen, takenAt: new Date(), startedAt,
    routers: [...world.routers.values()].map((r) => ({ name: r.name, publicAddress: r.wan.ipv4, lan: r.lan.spec.name })),
    apiOnlyNodes: apiNodes.map((n) => n.metadata.name).filter((name) => !worldNames.has(name)),
  };
  return withRates(snapshot, previous);
}

/** Five agents and five data planes start at once: on a busy 2-core machine that takes minutes. */
export const AGENT_READY_TIMEOUT_MS = 240_000;

export interface DemoOptions {
  once: boolean;
  refreshS: number;
  /** --once: how long to wait for an all-green matrix before giving up. */
  settleTimeoutS: number;
  write: (text: string) => void;
  color: boolean;
  clearScreen: boolean;
  /** Which world to build (lab/demo-scenarios.ts); default 'nat'. */
  scenario?: string;
  /** Interactive only: the page's port on 127.0.0.1 (0 = any free one); undefined = no page. */
  webPort?: number;
  /** Interactive only: where fault commands are read from, line by line (undefined = nowhere). */
  input?: NodeJS.ReadableStream;
}

/** What the demo needs from the machine; each missing piece names its Debian package. */
export function missingPrerequisites(): string[] {
  const missing: string[] = [];
  if (process.getuid?.() !== 0) missing.push('root (it builds network namespaces: run it as root, e.g. with sudo)');
  for (const [bin, pkg] of [['ip', 'iproute2'], ['nft', 'nftables'], ['conntrack', 'conntrack'], ['wg', 'wireguard-tools'], ['ping', 'iputils-ping']] as const) {
    if (!which(bin)) missing.push(`${bin} (Debian package ${pkg})`);
  }
  if (!existsSync('/dev/net/tun')) missing.push('/dev/net/tun');
  if (!existsSync('/usr/lib/cni/ptp') && !existsSync('/opt/cni/bin/ptp')) missing.push('the CNI plugins (Debian package containernetworking-plugins)');
  return missing;
}

/** Builds the world, shows it, and tears it down. Resolves with the exit code. */
export async function runDemo(options: DemoOptions): Promise<number> {
  const missing = missingPrerequisites();
  if (missing.length > 0) {
    options.write(`roamguard demo needs: ${missing.join('; ')}.\nInstall the packages with: bash scripts/install-system-deps.sh (as root)\n`);
    return 2;
  }
  const scenario = DEMO_SCENARIOS[options.scenario ?? DEFAULT_SCENARIO];
  if (!scenario) {
    options.write(`roamguard demo: no scenario ${JSON.stringify(options.scenario)} (${Object.keys(DEMO_SCENARIOS).join(', ')})\n`);
    return 2;
  }
  const scope = new Scope();
  let stopping = false;
  let wake: (() => void) | undefined;
  const onSignal = () => {
    if (stopping) return;
    stopping = true;
    options.write('\nstopping: removing namespaces, processes and files…\n');
    wake?.();
  };
  process.on('SIGINT', onSignal);
  process.on('SIGTERM', onSignal);
  const sleep = (ms: number) => new Promise<void>((resolve) => {
    const t = setTimeout(resolve, ms);
    wake = () => { clearTimeout(t); resolve(); };
  });
  const started = Date.now();
  const step = (what: string) => options.write(`[${((Date.now() - started) / 1000).toFixed(0).padStart(3)}s] ${what}\n`);
  let web: DemoWeb | undefined;
  let lines: ReadlineInterface | undefined;
  try {
    options.write(`${scenario.intro}\n`);
    const world = await scenario.build(scope, { keepaliveS: 10, onProgress: (what) => step(`creating ${what}`), agentEnv: { LOG_LEVEL: 'info' } });
    if (stopping) return 130;
    const pods = new Map<string, Pod>();
    const session = new DemoSession(world, pods);
    let kubectlLine: string | undefined;
    if (!options.once) {
      // kubectl on this machine reaches the API server directly: it listens on loopback here.
      const kubeconfig = join(scope.tempDir('roamguard-demo-'), 'kubeconfig');
      writeFileSync(kubeconfig, kubeConfigFor(world.api.url), { mode: 0o600 });
      kubectlLine = `export KUBECONFIG=${kubeconfig}`;
      step(`kubectl works against the demo's API server (${world.api.url}):\n\n    ${kubectlLine}\n    kubectl get nodes -o wide\n`);
      if (options.webPort !== undefined) {
        web = await startDemoWeb(session, { port: options.webPort, kubectl: kubectlLine }).catch((err: NodeJS.ErrnoException) => {
          if (err.code !== 'EADDRINUSE') throw err;
          step(`port ${options.webPort} is taken: the page gets another one`);
          return startDemoWeb(session, { port: 0, kubectl: kubectlLine });
        });
        step(`the live page: ${web.url}\n`);
      }
    }
    step(`starting ${world.nodes.length} agents (each starts its own roamguard wg data plane)`);
    await Promise.all(world.nodes.map(async (node) => {
      await world.startAgent(node, {}, { readyTimeoutMs: AGENT_READY_TIMEOUT_MS });
      world.setNodeReady(node, true, 'RoamguardAgentReady', 'the roamguard agent is ready');
      step(`agent on ${node.name} is ready`);
    }));
    for (const node of world.nodes) {
      if (stopping) return 130;
      const pod = await world.addPod(node);
      pods.set(node.name, pod);
      step(`pod on ${node.name}: ${pod.ipv4}, ${pod.ipv6} (CNI: ptp + host-local)`);
    }
    step('waiting for handshakes (NAT\'d nodes connect out; mappings are then shared)…');
    let deadline = Date.now() + options.settleTimeoutS * 1000;
    const screen = (snapshot: DemoSnapshot) => renderDemo(snapshot, options.color, {
      after: [
        ...(session.records.length > 0 ? ['FAULT LOG', ...session.log().map((l) => `  ${l}`), ''] : []),
        ...session.help(),
        '',
        ...(kubectlLine ? [`kubectl: ${kubectlLine}`] : []),
        ...(web ? [`page:    ${web.url}`] : []),
        ...(session.lastMessage ? ['', `> ${session.lastMessage}`] : []),
      ],
    });
    if (!options.once && options.input) {
      lines = createInterface({ input: options.input, terminal: false });
      lines.on('line', (line) => {
        const result = session.submit(line);
        if ('quit' in result && result.quit) { onSignal(); return; }
        if (result.message) options.write(`> ${result.message}\n`);
      });
      session.on('recovered', (r) => options.write(`> ${describeRecord(r)}\n`));
    }
    let previous: DemoSnapshot | undefined;
    let afterGreen = scenario.afterGreen ? await scenario.afterGreen() : undefined;
    let afterGreenResult: { ok: boolean; report: string } | undefined;
    for (;;) {
      if (!options.once) await session.followApi();
      const began = Date.now();
      let snapshot = await takeSnapshot(world, pods, previous);
      if (stopping) return options.once ? 130 : 0;
      if (afterGreen && snapshot.allGreen) {
        step(`all green: running the ${options.scenario} scenario`);
        afterGreenResult = await afterGreen(world, pods, step);
        afterGreen = undefined;
        // The mesh gets its own settle time again after the scenario.
        deadline = Math.max(deadline, Date.now() + 60_000);
        snapshot = await takeSnapshot(world, pods, snapshot);
      }
      previous = snapshot;
      const report = afterGreenResult ? `\n\n${afterGreenResult.report}` : '';
      if (options.once) {
        if ((snapshot.allGreen && !afterGreen) || Date.now() >= deadline) {
          options.write(`${renderDemo(snapshot, options.color)}${report}\n`);
          return snapshot.allGreen && !afterGreen && (afterGreenResult?.ok ?? true) ? 0 : 1;
        }
        await sleep(2000);
        continue;
      }
      session.observe(snapshot);
      options.write(`${options.clearScreen ? '\x1b[2J\x1b[H' : '\n'}${screen(snapshot)}${report}\n\nrefreshing every ${options.refreshS}s — Ctrl-C tears everything down\n`);
      await sleep(Math.max(0, options.refreshS * 1000 - (Date.now() - began)));
      if (stopping) return 0;
    }
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    lines?.close();
    await web?.close().catch(() => {});
    const problems = await scope.cleanup();
    options.write(problems.length === 0 ? 'demo removed: no namespaces or processes left behind\n' : `cleanup problems:\n  ${problems.join('\n  ')}\n`);
  }
}
