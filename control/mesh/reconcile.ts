/**
 * Desired peers against what the data plane reports (`get=1`), as the smallest `set=1` request
 * that closes the gap. Pure: the caller fetches the snapshot and sends the request.
 *
 * - Peers are matched by public key only.
 * - A peer missing from the desired set is removed only once the Node list is complete
 *   (`collectGarbage`): after an agent restart, a half-filled cache must not tear down tunnels.
 * - AllowedIPs change as set differences (`allowed_ip=-x` removes one prefix), never by replacing
 *   the peer; removals come before additions, so a prefix moving between peers in one request
 *   lands on its new owner. Daemons that predate `-` removal get `replace_allowed_ips` instead.
 * - The endpoint is a bootstrap hint. The data plane moves it when the peer roams (NAT rebinding),
 *   and reconcile keeps that: it writes the published endpoint only for a new peer, a peer with no
 *   endpoint, a peer whose published endpoint changed since we last wrote it, or (when we have no
 *   memory, after a restart) a peer that has not completed a handshake recently; and a peer the
 *   caller names in `rewriteEndpoints` (a direct trial that a late relayed datagram roamed back).
 *   A roam away from an endpoint the cluster states is taken back when it crossed into the other
 *   address family or its session stopped (roam-back.ts).
 */
import { Endpoint } from '../../dataplane/net/endpoint.ts';
import { formatPrefix, parsePrefix } from '../../dataplane/net/ip.ts';
import { keyText } from './key-text.ts';
import { TextCache } from './text-cache.ts';
import type { DeviceSnapshot, PeerChange, PeerSnapshot, SetRequest } from '../../dataplane/uapi/uapi-protocol.ts';
import { STATED_SOURCES, type DesiredPeer, type EndpointSource } from './desired-peers.ts';
import { replacedPeerEndpoint } from './replaced-peer.ts';
import { roamToTakeBack, type RoamTakenBack } from './roam-back.ts';

/** A handshake younger than this (WireGuard's Reject-After-Time) means the current endpoint works. */
export const RECENT_HANDSHAKE_MS = 180_000;

/** What the agent remembers between reconciles (in memory; lost on restart, which is handled). */
export interface ReconcileMemory {
  /** Base64 key → the published endpoint last written to the data plane for that peer. */
  writtenEndpoint: Map<string, string | undefined>;
  /**
   * Base64 key → the desired peer and the data plane's entry (its endpoint, keepalive and allowed
   * IPs: entrySignature) the last plan found in agreement, needing no change. While the desired
   * peer is the same object and the entry says the same, the outcome is the same, and the plan
   * skips the peer: the agent keeps unchanged desired peers (keepUnchangedPeers), so a Node
   * change at 5 000 peers plans the few peers it changed. `roam` holds what else a roam's fate
   * depends on (`roamContext`): a session that stops must be planned again.
   */
  settled: Map<string, { want: DesiredPeer; entry: string; roam: string }>;
}

export function newReconcileMemory(): ReconcileMemory {
  return { writtenEndpoint: new Map(), settled: new Map() };
}

export interface ReconcileOptions {
  collectGarbage: boolean;
  /** The data plane understands `allowed_ip=-prefix` (roamguard, newer wireguard-go). */
  canRemoveAllowedIp: boolean;
  nowWallMs: number;
  /** Peers whose wanted endpoint is written wherever the data plane roamed (a direct trial, relay.ts). */
  rewriteEndpoints?: ReadonlySet<string>;
  /**
   * Peers whose session received something within the liveness window (the relays' judgement);
   * undefined when there is none (keepalive off), and then no roam is judged stopped.
   */
  live?: ReadonlySet<string>;
  /** The address family of this node's own force-endpoint, when it has one (roam-back.ts). */
  ownForcedFamily?: 4 | 6;
}

export type PeerAction =
  /** `carriedEndpoint`: started at the endpoint of the peer it replaces (a rotated key, replaced-peer.ts). */
  | { kind: 'add'; peer: DesiredPeer; carriedEndpoint?: string }
  | { kind: 'remove'; publicKey: string }
  | {
    kind: 'update'; peer: DesiredPeer; added: string[]; removed: string[]; endpoint?: string; keepalive?: number;
    /** Set when `endpoint` takes back a roam of the data plane (roam-back.ts), and why. */
    roamTakenBack?: RoamTakenBack;
  };

