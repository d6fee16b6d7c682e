/**
 * What the suite measures: the raw veth link between the two namespaces (the ceiling), roamguard
 * under Node.js and Bun with and without crypto worker threads, upstream's newest wireguard-go
 * (the reference every ratio is taken against, found beside the checkout) and Debian's. Each
 * tunnel subject runs the same implementation on both sides, configured only with `wg`, with the
 * same addresses, port and MTU, so the figures compare like with like.
 */
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  WG_SOCKET_DIR, uniqueName, waitFor, which,
  type Namespace, type NsProcess, type PairTopology, type Scope,
} from '../../test/system/netns.ts';
import { generateKeyPair } from '../../test/system/wireguard-go.ts';
import { UserspaceWg, WIREGUARD_GO_MODERN, hasWireGuardGoModern } from '../../test/system/userspace-wg.ts';
import { pingOnce } from './tools.ts';
import { staleReason } from '../../bin/compiled.mjs';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
/** The roamguard entry point of this checkout. */
export const ROAMGUARD_BIN = join(ROOT, 'bin', 'roamguard');

/** Inner (tunnel) addresses: the benchmarking range of RFC 2544, only inside the namespaces. */
export const INNER = { a: '198.18.0.1', b: '198.18.0.2', prefixLength: 24 };
/** The tunnel MTU used for every implementation (wireguard-go's and roamguard's default). */
export const TUNNEL_MTU = 1420;
/** UDP port of both tunnel ends. */
export const LISTEN_PORT = 51820;

export type SubjectKind = 'raw' | 'roamguard' | 'wireguard-go';

export interface SubjectSpec {
  /** Name used by --only and in the results. */
  id: string;
  /** Name shown in the table. */
  label: string;
  kind: SubjectKind;
  runtime?: 'node' | 'bun';
  /** roamguard --threads; undefined = the daemon's default (one per core). */
  threads?: number;
  /** Extra environment of the roamguard daemons (data plane settings, dataplane/settings.ts). */
  env?: Record<string, string>;
  /** For wireguard-go subjects: which build. */
  build?: 'modern' | 'debian';
  /** Part of a run without --only. */
  byDefault: boolean;
  /** roamguard subjects: run another checkout's data plane (`--baseline DIR`) instead of this one's. */
  fromBaseline?: boolean;
  /** The entry point to run, set by the runner: another checkout's for baseline subjects, `--wireguard-go-modern`'s for that subject. */
  bin?: string;
}

export const SUBJECTS: readonly SubjectSpec[] = [
  { id: 'raw', label: 'raw veth link', kind: 'raw', byDefault: true },
  { id: 'node', label: 'roamguard node', kind: 'roamguard', runtime: 'node', byDefault: true },
  { id: 'node-t0', label: 'roamguard node --threads 0', kind: 'roamguard', runtime: 'node', threads: 0, byDefault: true },
  { id: 'bun', label: 'roamguard bun', kind: 'roamguard', runtime: 'bun', byDefault: true },
  { id: 'bun-t0', label: 'roamguard bun --threads 0', kind: 'roamguard', runtime: 'bun', threads: 0, byDefault: false },
  { id: 'wireguard-go-modern', label: 'wireguard-go 0.0.20250522', kind: 'wireguard-go', build: 'modern', byDefault: true },
  { id: 'wireguard-go', label: 'wireguard-go (Debian)', kind: 'wireguard-go', build: 'debian', byDefault: true },
  // Another checkout (`--baseline DIR`, e.g. a worktree of main before a change), in the same run:
  // before/after figures against an earlier data path (the product keeps only its own).
  { id: 'node-baseline', label: 'roamguard node, baseline checkout', kind: 'roamguard', runtime: 'node', fromBaseline: true, byDefault: false },
  { id: 'bun-baseline', label: 'roamguard bun, baseline checkout', kind: 'roamguard', runtime: 'bun', fromBaseline: true, byDefault: false },
];

/** The bun binary bin/roamguard would use, or undefined. */
export function bunBinary(): string | undefined {
  const local = join(ROOT, 'node_modules', '.bin', 'bun');
  return existsSync(local) ? local : which('bun');
}

