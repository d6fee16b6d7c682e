/**
 * `roamguard demo --once --scenario hard-nat`: the demo's NAT world with a port-randomising home
 * NAT and a café behind another one. The nodes there meet no NAT'd node directly, so the demo must
 * end all green with those pairs in the peer table as "relay via c1/c2", both sides of the
 * home ↔ café pair through the same relay, and leave nothing behind.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { run } from './netns.ts';
import { runDemo } from './demo-run.ts';

describe('roamguard demo --scenario hard-nat', { timeout: 320_000 }, () => {
  test('ends all green with the pairs behind port-randomising NATs relayed, as the peer table shows', async (t) => {
    const { code, output, pid } = await runDemo(['--once', '--timeout', '180', '--scenario', 'hard-nat'], { timeoutMs: 300_000 });
    assert.equal(code, 0, output.slice(-4000));
    const table = output.slice(output.lastIndexOf('PEERS'), output.lastIndexOf('REACHABILITY'));
    t.diagnostic(output.slice(output.lastIndexOf('RELAYS')));
    assert.match(output.slice(output.lastIndexOf('REACHABILITY')), /all pods reach all pods over IPv4 and IPv6/);
    assert.doesNotMatch(output.slice(output.lastIndexOf('REACHABILITY'), output.lastIndexOf('RELAYS')), /✗/);
    const relayed = (from: string, to: string) => new RegExp(`^${from} +${to} +203\\.0\\.113\\.[12]:519\\d\\d +relay via (c1|c2) `, 'm').exec(table)?.[1];
    const viaHome = relayed('h1', 'k1'), viaCafe = relayed('k1', 'h1');
    assert.ok(viaHome && viaHome === viaCafe, `h1 ↔ k1 through one relay in the peer table:\n${table}`);
    for (const [a, b] of [['o1', 'h1'], ['o2', 'k1']]) assert.ok(relayed(a, b), `${a} → ${b} relayed:\n${table}`);
    assert.match(table, /^o1 +o2 +192\.168\.1\.12:51822 +LAN /m, 'nodes behind one NAT keep their LAN path');
    assert.match(table, /^o1 +c1 +203\.0\.113\.1:51820 +public /m, 'public nodes are reached directly');
    assert.match(output, /demo removed: no namespaces or processes left behind/);
    const left = (await run('ip', ['netns', 'list'])).stdout.split('\n').filter((l) => l.startsWith(`rgt-${pid}-`));
    assert.deepEqual(left, []);
  });
});
