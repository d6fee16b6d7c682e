/**
 * Roaming: while traffic flows, the peer's outer source address and port change, and the
 * roamguard daemon follows it without being reconfigured (its peer has no configured endpoint:
 * it learns it from authenticated packets, and re-learns it when it changes).
 *
 * 1. Behind NAT: A (roamguard, "public") — R (router, nftables masquerade to a port range) —
 *    B (wireguard-go, persistent keepalive 1 s, knows A's endpoint). During a continuous ping
 *    A -> B, R's outer address is replaced and the masquerade port range changed; removing the
 *    address makes the kernel forget the masqueraded connections, so B's next packets leave with
 *    a new address and port. Replies resume and `wg show dump` on A reports the new endpoint.
 * 2. Direct: A (roamguard) — B (roamguard, keepalive 1 s). During a continuous ping A -> B, B's
 *    own address is replaced and its listen port changed with `wg set`; A follows.
 *
 * Needs root, iproute2, nftables, wireguard-tools, wireguard-go, iputils-ping and /dev/net/tun.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createPair, joinHostPort, reapStale, Scope, waitFor, type Namespace } from './netns.ts';
import {
  assertPing, describeTunnel, INNER, longestGap, PORT_A, requireDaemonPrerequisites, startContinuousPing, startTunnel,
  UserspaceWg, type PingTrace, type Tunnel,
} from './userspace-wg.ts';
import { generateKeyPair } from './wireguard-go.ts';

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));
const nowS = () => Date.now() / 1000;

/** A's view of B's endpoint. */
async function endpointSeenByA(t: Pick<Tunnel, 'a' | 'keysB'>): Promise<string | undefined> {
  return (await t.a.peer(t.keysB.publicKey))?.endpoint;
}

/**
 * Traffic before the move, one bounded outage (the peer's next packet on the new path teaches A
 * the new endpoint: at most a keepalive interval or a ping away), then steady replies again.
 */
function assertResumed(trace: PingTrace, movedAt: number, context: string): void {
  const before = trace.replies.filter((r) => r.at < movedAt).length;
  const after = trace.replies.filter((r) => r.at >= movedAt);
  const summary = `${trace.transmitted} sent, ${trace.replies.length} replies (${before} before the move, ${after.length} after)`;
  assert.ok(before > 5, `replies before the move: ${summary}${context}`);
  assert.ok(after.length > 0, `replies after the move: ${summary}\n${trace.output.slice(-1500)}${context}`);
  // The outage is the longest silence from the move on; it ends with the reply that follows it.
  let last = movedAt;
  let outage = 0;
  let resumedAt = after[0].at;
  for (const { at } of after) {
    if (at - last > outage) {
      outage = at - last;
      resumedAt = at;
    }
    last = at;
  }
  assert.ok(outage < 5, `traffic resumed ${outage.toFixed(2)} s after the move (want < 5 s): ${summary}${context}`);
  const lastReply = after[after.length - 1].at;
  const resumed = after.filter((r) => r.at >= resumedAt).length;
  assert.ok(resumed >= 20, `steady replies after the outage (${resumed}): ${summary}${context}`);
  const stall = longestGap(trace, resumedAt, lastReply);
  assert.ok(stall < 1, `no stall once resumed (longest gap ${stall.toFixed(2)} s): ${summary}${context}`);
}

