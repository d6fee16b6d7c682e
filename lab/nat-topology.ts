/**
 * The NAT world of the scenario suite and the demo: two cloud nodes on the "internet", an office
 * router masquerading for three office nodes (o1, o2 at first; the suite adds o3), and a home
 * router masquerading for one node. Nodes behind one NAT get distinct listen ports, so the
 * router keeps each node's source port for every destination — which is what lets the two NAT'd
 * sites reach each other directly.
 */
import type { Scope } from './netns.ts';
import { World, type Router, type SegmentSpec, type WorldNode } from './world.ts';

export const INTERNET: SegmentSpec = { name: 'internet', ipv4: '203.0.113.0/24', ipv6: '2001:db8:1::/64' };
export const OFFICE: SegmentSpec = { name: 'office', ipv4: '192.168.1.0/24', ipv6: 'fd10:1::/64' };
export const HOME: SegmentSpec = { name: 'home', ipv4: '192.168.2.0/24', ipv6: 'fd10:2::/64' };
/** A third site (the NAT suite's port-randomising café), added by the tests that need it. */
export const CAFE: SegmentSpec = { name: 'cafe', ipv4: '192.168.3.0/24', ipv6: 'fd10:3::/64' };
export const OFFICE_PUBLIC = '203.0.113.10';
export const HOME_PUBLIC = '203.0.113.20';

/** name, segment, host index, listen port */
export const NAT_NODES: ReadonlyArray<readonly [string, string, number, number]> = [
  ['c1', 'internet', 1, 51820],
  ['c2', 'internet', 2, 51820],
  ['o1', 'office', 11, 51821],
  ['o2', 'office', 12, 51822],
  ['h1', 'home', 11, 51824],
];
/** The third office node, added later by the suite ("a new node behind the same public IP"). */
export const LATE_OFFICE_NODE = ['o3', 'office', 13, 51823] as const;

export interface NatWorldOptions {
  /** Persistent keepalive for every node, seconds (the agent's default is 25). */
  keepaliveS?: number;
  onProgress?: (what: string) => void;
  agentEnv?: Record<string, string>;
}

export async function buildNatWorld(scope: Scope, options: NatWorldOptions = {}): Promise<World> {
  const progress = options.onProgress ?? (() => {});
  progress('API server and the internet segment');
  const world = await World.create(scope, {
    backbone: INTERNET,
    agentEnv: { ...(options.keepaliveS ? { WG_PERSISTENT_KEEPALIVE: String(options.keepaliveS) } : {}), ...options.agentEnv },
  });
  progress(`office router (${OFFICE_PUBLIC}, NAT for ${OFFICE.ipv4})`);
  await world.addRouter('office', { segment: 'internet', index: 10 }, OFFICE);
  progress(`home router (${HOME_PUBLIC}, NAT for ${HOME.ipv4})`);
  await world.addRouter('home', { segment: 'internet', index: 20 }, HOME);
  for (const [name, segment, index, port] of NAT_NODES) {
    progress(`node ${name} on ${segment}`);
    await world.addNode(name, segment, index, { listenPort: port });
  }
  return world;
}

export async function addNatNode(world: World, [name, segment, index, port]: readonly [string, string, number, number]): Promise<WorldNode> {
  return world.addNode(name, segment, index, { listenPort: port });
}

/** The café site's router, on the internet segment. */
export const CAFE_PUBLIC = '203.0.113.30';

/**
 * Makes a router pick a random port for every new flow (nftables `masquerade random-fully`), as
 * carrier-grade NATs and many firewalls do: a mapping one peer sees is useless to another, and
 * with unsolicited inbound dropped, nodes behind it meet no NAT'd node directly. Forgets the
 * router's UDP mappings, so the change applies to every tunnel at once.
 */
export async function randomisePorts(world: World, router: Router): Promise<void> {
  await router.ns.exec('nft', ['-f', '-'], { input: `flush chain inet router postrouting\nadd rule inet router postrouting oifname "${router.wan.ifname}" masquerade random,fully-random\n` });
  await world.flushRouterUdp(router);
}

/**
 * The NAT world with hard NATs (`roamguard demo --scenario hard-nat`): the home router randomises
 * ports, and a café behind another port-randomising router has one node (k1). Home and café reach
 * each other and the office only through a relay on a cloud node.
 */
export async function buildHardNatWorld(scope: Scope, options: NatWorldOptions = {}): Promise<World> {
  const progress = options.onProgress ?? (() => {});
  const world = await buildNatWorld(scope, options);
  progress('home router now picks a random port for every flow');
  await randomisePorts(world, world.routers.get('home')!);
  progress(`café router (${CAFE_PUBLIC}, NAT for ${CAFE.ipv4}, a random port for every flow)`);
  const cafe = await world.addRouter('cafe', { segment: 'internet', index: 30 }, CAFE);
  await randomisePorts(world, cafe);
  progress('node k1 on cafe');
  await world.addNode('k1', 'cafe', 11, { listenPort: 51826 });
  return world;
}
