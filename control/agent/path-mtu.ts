/**
 * Per-peer path MTU through the tunnel (pure: decisions on an injected clock; the agent runs the
 * probes and sets the routes).
 *
 * Why: the tunnel MTU fits the node's own link, but the path between two nodes may carry less
 * (PPPoE 1492, a cloud overlay 1450, an IPv6-in-IPv4 hop 1280). roamguard's data plane sends
 * every datagram with DF, so a datagram too large for the path is dropped whole; paths often drop
 * the ICMP that would say so. So the agent finds out itself: it pings the peer's tunnel gateway
 * address (network + 1 of its first pod CIDR, which the peer's agent puts on its tunnel) with
 * DF-set pings of chosen sizes and takes the largest size that gets an answer. The answer comes
 * back the same way, so what is learned is the smaller of the two directions. That size goes on
 * the routes to the peer's pod CIDRs, so the kernel answers a pod's oversized packet with
 * "fragmentation needed" / "packet too big", and the forward chain clamps TCP MSS to the route.
 *
 * Probes go to a host route of their own (the gateway address, no MTU), so a re-probe can find a
 * path that has grown since. When: once a peer has a working session; again when its endpoint
 * changes (a roam, a new NAT mapping: maybe another path), when traffic to it stalls (bytes go
 * out, nothing comes back for two looks in a row), every REPROBE_INTERVAL_MS, and soon after a
 * probe that got no answer at all (NO_ANSWER_RETRY_MS).
 */
import { keyToBase64 } from '../../dataplane/noise/keys.ts';
import type { DeviceSnapshot } from '../../dataplane/uapi/uapi-protocol.ts';
import type { WantedRoute } from '../host/routes.ts';
import type { DesiredPeer } from '../mesh/desired-peers.ts';
import { RECENT_HANDSHAKE_MS } from '../mesh/reconcile.ts';
import { probeAddress } from '../mesh/tunnel-gateway.ts';

/** The smallest inner size searched: a 1280-byte outer path less IPv6 outer overhead. */
export const MIN_PROBED_MTU = 1200;
export const REPROBE_INTERVAL_MS = 10 * 60_000;
/**
 * A probe nobody answered at any size is tried again this soon: right after the first handshake
 * the peer's agent may not have its route back to us yet, so the echo replies go elsewhere.
 */
export const NO_ANSWER_RETRY_MS = 10_000;
/** A stall re-probe waits this long after the last probe (a stalled peer stays stalled while we look). */
export const STALL_REPROBE_AFTER_MS = 30_000;
/** Bytes sent between two looks, with nothing received, that count as "traffic stalls". */
export const STALL_TX_BYTES = 4096;
/** Looks closer together than this (passes come in bursts on Node events) do not count. */
export const LOOK_INTERVAL_MS = 4000;

export type ProbeReason = 'first' | 'no-answer' | 'endpoint-changed' | 'stall' | 'periodic';

export interface PeerPathMtu {
  /** The learned inner MTU; undefined until a probe got an answer. */
  mtu: number | undefined;
  /** When the last probe finished (wall ms); 0 = never. */
  probedAtMs: number;
  /** Why the last probe ran. */
  reason: ProbeReason | undefined;
  /** The last probe got no answer at any size. */
  unanswered?: boolean;
  /** The endpoint at the last probe. */
  endpoint: string | undefined;
  lastTx: number;
  lastRx: number;
  /** When the counters above were read (wall ms). */
  lastLookMs: number;
  /** Looks in a row with bytes out and none in. */
  flatLooks: number;
}

/** Base64 key → what is known of that peer's path. */
export type PathMtuMemory = Map<string, PeerPathMtu>;

export interface ProbeTarget {
  key: string;
  nodeName: string;
  /** The peer's tunnel gateway address (IPv4 preferred). */
  address: string;
  reason: ProbeReason;
}

/**
 * Which peers to probe now. Updates the traffic counters in `memory` (call once per look) and
 * forgets peers the mesh no longer has.
 */
