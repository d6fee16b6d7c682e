/**
 * Helpers for system tests that run inside Linux network namespaces.
 *
 * Everything a test creates (namespaces, veth pairs, processes, temporary directories, control
 * sockets) is recorded in a {@link Scope} and torn down in reverse order by `scope.cleanup()`.
 * Cleanup is idempotent and never throws. As a last resort a synchronous process 'exit' handler
 * (and SIGINT/SIGTERM/SIGHUP handlers) remove whatever a scope did not get to clean up, so a
 * crashing test does not leave namespaces, wireguard-go processes or sockets behind.
 *
 * Naming: namespaces are called `rgt-<owner pid>-<random>` so parallel test files never collide and
 * {@link reapStale} can remove leftovers of test processes that were killed hard (SIGKILL).
 * Interface names must be unique per run as well, because /var/run/wireguard is shared by all
 * namespaces: use {@link uniqueName}.
 *
 * Traffic stays inside the namespaces a test creates; nothing here touches the root namespace's
 * links or addresses.
 */
import { spawn, spawnSync, type ChildProcess, type SpawnOptions } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { accessSync, constants as fsConstants, mkdtempSync, readdirSync, rmSync, statSync, unlinkSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { delimiter, join } from 'node:path';

/** `ip`, `nft`, `sysctl` live in sbin; make sure they are found even with a user's PATH. */
const EXTRA_PATH = ['/usr/local/sbin', '/usr/sbin', '/sbin', '/usr/local/bin', '/usr/bin', '/bin'];
export const SYSTEM_PATH = [...(process.env.PATH ?? '').split(delimiter).filter(Boolean), ...EXTRA_PATH]
  .filter((dir, i, all) => all.indexOf(dir) === i)
  .join(delimiter);

/** Prefix of every namespace created here; `reapStale` only ever touches names with this prefix. */
export const NETNS_PREFIX = 'rgt-';
/** Directory of the wireguard UAPI sockets; shared by all namespaces. */
export const WG_SOCKET_DIR = '/var/run/wireguard';

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

// ---------------------------------------------------------------------------------------------
// names

/** `length` random characters from [a-z0-9]. */
export function randomSuffix(length = 6): string {
  const alphabet = 'abcdefghijklmnopqrstuvwxyz0123456789';
  const bytes = randomBytes(length);
  let out = '';
  for (let i = 0; i < length; i++) out += alphabet[bytes[i] % alphabet.length];
  return out;
}

/**
 * A unique interface name: `prefix` + random suffix, at most 15 characters (IFNAMSIZ - 1).
 * With the default prefix `rg` the result has 8 characters (36^6 ≈ 2·10^9 possibilities).
 */
export function uniqueName(prefix = 'rg', suffixLength = 6): string {
  const name = prefix + randomSuffix(suffixLength);
  if (name.length > 15) throw new Error(`interface name ${JSON.stringify(name)} is longer than 15 characters`);
  if (!/^[A-Za-z0-9_-]+$/.test(name)) throw new Error(`bad interface name ${JSON.stringify(name)}`);
  return name;
}

// ---------------------------------------------------------------------------------------------
// running commands

export interface RunOptions {
  /** Kill the command (SIGKILL) and fail after this many ms. Default 10 000. */
  timeoutMs?: number;
  /** Written to stdin, which is then closed. Without it stdin is empty. */
  input?: string | Uint8Array;
  /** Resolve instead of throwing when the command exits non-zero. Default false. */
  allowFailure?: boolean;
  env?: NodeJS.ProcessEnv;
  cwd?: string;
}

export interface RunResult {
  /** The command line as text, for messages. */
  command: string;
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
  durationMs: number;
}

export class CommandError extends Error {
  constructor(message: string, readonly result: RunResult) {
    super(message);
    this.name = 'CommandError';
  }
}

function quote(arg: string): string {
  return /^[\w@%+=:,./-]+$/.test(arg) ? arg : `'${arg.replace(/'/g, `'\\''`)}'`;
}

export function formatCommand(cmd: string, args: readonly string[]): string {
  return [cmd, ...args].map(quote).join(' ');
}

function envWithPath(env?: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  return { ...process.env, ...env, PATH: SYSTEM_PATH };
}

/**
 * Runs a command to completion with captured output. Throws a {@link CommandError} (with the
 * command, exit status and stderr in the message) on a non-zero exit, a signal or a timeout,
 * unless `allowFailure` is set — a timeout always throws.
 */
export function run(cmd: string, args: readonly string[], options: RunOptions = {}): Promise<RunResult> {
  const timeoutMs = options.timeoutMs ?? 10_000;
  const command = formatCommand(cmd, args);
  const started = performance.now();
  return new Promise<RunResult>((resolve, reject) => {
    let child: ChildProcess;
    try {
      child = spawn(cmd, args, { env: envWithPath(options.env), cwd: options.cwd, stdio: ['pipe', 'pipe', 'pipe'] });
    } catch (err) {
      reject(new Error(`cannot start ${command}: ${(err as Error).message}`));
      return;
    }
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout!.on('data', (chunk: Buffer) => out.push(chunk));
    child.stderr!.on('data', (chunk: Buffer) => err.push(chunk));
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      if (child.pid !== undefined) killQuietly(child.pid, 'SIGKILL');
    }, timeoutMs);
    child.stdin!.on('error', () => { /* the command may exit without reading its input */ });
    child.stdin!.end(options.input ?? '');
    child.on('error', (e) => {
      clearTimeout(timer);
      reject(new Error(`cannot start ${command}: ${e.message}`));
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      const result: RunResult = {
        command, code, signal,
        stdout: Buffer.concat(out).toString('utf8'),
        stderr: Buffer.concat(err).toString('utf8'),
        durationMs: performance.now() - started,
      };
      const details = () => {
        const parts = [result.stderr.trim(), result.stdout.trim()].filter(Boolean).join('\n');
        return parts ? `\n${parts.slice(-4000)}` : '';
      };
      if (timedOut) {
        reject(new CommandError(`command timed out after ${timeoutMs} ms: ${command}${details()}`, result));
      } else if ((code !== 0 || signal !== null) && !options.allowFailure) {
        const status = signal ? `signal ${signal}` : `exit code ${code}`;
        reject(new CommandError(`command failed (${status}): ${command}${details()}`, result));
      } else {
        resolve(result);
      }
    });
  });
}

// ---------------------------------------------------------------------------------------------
// preconditions

/** Debian package that provides each binary the system tests use (for error messages). */
const PACKAGE_OF: Record<string, string> = {
  'ip': 'iproute2',
  'wg': 'wireguard-tools',
  'wireguard-go': 'wireguard-go',
  'ping': 'iputils-ping',
  'iperf3': 'iperf3',
  'nft': 'nftables',
};

/** The absolute path of `name` on the PATH used for commands here, or undefined. */
export function which(name: string): string | undefined {
  for (const dir of SYSTEM_PATH.split(delimiter)) {
    const candidate = join(dir, name);
    try {
      accessSync(candidate, fsConstants.X_OK);
      if (statSync(candidate).isFile()) return candidate;
    } catch { /* not here */ }
  }
  return undefined;
}

export interface Requirements {
  /** Binaries that must be on the PATH. Default: `ip`. */
  binaries?: readonly string[];
  /** Also require /dev/net/tun (for wireguard-go or our own TUN). Default false. */
  tun?: boolean;
}

/**
 * Fails (throws) with one clear message when the system test cannot run here: not root, no
 * `ip netns`, a missing binary or /dev/net/tun. This is deliberately not a skip: the test command
 * installs the packages, so their absence is a real failure. Call it from a `before` hook.
 */
export async function requireRoot(requirements: Requirements = {}): Promise<void> {
  const problems: string[] = [];
  if (process.platform !== 'linux') problems.push(`network namespaces need Linux (this is ${process.platform})`);
  if (typeof process.getuid === 'function' && process.getuid() !== 0) {
    problems.push(`must run as root (uid 0), running as uid ${process.getuid()}`);
  }
  const binaries = ['ip', ...(requirements.binaries ?? [])].filter((b, i, all) => all.indexOf(b) === i);
  const missing = binaries.filter((b) => which(b) === undefined);
  if (missing.length > 0) {
    const hint = missing.map((b) => (PACKAGE_OF[b] ? `${b} (Debian package ${PACKAGE_OF[b]})` : b)).join(', ');
    problems.push(`missing binaries on PATH: ${hint}`);
  }
  if (requirements.tun) {
    try {
      accessSync('/dev/net/tun', fsConstants.R_OK | fsConstants.W_OK);
    } catch (err) {
      problems.push(`/dev/net/tun is not usable: ${(err as Error).message}`);
    }
  }
  if (problems.length === 0 && !missing.includes('ip')) {
    const probe = await run('ip', ['netns', 'list'], { allowFailure: true, timeoutMs: 5000 });
    if (probe.code !== 0) problems.push(`\`ip netns list\` failed: ${probe.stderr.trim()}`);
  }
  if (problems.length > 0) {
    throw new Error(`system test preconditions not met:\n  - ${problems.join('\n  - ')}`);
  }
}