/** Why `spec` cannot run on this machine (shown as a note), or undefined when it can. */
export function unavailableReason(spec: SubjectSpec): string | undefined {
  if (spec.build === 'modern' && !hasWireGuardGoModern(spec.bin)) return `${spec.bin ?? WIREGUARD_GO_MODERN} not found: skipped (ratios are against Debian's wireguard-go)`;
  if (spec.build === 'debian' && !which('wireguard-go')) return 'wireguard-go is not installed (Debian package wireguard-go): skipped';
  if (spec.runtime === 'bun' && !bunBinary()) return 'bun is not installed (npm install bun): skipped';
  if (spec.fromBaseline && spec.bin === undefined) return 'needs --baseline DIR (another checkout): skipped';
  if (spec.fromBaseline && spec.bin !== undefined && !existsSync(spec.bin)) return `${spec.bin} not found: skipped`;
  return undefined;
}

/** One side's tunnel process. */
export interface TunnelProcess {
  side: 'a' | 'b';
  pid: number;
  /** /proc/PID/comm once running, e.g. node, bun, wireguard-go. */
  comm: string;
  ifname: string;
  process: NsProcess;
}

/** A subject ready to be measured: traffic from namespace A to `target` in namespace B. */
export interface RunningSubject {
  target: string;
  /** The tunnel processes (none for the raw link). */
  processes: TunnelProcess[];
  /** Facts worth keeping with the results (crypto providers, thread counts…). */
  info: Record<string, string>;
}

function comm(pid: number): string {
  try { return readFileSync(`/proc/${pid}/comm`, 'utf8').trim(); } catch { return '?'; }
}

/** Waits for a daemon's TUN and control socket; fails at once when the process exits. */
export async function waitUntilReady(ns: Namespace, ifname: string, proc: NsProcess, timeoutMs: number): Promise<void> {
  const socket = join(WG_SOCKET_DIR, `${ifname}.sock`);
  let exited = false;
  await waitFor(async () => {
    if (!proc.running) { exited = true; return true; }
    if (!existsSync(socket)) return false;
    return (await ns.ip(['link', 'show', 'dev', ifname], { allowFailure: true })).code === 0;
  }, timeoutMs, { description: `${proc.label} to create ${ifname} and its control socket`, intervalMs: 50 });
  if (exited) throw new Error(`${proc.label} exited before it was ready\n${proc.describe()}`);
}

/**
 * Throws unless the checkout `spec` runs has compiled JavaScript matching its sources. Else
 * bin/roamguard would run the TypeScript through tsx, and the bench would measure tsx's start-up,
 * threads and memory instead of the daemon's (an edit during a run does it too, so each start
 * checks again).
 */
export function requireCompiled(spec: SubjectSpec): void {
  if (spec.kind !== 'roamguard') return;
  const root = dirname(dirname(spec.bin ?? ROAMGUARD_BIN));
  const reason = staleReason(root);
  if (reason !== undefined) throw new Error(`${spec.label}: ${root}: ${reason}; run \`npm run build\` there first (a stale checkout runs through tsx, which the bench would measure)`);
}

/** Starts `roamguard wg -f` for `spec` in `ns` (a fresh interface name) and waits until it is ready. */
export async function startRoamguard(scope: Scope, ns: Namespace, spec: SubjectSpec, side: 'a' | 'b', logLevel = 'verbose'): Promise<TunnelProcess> {
  requireCompiled(spec);
  const ifname = uniqueName('rgb');
  scope.removeFileAtCleanup(join(WG_SOCKET_DIR, `${ifname}.sock`));
  const args = ['--runtime', spec.runtime ?? 'node', 'wg', '-f'];
  if (spec.threads !== undefined) args.push('--threads', String(spec.threads));
  args.push(ifname);
  // verbose logs only lifecycle events (providers, threads, handshakes), never per packet.
  const proc = scope.spawn(ns, spec.bin ?? ROAMGUARD_BIN, args, { env: { LOG_LEVEL: logLevel, ...spec.env }, label: `roamguard ${spec.runtime} ${ifname} in ${ns.name}` });
  await waitUntilReady(ns, ifname, proc, 30_000);
  return { side, pid: proc.pid, comm: comm(proc.pid), ifname, process: proc };
}

