/**
 * The data plane runs as its own long-lived process (`roamguard wg IFNAME`, or wireguard-go), so
 * restarting or upgrading the agent never cuts pod traffic (Cilium removed its in-agent userspace
 * WireGuard for exactly that reason). The agent only makes sure one answers on the control socket,
 * starting it when absent, and then talks to it through that socket alone.
 */
import { spawn } from 'node:child_process';
import { dirname, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { DataplaneChoice } from '../config/settings.ts';
import type { UapiClient } from '../../dataplane/uapi/uapi-client.ts';

export const ROAMGUARD_BIN = resolve(dirname(fileURLToPath(import.meta.url)), '../../bin/roamguard');

export interface DataplaneOptions {
  choice: DataplaneChoice;
  ifname: string;
  client: UapiClient;
  /** How long to wait for a data plane to answer after starting it (or, for `external`, at all). */
  readyTimeoutMs?: number;
  /** Environment for a started daemon (test timings…). */
  env?: NodeJS.ProcessEnv;
  /** Each line a daemon started here writes to its stderr (its errors), while both of us run. */
  onLog?: (line: string) => void;
}

export type DataplaneStatus = 'running' | 'started';

function launchCommand(choice: Exclude<DataplaneChoice, 'external'>, ifname: string): { cmd: string; args: string[] } {
  return choice === 'roamguard'
    ? { cmd: ROAMGUARD_BIN, args: ['wg', ifname] }
    : { cmd: 'wireguard-go', args: [ifname] };
}

/**
 * Where a started daemon's log lines go. Both daemons detach, and with LOG_LEVEL set the detached
 * one keeps the launcher's stderr: our pipe. Its errors then belong in our log, for as long as we
 * live; after we are gone (an agent restart) the pipe has no reader. roamguard's daemon shrugs
 * that off (dataplane/log.ts), but a Go program writing to a broken stderr pipe is killed by
 * SIGPIPE, so wireguard-go gets no LOG_LEVEL: it then detaches with its output on /dev/null, and
 * still reports a failed start itself, before detaching. The agent's own LOG_LEVEL (info, warn…)
 * means nothing to either: only `extra` (DataplaneOptions.env) may set one, for roamguard.
 */
function daemonEnvironment(choice: Exclude<DataplaneChoice, 'external'>, extra: NodeJS.ProcessEnv = {}): NodeJS.ProcessEnv {
  const { LOG_LEVEL: _agents, ...inherited } = process.env;
  const env = { ...inherited, ...extra };
  if (choice === 'roamguard') return { LOG_LEVEL: 'error', ...env };
  delete env.LOG_LEVEL;
  return env;
}

/**
 * Runs a daemon that detaches by itself (both do, like wireguard-go) and waits for the launcher to
 * return. The daemon's stderr stays ours: each line it writes is handed to `onLog`.
 */
function runDetaching(cmd: string, args: string[], env: NodeJS.ProcessEnv, onLog: (line: string) => void): Promise<void> {
  return new Promise((resolvePromise, reject) => {
    // detached: the daemon must not share the agent's process group, or a signal to the agent's
    // group (kubectl delete pod, Ctrl-C) would take the data plane down with it.
    const child = spawn(cmd, args, { detached: true, stdio: ['ignore', 'ignore', 'pipe'], env });
    const stderr = child.stderr!;
    stderr.setEncoding('utf8');
    stderr.on('error', () => {}); // a daemon that is gone has nothing more to say
    // Lines are held until the launcher's verdict: on failure its last one is the reason.
    let held: string[] | undefined = [];
    let partial = '';
    stderr.on('data', (chunk: string) => {
      const lines = (partial + chunk).split('\n');
      partial = lines.pop()!.slice(-4096);
      for (const line of lines) {
        if (line.trim() === '') continue;
        if (held === undefined) onLog(line);
        else if (held.push(line) > 64) held.shift();
      }
    });
    child.on('error', (err) => reject(new Error(`cannot start ${cmd}: ${err.message}`)));
    child.on('exit', (code, signal) => {
      const lines = held!;
      held = undefined;
      if (code === 0) {
        for (const line of lines) onLog(line);
        // Read for as long as the daemon writes, without keeping this process alive for it.
        (stderr as unknown as { unref(): void }).unref();
        resolvePromise();
      } else {
        stderr.destroy();
        reject(new Error(`${cmd} ${args.join(' ')} failed (${signal ?? `exit ${code}`}): ${(partial || lines.at(-1) || '').trim()}`));
      }
    });
  });
}

async function waitAlive(client: UapiClient, timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await client.alive()) return true;
    if (Date.now() >= deadline) return false;
    await new Promise((r) => setTimeout(r, 100));
  }
}

export async function ensureDataplane(options: DataplaneOptions): Promise<DataplaneStatus> {
  const timeout = options.readyTimeoutMs ?? 20_000;
  if (await options.client.alive()) return 'running';
  if (options.choice === 'external') {
    if (await waitAlive(options.client, timeout)) return 'running';
    throw new Error(`no data plane answers on ${options.client.socketPath} (WG_DATAPLANE=external: start one, e.g. roamguard wg ${options.ifname})`);
  }
  const { cmd, args } = launchCommand(options.choice, options.ifname);
  await runDetaching(cmd, args, daemonEnvironment(options.choice, options.env), options.onLog ?? (() => {}));
  if (!(await waitAlive(options.client, timeout))) throw new Error(`${cmd} started but ${options.client.socketPath} does not answer`);
  return 'started';
}

