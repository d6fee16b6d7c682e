/**
 * The command spawner (control/host/spawner.ts): commands started from a helper process give
 * what systemRunner gives (output, exit codes, stdin, a missing command), and a helper that dies
 * is replaced, failing only the commands that were waiting on it.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { CommandSpawner } from '../../control/host/spawner.ts';
import { systemRunner } from '../../control/host/runner.ts';
import { isBun } from '../../dataplane/sys/threads.ts';

test('results are what systemRunner gives: output, exit code, stdin, environment', async () => {
  const spawner = new CommandSpawner();
  try {
    for (const [cmd, args, options] of [
      ['sh', ['-c', 'echo out; echo err >&2; exit 3'], undefined],
      ['cat', [], { input: 'line one\nline two\n' }],
      ['sh', ['-c', 'echo "$RG_SPAWNER_TEST"'], { env: { RG_SPAWNER_TEST: 'from options' } }],
      ['ip', ['-j', 'link', 'show', 'lo'], undefined],
    ] as const) {
      const viaHelper = await spawner.run(cmd, args, options);
      const direct = await systemRunner(cmd, args, options);
      assert.deepEqual(viaHelper, direct, `${cmd} ${args.join(' ')}`);
    }
    if (isBun) assert.equal(spawner.helperPid, undefined, 'under Bun commands run from the process itself');
    else assert.ok(spawner.helperPid !== undefined && spawner.helperPid !== process.pid, 'the commands went through the helper');
  } finally {
    spawner.close();
  }
});

test('a command that cannot start is refused with the same message', async () => {
  const spawner = new CommandSpawner();
  try {
    const viaHelper = await spawner.run('rg-no-such-command', ['x']).then(() => 'ran', (err: Error) => err.message);
    const direct = await systemRunner('rg-no-such-command', ['x']).then(() => 'ran', (err: Error) => err.message);
    assert.equal(viaHelper, direct);
    assert.match(viaHelper, /cannot start rg-no-such-command/);
  } finally {
    spawner.close();
  }
});

test('a helper that dies fails the commands waiting on it, and the next command gets a new helper (under Bun: no helper, commands run directly)', async () => {
  const spawner = new CommandSpawner();
  try {
    if (isBun) {
      assert.equal((await spawner.run('echo', ['direct'])).stdout, 'direct\n');
      assert.equal(spawner.helperPid, undefined, 'no helper to die under Bun');
      return;
    }
    const waiting = spawner.run('sleep', ['5']).then(() => 'finished', (err: Error) => err.message);
    const first = spawner.helperPid!;
    process.kill(first, 'SIGKILL');
    assert.match(await waiting, /the command spawner exited/);
    const after = await spawner.run('echo', ['again']);
    assert.equal(after.stdout, 'again\n');
    assert.notEqual(spawner.helperPid, first);
  } finally {
    spawner.close();
  }
});

test('after close, commands run from this process', async () => {
  const spawner = new CommandSpawner();
  spawner.close();
  const result = await spawner.run('echo', ['direct']);
  assert.equal(result.stdout, 'direct\n');
  assert.equal(spawner.helperPid, undefined);
});
