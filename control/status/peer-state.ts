/**
 * One word for how a peer is doing, from what the data plane reports. Shared by
 * `roamguard status` and the agent's metrics, so both say the same thing.
 *
 * | state         | meaning                                                                      |
 * |---------------|------------------------------------------------------------------------------|
 * | `connected`   | a handshake completed within the last 180 s (WireGuard's Reject-After-Time:  |
 * |               | the session keys are valid)                                                  |
 * | `handshaking` | not connected, and trying: an initiation is in flight (roamguard's counters),|
 * |               | or — for data planes without counters — it never completed a handshake yet   |
 * | `stale`       | not connected and not trying: the last handshake is older than 180 s (with   |
 * |               | roamguard's counters also "never, and nothing in flight")                    |
 * | `no endpoint` | no address to send to: it stays down until the peer contacts us              |
 *
 * A peer is *unreachable* when a handshake is expected (persistent keepalive on, or packets are
 * waiting for it) but it has not been connected for a while (`UNREACHABLE_AFTER_MS`).
 */
import { RECENT_HANDSHAKE_MS } from '../mesh/reconcile.ts';

export type PeerState = 'connected' | 'handshaking' | 'stale' | 'no endpoint';
export const PEER_STATES: readonly PeerState[] = ['connected', 'handshaking', 'stale', 'no endpoint'];

/** A handshake younger than this means connected. */
export const CONNECTED_WITHIN_MS = RECENT_HANDSHAKE_MS;
/** Not connected for this long, while a handshake is expected: unreachable. */
export const UNREACHABLE_AFTER_MS = 30_000;

export interface PeerFacts {
  hasEndpoint: boolean;
  /** Wall-clock ms of the last completed handshake; 0 = never. */
  lastHandshakeWallMs: number;
  /** From roamguard's counters; undefined when the data plane has none. */
  handshakePending?: boolean;
}

export function peerState(peer: PeerFacts, nowWallMs: number): PeerState {
  const last = peer.lastHandshakeWallMs;
  if (last > 0 && nowWallMs - last < CONNECTED_WITHIN_MS) return 'connected';
  if (!peer.hasEndpoint) return 'no endpoint';
  if (peer.handshakePending === undefined) return last > 0 ? 'stale' : 'handshaking';
  return peer.handshakePending ? 'handshaking' : 'stale';
}

/** Whether the data plane should be completing handshakes with this peer. */
export function handshakeExpected(peer: { persistentKeepalive: number; stagedPackets?: number }): boolean {
  return peer.persistentKeepalive > 0 || (peer.stagedPackets ?? 0) > 0;
}

/** "12s ago", "3m 4s ago", "2h 5m ago", "3d 1h ago", or "never". */
export function formatAge(lastWallMs: number, nowWallMs: number): string {
  if (!(lastWallMs > 0)) return 'never';
  let s = Math.max(0, Math.floor((nowWallMs - lastWallMs) / 1000));
  const d = Math.floor(s / 86400); s -= d * 86400;
  const h = Math.floor(s / 3600); s -= h * 3600;
  const m = Math.floor(s / 60); s -= m * 60;
  if (d > 0) return `${d}d ${h}h ago`;
  if (h > 0) return `${h}h ${m}m ago`;
  if (m > 0) return `${m}m ${s}s ago`;
  return `${s}s ago`;
}

/** Bytes as `wg show` prints them: B, KiB, MiB, GiB, TiB with two decimals. */
export function formatBytes(n: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit++;
  }
  return unit === 0 ? `${n} B` : `${value.toFixed(2)} ${units[unit]}`;
}
