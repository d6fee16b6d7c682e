/**
 * The `roamguard wg` daemon (Node.js) against Debian's wireguard-go, both configured only with
 * `wg`, across two network namespaces:
 *
 *   namespace A: roamguard (TUN, UDP, crypto workers, control socket), inner 10.77.0.1 / fd77::1
 *   namespace B: wireguard-go, inner 10.77.0.2 / fd77::2
 *
 * Outer IPv4: both know each other's endpoint; we initiate. Pings both ways over inner IPv4 and
 * IPv6, iperf3 TCP both directions (figures reported, not asserted), our `wg show dump` (endpoint,
 * absolute handshake time, growing counters), then our daemon is restarted by pid and
 * reconfigured with `wg` and the tunnel comes back, then wireguard-go likewise.
 * Outer IPv6: only wireguard-go knows our endpoint, so it initiates and we learn its endpoint.
 *
 * Needs root, iproute2, wireguard-tools, wireguard-go, iputils-ping, iperf3 and /dev/net/tun.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createPair, reapStale, Scope } from './netns.ts';
import type { DumpPeer } from './wireguard-go.ts';
import {
  assertPing, describeTunnel, formatRate, INNER, iperf3, requireDaemonPrerequisites, startTunnel, type Tunnel,
} from './userspace-wg.ts';

const TEST_TIMEOUT_MS = 90_000;

/** Our (A's) view of B in `wg show dump`. */
async function ourPeer(t: Tunnel): Promise<DumpPeer> {
  const dump = await t.a.dump();
  assert.equal(dump.publicKey, t.keysA.publicKey, 'our public key as wg shows it');
  assert.equal(dump.peers.length, 1, `one peer in our dump: ${JSON.stringify(dump)}`);
  const peer = dump.peers[0];
  assert.equal(peer.publicKey, t.keysB.publicKey);
  return peer;
}

function assertRecentHandshake(peer: DumpPeer, context: string): void {
  const ageS = Date.now() / 1000 - peer.latestHandshake;
  assert.ok(peer.latestHandshake > 1_600_000_000, `latest handshake is an absolute Unix time: ${JSON.stringify(peer)}${context}`);
  assert.ok(ageS < 60 && ageS > -5, `latest handshake within the last minute (age ${ageS.toFixed(1)} s): ${JSON.stringify(peer)}${context}`);
}

async function pingAll(t: Tunnel, order: 'a-first' | 'b-first', context: string): Promise<void> {
  const fromA = [[t.topo.a, INNER.b.ipv4], [t.topo.a, INNER.b.ipv6]] as const;
  const fromB = [[t.topo.b, INNER.a.ipv4], [t.topo.b, INNER.a.ipv6]] as const;
  for (const [ns, dst] of order === 'a-first' ? [...fromA, ...fromB] : [...fromB, ...fromA]) {
    await assertPing(ns, dst, { count: 3 }, context);
  }
}

