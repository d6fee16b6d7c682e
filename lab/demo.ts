/**
 * `roamguard demo`: the NAT world of the scenario suite, built on this machine — an embedded
 * Kubernetes-API-compatible server, cloud nodes, an office NAT with two nodes behind one public
 * address, a home NAT with one node, a pod on each node — with a live table of nodes, peers,
 * endpoints (LAN or NAT mapping), handshakes, transfer and a pod-to-pod reachability matrix.
 *
 * Snapshots are plain data and rendering is a pure function (`renderDemo`), so the table is
 * unit-tested without namespaces.
 */
import { existsSync } from 'node:fs';
import { Scope, which } from './netns.ts';
import { buildNatWorld, HOME, INTERNET, OFFICE } from './nat-topology.ts';
import { ping } from './probe.ts';
import type { Pod, World } from './world.ts';

export interface DemoNode {
  name: string;
  site: string;
  address: string;
  /** Where the rest of the world sees it (its router's public address when NAT'd). */
  publicAddress: string;
  pod: { ipv4: string; ipv6: string };
}

export type PathKind = 'LAN' | 'NAT' | 'public' | 'none';

export interface DemoPeer {
  from: string;
  to: string;
  endpoint: string;
  path: PathKind;
  /** Seconds since the last handshake; undefined = never. */
  handshakeAgeS?: number;
  rxBytes: number;
  txBytes: number;
}

export interface DemoSnapshot {
  nodes: DemoNode[];
  peers: DemoPeer[];
  /** from → to → [IPv4 ok, IPv6 ok] for pod-to-pod pings. */
  matrix: Record<string, Record<string, [boolean, boolean]>>;
  allGreen: boolean;
  takenAt: Date;
}

function formatBytes(n: number): string {
  if (n < 1024) return `${n} B`;
  const units = ['KiB', 'MiB', 'GiB', 'TiB'];
  let v = n / 1024, i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i++; }
  return `${v.toFixed(v < 10 ? 1 : 0)} ${units[i]}`;
}

function formatAge(s: number | undefined): string {
  if (s === undefined) return 'never';
  if (s < 60) return `${Math.round(s)}s ago`;
  return `${Math.floor(s / 60)}m${String(Math.round(s % 60)).padStart(2, '0')}s ago`;
}

function table(header: string[], rows: string[][]): string[] {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i].length)));
  const line = (cells: string[]) => cells.map((c, i) => c.padEnd(widths[i])).join('  ').trimEnd();
  return [line(header), ...rows.map(line)];
}

