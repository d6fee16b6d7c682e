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
  /** Environment for a started daemon (LOG_LEVEL in wireguard-go's terms, test timings…). */
  env?: NodeJS.ProcessEnv;
}

export type DataplaneStatus = 'running' | 'started';

function launchCommand(choice: Exclude<DataplaneChoice, 'external'>, ifname: string): { cmd: string; args: string[] } {
  return choice === 'roamguard'
    ? { cmd: ROAMGUARD_BIN, args: ['wg', ifname] }
    : { cmd: 'wireguard-go', args: [ifname] };
}

/** Runs a daemon that detaches by itself (both do, like wireguard-go) and waits for it to return. */
function runDetaching(cmd: string, args: string[], env: NodeJS.ProcessEnv): Promise<void> {
  return new Promise((resolvePromise, reject) => {
    // detached: the daemon must not share the agent's process group, or a signal to the agent's
    // group (kubectl delete pod, Ctrl-C) would take the data plane down with it.
    const child = spawn(cmd, args, { detached: true, stdio: ['ignore', 'ignore', 'pipe'], env });
    let stderr = '';
    child.stderr!.setEncoding('utf8');
    child.stderr!.on('data', (chunk: string) => { if (stderr.length < 4096) stderr += chunk; });
    child.on('error', (err) => reject(new Error(`cannot start ${cmd}: ${err.message}`)));
    child.on('exit', (code, signal) => {
      child.stderr!.destroy();
      if (code === 0) resolvePromise();
      else reject(new Error(`${cmd} ${args.join(' ')} failed (${signal ?? `exit ${code}`}): ${stderr.trim().split('\n').at(-1) ?? ''}`));
    });
    child.unref();
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
  const env = { ...process.env, LOG_LEVEL: 'error', ...options.env };
  // The agent's own settings must not leak into the daemon's (LOG_LEVEL=info means nothing to it).
  await runDetaching(cmd, args, env);
  if (!(await waitAlive(options.client, timeout))) throw new Error(`${cmd} started but ${options.client.socketPath} does not answer`);
  return 'started';
}

