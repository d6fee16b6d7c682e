/**
 * The README's main command: `roamguard demo --once` builds the NAT world, prints an all-green
 * matrix, exits 0 and leaves nothing behind; without root it says so and changes nothing.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { run } from './netns.ts';
import { runDemo as runDemoWith } from './demo-run.ts';

const runDemo = (args: string[], asUser?: string) => runDemoWith(args, { timeoutMs: 280_000, asUser });


describe('roamguard demo', { timeout: 300_000 }, () => {
  test('--once prints an all-green matrix, exits 0 and removes everything it built', async () => {
    const { code, output, pid } = await runDemo(['--once', '--timeout', '150']);
    assert.equal(code, 0, output.slice(-3000));
    assert.match(output, /REACHABILITY \(pod → pod: IPv4 IPv6\)/);
    assert.match(output, /all pods reach all pods over IPv4 and IPv6/);
    assert.doesNotMatch(output.slice(output.indexOf('REACHABILITY')), /✗/);
    for (const node of ['c1', 'c2', 'o1', 'o2', 'h1']) assert.match(output, new RegExp(`^${node} `, 'm'));
    assert.match(output, /^o1 +o2 +192\.168\.1\.12:51822 +LAN/m, 'office nodes use the LAN between them');
    assert.match(output, /^c1 +h1 +203\.0\.113\.20:51824 +NAT/m, 'the cloud reaches home through its NAT mapping');
    assert.match(output, /demo removed: no namespaces or processes left behind/);
    // The demo's namespaces carry its process id (bin/roamguard execs node, keeping the pid).
    const left = (await run('ip', ['netns', 'list'])).stdout.split('\n').filter((l) => l.startsWith(`rgt-${pid}-`));
    assert.deepEqual(left, []);
  });

  test('without root it names what it needs and builds nothing', async () => {
    const { code, output } = await runDemo(['--once'], 'nobody');
    assert.equal(code, 2, output);
    assert.match(output, /roamguard demo needs: root \(it builds network namespaces/);
  });
});
