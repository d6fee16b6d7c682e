/**
 * Relays for pairs of nodes that cannot meet (both behind NATs that pick a new port for every
 * destination), as pure decisions from the Node objects, the data plane's view and a clock.
 *
 * The protocol, all of it in annotations every node can read:
 *
 * 1. A node offers to relay by carrying `relay-allocations` (relays on, and it is public: it
 *    publishes a globally routable address and nobody sees it behind NAT).
 * 2. A node with no working session with a peer for the reachability bound (15 s; both
 *    non-public, not behind the same NAT) lists, in its own `relay-requests`, that peer's key and
 *    the offering nodes it has a live session with (its relay candidates).
 * 3. Both sides and every relay compute the same relay for the pair from the two lists
 *    (`chooseRelay`: rendezvous hashing over the relays both reach). A relay serves a pair only
 *    when both members ask for each other and the rule picks it; it allocates two UDP ports for
 *    the pair and publishes them in its `relay-allocations`.
 * 4. Each side sets the peer's WireGuard endpoint to the relay's address and its own port. The
 *    relay learns each side's NAT mapping from the first datagram on that port and forwards
 *    opaque UDP between the two: WireGuard's encryption stays end to end.
 *
 * Trust: each annotation speaks only for the node that carries it. A requester's list only ever
 * affects pairs that include the requester; an allocation is only used when it comes from the
 * relay both members' lists pick, so a node that is not that relay cannot redirect a pair's
 * traffic by publishing allocations for it (test/unit/relay.test.ts plays that attacker).
 *
 * Direct paths keep being tried: when the direct endpoints of a relayed pair change (a NAT that
 * changed its behaviour, a new port forward), and every `retryMs` in any case, the pair's members
 * point at each other directly for `trialMs`; packets arriving from a non-relay address in that
 * window prove the direct path and the pair leaves the relay, otherwise it goes back. The two
 * members start their trials a moment apart, and a datagram still on its way through the relay
 * then lands after a member's switch: WireGuard roams to it, that member answers through the
 * relay, the other roams back too, and the pair would sit on the relay's ports for the rest of the
 * trial. So a trial keeps its direct endpoint (`directNow`: written again, with a packet at once)
 * and judges only what arrived since it last did.
 */
import { createHash } from 'node:crypto';
import { Endpoint } from '../../dataplane/net/endpoint.ts';
import { isSiteLocalAddress } from './claims.ts';
import { relayPairId } from './annotations.ts';
import type { DesiredPeer } from './desired-peers.ts';

/** Relays a node lists per request: a few are enough to find one both members reach. */
export const MAX_RELAY_CANDIDATES = 8;

/**
 * A peer that may relay for others: reached at the address it publishes (globally routable), and
 * nobody sees it behind NAT. Nodes behind NAT never relay: their mapping is not reachable for all.
 */
export function isPublicPeer(peer: DesiredPeer): boolean {
  if (peer.endpointSource !== 'published' || peer.endpoint === undefined || peer.natPublicAddress !== undefined) return false;
  return !isSiteLocalAddress(Endpoint.parse(peer.endpoint).host);
}

/** Whether this node is public by the same rule, from its own addresses and how others see it. */
export function isPublicSelf(addresses: readonly string[], selfNatPublicAddress: string | undefined): boolean {
  return selfNatPublicAddress === undefined && addresses.some((a) => !isSiteLocalAddress(a));
}

/**
 * This node's relay candidates: public peers that offer to relay and that this node has a live
 * session with, by node name (sorted, at most MAX_RELAY_CANDIDATES).
 */
export function relayCandidates(peers: ReadonlyMap<string, DesiredPeer>, offering: ReadonlySet<string>, live: ReadonlySet<string>): string[] {
  const out: string[] = [];
  for (const [key, peer] of peers) {
    if (offering.has(peer.nodeName) && live.has(key) && isPublicPeer(peer)) out.push(peer.nodeName);
  }
  return out.sort().slice(0, MAX_RELAY_CANDIDATES);
}

function rank(pairId: string, relay: string): string {
  return createHash('sha256').update(`${pairId}\n${relay}`).digest('hex');
}

/**
 * The relay for a pair: among the relays both members list, the one with the lowest
 * SHA-256(pair id, relay name). Every node computes the same from the two lists; pairs spread
 * evenly over relays, and a relay coming or going moves only the pairs it wins or served.
 */
