/**
 * A process whose reader threads block in poll(2) still ends when it should. Node ends a process by
 * joining its worker threads, and terminating a worker does not interrupt a system call: before
 * sys/threads.ts's wakeAtExit, an uncaught exception left the daemon alive for ever, its main thread
 * in pthread_join, its control socket and interface in place (found when a closed stderr raised one).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { isBun } from '../../dataplane/sys/threads.ts';

const child = fileURLToPath(new URL('./exit-with-reader.ts', import.meta.url));

/** Runs the child to its end (killed after `limitMs`); its exit code, whether it was killed, its output. */
function runChild(how: string, limitMs: number): Promise<{ code: number | null; killed: boolean; stdout: string; stderr: string }> {
  const args = isBun ? [child, how] : ['--import', 'tsx', child, how];
  const proc = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let stdout = '';
  let stderr = '';
  proc.stdout.on('data', (chunk: Buffer) => { stdout += chunk; });
  proc.stderr.on('data', (chunk: Buffer) => { stderr += chunk; });
  let killed = false;
  const timer = setTimeout(() => { killed = true; proc.kill('SIGKILL'); }, limitMs);
  return new Promise((resolve) => proc.on('close', (code) => {
    clearTimeout(timer);
    resolve({ code, killed, stdout, stderr });
  }));
}

test('an uncaught exception ends a process whose UDP reader sits in poll', { timeout: 60_000 }, async () => {
  const result = await runChild('throw', 20_000);
  assert.match(result.stdout, /reader running/, `the reader ran first\n${result.stderr}`);
  assert.equal(result.killed, false, `the process ended by itself (it hung in exit)\n${result.stderr}`);
  assert.notEqual(result.code, 0);
  assert.match(result.stderr, /an uncaught exception on purpose/);
});

test('process.exit ends a process whose UDP reader sits in poll, with its code', { timeout: 60_000 }, async () => {
  const result = await runChild('exit', 20_000);
  assert.match(result.stdout, /reader running/, `the reader ran first\n${result.stderr}`);
  assert.equal(result.killed, false, `the process ended by itself (it hung in exit)\n${result.stderr}`);
  assert.equal(result.code, 3);
});