// ---------------------------------------------------------------------------------------------
// polling

export interface WaitOptions {
  /** Poll interval in ms. Default 50. */
  intervalMs?: number;
  /** What is awaited, for the timeout message. */
  description?: string;
}

/**
 * Polls `condition` until it returns a truthy value (which is returned) or `timeoutMs` passes.
 * A condition that throws counts as "not yet"; its last error is reported on timeout.
 */
export async function waitFor<T>(
  condition: () => T | Promise<T>,
  timeoutMs: number,
  options: WaitOptions = {},
): Promise<NonNullable<T>> {
  const interval = options.intervalMs ?? 50;
  const deadline = performance.now() + timeoutMs;
  let lastError: unknown;
  for (;;) {
    try {
      const value = await condition();
      if (value) return value as NonNullable<T>;
      lastError = undefined;
    } catch (err) {
      lastError = err;
    }
    if (performance.now() >= deadline) {
      const what = options.description ?? 'condition';
      const why = lastError ? ` (last error: ${(lastError as Error).message ?? String(lastError)})` : '';
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}${why}`);
    }
    await sleep(Math.max(1, Math.min(interval, deadline - performance.now())));
  }
}

// ---------------------------------------------------------------------------------------------
// last-resort cleanup registry (synchronous, for process exit)

interface Leftovers {
  pids: Set<number>;
  namespaces: Set<string>;
  paths: Set<string>;
}

const leftovers: Leftovers = { pids: new Set(), namespaces: new Set(), paths: new Set() };
let exitHandlersInstalled = false;

function killQuietly(pid: number, signal: NodeJS.Signals): boolean {
  try {
    process.kill(pid, signal);
    return true;
  } catch {
    return false;
  }
}

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

function namespacePidsSync(ns: string): number[] {
  const r = spawnSync('ip', ['netns', 'pids', ns], { env: envWithPath(), encoding: 'utf8', timeout: 5000 });
  if (r.status !== 0 || typeof r.stdout !== 'string') return [];
  return r.stdout.split(/\s+/).filter(Boolean).map(Number).filter((n) => Number.isInteger(n) && n > 1);
}

function deleteNamespaceSync(ns: string): void {
  for (const pid of namespacePidsSync(ns)) killQuietly(pid, 'SIGKILL');
  spawnSync('ip', ['netns', 'del', ns], { env: envWithPath(), stdio: 'ignore', timeout: 5000 });
}

function removePathSync(path: string): void {
  try {
    rmSync(path, { recursive: true, force: true });
  } catch { /* best effort */ }
}

/** Synchronously removes everything still registered. Safe to call more than once. */
export function emergencyCleanupSync(): void {
  for (const pid of leftovers.pids) killQuietly(pid, 'SIGKILL');
  leftovers.pids.clear();
  for (const ns of leftovers.namespaces) deleteNamespaceSync(ns);
  leftovers.namespaces.clear();
  for (const path of leftovers.paths) removePathSync(path);
  leftovers.paths.clear();
}

function installExitHandlers(): void {
  if (exitHandlersInstalled) return;
  exitHandlersInstalled = true;
  process.on('exit', emergencyCleanupSync);
  for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
    process.once(signal, () => {
      emergencyCleanupSync();
      // Re-raise with the default disposition so the exit status tells what happened.
      process.kill(process.pid, signal);
    });
  }
}

/**
 * Removes leftovers of earlier test processes that died without cleaning up (e.g. SIGKILL):
 * namespaces `rgt-<pid>-*` whose owner pid is gone (processes inside them are killed first), and
 * `rg*.sock` control sockets in /var/run/wireguard that refuse connections twice in a row (dead:
 * nobody listens; `wg` itself unlinks such sockets). Resources of live test processes (parallel
 * runs) are never touched. Returns what was removed.
 */
export async function reapStale(): Promise<string[]> {
  const removed: string[] = [];
  const list = await run('ip', ['netns', 'list'], { allowFailure: true, timeoutMs: 5000 });
  for (const line of list.stdout.split('\n')) {
    const name = line.trim().split(/\s+/)[0];
    const m = name ? /^rgt-(\d+)-[a-z0-9]+$/.exec(name) : null;
    if (!m) continue;
    const owner = Number(m[1]);
    if (owner === process.pid || isAlive(owner)) continue;
    deleteNamespaceSync(name!);
    removed.push(name!);
  }
  let entries: string[] = [];
  try {
    entries = readdirSync(WG_SOCKET_DIR).filter((f) => /^rg[A-Za-z0-9_-]{0,13}\.sock$/.test(f));
  } catch { /* no socket directory yet */ }
  for (const entry of entries) {
    const path = join(WG_SOCKET_DIR, entry);
    if (!(await refusesConnection(path))) continue;
    await sleep(300);
    if (!(await refusesConnection(path))) continue;
    try {
      unlinkSync(path);
      removed.push(path);
    } catch { /* gone meanwhile */ }
  }
  return removed;
}

/** True when `path` is a unix socket nobody listens on (ECONNREFUSED). */
function refusesConnection(path: string): Promise<boolean> {
  return new Promise((resolve) => {
    const sock = connect({ path });
    const done = (refused: boolean) => {
      sock.destroy();
      resolve(refused);
    };
    sock.setTimeout(1000, () => done(false));
    sock.once('connect', () => done(false));
    sock.once('error', (err: NodeJS.ErrnoException) => done(err.code === 'ECONNREFUSED'));
  });
}

// ---------------------------------------------------------------------------------------------
// namespaces, processes, scope

export interface Namespace {
  readonly name: string;
  /** Runs `ip netns exec NAME cmd args…` to completion (see {@link run}). */
  exec(cmd: string, args?: readonly string[], options?: RunOptions): Promise<RunResult>;
  /** Runs `ip -n NAME args…` (no extra process inside the namespace). */
  ip(args: readonly string[], options?: RunOptions): Promise<RunResult>;
}

export interface SpawnInNamespaceOptions {
  cwd?: string;
  env?: NodeJS.ProcessEnv;
  /** Keep at most this many bytes of stdout/stderr for diagnostics. Default 64 KiB each. */
  keepOutputBytes?: number;
  /** Leave stdout unread here (the caller consumes `child.stdout`). Default false. */
  rawStdout?: boolean;
  /** Grace period between SIGTERM and SIGKILL on stop. Default 3000 ms. */
  stopTimeoutMs?: number;
  /** Name used in messages. Default: the command. */
  label?: string;
}

/** How long `exitedAndDrained` waits after a process's exit for its output pipes to drain. */
const OUTPUT_DRAIN_MS = 2000;

/**
 * Resolves once `child` has exited and what it wrote to its pipes has been read (never rejects;
 * call it right after spawning). 'exit' can come before the last 'data' event: a test that read
 * the output at 'exit' lost ping's closing statistics that way. 'close' comes once the pipes are
 * read to their end; a background child that inherited them can hold them open, so after the
 * exit this waits at most OUTPUT_DRAIN_MS for it.
 */
export function exitedAndDrained(child: ChildProcess): Promise<{ code: number | null; signal: NodeJS.Signals | null }> {
  return new Promise((resolve) => {
    child.once('exit', (code, signal) => {
      const info = { code, signal };
      const drained = setTimeout(() => resolve(info), OUTPUT_DRAIN_MS);
      child.once('close', () => { clearTimeout(drained); resolve(info); });
    });
  });
}

/** A long-running process started with `ip netns exec` (which execs, so the pid is the command's). */
export class NsProcess {
  readonly child: ChildProcess;
  readonly pid: number;
  readonly label: string;
  readonly command: string;
  /** Resolves when the process has exited and its output has been read (never rejects). */
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  private out = '';
  private err = '';
  private exitInfo: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  private readonly keep: number;
  private readonly stopTimeoutMs: number;

  constructor(child: ChildProcess, command: string, options: SpawnInNamespaceOptions) {
    if (child.pid === undefined) throw new Error(`cannot start ${command}`);
    this.child = child;
    this.pid = child.pid;
    this.command = command;
    this.label = options.label ?? command;
    this.keep = options.keepOutputBytes ?? 65536;
    this.stopTimeoutMs = options.stopTimeoutMs ?? 3000;
    if (!options.rawStdout) child.stdout?.on('data', (c: Buffer) => { this.out = this.trim(this.out + c.toString('utf8')); });
    child.stderr?.on('data', (c: Buffer) => { this.err = this.trim(this.err + c.toString('utf8')); });
    child.once('exit', (code, signal) => {
      this.exitInfo = { code, signal };
      leftovers.pids.delete(this.pid);
    });
    this.exited = exitedAndDrained(child);
    child.on('error', (e) => { this.err = this.trim(`${this.err}\n[spawn error] ${e.message}`); });
  }

  private trim(text: string): string {
    return text.length > this.keep ? text.slice(text.length - this.keep) : text;
  }

  get stdout(): string { return this.out; }
  get stderr(): string { return this.err; }
  get running(): boolean { return this.exitInfo === undefined; }
  get exitStatus() { return this.exitInfo; }

  /** SIGTERM by pid, SIGKILL after the grace period; resolves once it has exited. Never throws. */
  async stop(): Promise<void> {
    if (!this.running) return;
    killQuietly(this.pid, 'SIGTERM');
    const timer = new Promise<'timeout'>((r) => { const t = setTimeout(() => r('timeout'), this.stopTimeoutMs); t.unref(); });
    if ((await Promise.race([this.exited, timer])) === 'timeout') {
      killQuietly(this.pid, 'SIGKILL');
      await Promise.race([this.exited, sleep(2000)]);
    }
    leftovers.pids.delete(this.pid);
  }

  /** A short description with the tail of its output, for assertion messages. */
  describe(): string {
    const status = this.exitInfo
      ? ` exited (${this.exitInfo.signal ? `signal ${this.exitInfo.signal}` : `code ${this.exitInfo.code}`})`
      : ' running';
    const tail = (s: string) => s.trim().split('\n').slice(-20).join('\n');
    return `${this.label} [pid ${this.pid}]${status}\n--- stderr ---\n${tail(this.err)}\n--- stdout ---\n${tail(this.out)}`;
  }
}

export interface VethEnd {
  ns: Namespace;
  ifname: string;
  /** Address without prefix length, e.g. '192.0.2.1' (undefined if none was given). */
  ipv4?: string;
  ipv6?: string;
}

export interface VethOptions {
  /** IPv4 addresses with prefix for the two ends, e.g. ['192.0.2.1/24', '192.0.2.2/24']. */
  ipv4?: [string, string];
  /** IPv6 addresses with prefix, e.g. ['2001:db8::1/64', '2001:db8::2/64']; added with `nodad`. */
  ipv6?: [string, string];
  /** Interface names; default unique `ve…` names. */
  names?: [string, string];
  mtu?: number;
}

type CleanupStep = { description: string; run: () => Promise<void> | void };

/**
 * Records everything a test creates and tears it down in reverse order. `cleanup()` is
 * idempotent and never throws; problems are collected and returned (and logged to stderr).
 */
export class Scope {
  private steps: CleanupStep[] = [];
  private closed = false;
  /** Unique per scope; used in namespace names. */
  readonly id = randomSuffix(6);

  constructor() {
    installExitHandlers();
  }

  /** Registers a cleanup step; steps run in reverse order of registration. */
  defer(description: string, step: () => Promise<void> | void): void {
    if (this.closed) throw new Error(`scope already cleaned up; cannot register "${description}"`);
    this.steps.push({ description, run: step });
  }

  /** Creates a namespace `rgt-<pid>-<random>` with `lo` up. */
  async namespace(): Promise<Namespace> {
    const name = `${NETNS_PREFIX}${process.pid}-${randomSuffix(6)}`;
    leftovers.namespaces.add(name);
    await run('ip', ['netns', 'add', name]);
    this.defer(`delete namespace ${name}`, () => this.deleteNamespace(name));
    const ns: Namespace = {
      name,
      exec: (cmd, args = [], options) => run('ip', ['netns', 'exec', name, cmd, ...args], options),
      ip: (args, options) => run('ip', ['-n', name, ...args], options),
    };
    await ns.ip(['link', 'set', 'lo', 'up']);
    return ns;
  }

  private async deleteNamespace(name: string): Promise<void> {
    // Anything still running inside (e.g. a ping) would keep the namespace alive.
    const pids = await run('ip', ['netns', 'pids', name], { allowFailure: true, timeoutMs: 5000 });
    for (const pid of pids.stdout.split(/\s+/).filter(Boolean).map(Number)) {
      if (Number.isInteger(pid) && pid > 1) killQuietly(pid, 'SIGKILL');
    }
    await run('ip', ['netns', 'del', name], { allowFailure: true, timeoutMs: 5000 });
    leftovers.namespaces.delete(name);
  }

  /**
   * Creates a veth pair with one end in each namespace, optional IPv4/IPv6 addresses (IPv6 with
   * `nodad`, usable at once) and both ends up. The pair disappears with either namespace; it is
   * also deleted explicitly at cleanup.
   */
  async veth(a: Namespace, b: Namespace, options: VethOptions = {}): Promise<[VethEnd, VethEnd]> {
    const [nameA, nameB] = options.names ?? [uniqueName('ve'), uniqueName('ve')];
    await run('ip', ['link', 'add', nameA, 'netns', a.name, 'type', 'veth', 'peer', 'name', nameB, 'netns', b.name]);
    this.defer(`delete veth ${a.name}/${nameA}`, async () => {
      await a.ip(['link', 'del', nameA], { allowFailure: true, timeoutMs: 5000 });
    });
    const ends: [VethEnd, VethEnd] = [{ ns: a, ifname: nameA }, { ns: b, ifname: nameB }];
    for (let i = 0; i < 2; i++) {
      const end = ends[i];
      if (options.mtu) await end.ns.ip(['link', 'set', end.ifname, 'mtu', String(options.mtu)]);
      const v4 = options.ipv4?.[i];
      if (v4) {
        await end.ns.ip(['addr', 'add', v4, 'dev', end.ifname]);
        end.ipv4 = v4.split('/')[0];
      }
      const v6 = options.ipv6?.[i];
      if (v6) {
        await end.ns.ip(['addr', 'add', v6, 'dev', end.ifname, 'nodad']);
        end.ipv6 = v6.split('/')[0];
      }
      await end.ns.ip(['link', 'set', end.ifname, 'up']);
    }
    return ends;
  }

  /**
   * Starts `cmd args…` inside `ns` (`ip netns exec`), tracking its pid; it is stopped (SIGTERM,
   * then SIGKILL) at cleanup. stdin is a pipe, so a child that reads stdin sees EOF when the test
   * process dies.
   */
  spawn(ns: Namespace, cmd: string, args: readonly string[] = [], options: SpawnInNamespaceOptions = {}): NsProcess {
    const spawnOptions: SpawnOptions = {
      cwd: options.cwd,
      env: envWithPath(options.env),
      stdio: ['pipe', 'pipe', 'pipe'],
    };
    const fullArgs = ['netns', 'exec', ns.name, cmd, ...args];
    const child = spawn('ip', fullArgs, spawnOptions);
    const proc = new NsProcess(child, formatCommand(cmd, args), options);
    leftovers.pids.add(proc.pid);
    this.defer(`stop ${proc.label} (pid ${proc.pid})`, () => proc.stop());
    return proc;
  }

  /** A fresh private temporary directory (mode 0700), removed at cleanup. */
  tempDir(prefix = 'roamguard-test-'): string {
    const dir = mkdtempSync(join(tmpdir(), prefix));
    leftovers.paths.add(dir);
    this.defer(`remove ${dir}`, () => {
      removePathSync(dir);
      leftovers.paths.delete(dir);
    });
    return dir;
  }

  /**
   * Registers a file (e.g. a control socket) to unlink at cleanup, also at process exit.
   * Registered now, so it runs after everything registered later (processes) has been stopped.
   */
  removeFileAtCleanup(path: string): void {
    leftovers.paths.add(path);
    this.defer(`remove ${path}`, () => {
      try { unlinkSync(path); } catch { /* already gone */ }
      leftovers.paths.delete(path);
    });
  }

  /** Tears everything down in reverse order. Idempotent; never throws; returns the problems. */
  async cleanup(): Promise<string[]> {
    const problems: string[] = [];
    this.closed = true;
    while (this.steps.length > 0) {
      const step = this.steps.pop()!;
      try {
        await step.run();
      } catch (err) {
        problems.push(`${step.description}: ${(err as Error).message ?? String(err)}`);
      }
    }
    if (problems.length > 0) process.stderr.write(`[netns] cleanup problems:\n  ${problems.join('\n  ')}\n`);
    return problems;
  }
}

/** Alias: a scope that holds a test topology. */
export { Scope as Topology };

// ---------------------------------------------------------------------------------------------
// the common two-namespace topology

export interface PairTopology {
  a: Namespace;
  b: Namespace;
  /** The veth ends with their outer addresses. */
  linkA: VethEnd & { ipv4: string; ipv6: string };
  linkB: VethEnd & { ipv4: string; ipv6: string };
}

/** Default outer addresses of {@link createPair}: documentation ranges, only inside the namespaces. */
export const PAIR_ADDRESSES = {
  ipv4: ['192.0.2.1/24', '192.0.2.2/24'] as [string, string],
  ipv6: ['2001:db8:77::1/64', '2001:db8:77::2/64'] as [string, string],
};

/**
 * Two fresh namespaces A and B joined by a veth pair with IPv4 and IPv6 addresses (defaults in
 * {@link PAIR_ADDRESSES}), everything recorded in `scope`.
 */
export async function createPair(scope: Scope, addresses: VethOptions = PAIR_ADDRESSES): Promise<PairTopology> {
  const a = await scope.namespace();
  const b = await scope.namespace();
  const [linkA, linkB] = await scope.veth(a, b, { ipv4: PAIR_ADDRESSES.ipv4, ipv6: PAIR_ADDRESSES.ipv6, ...addresses });
  if (!linkA.ipv4 || !linkA.ipv6 || !linkB.ipv4 || !linkB.ipv6) throw new Error('createPair needs IPv4 and IPv6 addresses');
  return { a, b, linkA: linkA as PairTopology['linkA'], linkB: linkB as PairTopology['linkB'] };
}

/** `host:port` or `[host]:port`. */
export function joinHostPort(host: string, port: number): string {
  return host.includes(':') ? `[${host}]:${port}` : `${host}:${port}`;
}

/** Namespaces of this process that still exist (for leak assertions). */
export async function ownNamespaces(): Promise<string[]> {
  const list = await run('ip', ['netns', 'list'], { timeoutMs: 5000 });
  const prefix = `${NETNS_PREFIX}${process.pid}-`;
  return list.stdout.split('\n').map((l) => l.trim().split(/\s+/)[0]).filter((n): n is string => !!n && n.startsWith(prefix));
}