export function chooseRelay(pairId: string, a: readonly string[], b: readonly string[]): string | undefined {
  const theirs = new Set(b);
  let best: { name: string; rank: string } | undefined;
  for (const name of new Set(a)) {
    if (!theirs.has(name)) continue;
    const r = rank(pairId, name);
    if (!best || r < best.rank) best = { name, rank: r };
  }
  return best?.name;
}

// --- liveness: is a session with a peer carrying packets? -------------------------------------

/** Base64 key → received bytes at the last look and when they last grew (wall ms). */
export type LivenessMemory = Map<string, { rxBytes: number; grewAt: number }>;

/**
 * Peers whose received bytes grew within their window (`windowFor(key)`, ms). With persistent
 * keepalive every live peer sends something at least every keepalive period, so a relay whose node
 * died drops out of the candidates within the window (the handshake age alone would take minutes).
 */
export function livePeers(device: ReadonlyArray<{ key: string; rxBytes: number; lastHandshakeWallMs: number }>, memory: LivenessMemory, nowWallMs: number, windowFor: (key: string) => number): Set<string> {
  const seen = new Set<string>();
  const live = new Set<string>();
  for (const p of device) {
    seen.add(p.key);
    const m = memory.get(p.key);
    // First sight (a new peer, an agent that restarted): a peer with a session gets the benefit of
    // the doubt for one window, one without has said nothing yet.
    if (!m) memory.set(p.key, { rxBytes: p.rxBytes, grewAt: p.lastHandshakeWallMs > 0 ? nowWallMs : 0 });
    else if (p.rxBytes !== m.rxBytes) memory.set(p.key, { rxBytes: p.rxBytes, grewAt: nowWallMs });
    if (nowWallMs - memory.get(p.key)!.grewAt <= windowFor(p.key)) live.add(p.key);
  }
  for (const key of [...memory.keys()]) if (!seen.has(key)) memory.delete(key);
  return live;
}

// --- probing the relays while a pair needs one ------------------------------------------------

/**
 * While this node has a peer in relay mode or without a working session, the agent sends every
 * relay candidate a datagram this often through the tunnel (control/agent/relay-probe.ts); the
 * candidate's answer makes its received bytes grow whatever the keepalive period.
 */
export const RELAY_PROBE_INTERVAL_MS = 2000;

/**
 * A candidate probed for at least this long that sent nothing back for this long is taken for
 * dead. Four probes: one lost datagram never moves a pair. With the keepalive window alone (at
 * least two keepalives, 55 s at the default 25 s) a relay lost mid-pair would be replaced only
 * after a minute; with probes the pair moves within about 20 s (docs/robustness.md).
 */
export const PROBED_SILENCE_MS = 8000;

/** Base64 key → since when (wall ms) the peer has been probed without a break. */
export type ProbingMemory = Map<string, number>;

/** Records which peers are probed now: new ones from now, ones no longer probed are forgotten. */
export function updateProbing(memory: ProbingMemory, probed: Iterable<string>, nowWallMs: number): void {
  const now = new Set(probed);
  for (const key of [...memory.keys()]) if (!now.has(key)) memory.delete(key);
  for (const key of now) if (!memory.has(key)) memory.set(key, nowWallMs);
}

/**
 * The liveness window of a peer: PROBED_SILENCE_MS once it has been probed that long (before,
 * silence since the last keepalive is no evidence), else `keepaliveWindowMs`.
 */
export function livenessWindow(key: string, probing: ProbingMemory, nowWallMs: number, keepaliveWindowMs: number): number {
  const since = probing.get(key);
  return since !== undefined && nowWallMs - since >= PROBED_SILENCE_MS ? PROBED_SILENCE_MS : keepaliveWindowMs;
}

/**
 * The peers to probe: relay-offering public peers, while this node has any peer that needs a
 * relay: one in relay mode (`relayed`), or a mesh peer without a working session (`unreachable`),
 * which is about to ask for one. The second matters: with persistent keepalives on both ends, a
 * relay whose keepalive timer keeps being restarted by ours never sends one, so without an answer
 * to a probe it looks dead and would never be asked.
 */
export function relaysToProbe(
  peers: ReadonlyMap<string, DesiredPeer>, offering: ReadonlySet<string>, relayed: ReadonlySet<string>, unreachable: ReadonlySet<string>,
): string[] {
  const needing = relayed.size > 0 || [...unreachable].some((key) => peers.has(key));
  if (!needing) return [];
  return [...peers].filter(([, p]) => offering.has(p.nodeName) && isPublicPeer(p)).map(([key]) => key).sort();
}

