/**
 * Whether each peer has a working session, judged from the data plane's handshake times and an
 * injected clock (pure: the agent logs and exposes what this returns).
 *
 * A peer is unreachable when it has had no first handshake three keepalive periods (at least
 * 15 s) after the agent configured it — handshake attempts repeat every 5 s, so one is not
 * coming — or none for longer than WireGuard keeps a session (180 s) plus a keepalive. Two nodes
 * that cannot reach each other (both behind NATs that do not let them meet) show up here instead
 * of failing silently.
 */
import { keyToBase64 } from '../../dataplane/noise/keys.ts';
import type { DeviceSnapshot } from '../../dataplane/uapi/uapi-protocol.ts';
import type { DesiredPeer } from '../mesh/desired-peers.ts';
import { RECENT_HANDSHAKE_MS } from '../mesh/reconcile.ts';

export interface ReachabilityMemory {
  /** Base64 key → when the agent first configured the peer (wall ms). */
  configuredAt: Map<string, number>;
  /** Base64 keys judged unreachable now. */
  unreachable: Set<string>;
}

export function newReachabilityMemory(): ReachabilityMemory {
  return { configuredAt: new Map(), unreachable: new Set() };
}

export interface ReachabilityChange {
  kind: 'unreachable' | 'reachable';
  key: string;
  peer: DesiredPeer;
  /** 0 = never. */
  lastHandshakeWallMs: number;
}

/** Updates `memory` for the peers the mesh wants and returns what changed since the last call. */
export function judgeReachability(
  peers: ReadonlyMap<string, DesiredPeer>,
  device: DeviceSnapshot,
  memory: ReachabilityMemory,
  options: { nowWallMs: number; persistentKeepaliveS: number },
): ReachabilityChange[] {
  const now = options.nowWallMs;
  const keepaliveMs = options.persistentKeepaliveS * 1000;
  const byKey = new Map(device.peers.map((p) => [keyToBase64(p.publicKey), p]));
  for (const key of [...memory.configuredAt.keys()]) if (!peers.has(key)) memory.configuredAt.delete(key);
  for (const key of [...memory.unreachable]) if (!peers.has(key)) memory.unreachable.delete(key);
  const firstDeadline = Math.max(15_000, 3 * keepaliveMs);
  const changes: ReachabilityChange[] = [];
  for (const [key, peer] of peers) {
    if (!memory.configuredAt.has(key)) memory.configuredAt.set(key, now);
    const last = byKey.get(key)?.lastHandshakeWallMs ?? 0;
    const stale = last > 0 ? now - last > RECENT_HANDSHAKE_MS + keepaliveMs : now - memory.configuredAt.get(key)! > firstDeadline;
    if (stale && !memory.unreachable.has(key)) {
      memory.unreachable.add(key);
      changes.push({ kind: 'unreachable', key, peer, lastHandshakeWallMs: last });
    } else if (!stale && memory.unreachable.delete(key)) {
      changes.push({ kind: 'reachable', key, peer, lastHandshakeWallMs: last });
    }
  }
  return changes;
}