describe('daemon: roamguard (Node.js) <-> wireguard-go', () => {
  before(async () => {
    await requireDaemonPrerequisites(['roamguard-node', 'wireguard-go'], ['iperf3']);
    await reapStale();
  });

  const scopes: Scope[] = [];
  after(async () => {
    for (const scope of scopes) await scope.cleanup();
  });

  test('outer IPv4: ping both ways, iperf3 both ways, wg show dump, restart of either side', { timeout: TEST_TIMEOUT_MS }, async (tc) => {
    const scope = new Scope();
    scopes.push(scope);
    const topo = await createPair(scope);
    const t = await startTunnel(scope, topo, { a: { implementation: 'roamguard-node' }, b: { implementation: 'wireguard-go' }, outer: 4 });
    const ctx = () => describeTunnel(t);

    await pingAll(t, 'a-first', ctx());

    // wg show dump on our side: endpoint, an absolute recent handshake, counters that grow.
    const first = await ourPeer(t);
    assert.equal(first.endpoint, t.endpointB, `B's endpoint in our dump${ctx()}`);
    assert.deepEqual([...first.allowedIps].sort(), [`${INNER.b.ipv4}/32`, `${INNER.b.ipv6}/128`].sort());
    assertRecentHandshake(first, ctx());
    assert.ok(first.rxBytes > 0 && first.txBytes > 0, `counters after pings: ${JSON.stringify(first)}`);
    await assertPing(topo.a, INNER.b.ipv4, { count: 2 }, ctx());
    const second = await ourPeer(t);
    assert.ok(second.rxBytes > first.rxBytes, `rx grows: ${first.rxBytes} -> ${second.rxBytes}`);
    assert.ok(second.txBytes > first.txBytes, `tx grows: ${first.txBytes} -> ${second.txBytes}`);

    // Throughput, both directions (A sends, then B sends); reported, not asserted beyond > 0.
    const up = await iperf3(scope, topo.b, topo.a, INNER.b.ipv4, { seconds: 3 });
    const down = await iperf3(scope, topo.b, topo.a, INNER.b.ipv4, { seconds: 3, reverse: true });
    tc.diagnostic(`iperf3 roamguard(node) -> wireguard-go: ${formatRate(up.receivedBitsPerSecond)} (retransmits ${up.retransmits ?? '?'})`);
    tc.diagnostic(`iperf3 wireguard-go -> roamguard(node): ${formatRate(down.receivedBitsPerSecond)} (retransmits ${down.retransmits ?? '?'})`);
    assert.ok(up.receivedBitsPerSecond > 0, 'iperf3 A -> B moved data');
    assert.ok(down.receivedBitsPerSecond > 0, 'iperf3 B -> A moved data');
    const afterIperf = await ourPeer(t);
    assert.ok(afterIperf.txBytes > second.txBytes + 1_000_000, `our tx counter counts the iperf3 data: ${JSON.stringify(afterIperf)}`);
    assert.ok(afterIperf.rxBytes > second.rxBytes + 1_000_000, `our rx counter counts the iperf3 data: ${JSON.stringify(afterIperf)}`);

    // Restart our daemon: stop by pid, start under the same name, reconfigure with wg.
    const oldPid = t.a.process.pid;
    await t.a.restart();
    assert.notEqual(t.a.process.pid, oldPid, 'a new daemon process');
    const fresh = await ourPeer(t);
    assert.equal(fresh.latestHandshake, 0, 'the restarted daemon starts without a session');
    await pingAll(t, 'a-first', `\nafter restarting roamguard${ctx()}`);
    assertRecentHandshake(await ourPeer(t), ctx());

    // Restart wireguard-go likewise. It has no session after the restart, so traffic that works
    // proves a new handshake; it knows our endpoint and initiates when it has something to send.
    const oldGoPid = t.b.process.pid;
    await t.b.restart();
    assert.notEqual(t.b.process.pid, oldGoPid, 'a new wireguard-go process');
    await pingAll(t, 'b-first', `\nafter restarting wireguard-go${ctx()}`);
    const afterRestart = await ourPeer(t);
    assertRecentHandshake(afterRestart, ctx());
    assert.equal(afterRestart.endpoint, t.endpointB);
  });

  test('outer IPv6: wireguard-go initiates, we learn its endpoint; ping both ways', { timeout: TEST_TIMEOUT_MS }, async () => {
    const scope = new Scope();
    scopes.push(scope);
    const topo = await createPair(scope);
    const t = await startTunnel(scope, topo, {
      a: { implementation: 'roamguard-node' }, b: { implementation: 'wireguard-go' }, outer: 6, endpoints: 'b-knows-a',
    });
    const ctx = () => describeTunnel(t);
    const before = await ourPeer(t);
    assert.equal(before.endpoint, undefined, 'we are not told B\'s endpoint');
    assert.equal(before.latestHandshake, 0);

    await pingAll(t, 'b-first', ctx());
    const peer = await ourPeer(t);
    assert.equal(peer.endpoint, t.endpointB, `the endpoint we learnt from B's packets${ctx()}`);
    assert.match(peer.endpoint!, /^\[2001:db8:77::2\]:\d+$/, 'an IPv6 outer endpoint');
    assertRecentHandshake(peer, ctx());
    const theirs = await t.b.peer(t.keysA.publicKey);
    assert.equal(theirs?.endpoint, t.endpointA, `wireguard-go sees our IPv6 endpoint: ${JSON.stringify(theirs)}`);
    assert.ok((theirs?.rxBytes ?? 0) > 0 && (theirs?.txBytes ?? 0) > 0, `wireguard-go counted traffic: ${JSON.stringify(theirs)}`);
  });
});