// --- the members' side ------------------------------------------------------------------------

interface RelayedPeer {
  since: number;
  /** The direct endpoints (peer's and ours as others see us) when direct was last tried. */
  triedKey: string;
  lastTrialAt: number;
  trial?: { until: number; rxAtStart: number; relayEndpoint?: string };
}

/** Base64 key of a peer → its relay state. Peers not in it talk directly. */
export type RelayClientMemory = Map<string, RelayedPeer>;

export interface RelayClientInput {
  selfKey: string;
  /** This node is public itself: it never needs a relay. */
  selfPublic: boolean;
  /** Where others see this node behind NAT (`ip:port`); part of the direct path's identity. */
  selfNatEndpoint?: string;
  /** The desired mesh with the direct endpoints. */
  peers: ReadonlyMap<string, DesiredPeer>;
  /** Peers without a working session (control/agent/reachability.ts). */
  unreachable: ReadonlySet<string>;
  /** This node's relay candidates (`relayCandidates`). */
  candidates: readonly string[];
  /** Each peer's `relay-requests`, by the peer's key (only what that peer's own Node says). */
  requestsOf: ReadonlyMap<string, ReadonlyMap<string, readonly string[]>>;
  /** Each offering node's `relay-allocations`, by node name. */
  allocationsOf: ReadonlyMap<string, ReadonlyMap<string, readonly [number, number]>>;
  /** What the data plane reports per peer key. */
  device: ReadonlyMap<string, { endpoint?: string; rxBytes: number }>;
  nowWallMs: number;
  /** How long a direct trial lasts (longer than a keepalive period, so an idle peer speaks). */
  trialMs: number;
  /** Direct is tried again this often even when nothing changed. */
  retryMs: number;
}

export type RelayEvent =
  | { kind: 'relay-needed' | 'direct-again' | 'direct-trial' | 'direct-trial-failed'; key: string; node: string }
  | { kind: 'relayed'; key: string; node: string; via: string; endpoint: string };

export interface RelayClientDecision {
  /** This node's `relay-requests`: peer key → relay candidates. */
  requests: Map<string, string[]>;
  /** Peers to reach through a relay now: key → the relay's address and port for us, and its name. */
  routes: Map<string, { endpoint: string; via: string }>;
  /**
   * Peers whose direct endpoint is written this pass for a trial, even over a roam, and given a
   * packet at once: a trial starts, or a datagram through the relay took the data plane back.
   */
  directNow: Set<string>;
  events: RelayEvent[];
}

