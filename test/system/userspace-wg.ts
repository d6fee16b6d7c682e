/**
 * One way to run any userspace WireGuard in a network namespace and drive it with `wg`:
 *
 *   'wireguard-go'    Debian's `wireguard-go -f IFNAME`
 *   'wireguard-go-modern'  the newest upstream wireguard-go beside the checkout
 *                     (../shared/anchors/wireguard-go-modern, see {@link WIREGUARD_GO_MODERN}), same usage
 *   'roamguard-node'  `bin/roamguard --runtime node wg -f [--threads N] IFNAME`
 *   'roamguard-bun'   `bin/roamguard --runtime bun wg -f [--threads N] IFNAME`
 *
 * Every daemon runs in the foreground, so the test owns its pid (stop and restart by pid, never by
 * name); {@link UserspaceWg.start} returns once the control socket and the TUN link exist. The
 * daemon's environment gets LOG_LEVEL (option, else the test's own $LOG_LEVEL, else `error`) and
 * ROAMGUARD_TEST_TIMINGS (option `timings`, else the test's own value). The configuration,
 * restart and dump machinery is {@link WgDaemon} from wireguard-go.ts.
 *
 * Also here, for the daemon system tests: a two-daemon tunnel over a namespace pair
 * ({@link startTunnel}), ping and iperf3 helpers, and finding the pid that serves a control
 * socket (for daemons we did not start in the foreground, e.g. under wg-quick).
 */