export interface ReconcilePlan {
  /** Undefined when nothing needs changing. */
  request?: SetRequest;
  actions: PeerAction[];
  /** Peers the data plane has but the mesh does not want, kept because garbage collection is off. */
  kept: string[];
}

/** Canonical texts of prefix texts seen before: every pass compares the same 20 000 at 5 000 peers. */
const canonicalTexts = new TextCache((text: string) => formatPrefix(parsePrefix(text)));
const canonicalText = (text: string): string => canonicalTexts.get(text);

function canonical(list: Iterable<string>): Set<string> {
  const out = new Set<string>();
  for (const text of list) out.add(canonicalText(text));
  return out;
}

/** Signatures of data-plane entries seen before: the model keeps the entries no set touched. */
const entrySignatures = new WeakMap<PeerSnapshot, string>();

/** What a plan reads of a data-plane entry, as one text: endpoint, keepalive, allowed IPs in order. */
function entrySignature(entry: PeerSnapshot): string {
  let text = entrySignatures.get(entry);
  if (text === undefined) {
    text = `${entry.endpoint?.toString() ?? '-'} ${entry.persistentKeepalive} ${entry.allowedIps.map(formatPrefix).join(' ')}`;
    entrySignatures.set(entry, text);
  }
  return text;
}

/** What, besides the desired peer and the data plane's entry, decides whether a roam is kept. */
function roamContext(live: boolean, ownForcedFamily: 4 | 6 | undefined): string {
  return `${live ? 'live' : 'quiet'} ${ownForcedFamily ?? '-'}`;
}

