/**
 * The demo's `small-mtu` scenario (`roamguard demo --once --scenario small-mtu`): the NAT world
 * with the home router's WAN link a 1280-byte hop that drops the ICMP saying so (a PPPoE line or
 * a tunnel hop that hides itself). Small pings cross it whatever happens; bulk TCP only does
 * because each agent learns the path MTU to h1 and puts it on its routes.
 *
 * Once all green: for every peer of the node behind the hop, the path MTU each side learned (the
 * MTU on its routes to the other's pod CIDRs) and a 2-second iperf3 between their pods in both
 * directions. It passes when both sides learned a path MTU below the tunnel's and every transfer
 * moved at a sane rate.
 */
import { iperf3 } from './probe.ts';
import { buildNatWorld, type NatWorldOptions } from './nat-topology.ts';
import type { Scope } from './netns.ts';
import type { Pod, World, WorldNode } from './world.ts';

export const HOP_MTU = 1280;
const NARROW_SITE = 'home';
const SANE_BITS_PER_SECOND = 10e6;
/** The matrix goes green on small pings, before the probes of the last handshakes are done. */
const LEARN_TIMEOUT_MS = 60_000;

export async function buildSmallMtuWorld(scope: Scope, options: NatWorldOptions): Promise<World> {
  const world = await buildNatWorld(scope, options);
  const router = world.routers.get(NARROW_SITE)!;
  options.onProgress?.(`a ${HOP_MTU}-byte hop on the ${NARROW_SITE} router's WAN link, dropping "fragmentation needed"`);
  await world.narrowRouterUplink(router, HOP_MTU);
  return world;
}

/** The MTU on `node`'s routes to `other`'s pod CIDRs: the path MTU it learned, or undefined (none set). */
async function learnedMtu(node: WorldNode, other: WorldNode): Promise<number | undefined> {
  const mtus: number[] = [];
  for (const family of ['-4', '-6']) {
    const listed = JSON.parse((await node.ns.ip(['-j', family, 'route', 'show', 'dev', node.ifname, 'proto', '147'])).stdout || '[]') as Array<{ dst: string; metrics?: Array<{ mtu?: number }> }>;
    for (const r of listed) {
      const mtu = r.metrics?.find((m) => m.mtu)?.mtu;
      if (mtu !== undefined && other.podCidrs.includes(r.dst)) mtus.push(mtu);
    }
  }
  return mtus.length > 0 ? Math.min(...mtus) : undefined;
}

interface PairResult { peer: string; mtuHere?: number; mtuThere?: number; rates: Array<{ what: string; bitsPerSecond?: number; error?: string }> }

export async function runSmallMtuScenario(world: World, pods: ReadonlyMap<string, Pod>, step: (what: string) => void): Promise<{ ok: boolean; report: string }> {
  const narrow = world.nodes.find((n) => n.segment.spec.name === NARROW_SITE)!;
  const results: PairResult[] = [];
  for (const other of world.nodes.filter((n) => n !== narrow)) {
    step(`path MTU and iperf3 between ${narrow.name} and ${other.name}`);
    const a = pods.get(narrow.name)!, b = pods.get(other.name)!;
    const deadline = Date.now() + LEARN_TIMEOUT_MS;
    let here: number | undefined, there: number | undefined;
    while ((here = await learnedMtu(narrow, other)) === undefined || (there = await learnedMtu(other, narrow)) === undefined) {
      if (Date.now() > deadline) break;
      await new Promise((r) => setTimeout(r, 1000));
    }
    const result: PairResult = { peer: other.name, mtuHere: here, mtuThere: there, rates: [] };
    for (const [server, client, what] of [[b, a, `${narrow.name} → ${other.name}`], [a, b, `${other.name} → ${narrow.name}`]] as const) {
      try {
        const r = await iperf3(world.scope, server.ns, client.ns, server.ipv4, { seconds: 2 });
        result.rates.push({ what, bitsPerSecond: r.receivedBitsPerSecond });
      } catch (err) {
        result.rates.push({ what, error: (err as Error).message.split('\n')[0] });
      }
    }
    results.push(result);
  }
  const passed = (r: PairResult) => r.mtuHere !== undefined && r.mtuThere !== undefined && r.rates.every((x) => (x.bitsPerSecond ?? 0) > SANE_BITS_PER_SECOND);
  const rows = [['pair', `path MTU at ${narrow.name}`, 'at the peer', 'iperf3 (2 s, IPv4, each way)']];
  for (const r of results) {
    rows.push([`${narrow.name} ↔ ${r.peer}`, String(r.mtuHere ?? 'not learned'), String(r.mtuThere ?? 'not learned'),
      r.rates.map((x) => `${x.what} ${x.bitsPerSecond !== undefined ? `${(x.bitsPerSecond / 1e6).toFixed(0)} Mbit/s` : `failed (${x.error})`}`).join(', ')]);
  }
  const widths = rows[0].map((_, c) => Math.max(...rows.map((row) => row[c].length)));
  const ok = results.every(passed);
  return {
    ok,
    report: [
      `SMALL MTU (a ${HOP_MTU}-byte hop on the ${NARROW_SITE} router's uplink that drops the ICMP saying so; tunnel MTU 1420)`,
      ...rows.map((row) => row.map((cell, c) => cell.padEnd(widths[c])).join('  ').trimEnd()),
      '',
      ok ? `every peer of ${narrow.name} learned the path MTU both ways, and bulk TCP crosses the hop both ways`
        : 'a path MTU was not learned or a transfer stalled (see above)',
    ].join('\n'),
  };
}
