/**
 * A node that rotated its key becomes a new peer (a peer is its public key), and its old peer goes
 * away in the same `set` transaction. What the old peer had learned should not go with it: its
 * endpoint is where the node answered a moment ago — for a node behind NAT the mapping that the
 * data plane learned by roaming, which the Node objects may not carry yet under the new key
 * (other nodes' `discovered-endpoints` are keyed by the old one until they see the new key
 * working). So the new peer starts at the old one's endpoint, and its first handshake goes where
 * the node is (pure).
 */
import type { Endpoint } from '../../dataplane/net/endpoint.ts';
import { formatPrefix } from '../../dataplane/net/ip.ts';
import { keyToBase64 } from '../../dataplane/noise/keys.ts';
import type { DeviceSnapshot } from '../../dataplane/uapi/uapi-protocol.ts';
import type { DesiredPeer } from './desired-peers.ts';

/**
 * The endpoint of the device peer that `want` replaces: a peer the mesh no longer wants, holding
 * one of `want`'s allowed IPs (the claims rules give a pod CIDR to one node only, so that is the
 * same node under its old key), with a handshake younger than `recentMs`. Undefined when there is
 * none, or when an operator forced `want`'s endpoint.
 */
export function replacedPeerEndpoint(
  want: DesiredPeer,
  device: DeviceSnapshot,
  desired: ReadonlyMap<string, DesiredPeer>,
  nowWallMs: number,
  recentMs: number,
): Endpoint | undefined {
  if (want.endpointSource === 'forced') return undefined;
  const wanted = new Set(want.allowedIps);
  let best: { endpoint: Endpoint; handshake: number } | undefined;
  for (const peer of device.peers) {
    if (!peer.endpoint || desired.has(keyToBase64(peer.publicKey))) continue;
    if (!(peer.lastHandshakeWallMs > 0 && nowWallMs - peer.lastHandshakeWallMs < recentMs)) continue;
    if (!peer.allowedIps.some((p) => wanted.has(formatPrefix(p)))) continue;
    if (!best || peer.lastHandshakeWallMs > best.handshake) best = { endpoint: peer.endpoint, handshake: peer.lastHandshakeWallMs };
  }
  return best?.endpoint;
}
