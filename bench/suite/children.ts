/**
 * The suite's helper processes (microbenchmarks, the scale run's simulated peers): TypeScript
 * scripts of this checkout run by Node (through tsx) or Bun inside one of the bench's namespaces,
 * tracked by a Scope (stopped by pid), talking JSON lines on stdout.
 */
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { which, type Namespace, type NsProcess, type Scope } from '../../test/system/netns.ts';
import { ROAMGUARD_BIN, bunBinary } from './subjects.ts';

const ROOT = join(ROAMGUARD_BIN, '..', '..');

/** The command that runs `script` (a path inside this checkout) under `runtime`. */
export function scriptCommand(runtime: 'node' | 'bun', script: string, options: { exposeGc?: boolean } = {}): { cmd: string; args: string[] } {
  const path = join(ROOT, script);
  if (runtime === 'bun') {
    const bun = bunBinary();
    if (!bun) throw new Error('bun is not installed (npm install bun)');
    return { cmd: bun, args: [path] };
  }
  const args = options.exposeGc ? ['--expose-gc'] : [];
  args.push('--import', `file://${join(ROOT, 'node_modules', 'tsx', 'dist', 'esm', 'index.mjs')}`, path);
  // The bench itself may run under Bun (roamguard --runtime bun bench): then find node on the PATH.
  const onBun = typeof (globalThis as { Bun?: unknown }).Bun !== 'undefined';
  return { cmd: onBun ? (which('node') ?? 'node') : process.execPath, args };
}

export interface ChildOptions {
  label: string;
  /** Written to stdin (then left open: the child sees EOF only when the bench dies). */
  input?: string;
  /** Stop the child and fail after this long. */
  timeoutMs: number;
  /** Every JSON line of stdout, parsed. */
  onMessage: (message: unknown) => void;
}

/**
 * Runs `cmd args` in `ns` until it exits; resolves when it exited with status 0, else throws with
 * the tail of its stderr. Lines of stdout that are not JSON are ignored.
 */
export async function runJsonLinesChild(scope: Scope, ns: Namespace, cmd: string, args: string[], options: ChildOptions): Promise<void> {
  const child: NsProcess = scope.spawn(ns, cmd, args, { label: options.label, rawStdout: true, stopTimeoutMs: 2000 });
  const lines = createInterface({ input: child.child.stdout! });
  const read = new Promise<void>((resolve) => {
    lines.on('line', (line) => {
      if (!line.startsWith('{')) return;
      let message: unknown;
      try { message = JSON.parse(line); } catch { return; }
      options.onMessage(message);
    });
    lines.once('close', resolve);
  });
  if (options.input !== undefined) child.child.stdin?.write(options.input);
  let timer: NodeJS.Timeout | undefined;
  const overstayed = new Promise<'timeout'>((resolve) => { timer = setTimeout(() => resolve('timeout'), options.timeoutMs); });
  const outcome = await Promise.race([child.exited, overstayed]);
  clearTimeout(timer);
  if (outcome === 'timeout') {
    await child.stop();
    throw new Error(`${options.label} did not finish within ${Math.round(options.timeoutMs / 1000)} s\n${child.describe()}`);
  }
  await Promise.race([read, new Promise((resolve) => setTimeout(resolve, 1000))]);
  if (outcome.code !== 0) throw new Error(`${options.label} failed (${outcome.signal ?? `exit ${outcome.code}`})\n${child.describe()}`);
}