/** Decides, for every peer, whether it goes through a relay, and updates `memory`. */
export function decideRelays(input: RelayClientInput, memory: RelayClientMemory, previous?: ReadonlyMap<string, { endpoint: string; via: string }>): RelayClientDecision {
  const now = input.nowWallMs;
  const requests = new Map<string, string[]>();
  const routes = new Map<string, { endpoint: string; via: string }>();
  const directNow = new Set<string>();
  const events: RelayEvent[] = [];
  for (const key of [...memory.keys()]) if (!input.peers.has(key)) memory.delete(key);
  for (const [key, peer] of input.peers) {
    // Nodes behind the same NAT use the LAN; a public node is reached directly by everyone.
    const eligible = !input.selfPublic && !isPublicPeer(peer) && peer.endpointSource !== 'lan' && key !== input.selfKey;
    const directKey = `${peer.endpoint ?? ''}|${input.selfNatEndpoint ?? ''}`;
    let state = memory.get(key);
    if (!state) {
      if (!eligible || !input.unreachable.has(key) || input.candidates.length === 0) continue;
      state = { since: now, triedKey: directKey, lastTrialAt: now };
      memory.set(key, state);
      events.push({ kind: 'relay-needed', key, node: peer.nodeName });
    } else if (!eligible) {
      memory.delete(key);
      events.push({ kind: 'direct-again', key, node: peer.nodeName });
      continue;
    }
    const seen = input.device.get(key);
    if (state.trial && now >= state.trial.until) {
      const moved = seen?.endpoint !== undefined && seen.endpoint !== state.trial.relayEndpoint;
      if (moved && seen!.rxBytes > state.trial.rxAtStart) {
        memory.delete(key);
        events.push({ kind: 'direct-again', key, node: peer.nodeName });
        continue;
      }
      state.trial = undefined;
      state.lastTrialAt = now;
      events.push({ kind: 'direct-trial-failed', key, node: peer.nodeName });
    } else if (!state.trial && (directKey !== state.triedKey || now - state.lastTrialAt >= input.retryMs) && peer.endpoint !== undefined) {
      state.trial = { until: now + input.trialMs, rxAtStart: seen?.rxBytes ?? 0, relayEndpoint: previous?.get(key)?.endpoint };
      state.triedKey = directKey;
      directNow.add(key);
      events.push({ kind: 'direct-trial', key, node: peer.nodeName });
    } else if (state.trial && seen?.endpoint !== undefined && seen.endpoint === state.trial.relayEndpoint) {
      // Roamed back to the relay mid-trial (see the top of this file): direct again, and only
      // what arrives from now on counts.
      state.trial.rxAtStart = seen.rxBytes;
      directNow.add(key);
    }
    if (input.candidates.length === 0) continue;
    requests.set(key, [...input.candidates]);
    if (state.trial) continue;
    const theirs = input.requestsOf.get(key)?.get(input.selfKey);
    if (!theirs) continue;
    const pairId = relayPairId(input.selfKey, key);
    const via = chooseRelay(pairId, input.candidates, theirs);
    const ports = via === undefined ? undefined : input.allocationsOf.get(via)?.get(pairId);
    const relayPeer = via === undefined ? undefined : [...input.peers.values()].find((p) => p.nodeName === via);
    if (!ports || !relayPeer?.endpoint) continue;
    const endpoint = new Endpoint(Endpoint.parse(relayPeer.endpoint).host, ports[input.selfKey < key ? 0 : 1]).toString();
    routes.set(key, { endpoint, via: via! });
    const before = previous?.get(key);
    if (before?.endpoint !== endpoint) events.push({ kind: 'relayed', key, node: peer.nodeName, via: via!, endpoint });
  }
  return { requests, routes, directNow, events };
}

// --- the relay's side -------------------------------------------------------------------------

/**
 * The pairs this node relays: both members ask for each other and the rule picks this node.
 * `requestsOf` holds only cluster members' own requests (by their key), so nothing else can make
 * a relay serve anyone.
 */
export function relayAssignments(selfName: string, selfKey: string, requestsOf: ReadonlyMap<string, ReadonlyMap<string, readonly string[]>>): string[] {
  const out: string[] = [];
  for (const [a, asked] of requestsOf) {
    for (const [b, listA] of asked) {
      if (!(a < b) || a === selfKey || b === selfKey) continue;
      const listB = requestsOf.get(b)?.get(a);
      if (!listB) continue;
      const id = relayPairId(a, b);
      if (chooseRelay(id, listA, listB) === selfName) out.push(id);
    }
  }
  return out.sort();
}

export interface RelayLimits {
  portMin: number;
  portMax: number;
  /** Pairs served at once (each takes two ports). */
  maxPairs: number;
}

/**
 * Ports for the wanted pairs: a pair keeps its ports while it is wanted (its members are already
 * using them); new pairs get the lowest free two, in pair order, until `maxPairs` or the range
 * runs out (`refused`). `unusable` are ports that could not be bound.
 */
export function allocateRelayPorts(
  current: ReadonlyMap<string, readonly [number, number]>, wanted: readonly string[], limits: RelayLimits, unusable: ReadonlySet<number> = new Set(),
): { allocations: Map<string, [number, number]>; refused: string[] } {
  const allocations = new Map<string, [number, number]>();
  const used = new Set<number>(unusable);
  const want = new Set(wanted);
  for (const [id, ports] of current) {
    if (!want.has(id) || allocations.size >= limits.maxPairs || unusable.has(ports[0]) || unusable.has(ports[1])) continue;
    allocations.set(id, [ports[0], ports[1]]);
    used.add(ports[0]);
    used.add(ports[1]);
  }
  const refused: string[] = [];
  let next = limits.portMin;
  const free = (): number | undefined => {
    while (next <= limits.portMax && used.has(next)) next++;
    if (next > limits.portMax) return undefined;
    used.add(next);
    return next++;
  };
  for (const id of [...want].sort()) {
    if (allocations.has(id)) continue;
    if (allocations.size >= limits.maxPairs) { refused.push(id); continue; }
    const a = free(), b = a === undefined ? undefined : free();
    if (a === undefined || b === undefined) { refused.push(id); continue; }
    allocations.set(id, [a, b]);
  }
  return { allocations, refused };
}
