/**
 * The tunnel MTU when WG_MTU is `auto`: the MTU of the link that carries the node's own address
 * (the one peers send WireGuard datagrams to), less WireGuard's overhead for the endpoint family.
 *
 * Overhead: 32 bytes of WireGuard header and tag, 8 of UDP, 20 of IPv4 or 40 of IPv6. With
 * WG_IP_FAMILY=ipv4 every endpoint is IPv4 (60 bytes); otherwise some peer may be reached over
 * IPv6, so 80 (what wg-quick subtracts too). A 1500 link so gives 1420, a 1400 link 1340 (IPv4).
 *
 * Which link: the one holding one of the node's addresses — not the default route's, which on a
 * node with a separate private network is the wrong NIC (hcloud-k8s #450). Several: the smallest.
 * None (addresses not on this host): the default route's link. Nothing known: 1500.
 */
import { formatIp, parseIp } from '../../dataplane/net/ip.ts';
import type { EndpointFamily } from './node-addresses.ts';
import { runChecked, systemRunner, type CommandRunner } from './runner.ts';

export const WIREGUARD_OVERHEAD = { ipv4: 60, ipv6: 80 } as const;
/** The smallest tunnel MTU: IPv6 needs 1280 on every link. */
export const MIN_TUNNEL_MTU = 1280;
const ASSUMED_LINK_MTU = 1500;

export interface UplinkChoice {
  /** The link the MTU came from, or undefined when nothing was found (ASSUMED_LINK_MTU). */
  link: string | undefined;
  linkMtu: number;
  /** linkMtu less the overhead, at least MIN_TUNNEL_MTU. */
  tunnelMtu: number;
  how: 'node-address' | 'default-route' | 'assumed';
}

interface LinkInfo { ifname?: unknown; mtu?: unknown; addr_info?: unknown }

function parseLinks(json: string): LinkInfo[] {
  const value: unknown = json.trim() === '' ? [] : JSON.parse(json);
  if (!Array.isArray(value)) throw new Error('cannot parse `ip -j addr` output: expected a JSON array');
  return value as LinkInfo[];
}

function canonical(text: string): string | undefined {
  try {
    return formatIp(parseIp(text));
  } catch {
    return undefined;
  }
}

export function overheadFor(family: EndpointFamily): number {
  return family === 'ipv4' ? WIREGUARD_OVERHEAD.ipv4 : WIREGUARD_OVERHEAD.ipv6;
}

/**
 * Chooses the uplink from `ip -j addr show` and `ip -j route show default` (both families'
 * listings concatenated as JSON arrays). Pure: the agent passes what `ip` printed.
 */
export function chooseUplinkMtu(addrJson: string, defaultRoutesJson: string[], nodeAddresses: readonly string[], family: EndpointFamily): UplinkChoice {
  const links = parseLinks(addrJson);
  const wanted = new Set(nodeAddresses
    .map(canonical)
    .filter((a): a is string => a !== undefined)
    .filter((a) => family === 'dualstack' || (family === 'ipv4') === !a.includes(':')));
  const mtuOf = (l: LinkInfo) => (typeof l.mtu === 'number' && Number.isInteger(l.mtu) && l.mtu >= 68 ? l.mtu : undefined);
  let best: { link: string; mtu: number } | undefined;
  for (const l of links) {
    const mtu = mtuOf(l);
    if (mtu === undefined || typeof l.ifname !== 'string' || !Array.isArray(l.addr_info)) continue;
    const holds = (l.addr_info as Array<{ local?: unknown }>).some((a) => typeof a.local === 'string' && wanted.has(canonical(a.local) ?? ''));
    if (holds && (best === undefined || mtu < best.mtu)) best = { link: l.ifname, mtu };
  }
  let how: UplinkChoice['how'] = 'node-address';
  if (best === undefined) {
    how = 'default-route';
    for (const json of defaultRoutesJson) {
      for (const r of parseLinks(json) as Array<{ dev?: unknown }>) {
        const link = links.find((l) => l.ifname === r.dev);
        const mtu = link && mtuOf(link);
        if (link && mtu !== undefined && (best === undefined || mtu < best.mtu)) best = { link: link.ifname as string, mtu };
      }
    }
  }
  if (best === undefined) return { link: undefined, linkMtu: ASSUMED_LINK_MTU, tunnelMtu: ASSUMED_LINK_MTU - overheadFor(family), how: 'assumed' };
  return { link: best.link, linkMtu: best.mtu, tunnelMtu: Math.max(MIN_TUNNEL_MTU, best.mtu - overheadFor(family)), how };
}

/** Reads the links and default routes with `ip` and chooses (see chooseUplinkMtu). */
export async function detectUplinkMtu(nodeAddresses: readonly string[], family: EndpointFamily, runner: CommandRunner = systemRunner): Promise<UplinkChoice> {
  const addr = await runChecked(runner, 'list addresses', 'ip', ['-j', 'addr', 'show']);
  const routes: string[] = [];
  for (const f of ['-4', '-6']) {
    const r = await runner('ip', ['-j', f, 'route', 'show', 'default']);
    if (r.code === 0) routes.push(r.stdout);
  }
  return chooseUplinkMtu(addr.stdout, routes, nodeAddresses, family);
}