import { accessSync, constants as fsConstants, existsSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import {
  joinHostPort, requireRoot, run, uniqueName, waitFor, WG_SOCKET_DIR,
  type Namespace, type NsProcess, type PairTopology, type Scope,
} from './netns.ts';
import {
  daemonLogLevel, generateKeyPair, WgDaemon, WireGuardGo,
  type KeyPair, type LaunchSpec, type PeerConfig, type StartOptions,
} from './wireguard-go.ts';

export type Implementation = 'wireguard-go' | 'wireguard-go-modern' | 'roamguard-node' | 'roamguard-bun';

export const REPO_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');
/** The roamguard entry point (a shell script choosing Node.js or Bun). */
export const ROAMGUARD_BIN = join(REPO_ROOT, 'bin/roamguard');
/** The program for wg-quick's WG_QUICK_USERSPACE_IMPLEMENTATION. */
export const ROAMGUARD_WG_BIN = join(REPO_ROOT, 'bin/roamguard-wg');
/**
 * Upstream wireguard-go's newest release, built beside the checkout (README there); absent on a
 * user's machine, so tests that use it check {@link hasWireGuardGoModern} first.
 */
export const WIREGUARD_GO_MODERN = resolve(REPO_ROOT, '../shared/anchors/wireguard-go-modern');

/** Whether `path` (default: the build beside the checkout) is an executable file. */
export function hasWireGuardGoModern(path = WIREGUARD_GO_MODERN): boolean {
  try { accessSync(path, fsConstants.X_OK); return true; } catch { return false; }
}

export interface UserspaceWgOptions extends StartOptions {
  /** Default 'roamguard-node'. */
  implementation?: Implementation;
  /** roamguard only: `--threads N` (data threads; 0 = one TUN queue). Default: the daemon's. */
  threads?: number;
  /**
   * roamguard under Node only: run the TypeScript sources through tsx, as bin/launch.mjs does in a
   * checkout whose sources changed since they were compiled. Default: whatever the launcher picks.
   */
  fromSources?: boolean;
  /** roamguard only: ROAMGUARD_TEST_TIMINGS (milliseconds). Default: the test's own env value. */
  timings?: Record<string, number>;
  /** wireguard-go-modern only: its binary. Default {@link WIREGUARD_GO_MODERN}. */
  binary?: string;
}

/** The foreground command line and environment of `implementation` for `ifname`. */
export function launchSpec(implementation: Implementation, ifname: string, options: UserspaceWgOptions = {}): LaunchSpec {
  if (implementation === 'wireguard-go') return WireGuardGo.launchSpec(ifname, options);
  if (implementation === 'wireguard-go-modern') {
    return { ...WireGuardGo.launchSpec(ifname, options), command: options.binary ?? WIREGUARD_GO_MODERN, label: `wireguard-go-modern ${ifname}` };
  }
  const env: Record<string, string> = { ...options.env, LOG_LEVEL: daemonLogLevel(options.logLevel) };
  const runtime = implementation === 'roamguard-bun' ? 'bun' : 'node';
  const timings = options.timings ? JSON.stringify(options.timings) : process.env.ROAMGUARD_TEST_TIMINGS;
  if (timings !== undefined) env.ROAMGUARD_TEST_TIMINGS = timings;
  const args = ['wg', '-f'];
  if (options.threads !== undefined) args.push('--threads', String(options.threads));
  args.push(ifname);
  if (options.fromSources === true) {
    if (runtime !== 'node') throw new Error('fromSources: tsx is for Node; Bun runs the sources natively');
    env.ROAMGUARD_RUNTIME = 'node';
    const tsx = join(REPO_ROOT, 'node_modules/tsx/dist/loader.mjs');
    return { command: 'node', args: ['--import', tsx, join(REPO_ROOT, 'bin/roamguard.ts'), ...args], env, label: `roamguard(node, sources) ${ifname}` };
  }
  return { command: ROAMGUARD_BIN, args: ['--runtime', runtime, ...args], env, label: `roamguard(${runtime}) ${ifname}` };
}

/** A userspace WireGuard daemon of any implementation, in the foreground inside a namespace. */
export class UserspaceWg extends WgDaemon {
  private constructor(scope: Scope, ns: Namespace, ifname: string, spec: LaunchSpec, options: StartOptions, readonly implementation: Implementation) {
    super(scope, ns, ifname, spec, options);
  }

  /**
   * Starts the daemon inside `ns` and waits until its control socket and TUN link exist.
   * Cleanup (registered in `scope`): stop by pid, then remove the socket if it was left behind.
   */
  static async start(scope: Scope, ns: Namespace, options: UserspaceWgOptions = {}): Promise<UserspaceWg> {
    const implementation = options.implementation ?? 'roamguard-node';
    const ifname = options.ifname ?? uniqueName('rg');
    // Node.js compiles the TypeScript sources at start (tsx): allow for a loaded machine.
    const startTimeoutMs = options.startTimeoutMs ?? (implementation.startsWith('wireguard-go') ? 5000 : 20_000);
    const spec = launchSpec(implementation, ifname, options);
    const daemon = new UserspaceWg(scope, ns, ifname, spec, { ...options, startTimeoutMs }, implementation);
    await daemon.launch();
    return daemon;
  }

  /** Lines of the daemon's stderr (the kept tail) matching `pattern`. */
  logLines(pattern: RegExp): string[] {
    return this.process.stderr.split('\n').filter((line) => pattern.test(line));
  }
}

export { WireGuardGo };

/**
 * Fails with one clear message when a daemon system test cannot run: not root, missing binaries,
 * no /dev/net/tun, or (for roamguard) an incomplete checkout (no `npm install`: tsx or bun missing).
 */
export async function requireDaemonPrerequisites(implementations: readonly Implementation[], binaries: readonly string[] = []): Promise<void> {
  const needed = ['wg', 'ping', 'ss', ...binaries];
  if (implementations.includes('wireguard-go')) needed.push('wireguard-go');
  await requireRoot({ binaries: needed, tun: true });
  const problems: string[] = [];
  const executable = (path: string) => {
    try { accessSync(path, fsConstants.X_OK); return true; } catch { return false; }
  };
  if (implementations.some((i) => i.startsWith('roamguard')) && !executable(ROAMGUARD_BIN)) problems.push(`${ROAMGUARD_BIN} is not executable`);
  if (implementations.includes('wireguard-go-modern') && !executable(WIREGUARD_GO_MODERN)) problems.push(`${WIREGUARD_GO_MODERN} is not executable`);
  if (implementations.includes('roamguard-node') && !existsSync(join(REPO_ROOT, 'node_modules/tsx/dist/esm/index.mjs'))) {
    problems.push('tsx is not installed (run `npm install` in the checkout)');
  }
  if (implementations.includes('roamguard-bun') && !executable(join(REPO_ROOT, 'node_modules/.bin/bun'))) {
    const onPath = await run('sh', ['-c', 'command -v bun'], { allowFailure: true });
    if (onPath.code !== 0) problems.push('bun is not installed (npm install installs the dev dependency `bun`)');
  }
  if (problems.length > 0) throw new Error(`daemon system test preconditions not met:\n  - ${problems.join('\n  - ')}`);
}

// ---------------------------------------------------------------------------------------------
// a tunnel between two daemons over a namespace pair

/** Inner (tunnel) addresses of sides A and B. */
export const INNER = {
  a: { ipv4: '10.77.0.1', ipv6: 'fd77::1' },
  b: { ipv4: '10.77.0.2', ipv6: 'fd77::2' },
} as const;
export const PORT_A = 51820;
export const PORT_B = 51821;

export interface TunnelOptions {
  a?: UserspaceWgOptions;
  b?: UserspaceWgOptions;
  /** Family of the outer (UDP) endpoints. Default 4. */
  outer?: 4 | 6;
  /** Which sides are given the other's endpoint. Default 'both'. */
  endpoints?: 'both' | 'a-knows-b' | 'b-knows-a';
  /** Persistent keepalive (s) each side sets for its peer. Default off. */
  keepalive?: { a?: number; b?: number };
}

export interface Tunnel {
  topo: PairTopology;
  a: UserspaceWg;
  b: UserspaceWg;
  keysA: KeyPair;
  keysB: KeyPair;
  /** A's outer endpoint as B sees it, and B's as A sees it. */
  endpointA: string;
  endpointB: string;
}

/**
 * Starts one daemon in each namespace of `topo`, configures both with `wg` (keys, listen ports
 * {@link PORT_A}/{@link PORT_B}, the peer with allowed IPs /32 and /128 of its inner addresses,
 * endpoints as asked), adds the inner addresses and brings both TUNs up.
 */
export async function startTunnel(scope: Scope, topo: PairTopology, options: TunnelOptions = {}): Promise<Tunnel> {
  const outer = options.outer ?? 4;
  const endpointA = joinHostPort(outer === 4 ? topo.linkA.ipv4 : topo.linkA.ipv6, PORT_A);
  const endpointB = joinHostPort(outer === 4 ? topo.linkB.ipv4 : topo.linkB.ipv6, PORT_B);
  const [keysA, keysB] = await Promise.all([generateKeyPair(), generateKeyPair()]);
  const [a, b] = await Promise.all([
    UserspaceWg.start(scope, topo.a, options.a),
    UserspaceWg.start(scope, topo.b, options.b),
  ]);
  const endpoints = options.endpoints ?? 'both';
  const peerOf = (keys: KeyPair, inner: { ipv4: string; ipv6: string }, endpoint: string | undefined, keepalive: number | undefined): PeerConfig => ({
    publicKey: keys.publicKey,
    allowedIps: [`${inner.ipv4}/32`, `${inner.ipv6}/128`],
    ...(endpoint !== undefined ? { endpoint } : {}),
    ...(keepalive !== undefined ? { persistentKeepalive: keepalive } : {}),
  });
  await a.configure({
    privateKey: keysA.privateKey,
    listenPort: PORT_A,
    peers: [peerOf(keysB, INNER.b, endpoints === 'b-knows-a' ? undefined : endpointB, options.keepalive?.a)],
  });
  await b.configure({
    privateKey: keysB.privateKey,
    listenPort: PORT_B,
    peers: [peerOf(keysA, INNER.a, endpoints === 'a-knows-b' ? undefined : endpointA, options.keepalive?.b)],
  });
  for (const [daemon, inner] of [[a, INNER.a], [b, INNER.b]] as const) {
    await daemon.addAddress(`${inner.ipv4}/24`);
    await daemon.addAddress(`${inner.ipv6}/64`);
    await daemon.up();
  }
  return { topo, a, b, keysA, keysB, endpointA, endpointB };
}

/** Both daemons' state, for assertion messages. */
export function describeTunnel(t: Pick<Tunnel, 'a' | 'b'>): string {
  return `\n${t.a.describe()}\n${t.b.describe()}`;
}

// ---------------------------------------------------------------------------------------------
// traffic

export { parsePingOutput, ping, type PingOptions, type PingResult } from '../../lab/probe.ts';
import { parsePingOutput, ping, type PingOptions, type PingResult } from '../../lab/probe.ts';

/** Pings until `count` replies arrive (within the deadline), else throws with ping's output. */
export async function assertPing(ns: Namespace, dst: string, options: PingOptions = {}, context = ''): Promise<PingResult> {
  const result = await ping(ns, dst, options);
  const count = options.count ?? 3;
  if (result.received < count) {
    throw new Error(`ping ${dst} from ${ns.name}: ${result.received}/${count} replies\n${result.output.trim()}${context}`);
  }
  return result;
}

export { iperf3, type Iperf3Result } from '../../lab/probe.ts';

export function formatRate(bitsPerSecond: number): string {
  return bitsPerSecond >= 1e9 ? `${(bitsPerSecond / 1e9).toFixed(2)} Gbit/s` : `${(bitsPerSecond / 1e6).toFixed(1)} Mbit/s`;
}

// ---------------------------------------------------------------------------------------------
// processes we did not start ourselves

/**
 * Pids of the processes listening on the control socket of `ifname`, from `ss -xlpn` run inside
 * `ns` (unix sockets belong to the namespace of the process that made them).
 */
export async function socketOwnerPids(ns: Namespace, ifname: string): Promise<number[]> {
  const out = await ns.exec('ss', ['-xlpn'], { allowFailure: true });
  const path = join(WG_SOCKET_DIR, `${ifname}.sock`);
  const pids = new Set<number>();
  for (const line of out.stdout.split('\n')) {
    const fields = line.trim().split(/\s+/);
    if (!fields.some((f) => f === path || f.endsWith(`/${ifname}.sock`))) continue;
    for (const m of line.matchAll(/pid=(\d+)/g)) pids.add(Number(m[1]));
  }
  return [...pids];
}

/** Whether `pid` is a live process (a zombie waiting to be reaped counts as gone). */
export function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EPERM') return false;
  }
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) !== 'Z';
  } catch {
    return false;
  }
}

