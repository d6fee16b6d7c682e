/**
 * What this node's data plane tells the mesh about its peers' endpoints (pure, injected clock):
 *
 * - `observedEndpoints`: peers seen at an address that is none of their own, with a recent
 *   handshake (an endpoint is only known to work if it did): they are behind NAT, and this is
 *   what the agent publishes as `roamguard.io/discovered-endpoints` (Kilo's approach).
 * - `workingAtOwnAddress`: peers with a recent handshake at one of their own addresses: what
 *   others observe must not move them (`observedMayOverride` in control/mesh/desired-peers.ts).
 */
import { keyToBase64 } from '../../dataplane/noise/keys.ts';
import type { DeviceSnapshot } from '../../dataplane/uapi/uapi-protocol.ts';
import type { DesiredPeer } from '../mesh/desired-peers.ts';
import { RECENT_HANDSHAKE_MS } from '../mesh/reconcile.ts';

function recent(lastHandshakeWallMs: number, nowWallMs: number): boolean {
  return lastHandshakeWallMs > 0 && nowWallMs - lastHandshakeWallMs < RECENT_HANDSHAKE_MS;
}

/** Base64 key → `ip:port` for peers this node reaches at an address not their own. */
export function observedEndpoints(peers: ReadonlyMap<string, DesiredPeer>, device: DeviceSnapshot, nowWallMs: number): Map<string, string> {
  const observed = new Map<string, string>();
  for (const peer of device.peers) {
    const key = keyToBase64(peer.publicKey);
    const want = peers.get(key);
    if (!want || !peer.endpoint || !recent(peer.lastHandshakeWallMs, nowWallMs)) continue;
    if ((want.addresses ?? []).includes(peer.endpoint.host)) continue;
    observed.set(key, peer.endpoint.toString());
  }
  return observed;
}

/** Base64 keys of peers with a recent handshake at one of their own addresses. */
export function workingAtOwnAddress(peers: ReadonlyMap<string, DesiredPeer>, device: DeviceSnapshot, nowWallMs: number): Set<string> {
  const out = new Set<string>();
  for (const peer of device.peers) {
    const key = keyToBase64(peer.publicKey);
    const want = peers.get(key);
    if (!want || !peer.endpoint || !recent(peer.lastHandshakeWallMs, nowWallMs)) continue;
    if ((want.addresses ?? []).includes(peer.endpoint.host)) out.add(key);
  }
  return out;
}

/**
 * Peers whose session is carrying packets keep the endpoint their data plane learned from them,
 * instead of one others observed (`discovered`). Behind a NAT that picks a port per destination
 * every observer sees the peer somewhere else; writing one observer's view over a session that
 * works breaks it until the peer's next packet moves it back, and that observer's view flips in
 * turn. A forced endpoint, a LAN or published address, and relay and trial endpoints (`exclude`)
 * are still written as decided.
 */
export function keepLiveEndpoints<P extends DesiredPeer>(
  peers: ReadonlyMap<string, P>, device: DeviceSnapshot, live: ReadonlySet<string>, exclude: ReadonlySet<string>,
): Map<string, P> {
  const out = new Map(peers);
  for (const peer of device.peers) {
    const key = keyToBase64(peer.publicKey);
    const want = out.get(key);
    if (!want || want.endpointSource !== 'discovered' || !peer.endpoint || !live.has(key) || exclude.has(key)) continue;
    const here = peer.endpoint.toString();
    if (here !== want.endpoint) out.set(key, { ...want, endpoint: here });
  }
  return out;
}
