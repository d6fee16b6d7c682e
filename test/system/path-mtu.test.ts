/**
 * Path MTU without black holes (issue 16), in namespaces: a cloud node c1 on the "internet" and a
 * home node h1 behind a NAT router whose WAN link is a 1280-byte hop that drops the ICMP saying
 * so. Pods on both nodes; iperf3 between them in both directions over IPv4 and IPv6.
 *
 *   1. Per-peer path MTU off: small pings pass, bulk TCP stalls (the hop swallows every full-size
 *      datagram: the data plane sends them with DF, and no ICMP comes back). This proves the
 *      network, so step 2 proves the feature.
 *   2. Agents restarted with it on (the default): each learns 1216 for the other (the largest
 *      inner size whose padded datagram fits 1280), puts it on the routes to the other's pod
 *      CIDRs, `roamguard status` shows it, and iperf3 completes at a sane rate both ways, IPv4 and
 *      IPv6 (TCP MSS clamped to the route).
 *
 * c1's uplink is 1400 with WG_IP_FAMILY=ipv4: its tunnel (and its pods) get 1340 from WG_MTU=auto.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { HOME, INTERNET } from '../../lab/nat-topology.ts';
import { ROAMGUARD, World, type Pod, type WorldNode } from '../../lab/world.ts';
import { Scope, waitFor } from './netns.ts';
import { iperf3, ping, requireDaemonPrerequisites } from './userspace-wg.ts';

const HOP_MTU = 1280;
/** 1280 − 60 (IPv4 endpoints) = 1220, less what WireGuard's padding to 16 bytes takes: 1216. */
const EXPECTED_PATH_MTU = 1216;
/** "A sane rate": what a 1280 hop carries easily on this machine is hundreds; a stall is ~0. */
const SANE_BITS_PER_SECOND = 20e6;

const scope = new Scope();
let world: World;
let c1: WorldNode;
let h1: WorldNode;
let podC: Pod;
let podH: Pod;

before(async () => {
  await requireDaemonPrerequisites(['roamguard-node'], ['nft', 'iperf3']);
  world = await World.create(scope, { backbone: INTERNET, agentEnv: { WG_PERSISTENT_KEEPALIVE: '5' } });
  const router = await world.addRouter('home', { segment: 'internet', index: 20 }, HOME);
  await world.narrowRouterUplink(router, HOP_MTU);
  c1 = await world.addNode('c1', 'internet', 1, { env: { WG_IP_FAMILY: 'ipv4' } });
  await world.setUplinkMtu(c1, 1400);
  h1 = await world.addNode('h1', 'home', 11, { listenPort: 51824 });
});
after(async () => { await scope.cleanup(); });

/** The MTUs of the agent's routes on the tunnel (proto 147), by destination. */
async function routeMtus(node: WorldNode): Promise<Map<string, number | undefined>> {
  const out = new Map<string, number | undefined>();
  for (const family of ['-4', '-6']) {
    const listed = JSON.parse((await node.ns.ip(['-j', family, 'route', 'show', 'dev', node.ifname, 'proto', '147'])).stdout || '[]') as Array<{ dst: string; metrics?: Array<{ mtu?: number }> }>;
    for (const r of listed) out.set(r.dst, r.metrics?.find((m) => m.mtu)?.mtu);
  }
  return out;
}

async function linkMtu(node: WorldNode): Promise<number> {
  return (JSON.parse((await node.ns.ip(['-j', 'link', 'show', 'dev', node.ifname])).stdout) as Array<{ mtu: number }>)[0].mtu;
}

async function startBoth(env: Record<string, string>): Promise<void> {
  await Promise.all([world.startAgent(c1, env), world.startAgent(h1, env)]);
  await waitFor(async () => (await ping(podC.ns, podH.ipv4, { count: 1, deadlineS: 3 }).catch(() => undefined))?.received === 1, 60_000, { description: 'a small ping from c1\'s pod to h1\'s pod' });
}

