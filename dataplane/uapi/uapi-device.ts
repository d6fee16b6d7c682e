/**
 * Applies validated `set` requests to a device and takes the snapshots `get` reports.
 *
 * The protocol core (WireGuardCore) holds keys, peers and allowed IPs; the listen port and the
 * firewall mark belong to the daemon's UDP layer, reached through the narrow {@link UapiHost}.
 *
 * Semantics follow wireguard-go's UAPI: device settings first (private key, listen port, fwmark,
 * replace_peers), then each peer section in order. When applying fails (a port that cannot be
 * bound), the rest is skipped and the errno returned; what was applied before stays applied.
 * Nothing here throws: an unexpected exception becomes errno −55.
 */
import { constants as osConstants } from 'node:os';
import type { WireGuardCore } from '../core.ts';
import { clampPrivateKey, constantTimeEqual, isZeroKey } from '../noise/keys.ts';
import {
  UAPI_ERRNO, type DeviceSnapshot, type PeerChange, type SetRequest,
} from './uapi-protocol.ts';
import type { DeviceStats } from './uapi-stats.ts';

/** What the control socket needs from the daemon besides the protocol core. */
export interface UapiHost {
  readonly core: WireGuardCore;
  /** The UDP port currently bound (0 = none). */
  readonly listenPort: number;
  /**
   * Rebinds the UDP sockets to `port` (0 = any free port). Rejects when that fails, with an error
   * whose `code` is a Node errno name ('EADDRINUSE' when the port is taken).
   */
  setListenPort(port: number): Promise<void>;
  /** The firewall mark on outgoing datagrams (0 = none). */
  readonly fwmark: number;
  /** Sets the firewall mark; may throw an error with a Node errno `code`. */
  setFwmark(mark: number): void | Promise<void>;
  /** The counters for `get=roamguard-stats` (uapi-stats.ts); without it the operation is refused. */
  stats?(): DeviceStats;
}

/** The two operations of the control socket, as uapi-server.ts calls them. */
export interface UapiHandler {
  /** A snapshot, or a complete `get` answer already formatted (formatGetResponse). */
  get(): DeviceSnapshot | string | Promise<DeviceSnapshot | string>;
  /**
   * Applies a validated request; resolves to the errno to answer (0 = success). The request's
   * private and preshared keys are wiped once this settles: copy what is kept.
   */
  set(request: SetRequest): number | Promise<number>;
  /** Counters, or an answer already formatted (formatStatsResponse); absent: the operation is unknown. */
  stats?(): DeviceStats | string | Promise<DeviceStats | string>;
}

export interface UapiDeviceOptions {
  /** Told about failed operations (for the daemon's log). */
  log?: (message: string) => void;
}

/** Negative errno for an error with a Node `code` such as 'EADDRINUSE', or `fallback`. */
export function errnoOf(err: unknown, fallback: number): number {
  const code = (err as { code?: unknown } | null)?.code;
  if (typeof code === 'string') {
    if (code === 'EADDRINUSE') return UAPI_ERRNO.EADDRINUSE;
    const value = (osConstants.errno as Record<string, number | undefined>)[code];
    if (typeof value === 'number' && value > 0) return -value;
  }
  return fallback;
}

function samePrivateKey(current: Uint8Array | undefined, requested: Uint8Array): boolean {
  if (isZeroKey(requested)) return current === undefined;
  return current !== undefined && constantTimeEqual(current, clampPrivateKey(requested));
}

function applyPeerChange(core: WireGuardCore, change: PeerChange): void {
  const own = core.ourPublicKey;
  // A section for our own key is parsed and ignored, as in wireguard-go.
  if (own && constantTimeEqual(own, change.publicKey)) return;
  let peer = core.getPeer(change.publicKey);
  if (change.remove) {
    if (peer) core.removePeer(change.publicKey);
    return;
  }
  if (!peer) {
    if (change.updateOnly) return;
    peer = core.addPeer(change.publicKey);
  }
  if (change.presharedKey) peer.setPresharedKey(change.presharedKey);
  if (change.endpoint) peer.endpoint = change.endpoint;
  if (change.replaceAllowedIps) core.allowedIps.removeByPeer(peer);
  for (const { prefix, remove } of change.allowedIps) {
    // Adding a prefix another peer owns moves it here; removing only touches this peer's own.
    if (remove) core.allowedIps.remove(prefix, peer);
    else core.allowedIps.insert(prefix, peer);
  }
  // Last, so a keepalive this enables goes to the endpoint set above (the peer sends it at once).
  if (change.persistentKeepalive !== undefined) peer.setPersistentKeepalive(change.persistentKeepalive);
  // As wireguard-go does when a section ends: packets that waited (e.g. for an endpoint) go now.
  if (core.up) peer.sendStagedPackets();
}