describe('daemon: roaming — roamguard follows a peer whose address and port change', () => {
  before(async () => {
    await requireDaemonPrerequisites(['roamguard-node', 'wireguard-go'], ['nft', 'sysctl']);
    await reapStale();
  });

  const scopes: Scope[] = [];
  after(async () => {
    for (const scope of scopes) await scope.cleanup();
  });

  test('behind NAT: the masquerade mapping changes during a continuous ping; A follows B', { timeout: 60_000 }, async (tc) => {
    const scope = new Scope();
    scopes.push(scope);
    // A and R on the "internet" (192.0.2.0/24); B behind R on 10.99.0.0/24.
    const topo = await createPair(scope);
    const a = topo.a;
    const r: Namespace = topo.b;
    const b = await scope.namespace();
    await scope.veth(r, b, { ipv4: ['10.99.0.1/24', '10.99.0.2/24'] });
    await b.ip(['route', 'add', 'default', 'via', '10.99.0.1']);
    await r.exec('sysctl', ['-q', '-w', 'net.ipv4.ip_forward=1']);
    const outside = topo.linkB.ifname;
    const natRules = (ports: string) => `table ip rgnat {
  chain post {
    type nat hook postrouting priority srcnat; policy accept;
    oifname "${outside}" meta l4proto udp masquerade to :${ports}
  }
}
`;
    await r.exec('nft', ['-f', '-'], { input: natRules('40000-40009') });

    const wgA = await UserspaceWg.start(scope, a, { implementation: 'roamguard-node' });
    const wgB = await UserspaceWg.start(scope, b, { implementation: 'wireguard-go' });
    const [keysA, keysB] = await Promise.all([generateKeyPair(), generateKeyPair()]);
    const t = { a: wgA, b: wgB, keysA, keysB };
    await wgA.configure({
      privateKey: t.keysA.privateKey,
      listenPort: PORT_A,
      peers: [{ publicKey: t.keysB.publicKey, allowedIps: [`${INNER.b.ipv4}/32`, `${INNER.b.ipv6}/128`] }],
    });
    await wgB.configure({
      privateKey: t.keysB.privateKey,
      peers: [{
        publicKey: t.keysA.publicKey, endpoint: joinHostPort(topo.linkA.ipv4, PORT_A), persistentKeepalive: 1,
        allowedIps: [`${INNER.a.ipv4}/32`, `${INNER.a.ipv6}/128`],
      }],
    });
    for (const [d, inner] of [[wgA, INNER.a], [wgB, INNER.b]] as const) {
      await d.addAddress(`${inner.ipv4}/24`);
      await d.addAddress(`${inner.ipv6}/64`);
      await d.up();
    }
    const ctx = () => describeTunnel(t);

    // B's keepalive reaches A through the NAT: A learns the mapped endpoint.
    const first = await waitFor(endpointSeenByA.bind(null, t), 15_000, { description: 'A to learn B\'s endpoint from its keepalives' });
    assert.match(first, /^192\.0\.2\.2:4000\d$/, `A sees B as R's outer address and a port of the first range${ctx()}`);
    await assertPing(a, INNER.b.ipv4, { count: 2 }, ctx());

    const trace = startContinuousPing(scope, a, INNER.b.ipv4, { durationS: 6, intervalS: 0.05 });
    await sleep(2000);
    // New mapping: another outer address (removing the old one drops its masqueraded
    // connections) and another port range.
    const movedAt = nowS();
    await r.exec('nft', ['-f', '-'], { input: `flush table ip rgnat\n${natRules('50000-50009')}` });
    await r.ip(['addr', 'del', `${topo.linkB.ipv4}/24`, 'dev', outside]);
    await r.ip(['addr', 'add', '192.0.2.3/24', 'dev', outside]);
    const result = await trace;

    const now = await endpointSeenByA(t);
    tc.diagnostic(`endpoint of B seen by A: ${first} -> ${now}; ping: ${result.transmitted} sent, ${result.replies.length} replies`);
    assert.match(now ?? '', /^192\.0\.2\.3:5000\d$/, `A's wg show dump reports B's new mapped endpoint${ctx()}`);
    assertResumed(result, movedAt, ctx());
    await assertPing(a, INNER.b.ipv6, { count: 2 }, ctx());
  });

  test('direct: the roamguard peer changes address and listen port during a continuous ping; A follows', { timeout: 60_000 }, async (tc) => {
    const scope = new Scope();
    scopes.push(scope);
    const topo = await createPair(scope);
    const t = await startTunnel(scope, topo, {
      a: { implementation: 'roamguard-node' }, b: { implementation: 'roamguard-node' }, endpoints: 'b-knows-a', keepalive: { b: 1 },
    });
    const ctx = () => describeTunnel(t);
    const first = await waitFor(endpointSeenByA.bind(null, t), 15_000, { description: 'A to learn B\'s endpoint from its keepalives' });
    assert.equal(first, t.endpointB);
    await assertPing(topo.a, INNER.b.ipv4, { count: 2 }, ctx());

    const trace = startContinuousPing(scope, topo.a, INNER.b.ipv4, { durationS: 6, intervalS: 0.05 });
    await sleep(2000);
    const movedAt = nowS();
    const newPort = 51831;
    await topo.b.ip(['addr', 'del', `${topo.linkB.ipv4}/24`, 'dev', topo.linkB.ifname]);
    await topo.b.ip(['addr', 'add', '192.0.2.3/24', 'dev', topo.linkB.ifname]);
    await t.b.wg(['set', t.b.ifname, 'listen-port', String(newPort)]);
    const result = await trace;

    const now = await endpointSeenByA(t);
    tc.diagnostic(`endpoint of B seen by A: ${first} -> ${now}; ping: ${result.transmitted} sent, ${result.replies.length} replies`);
    assert.equal(now, `192.0.2.3:${newPort}`, `A's wg show dump reports B's new endpoint${ctx()}`);
    assertResumed(result, movedAt, ctx());
  });
});