describe('path MTU: a 1280 hop that drops ICMP between two nodes', { timeout: 400_000 }, () => {
  test('uplink-derived tunnel MTU: a 1400 link with IPv4 endpoints gives 1340, a 1500 link (dualstack) 1420; the pods get the same', async () => {
    // The CNI conflist is written once the agent set the tunnel up.
    await Promise.all([world.startAgent(c1, { PATH_MTU_DISCOVERY: 'false' }), world.startAgent(h1, { PATH_MTU_DISCOVERY: 'false' })]);
    assert.equal(await linkMtu(c1), 1340);
    assert.equal(JSON.parse(world.conflist(c1)).plugins[0].mtu, 1340);
    assert.equal(await linkMtu(h1), 1420);
    assert.equal(JSON.parse(world.conflist(h1)).plugins[0].mtu, 1420);
    assert.match(c1.agent!.stderr, /tunnel MTU from the uplink.*mtu=1340.*linkMtu=1400/);
    podC = await world.addPod(c1);
    podH = await world.addPod(h1);
    const mtuOf = async (pod: Pod) => (JSON.parse((await pod.ns.ip(['-j', 'link', 'show', 'dev', 'eth0'])).stdout) as Array<{ mtu: number }>)[0].mtu;
    assert.equal(await mtuOf(podC), 1340);
    assert.equal(await mtuOf(podH), 1420);
  });

  test('with per-peer path MTU off, small packets pass and bulk TCP stalls (the black hole is real)', async () => {
    await waitFor(async () => (await ping(podC.ns, podH.ipv4, { count: 1, deadlineS: 3 }).catch(() => undefined))?.received === 1, 60_000, { description: 'a small ping across the hop' });
    assert.ok([...(await routeMtus(c1)).values()].every((m) => m === undefined), 'no route MTUs while off');
    for (const [server, client, address, what] of [[podH, podC, podH.ipv4, 'c1 → h1 IPv4'], [podC, podH, podC.ipv6, 'h1 → c1 IPv6']] as const) {
      const result = await iperf3(scope, server.ns, client.ns, address, { seconds: 3 }).catch((err: Error) => err);
      const rate = result instanceof Error ? 0 : result.receivedBitsPerSecond;
      console.log(`  ℹ off, ${what}: ${result instanceof Error ? `iperf3 failed (${result.message.split('\n')[0]})` : `${(rate / 1e6).toFixed(2)} Mbit/s`}`);
      assert.ok(rate < 1e6, `${what}: expected a stall without path MTU discovery, got ${(rate / 1e6).toFixed(1)} Mbit/s`);
    }
  });

  test('with it on, each node learns 1216 for the other, routes and status carry it, and iperf3 completes both ways over IPv4 and IPv6', async () => {
    await Promise.all([world.stopAgent(c1), world.stopAgent(h1)]);
    await startBoth({});
    for (const [node, other] of [[c1, h1], [h1, c1]] as const) {
      await waitFor(async () => {
        const mtus = await routeMtus(node);
        return other.podCidrs.every((cidr) => mtus.get(cidr) === EXPECTED_PATH_MTU);
      }, 60_000, { description: `${node.name}'s routes to ${other.name}'s pod CIDRs carrying MTU ${EXPECTED_PATH_MTU}` })
        .catch(async (err: Error) => assert.fail(`${err.message}\nroutes: ${JSON.stringify([...(await routeMtus(node))])}\n${node.agent!.stderr.split('\n').filter((l) => /MTU|probe/i.test(l)).join('\n')}`));
    }
    assert.match(c1.agent!.stderr, /the path to a peer carries less than the tunnel MTU.*node=h1.*pathMtu=1216/);
    const status = await c1.ns.exec(ROAMGUARD, ['status'], { env: { ...process.env, ...c1.env } });
    assert.match(status.stdout, /PATH MTU/);
    assert.match(status.stdout, /^h1 .* 1216 \(path\) /m, status.stdout);

    const rates: string[] = [];
    for (const [server, client, address, what] of [
      [podH, podC, podH.ipv4, 'c1 → h1 IPv4'], [podC, podH, podC.ipv4, 'h1 → c1 IPv4'],
      [podH, podC, podH.ipv6, 'c1 → h1 IPv6'], [podC, podH, podC.ipv6, 'h1 → c1 IPv6'],
    ] as const) {
      const result = await iperf3(scope, server.ns, client.ns, address, { seconds: 3 });
      rates.push(`${what} ${(result.receivedBitsPerSecond / 1e6).toFixed(0)} Mbit/s`);
      assert.ok(result.receivedBitsPerSecond > SANE_BITS_PER_SECOND, `${what}: ${(result.receivedBitsPerSecond / 1e6).toFixed(1)} Mbit/s`);
    }
    console.log(`  ℹ on: ${rates.join(', ')}`);
  });
});