/**
 * Applies `request` to the host, in order: private key, listen port, fwmark, replace_peers, peer
 * sections. Resolves to 0 or the negative errno of the first failure. Never rejects.
 *
 * Unchanged settings are not re-applied: the same private key keeps the sessions (so
 * `wg syncconf` with an unchanged key does not interrupt traffic) and the same non-zero listen
 * port is not rebound.
 */
export async function applySetRequest(host: UapiHost, request: SetRequest, options: UapiDeviceOptions = {}): Promise<number> {
  const log = options.log ?? (() => {});
  try {
    const core = host.core;
    if (request.privateKey && !samePrivateKey(core.ourPrivateKey, request.privateKey)) {
      // Also removes a peer whose key is our new public key, and ends every session.
      core.setPrivateKey(request.privateKey);
    }
    if (request.listenPort !== undefined && (request.listenPort === 0 || request.listenPort !== host.listenPort)) {
      try {
        await host.setListenPort(request.listenPort);
      } catch (err) {
        log(`set: cannot listen on port ${request.listenPort}: ${(err as Error)?.message ?? err}`);
        return errnoOf(err, UAPI_ERRNO.EADDRINUSE);
      }
    }
    if (request.fwmark !== undefined && request.fwmark !== host.fwmark) {
      try {
        await host.setFwmark(request.fwmark);
      } catch (err) {
        log(`set: cannot set fwmark ${request.fwmark}: ${(err as Error)?.message ?? err}`);
        return errnoOf(err, UAPI_ERRNO.UNKNOWN);
      }
    }
    if (request.replacePeers) {
      for (const peer of [...core.peers]) core.removePeer(peer.publicKey);
    }
    for (const change of request.peers) applyPeerChange(core, change);
    return 0;
  } catch (err) {
    log(`set: unexpected failure: ${(err as Error)?.stack ?? err}`);
    return UAPI_ERRNO.UNKNOWN;
  }
}

/** The device as `get` reports it, peers in the order they were added. */
export function takeSnapshot(host: UapiHost): DeviceSnapshot {
  const core = host.core;
  const peers = [];
  for (const peer of core.peers) {
    peers.push({
      publicKey: peer.publicKey,
      presharedKey: peer.presharedKey,
      endpoint: peer.endpoint,
      lastHandshakeWallMs: peer.lastHandshakeWallMs,
      txBytes: peer.txBytes,
      rxBytes: peer.rxBytes,
      persistentKeepalive: peer.persistentKeepalive,
      allowedIps: core.allowedIps.entriesFor(peer),
    });
  }
  return { privateKey: core.ourPrivateKey, listenPort: host.listenPort, fwmark: host.fwmark, peers };
}

/**
 * The handler for uapi-server.ts over a host. Operations from all connections run one at a time,
 * in arrival order, so a `get` never sees half of a `set` (a set may wait on a rebind).
 */
export function createUapiHandler(host: UapiHost, options: UapiDeviceOptions = {}): UapiHandler {
  let queue: Promise<unknown> = Promise.resolve();
  const serialized = <T>(operation: () => T | Promise<T>): Promise<T> => {
    const result = queue.then(operation);
    queue = result.catch(() => {});
    return result;
  };
  const handler: UapiHandler = {
    get: () => serialized(() => takeSnapshot(host)),
    set: (request) => serialized(() => applySetRequest(host, request, options)),
  };
  if (host.stats) handler.stats = () => serialized(() => host.stats!());
  return handler;
}
