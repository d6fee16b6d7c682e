/**
 * sys/jit-tiering.ts: after optimizeDataPathSooner() a thread that was already running
 * optimizes a hot function after fewer calls than V8's default budget lets it. Shown in a child Node process
 * (V8's natives syntax reports the tier; compiling synchronously so the count is exact), whatever
 * runtime runs this test: the setting is about V8.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const MODULE = fileURLToPath(new URL('../../dataplane/sys/jit-tiering.ts', import.meta.url));
const TSX = fileURLToPath(new URL('../../node_modules/tsx/dist/loader.mjs', import.meta.url));

/** Calls until a worker thread's hot function is optimized, with or without the lower budget. */
function callsUntilOptimized(sooner: boolean): number {
  // As in the daemon: the thread is running before the budget changes (it waits for the go).
  const script = `
    const { optimizeDataPathSooner } = await import(${JSON.stringify(MODULE)});
    const { Worker } = await import('node:worker_threads');
    const worker = new Worker(\`
      import('node:worker_threads').then(({ parentPort }) => parentPort.once('message', () => {
        function work(a) { let s = 0; for (let i = 0; i < a.length; i++) s = (s + a[i] * 31) | 0; return s; }
        const a = new Int32Array(64).fill(3);
        let calls = 0;
        for (; calls < 100000; calls++) { work(a); if ((%GetOptimizationStatus(work) & 16) !== 0) break; }
        parentPort.postMessage(calls);
      }));
    \`, { eval: true });
    worker.on('online', () => {
      if (process.env.SOONER === '1') optimizeDataPathSooner();
      worker.postMessage('go');
    });
    worker.on('message', (calls) => { console.log(calls); process.exit(0); });`;
  const r = spawnSync('node', ['--import', TSX, '--allow-natives-syntax', '--no-concurrent-recompilation', '--input-type=module', '-e', script], {
    encoding: 'utf8', env: { ...process.env, SOONER: sooner ? '1' : '0' }, timeout: 30_000,
  });
  assert.equal(r.status, 0, r.stderr);
  return Number(r.stdout.trim());
}

describe('V8 interrupt budget for the data threads', () => {
  test('a running thread, after optimizeDataPathSooner(), optimizes a hot function after far fewer calls', () => {
    const usual = callsUntilOptimized(false);
    const sooner = callsUntilOptimized(true);
    assert.ok(usual > 0 && usual < 100000, `optimized at all with V8's default (${usual} calls)`);
    assert.ok(sooner * 2 <= usual, `sooner: ${sooner} calls, V8's default: ${usual}`);
  });
});
