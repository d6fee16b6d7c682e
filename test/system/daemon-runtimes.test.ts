/**
 * The `roamguard wg` daemon against itself on each runtime: Node.js–Node.js, Bun–Bun and
 * Node.js–Bun, and Node.js without offloads against Bun with them, in two network namespaces,
 * configured only with `wg`. For each pair: pings both ways over inner IPv4 and IPv6 (outer
 * IPv4), and a short iperf3 TCP run (figure reported).
 *
 * Needs root, iproute2, wireguard-tools, iputils-ping, iperf3, /dev/net/tun, and `npm install`
 * (tsx for Node.js, the `bun` dev dependency for Bun).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createPair, reapStale, Scope } from './netns.ts';
import {
  assertPing, describeTunnel, formatRate, INNER, iperf3, requireDaemonPrerequisites, startTunnel, type Implementation,
} from './userspace-wg.ts';

/**
 * The path a kernel without TUN and UDP offloads makes the daemon take (no IFF_VNET_HDR, no UDP
 * GSO/GRO), forced through the two switches that remain for this (dataplane/settings.ts).
 */
const NO_OFFLOADS = { ROAMGUARD_TUN_OFFLOAD: '0', ROAMGUARD_UDP_OFFLOAD: '0' };

const PAIRS: ReadonlyArray<[Implementation, Implementation, Record<string, string>?]> = [
  ['roamguard-node', 'roamguard-node'],
  ['roamguard-bun', 'roamguard-bun'],
  ['roamguard-node', 'roamguard-bun'],
  // A without offloads, against B with them.
  ['roamguard-node', 'roamguard-bun', NO_OFFLOADS],
];

const short = (i: Implementation) => i.replace('roamguard-', '');

describe('daemon: roamguard <-> roamguard on Node.js and Bun', () => {
  before(async () => {
    await requireDaemonPrerequisites(['roamguard-node', 'roamguard-bun'], ['iperf3']);
    await reapStale();
  });

  const scopes: Scope[] = [];
  after(async () => {
    for (const scope of scopes) await scope.cleanup();
  });

  for (const [implA, implB, envA] of PAIRS) {
    const labelA = envA ? `${short(implA)} (no TUN or UDP offloads)` : short(implA);
    test(`${labelA} <-> ${short(implB)}: ping v4/v6 both ways, iperf3`, { timeout: 60_000 }, async (tc) => {
      const scope = new Scope();
      scopes.push(scope);
      const topo = await createPair(scope);
      const t = await startTunnel(scope, topo, { a: { implementation: implA, env: envA }, b: { implementation: implB } });
      const ctx = describeTunnel(t);
      for (const [ns, dst] of [[topo.a, INNER.b.ipv4], [topo.a, INNER.b.ipv6], [topo.b, INNER.a.ipv4], [topo.b, INNER.a.ipv6]] as const) {
        await assertPing(ns, dst, { count: 3 }, ctx);
      }
      const result = await iperf3(scope, topo.b, topo.a, INNER.b.ipv6, { seconds: 3 });
      tc.diagnostic(`iperf3 ${labelA} -> ${short(implB)} (inner IPv6): ${formatRate(result.receivedBitsPerSecond)} (retransmits ${result.retransmits ?? '?'})`);
      assert.ok(result.receivedBitsPerSecond > 0, `iperf3 moved data${describeTunnel(t)}`);
      const peer = await t.a.peer(t.keysB.publicKey);
      assert.ok(peer && peer.txBytes > 1_000_000 && peer.rxBytes > 0, `A's counters after iperf3: ${JSON.stringify(peer)}`);
      assert.equal(t.a.process.running && t.b.process.running, true, `both daemons still run${describeTunnel(t)}`);
    });
  }
});
