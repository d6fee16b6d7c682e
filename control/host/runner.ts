/**
 * How the host-programming modules run external commands (`nft`, `ip`, CNI plugins).
 *
 * Every function in control/host/ that touches the host takes a {@link CommandRunner} instead of
 * spawning processes itself, so unit tests can record what would be run and system tests can run
 * the same code inside a network namespace ({@link netnsRunner}).
 *
 * A runner never throws because a command exited non-zero: it reports the exit status and the
 * callers decide (most go through {@link runChecked}, which turns a failure into an error that
 * names the command, its purpose and its stderr). It rejects only when the command could not be
 * started at all or ran past its timeout.
 */
import { spawn } from 'node:child_process';
import { delimiter } from 'node:path';

export interface CommandOptions {
  /** Written to stdin, which is then closed. Without it stdin is empty. */
  input?: string;
  /** Variables added to the inherited environment. */
  env?: Readonly<Record<string, string>>;
  /** Kill (SIGKILL) and reject after this many ms. Default 30 000. */
  timeoutMs?: number;
}

export interface CommandResult {
  /** The command line as text, for messages. */
  command: string;
  code: number | null;
  signal: string | null;
  stdout: string;
  stderr: string;
}

export type CommandRunner = (cmd: string, args: readonly string[], options?: CommandOptions) => Promise<CommandResult>;

/** A command that exited non-zero (or by a signal) where success was required. */
export class HostCommandError extends Error {
  constructor(message: string, readonly result: CommandResult) {
    super(message);
    this.name = 'HostCommandError';
  }
}

// `ip` and `nft` live in sbin, which a container's or a user's PATH may lack.
const SBIN_DIRS = ['/usr/local/sbin', '/usr/sbin', '/sbin', '/usr/local/bin', '/usr/bin', '/bin'];

function pathWithSbin(path: string | undefined): string {
  const dirs = [...(path ?? '').split(delimiter).filter(Boolean), ...SBIN_DIRS];
  return dirs.filter((dir, i) => dirs.indexOf(dir) === i).join(delimiter);
}

function quoteArg(arg: string): string {
  return /^[\w@%+=:,./-]+$/.test(arg) ? arg : `'${arg.replace(/'/g, `'\\''`)}'`;
}

/** `cmd args…` as a shell-like line, for messages only. */
export function describeCommand(cmd: string, args: readonly string[]): string {
  return [cmd, ...args].map(quoteArg).join(' ');
}

/** Runs commands on this host with child_process.spawn (no shell). */
export const systemRunner: CommandRunner = (cmd, args, options = {}) => {
  const command = describeCommand(cmd, args);
  const timeoutMs = options.timeoutMs ?? 30_000;
  return new Promise<CommandResult>((resolve, reject) => {
    const env = { ...process.env, ...options.env };
    env.PATH = pathWithSbin(env.PATH);
    let child;
    try {
      child = spawn(cmd, [...args], { env, stdio: ['pipe', 'pipe', 'pipe'] });
    } catch (err) {
      reject(new Error(`cannot start ${command}: ${(err as Error).message}`));
      return;
    }
    const out: Buffer[] = [];
    const errOut: Buffer[] = [];
    child.stdout.on('data', (chunk: Buffer) => out.push(chunk));
    child.stderr.on('data', (chunk: Buffer) => errOut.push(chunk));
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      child.kill('SIGKILL');
    }, timeoutMs);
    // A command may exit without reading its input; that is not our error to report.
    child.stdin.on('error', () => {});
    child.stdin.end(options.input ?? '');
    child.on('error', (e) => {
      clearTimeout(timer);
      reject(new Error(`cannot start ${command}: ${e.message}`));
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      const result: CommandResult = {
        command, code, signal,
        stdout: Buffer.concat(out).toString('utf8'),
        stderr: Buffer.concat(errOut).toString('utf8'),
      };
      if (timedOut) reject(new HostCommandError(`command timed out after ${timeoutMs} ms: ${command}`, result));
      else resolve(result);
    });
  });
};

/**
 * A runner that runs every command inside the named network namespace (`ip netns exec NAME …`),
 * through `base`. Used by system tests to program a namespace exactly as the agent programs a node.
 */
export function netnsRunner(namespace: string, base: CommandRunner = systemRunner): CommandRunner {
  if (!/^[A-Za-z0-9_.-]+$/.test(namespace)) throw new Error(`bad network namespace name ${JSON.stringify(namespace)}`);
  return async (cmd, args, options) => {
    const result = await base('ip', ['netns', 'exec', namespace, cmd, ...args], options);
    return { ...result, command: `[netns ${namespace}] ${describeCommand(cmd, args)}` };
  };
}

/**
 * Runs a command that must succeed. `purpose` says why it ran ("apply the nftables ruleset"), so
 * the error reads as what failed, then how, then the command's own explanation.
 */
export async function runChecked(
  runner: CommandRunner,
  purpose: string,
  cmd: string,
  args: readonly string[],
  options?: CommandOptions,
): Promise<CommandResult> {
  const result = await runner(cmd, args, options);
  if (result.code !== 0 || result.signal !== null) {
    const status = result.signal !== null ? `signal ${result.signal}` : `exit code ${result.code}`;
    const detail = [result.stderr.trim(), result.stdout.trim()].filter(Boolean).join('\n').slice(-4000);
    throw new HostCommandError(`cannot ${purpose}: ${result.command} failed (${status})${detail ? `:\n${detail}` : ''}`, result);
  }
  return result;
}