async function startWireguardGo(scope: Scope, ns: Namespace, spec: SubjectSpec, side: 'a' | 'b'): Promise<TunnelProcess> {
  const implementation = spec.build === 'modern' ? 'wireguard-go-modern' : 'wireguard-go';
  const wg = await UserspaceWg.start(scope, ns, { implementation, binary: spec.bin, ifname: uniqueName('rgb'), logLevel: 'error', startTimeoutMs: 10_000 });
  return { side, pid: wg.process.pid, comm: comm(wg.process.pid), ifname: wg.ifname, process: wg.process };
}

/** Configures one side with `wg set` and `ip`: key, port, the one peer, address, MTU, up. */
async function configureSide(
  ns: Namespace, ifname: string, keyFile: string, peerPublicKey: string, peerOuter: string, innerAddress: string, peerInner: string,
): Promise<void> {
  await ns.exec('wg', [
    'set', ifname, 'listen-port', String(LISTEN_PORT), 'private-key', keyFile,
    'peer', peerPublicKey, 'endpoint', `${peerOuter}:${LISTEN_PORT}`, 'allowed-ips', `${peerInner}/32`,
  ]);
  await ns.ip(['addr', 'add', `${innerAddress}/${INNER.prefixLength}`, 'dev', ifname]);
  await ns.ip(['link', 'set', 'dev', ifname, 'mtu', String(TUNNEL_MTU)]);
  await ns.ip(['link', 'set', 'dev', ifname, 'up']);
}

/**
 * Starts `spec` on the topology; everything it creates is recorded in `scope` (a scope of its
 * own, cleaned up after the subject). Returns once a first ping crossed (handshake done).
 */
export async function startSubject(scope: Scope, topo: PairTopology, spec: SubjectSpec): Promise<RunningSubject> {
  if (spec.kind === 'raw') return { target: topo.linkB.ipv4, processes: [], info: { mtu: 'veth default (1500)' } };

  const [a, b] = spec.kind === 'wireguard-go'
    ? await Promise.all([startWireguardGo(scope, topo.a, spec, 'a'), startWireguardGo(scope, topo.b, spec, 'b')])
    : await Promise.all([startRoamguard(scope, topo.a, spec, 'a'), startRoamguard(scope, topo.b, spec, 'b')]);

  const keyDir = scope.tempDir('roamguard-bench-keys-');
  const [keyA, keyB] = await Promise.all([generateKeyPair(), generateKeyPair()]);
  const fileA = join(keyDir, 'a.key'), fileB = join(keyDir, 'b.key');
  writeFileSync(fileA, `${keyA.privateKey}\n`, { mode: 0o600 });
  writeFileSync(fileB, `${keyB.privateKey}\n`, { mode: 0o600 });
  await configureSide(topo.a, a.ifname, fileA, keyB.publicKey, topo.linkB.ipv4, INNER.a, INNER.b);
  await configureSide(topo.b, b.ifname, fileB, keyA.publicKey, topo.linkA.ipv4, INNER.b, INNER.a);

  // The first ping triggers the handshake; wait until the tunnel carries traffic.
  await waitFor(() => pingOnce(topo.a, INNER.b), 20_000, { description: `a first ping through ${spec.label}`, intervalMs: 100 })
    .catch((err: unknown) => { throw new Error(`${(err as Error).message}\n${a.process.describe()}\n${b.process.describe()}`); });

  const info: Record<string, string> = { mtu: String(TUNNEL_MTU) };
  for (const p of [a, b]) {
    if (!p.process.running) throw new Error(`${p.process.label} exited\n${p.process.describe()}`);
    info[`process ${p.side}`] = `${p.comm} pid ${p.pid}`;
  }
  if (spec.kind === 'roamguard') {
    const log = a.process.stderr + a.process.stdout;
    const providers = /crypto providers: (.*)/.exec(log)?.[1];
    const queues = /TUN queues (\d+)/.exec(log)?.[1];
    const threads = /crypto threads (\d+)/.exec(log)?.[1];
    if (providers) info.crypto = providers.trim();
    if (queues) info['TUN queues'] = queues;
    if (threads) info['crypto threads'] = threads;
  }
  return { target: INNER.b, processes: [a, b], info };
}