export function dueProbes(
  peers: ReadonlyMap<string, DesiredPeer>,
  tunnelRoutes: readonly string[],
  device: DeviceSnapshot,
  memory: PathMtuMemory,
  nowWallMs: number,
): ProbeTarget[] {
  const routed = new Set(tunnelRoutes);
  for (const key of [...memory.keys()]) if (!peers.has(key)) memory.delete(key);
  const due: ProbeTarget[] = [];
  for (const seen of device.peers) {
    const key = keyToBase64(seen.publicKey);
    const peer = peers.get(key);
    if (!peer) continue;
    const address = probeAddress(peer, routed);
    if (address === undefined) continue;
    let m = memory.get(key);
    if (!m) memory.set(key, m = { mtu: undefined, probedAtMs: 0, reason: undefined, endpoint: undefined, lastTx: seen.txBytes, lastRx: seen.rxBytes, lastLookMs: nowWallMs, flatLooks: 0 });
    if (nowWallMs - m.lastLookMs >= LOOK_INTERVAL_MS) {
      const sent = seen.txBytes - m.lastTx;
      const received = seen.rxBytes - m.lastRx;
      m.flatLooks = sent >= STALL_TX_BYTES && received === 0 ? m.flatLooks + 1 : 0;
      m.lastTx = seen.txBytes;
      m.lastRx = seen.rxBytes;
      m.lastLookMs = nowWallMs;
    }
    const working = seen.lastHandshakeWallMs > 0 && nowWallMs - seen.lastHandshakeWallMs < RECENT_HANDSHAKE_MS;
    if (!working) continue;
    const endpoint = seen.endpoint?.toString();
    let reason: ProbeReason | undefined;
    if (m.probedAtMs === 0) reason = 'first';
    else if (endpoint !== m.endpoint) reason = 'endpoint-changed';
    else if (m.unanswered && nowWallMs - m.probedAtMs >= NO_ANSWER_RETRY_MS) reason = 'no-answer';
    else if (m.flatLooks >= 2 && nowWallMs - m.probedAtMs >= STALL_REPROBE_AFTER_MS) reason = 'stall';
    else if (nowWallMs - m.probedAtMs >= REPROBE_INTERVAL_MS) reason = 'periodic';
    if (reason) due.push({ key, nodeName: peer.nodeName, address, reason });
  }
  return due;
}

/** Records a finished probe: `mtu` undefined when not even the smallest size was answered (the path is kept as it was). */
export function recordProbe(memory: PathMtuMemory, target: ProbeTarget, endpoint: string | undefined, mtu: number | undefined, nowWallMs: number): { changed: boolean; before: number | undefined } {
  const m = memory.get(target.key);
  if (!m) return { changed: false, before: undefined };
  const before = m.mtu;
  m.probedAtMs = nowWallMs;
  m.reason = target.reason;
  m.endpoint = endpoint;
  m.flatLooks = 0;
  m.unanswered = mtu === undefined;
  if (mtu !== undefined) m.mtu = mtu;
  return { changed: m.mtu !== before, before };
}

/**
 * The largest size in [low, high] that `fits`, or undefined when `low` does not. Tries `high`
 * first (most paths carry the whole tunnel MTU: one probe), then `low`, then halves the gap:
 * about log2(high - low) probes, each one answered or timed out.
 */
export async function searchLargestFit(low: number, high: number, fits: (size: number) => Promise<boolean>): Promise<number | undefined> {
  if (!Number.isInteger(low) || !Number.isInteger(high) || low > high) throw new Error(`bad search range ${low}..${high}`);
  if (await fits(high)) return high;
  if (!(await fits(low))) return undefined;
  let good = low, bad = high;
  while (bad - good > 1) {
    const mid = (good + bad) >>> 1;
    if (await fits(mid)) good = mid;
    else bad = mid;
  }
  return good;
}

/**
 * The routes the agent owns on the tunnel: every routed pod CIDR, carrying its peer's learned MTU
 * when that is below the tunnel's, plus a host route without MTU to each probe address.
 */
export function routesWithPathMtu(
  tunnelRoutes: readonly string[],
  peers: ReadonlyMap<string, DesiredPeer>,
  memory: PathMtuMemory,
  tunnelMtu: number,
  probing: boolean,
): WantedRoute[] {
  const routed = new Set(tunnelRoutes);
  const mtuOf = new Map<string, number>();
  const probes: WantedRoute[] = [];
  for (const [key, peer] of peers) {
    if (!probing) continue;
    const address = probeAddress(peer, routed);
    if (address !== undefined) probes.push({ dst: `${address}/${address.includes(':') ? 128 : 32}` });
    const mtu = memory.get(key)?.mtu;
    if (mtu === undefined || mtu >= tunnelMtu) continue;
    for (const cidr of peer.allowedIps) if (routed.has(cidr)) mtuOf.set(cidr, mtu);
  }
  return [...tunnelRoutes.map((dst) => (mtuOf.has(dst) ? { dst, mtu: mtuOf.get(dst) } : { dst })), ...probes];
}
