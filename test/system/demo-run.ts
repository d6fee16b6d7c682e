/**
 * Runs `roamguard demo ARGS` as a child (optionally as another user) and collects its output; the
 * demo tests share it. The demo is stopped with SIGINT (its own clean-up path) after `timeoutMs`.
 */
import { spawn } from 'node:child_process';
import { exitedAndDrained } from './netns.ts';
import { REPO_ROOT, ROAMGUARD_BIN } from './userspace-wg.ts';

export interface DemoRun { code: number | null; output: string; pid: number }

export function runDemo(args: string[], options: { timeoutMs: number; asUser?: string }): Promise<DemoRun> {
  return new Promise((resolve, reject) => {
    const { asUser } = options;
    const [cmd, argv] = asUser ? ['runuser', ['-u', asUser, '--', ROAMGUARD_BIN, 'demo', ...args]] : [ROAMGUARD_BIN, ['demo', ...args]];
    const child = spawn(cmd, argv, { cwd: REPO_ROOT, stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    child.stdout.on('data', (c: Buffer) => { output += c.toString(); });
    child.stderr.on('data', (c: Buffer) => { output += c.toString(); });
    const timer = setTimeout(() => { child.kill('SIGINT'); }, options.timeoutMs);
    child.on('error', reject);
    child.once('exit', () => clearTimeout(timer));
    void exitedAndDrained(child).then(({ code }) => resolve({ code, output, pid: child.pid! }));
  });
}