/** The command line of a live process, or undefined. */
export function commandLine(pid: number): string | undefined {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean).join(' ');
  } catch {
    return undefined;
  }
}

/**
 * Registers in `scope` that `pid` (a daemon we did not spawn) must be gone at cleanup: SIGTERM,
 * then SIGKILL, by that pid only, and only while it still runs `expectedCommand` (pid reuse).
 */
export function killAtCleanup(scope: Scope, pid: number, expectedCommand: RegExp): void {
  scope.defer(`stop detached daemon pid ${pid}`, async () => {
    const matches = () => isAlive(pid) && expectedCommand.test(commandLine(pid) ?? '');
    if (!matches()) return;
    try { process.kill(pid, 'SIGTERM'); } catch { return; }
    const deadline = Date.now() + 3000;
    while (matches() && Date.now() < deadline) await new Promise((r) => setTimeout(r, 50));
    if (matches()) {
      try { process.kill(pid, 'SIGKILL'); } catch { /* gone */ }
    }
  });
}

/** Waits until `proc` exits; resolves with its status or throws after `timeoutMs`. */
export async function waitForExit(proc: NsProcess, timeoutMs: number, what: string): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  const timeout = new Promise<'timeout'>((r) => setTimeout(() => r('timeout'), timeoutMs).unref());
  const status = await Promise.race([proc.exited, timeout]);
  if (status === 'timeout') throw new Error(`${proc.label} did not exit within ${timeoutMs} ms after ${what}\n${proc.describe()}`);
  return status;
}

