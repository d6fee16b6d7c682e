/**
 * A peer's tunnel gateway address: network + 1 of its first pod CIDR routed through the tunnel,
 * which the peer's agent puts on its tunnel interface. It is the one address in a peer's pod CIDRs
 * that its agent holds itself, so both path-MTU probes (agent/path-mtu.ts) and relay probes
 * (agent/relays.ts) are sent to it (pure).
 */
import { formatIp, parsePrefix } from '../../dataplane/net/ip.ts';
import { gatewayAddress } from '../host/cidrs.ts';
import type { DesiredPeer } from './desired-peers.ts';
import { TextCache } from './text-cache.ts';

/**
 * A pod CIDR's gateway address ('' for a prefix too small to have one), remembered: every pass
 * asks for every peer's (routesWithPathMtu), 5 000 of them at 5 000 Nodes.
 */
const gatewayOfCidr = new TextCache((cidr: string): string => {
  const prefix = parsePrefix(cidr);
  return prefix.bits > prefix.address.length * 8 - 2 ? '' : formatIp(gatewayAddress(prefix));
});

/** The address probes go to: the gateway of the peer's first routed pod CIDR (IPv4 sorts first). */
export function probeAddress(peer: DesiredPeer, tunnelRoutes: ReadonlySet<string>): string | undefined {
  for (const cidr of peer.allowedIps) {
    if (!tunnelRoutes.has(cidr)) continue;
    const gateway = gatewayOfCidr.get(cidr);
    if (gateway !== '') return gateway;
  }
  return undefined;
}