export function planReconcile(
  desired: ReadonlyMap<string, DesiredPeer>,
  device: DeviceSnapshot,
  memory: ReconcileMemory,
  options: ReconcileOptions,
): ReconcilePlan {
  const actions: PeerAction[] = [];
  const kept: string[] = [];
  const removals: PeerChange[] = [];
  const updates: PeerChange[] = [];
  const seen = new Set<string>();
  const roamWhenLive = roamContext(true, options.ownForcedFamily);
  const roamWhenQuiet = roamContext(false, options.ownForcedFamily);

  for (const current of device.peers) {
    const key = keyText(current.publicKey);
    seen.add(key);
    const want = desired.get(key);
    const settled = memory.settled.get(key);
    const live = options.live?.has(key);
    const roam = live === false ? roamWhenQuiet : roamWhenLive;
    if (want !== undefined && settled !== undefined && settled.want === want && settled.entry === entrySignature(current) && settled.roam === roam && !options.rewriteEndpoints?.has(key)) continue;
    memory.settled.delete(key);
    if (!want) {
      if (options.collectGarbage) {
        actions.push({ kind: 'remove', publicKey: key });
        removals.push({ publicKey: current.publicKey, remove: true, updateOnly: false, replaceAllowedIps: false, allowedIps: [] });
      } else {
        kept.push(key);
      }
      continue;
    }
    const have = canonical(current.allowedIps.map(formatPrefix));
    const wantSet = canonical(want.allowedIps);
    const added = [...wantSet].filter((p) => !have.has(p));
    const removed = [...have].filter((p) => !wantSet.has(p));

    const written = memory.writtenEndpoint.get(key);
    const remembered = memory.writtenEndpoint.has(key);
    const recent = current.lastHandshakeWallMs > 0 && options.nowWallMs - current.lastHandshakeWallMs < RECENT_HANDSHAKE_MS;
    let endpoint: string | undefined;
    let roamTakenBack: RoamTakenBack | undefined;
    if (want.endpoint !== undefined) {
      const wanted = Endpoint.parse(want.endpoint);
      if (current.endpoint && wanted.equals(current.endpoint)) {
        // Already there (written by us, or reached by roaming): remember it as the baseline, so
        // a later roam away from it is not mistaken for a changed annotation.
        memory.writtenEndpoint.set(key, want.endpoint);
      } else {
        if (!current.endpoint || options.rewriteEndpoints?.has(key)) endpoint = want.endpoint;
        else if (remembered && written !== want.endpoint) endpoint = want.endpoint;
        else if (!remembered && !recent) endpoint = want.endpoint;
        else {
          roamTakenBack = roamToTakeBack({
            wanted, source: want.endpointSource, current: current.endpoint, live,
            everHandshook: current.lastHandshakeWallMs > 0, ownForcedFamily: options.ownForcedFamily,
          });
          if (roamTakenBack !== undefined) endpoint = want.endpoint;
        }
        if (endpoint !== undefined || !remembered) memory.writtenEndpoint.set(key, want.endpoint);
      }
    }
    const keepalive = current.persistentKeepalive !== want.persistentKeepalive ? want.persistentKeepalive : undefined;

    if (added.length === 0 && removed.length === 0 && endpoint === undefined && keepalive === undefined) {
      memory.settled.set(key, { want, entry: entrySignature(current), roam });
      continue;
    }
    actions.push({ kind: 'update', peer: want, added, removed, endpoint, keepalive, ...(roamTakenBack ? { roamTakenBack } : {}) });
    const replace = removed.length > 0 && !options.canRemoveAllowedIp;
    if (removed.length > 0 && !replace) {
      removals.push({
        publicKey: want.publicKeyBytes, remove: false, updateOnly: true, replaceAllowedIps: false,
        allowedIps: removed.map((p) => ({ prefix: parsePrefix(p), remove: true })),
      });
    }
    updates.push({
      publicKey: want.publicKeyBytes, remove: false, updateOnly: true,
      endpoint: endpoint === undefined ? undefined : Endpoint.parse(endpoint),
      persistentKeepalive: keepalive,
      replaceAllowedIps: replace,
      allowedIps: (replace ? [...wantSet] : added).map((p) => ({ prefix: parsePrefix(p), remove: false })),
    });
  }

  for (const [key, want] of desired) {
    if (seen.has(key)) continue;
    // The published endpoint stays the baseline: a carried one counts as a roam away from it.
    const carried = replacedPeerEndpoint(want, device, desired, options.nowWallMs, RECENT_HANDSHAKE_MS);
    actions.push(carried ? { kind: 'add', peer: want, carriedEndpoint: carried.toString() } : { kind: 'add', peer: want });
    memory.writtenEndpoint.set(key, want.endpoint);
    updates.push({
      publicKey: want.publicKeyBytes, remove: false, updateOnly: false,
      endpoint: carried ?? (want.endpoint === undefined ? undefined : Endpoint.parse(want.endpoint)),
      persistentKeepalive: want.persistentKeepalive,
      replaceAllowedIps: false,
      allowedIps: want.allowedIps.map((p) => ({ prefix: parsePrefix(p), remove: false })),
    });
  }
  for (const key of [...memory.writtenEndpoint.keys()]) if (!desired.has(key)) memory.writtenEndpoint.delete(key);
  for (const key of [...memory.settled.keys()]) if (!seen.has(key)) memory.settled.delete(key);

  const peers = [...removals, ...updates];
  return { actions, kept, request: peers.length > 0 ? { replacePeers: false, peers } : undefined };
}

/** Sources of endpoints whose peer gets a packet at once when given one (`peersToKick`). */
const KICKED_SOURCES: ReadonlySet<EndpointSource | undefined> = new Set<EndpointSource | undefined>([...STATED_SOURCES, 'relay']);

/**
 * The peers of a plan to send a packet now, at their new endpoint.
 *
 * A peer given an endpoint the cluster states (forced, published, LAN) gets one: it then answers
 * on the new path, instead of its next keepalive on the old one roaming us back before we ever
 * used it. So does a peer given a relay's port: the relay learns each member's NAT mapping from
 * its first datagram, and forwards nothing to a member it has not heard from (an idle pair would
 * wait up to a keepalive, 25 s by default, after a relay was replaced). So does a relayed pair's
 * direct trial (`directTrials`): each member's packet opens its own NAT for the other's, both at
 * once. Observed endpoints are left to their own timing.
 */
export function peersToKick(actions: readonly PeerAction[], directTrials?: ReadonlySet<string>): DesiredPeer[] {
  return actions.flatMap((a) => (a.kind === 'update' && a.endpoint !== undefined
    && (KICKED_SOURCES.has(a.peer.endpointSource) || directTrials?.has(a.peer.publicKey) === true) ? [a.peer] : []));
}