/** The whole screen for one snapshot. */
export function renderDemo(s: DemoSnapshot, color = false): string {
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
  out.push(...table(['from', 'to', 'endpoint', 'path', 'last handshake', 'received', 'sent'],
    s.peers.map((p) => [p.from, p.to, p.endpoint || '(none)', p.path, formatAge(p.handshakeAgeS), formatBytes(p.rxBytes), formatBytes(p.txBytes)])));
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
export async function takeSnapshot(world: World, pods: ReadonlyMap<string, Pod>): Promise<DemoSnapshot> {
  const natPublic = new Map<string, string>();
  for (const router of world.routers.values()) natPublic.set(router.lan.spec.name, router.wan.ipv4);
  const publicSet = new Set(natPublic.values());
  const nodes: DemoNode[] = world.nodes.map((n) => ({
    name: n.name, site: n.segment.spec.name, address: n.ipv4, publicAddress: natPublic.get(n.segment.spec.name) ?? n.ipv4,
    pod: { ipv4: pods.get(n.name)?.ipv4 ?? '-', ipv6: pods.get(n.name)?.ipv6 ?? '-' },
  }));
  const now = Date.now() / 1000;
  const peers: DemoPeer[] = [];
  for (const node of world.nodes) {
    const view = await world.wgPeers(node).catch(() => new Map());
    for (const [key, p] of view) {
      const other = world.nodeByKey(key);
      if (!other) continue;
      peers.push({
        from: node.name, to: other.name, endpoint: p.endpoint,
        path: classifyPath(p.endpoint, other.ipv4, publicSet, !natPublic.has(other.segment.spec.name)),
        handshakeAgeS: p.latestHandshake > 0 ? Math.max(0, now - p.latestHandshake) : undefined,
        rxBytes: p.rx, txBytes: p.tx,
      });
    }
  }
  const matrix: DemoSnapshot['matrix'] = {};
  let allGreen = true;
  await Promise.all(world.nodes.map(async (from) => {
    matrix[from.name] = {};
    const src = pods.get(from.name);
    for (const to of world.nodes) {
      if (from === to) continue;
      const dst = pods.get(to.name);
      const ok = async (address: string | undefined) => !!src && !!address && (await ping(src.ns, address, { count: 1, deadlineS: 3 }).catch(() => undefined))?.received === 1;
      const cell: [boolean, boolean] = [await ok(dst?.ipv4), await ok(dst?.ipv6)];
      matrix[from.name][to.name] = cell;
      if (!cell[0] || !cell[1]) allGreen = false;
    }
  }));
  return { nodes, peers: peers.sort((a, b) => a.from.localeCompare(b.from) || a.to.localeCompare(b.to)), matrix, allGreen, takenAt: new Date() };
}

/**
 * Scenarios (`--scenario NAME`): run once the matrix is first all green, each in its own file;
 * the demo then shows the table again and the scenario's report, and `--once` exits 0 only when
 * the scenario passed and the matrix is green again.
 */
export const DEMO_SCENARIOS: Record<string, () => Promise<(world: World, pods: ReadonlyMap<string, Pod>, step: (what: string) => void) => Promise<{ ok: boolean; report: string }>>> = {
  'key-rotation': async () => (await import('./key-rotation-scenario.ts')).runKeyRotationScenario,
};

export interface DemoOptions {
  /** A name from DEMO_SCENARIOS. */
  scenario?: string;
  once: boolean;
  refreshS: number;
  /** --once: how long to wait for an all-green matrix before giving up. */
  settleTimeoutS: number;
  write: (text: string) => void;
  color: boolean;
  clearScreen: boolean;
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
  try {
    options.write(`Building the demo world: internet ${INTERNET.ipv4}, office NAT ${OFFICE.ipv4}, home NAT ${HOME.ipv4}\n`);
    const world = await buildNatWorld(scope, { keepaliveS: 10, onProgress: (what) => step(`creating ${what}`), agentEnv: { LOG_LEVEL: 'info' } });
    if (stopping) return 130;
    step(`starting ${world.nodes.length} agents (each starts its own roamguard wg data plane)`);
    await Promise.all(world.nodes.map(async (node) => {
      await world.startAgent(node);
      step(`agent on ${node.name} is ready`);
    }));
    const pods = new Map<string, Pod>();
    for (const node of world.nodes) {
      if (stopping) return 130;
      const pod = await world.addPod(node);
      pods.set(node.name, pod);
      step(`pod on ${node.name}: ${pod.ipv4}, ${pod.ipv6} (CNI: ptp + host-local)`);
    }
    step('waiting for handshakes (NAT\'d nodes connect out; mappings are then shared)…');
    let deadline = Date.now() + options.settleTimeoutS * 1000;
    let scenario = options.scenario === undefined ? undefined : await DEMO_SCENARIOS[options.scenario]();
    let scenarioResult: { ok: boolean; report: string } | undefined;
    for (;;) {
      let snapshot = await takeSnapshot(world, pods);
      if (stopping) return 130;
      if (scenario && snapshot.allGreen) {
        step(`all green: running the ${options.scenario} scenario`);
        scenarioResult = await scenario(world, pods, step);
        scenario = undefined;
        // The mesh gets its own settle time again after the scenario.
        deadline = Math.max(deadline, Date.now() + 60_000);
        snapshot = await takeSnapshot(world, pods);
      }
      const report = scenarioResult ? `\n\n${scenarioResult.report}` : '';
      if (options.once) {
        if ((snapshot.allGreen && !scenario) || Date.now() >= deadline) {
          options.write(`${renderDemo(snapshot, options.color)}${report}\n`);
          return snapshot.allGreen && !scenario && (scenarioResult?.ok ?? true) ? 0 : 1;
        }
        await sleep(2000);
        continue;
      }
      options.write(`${options.clearScreen ? '\x1b[2J\x1b[H' : '\n'}${renderDemo(snapshot, options.color)}${report}\n\nrefreshing every ${options.refreshS}s — Ctrl-C tears everything down\n`);
      await sleep(options.refreshS * 1000);
      if (stopping) return 0;
    }
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    const problems = await scope.cleanup();
    options.write(problems.length === 0 ? 'demo removed: no namespaces or processes left behind\n' : `cleanup problems:\n  ${problems.join('\n  ')}\n`);
  }
}
