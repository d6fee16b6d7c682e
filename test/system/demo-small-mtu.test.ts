/**
 * `roamguard demo --once --scenario small-mtu`: the demo's NAT world with a 1280-byte hop that
 * drops ICMP on the home router's uplink. It must end all green, report for every peer of h1 the
 * path MTU learned on both sides (below the tunnel's 1420) and bulk TCP across the hop both ways,
 * and leave nothing behind.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { run } from './netns.ts';
import { runDemo } from './demo-run.ts';

describe('roamguard demo --scenario small-mtu', { timeout: 420_000 }, () => {
  test('learns the path MTU across the narrow hop on both sides of every pair, bulk TCP crosses it, ends all green', async (t) => {
    const { code, output, pid } = await runDemo(['--once', '--timeout', '150', '--scenario', 'small-mtu'], { timeoutMs: 400_000 });
    assert.equal(code, 0, output.slice(-4000));
    const report = output.slice(output.indexOf('SMALL MTU'));
    t.diagnostic(report);
    assert.match(output, /all pods reach all pods over IPv4 and IPv6/);
    for (const peer of ['c1', 'c2', 'o1', 'o2']) {
      const row = new RegExp(`^h1 ↔ ${peer} +(\\d+) +(\\d+) +h1 → ${peer} (\\d+) Mbit/s, ${peer} → h1 (\\d+) Mbit/s$`, 'm').exec(report);
      assert.ok(row, `a row for h1 ↔ ${peer}:\n${report}`);
      const [, here, there, out, back] = row.map(Number);
      assert.ok(here < 1420 && there < 1420 && here <= 1220 && there <= 1220, `path MTUs ${here}/${there}: the hop's 1280 less 60 at most`);
      assert.ok(out > 10 && back > 10, `iperf3 ${out}/${back} Mbit/s`);
    }
    assert.match(report, /every peer of h1 learned the path MTU both ways, and bulk TCP crosses the hop both ways/);
    assert.match(output, /demo removed: no namespaces or processes left behind/);
    const left = (await run('ip', ['netns', 'list'])).stdout.split('\n').filter((l) => l.startsWith(`rgt-${pid}-`));
    assert.deepEqual(left, []);
  });
});
