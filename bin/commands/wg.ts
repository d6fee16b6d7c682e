/**
 * `roamguard wg [-f|--foreground] [--threads N] IFNAME`: the userspace WireGuard daemon, started
 * like wireguard-go. Without -f it detaches and returns only once the interface and the control
 * socket are ready (or fails with the daemon's error), so wg-quick can use it.
 */
import { spawn } from 'node:child_process';
import { closeSync, writeSync } from 'node:fs';
import type { Command } from '../roamguard.ts';
import { parseLogLevel } from '../../dataplane/log.ts';
import { dataplaneSettingsTable, loadDataplaneSettings, type DataplaneSettings } from '../../dataplane/settings.ts';

/** The detached daemon reports readiness ("ok") or its error on this file descriptor. */
const READY_FD = 3;
const READY_ENV = 'ROAMGUARD_READY_FD';

interface WgArgs {
  ifname: string;
  foreground: boolean;
  threads?: number;
}

function parseArgs(args: string[]): WgArgs {
  let foreground = process.env.WG_PROCESS_FOREGROUND === '1';
  let threads: number | undefined;
  const rest: string[] = [];
  for (let i = 0; i < args.length; i++) {
    const arg = args[i];
    if (arg === '-f' || arg === '--foreground') foreground = true;
    else if (arg === '--threads') {
      threads = Number(args[++i]);
      if (!Number.isInteger(threads) || threads < 0 || threads > 64) throw new Error(`--threads must be a whole number 0..64, got ${args[i]}`);
    } else if (arg.startsWith('-')) throw new Error(`unknown option ${arg} (see roamguard wg --help)`);
    else rest.push(arg);
  }
  if (rest.length !== 1) throw new Error('usage: roamguard wg [-f|--foreground] [--threads N] IFNAME');
  return { ifname: rest[0], foreground, threads };
}

function report(message: string): void {
  const fd = Number(process.env[READY_ENV]);
  if (!Number.isInteger(fd) || fd <= 0) return;
  try {
    writeSync(fd, `${message}\n`);
    closeSync(fd);
  } catch { /* the parent is gone: nothing to tell */ }
  delete process.env[READY_ENV];
}

/** Re-runs this command in the foreground, detached, and waits for its readiness report. */
function detach(args: string[]): Promise<number> {
  const logging = process.env.LOG_LEVEL !== undefined && process.env.LOG_LEVEL !== 'silent';
  const child = spawn(process.execPath, [...process.execArgv, process.argv[1], 'wg', '--foreground', ...args.filter((a) => a !== '-f' && a !== '--foreground')], {
    detached: true,
    stdio: ['ignore', logging ? 'inherit' : 'ignore', logging ? 'inherit' : 'ignore', 'pipe'],
    env: { ...process.env, [READY_ENV]: String(READY_FD) },
  });
  return new Promise((resolve) => {
    let answer = '';
    const pipe = child.stdio[READY_FD] as NodeJS.ReadableStream;
    pipe.setEncoding('utf8');
    pipe.on('data', (chunk: string) => { answer += chunk; });
    const settle = (code: number) => {
      child.removeAllListeners('exit');
      pipe.removeAllListeners();
      (pipe as unknown as { destroy(): void }).destroy();
      child.unref();
      resolve(code);
    };
    pipe.on('end', () => {
      const line = answer.trim();
      if (line === 'ok') settle(0);
      else {
        console.error(`roamguard wg: ${line || 'the daemon exited before it was ready'}`);
        settle(1);
      }
    });
    child.on('exit', (code) => {
      if (answer.trim() === '') {
        console.error(`roamguard wg: the daemon exited (code ${code}) before it was ready`);
        settle(1);
      }
    });
  });
}

export const wg: Command = {
  summary: 'run the userspace WireGuard daemon for an interface (like wireguard-go)',
  usage: `roamguard wg [-f|--foreground] [--threads N] IFNAME

  -f, --foreground   stay in the foreground (also WG_PROCESS_FOREGROUND=1)
  --threads N        data threads: TUN queues, each read, sealed and sent by its own thread
                     (default: one per core; 0 = one queue, as 1)

Environment: LOG_LEVEL=verbose|debug|error|silent (default error); ROAMGUARD_RUNTIME=node|bun.
The control socket is /var/run/wireguard/IFNAME.sock; configure with wg(8).
The daemon exits on SIGINT/SIGTERM, when the socket file is deleted or the interface removed.

The data path's settings (read once at start; a bad value stops it with one line naming it):

${dataplaneSettingsTable()}`,
  async run(args) {
    let parsed: WgArgs;
    let settings: DataplaneSettings;
    try {
      parsed = parseArgs(args);
      parseLogLevel(process.env.LOG_LEVEL);
      // Checked before detaching too, so that a bad value is reported by the command itself.
      settings = loadDataplaneSettings();
    } catch (err) {
      console.error(`roamguard wg: ${(err as Error).message}`);
      return 2;
    }
    if (!parsed.foreground) return detach(args);
    const { runDaemon } = await import('../../dataplane/device/daemon.ts');
    try {
      return await runDaemon({
        ifname: parsed.ifname,
        logLevel: parseLogLevel(process.env.LOG_LEVEL),
        threads: parsed.threads,
        settings,
        onReady: () => report('ok'),
      });
    } catch (err) {
      const message = (err as Error).message;
      report(message);
      console.error(`roamguard wg: ${message}`);
      return 1;
    }
  },
};