// ---------------------------------------------------------------------------------------------
// continuous traffic

export interface PingTrace {
  /** Echo requests sent (from ping's statistics line). */
  transmitted: number;
  /** Replies, each with its sequence number and arrival time (Unix seconds, from `ping -D`). */
  replies: Array<{ seq: number; at: number }>;
  lossPercent: number;
  output: string;
}

/**
 * Starts `ping -D -i INTERVAL -w DURATION DST` in `ns` in the background (registered in `scope`)
 * and returns a promise of every reply with its arrival time, to see when traffic flowed.
 */
export function startContinuousPing(scope: Scope, ns: Namespace, dst: string, options: { durationS: number; intervalS: number }): Promise<PingTrace> {
  const proc = scope.spawn(ns, 'ping', ['-n', '-D', '-i', String(options.intervalS), '-w', String(options.durationS), dst], {
    label: `ping ${dst} in ${ns.name}`,
    keepOutputBytes: 1024 * 1024,
  });
  return (async () => {
    await waitForExit(proc, (options.durationS + 15) * 1000, 'its deadline');
    const output = proc.stdout;
    const replies: PingTrace['replies'] = [];
    for (const m of output.matchAll(/^\[(\d+\.\d+)\] \d+ bytes from .*?icmp_seq=(\d+)/gm)) {
      replies.push({ at: Number(m[1]), seq: Number(m[2]) });
    }
    const stats = parsePingOutput(output);
    return { transmitted: stats.transmitted, replies, lossPercent: stats.lossPercent, output };
  })();
}

/** The longest time without a reply within [from, to] (Unix seconds), in seconds. */
export function longestGap(trace: PingTrace, from: number, to: number): number {
  let last = from;
  let gap = 0;
  for (const { at } of trace.replies) {
    if (at < from || at > to) continue;
    gap = Math.max(gap, at - last);
    last = at;
  }
  return Math.max(gap, to - last);
}
