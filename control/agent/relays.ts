/**
 * The agent's part in relaying (control/mesh/relay.ts decides; this keeps the memory between
 * passes, runs the forwarder and says what to publish). Each pass:
 *
 *   Nodes + data plane → liveness of peers → relay candidates → `decideRelays` (this node's
 *   requests, and the peers it reaches through a relay) → as a public node: the pairs it relays
 *   (`relayAssignments`) → ports (`allocateRelayPorts`) → forwarder sockets → annotations.
 *
 * With RELAY off the node neither asks nor offers, and publishes neither annotation.
 */
import { keyToBase64 } from '../../dataplane/noise/keys.ts';
import type { DeviceSnapshot } from '../../dataplane/uapi/uapi-protocol.ts';
import type { Settings } from '../config/settings.ts';
import type { AgentLogger } from '../log.ts';
import { Endpoint } from '../../dataplane/net/endpoint.ts';
import {
  ANNOTATION, formatRelayAllocations, formatRelayRequests, parseRelayAllocations, parseRelayRequests, type NodeObject,
} from '../mesh/annotations.ts';
import type { DesiredPeer, MeshState } from '../mesh/desired-peers.ts';
import {
  allocateRelayPorts, decideRelays, isPublicSelf, livenessWindow, livePeers, relayAssignments, relayCandidates, relaysToProbe,
  updateProbing, type LivenessMemory, type ProbingMemory, type RelayClientMemory,
} from '../mesh/relay.ts';
import { probeAddress } from '../mesh/tunnel-gateway.ts';
import { RelayProber } from './relay-probe.ts';
import { RelayForwarderThread } from '../relay/forwarder-thread.ts';
import type { PairCounters } from '../relay/forward-core.ts';
import type { AnnotationPatch } from './own-annotations.ts';

/** Direct is tried again this often for every relayed pair, even when nothing changed. */
export const DIRECT_RETRY_MS = 10 * 60_000;

export interface RelayPassInput {
  nodes: readonly NodeObject[];
  mesh: MeshState;
  device: DeviceSnapshot;
  selfKey: string;
  selfAddresses: readonly string[];
  unreachable: ReadonlySet<string>;
  nowWallMs: number;
}

export interface RelayPassResult {
  /** The mesh with relayed peers' endpoints pointing at their relay. */
  peers: Map<string, DesiredPeer>;
  /** Annotations of this Node to write (only what changed); undefined when nothing did. */
  patch?: AnnotationPatch;
  /** Endpoints that are relay ports: never published as where a peer was discovered. */
  relayEndpoints: Set<string>;
  /** Peers on a direct trial whose direct endpoint is written now, over a roam, with a packet (`decideRelays`). */
  directNow: Set<string>;
}

export class AgentRelays {
  /** Peers reached through a relay now: key → relay endpoint and relay name. */
  routes = new Map<string, { endpoint: string; via: string }>();
  /** Pairs this node relays: pair id → ports. */
  allocations = new Map<string, [number, number]>();
  private readonly client: RelayClientMemory = new Map();
  private readonly liveness: LivenessMemory = new Map();
  /** Relay candidates probed now, and since when. */
  private readonly probing: ProbingMemory = new Map();
  readonly prober: RelayProber;
  private forwarder: RelayForwarderThread | undefined;
  private publishedRequests: string | null | undefined;
  private publishedAllocations: string | null | undefined;
  private refusedLogged = '';
  /** Why no relay could be asked for, as last logged ('' = nothing to say). */
  private noCandidateLogged = '';
  private readonly countersLogged = new Map<string, string>();
  /** Key → node name, from the last pass (labels of the counters). */
  private names = new Map<string, string>();

  constructor(private readonly settings: Settings, private readonly log: AgentLogger, prober?: RelayProber) {
    this.prober = prober ?? new RelayProber();
  }

  /**
   * Peers that sent something within the liveness window at the last pass (all of them when
   * keepalive is off: nothing says otherwise then).
   */
  live: ReadonlySet<string> | undefined;

  /** Peers in relay mode (relayed, waiting for a relay, or trying direct). */
  relayedPeers(): Set<string> {
    return new Set(this.client.keys());
  }

  /** Per relayed pair, by `nodeA,nodeB`: forwarding counters (empty unless this node relays). */
  counters(): Map<string, PairCounters> {
    const out = new Map<string, PairCounters>();
    for (const [id, c] of this.forwarder?.counters() ?? []) out.set(id.split(',').map((k) => this.names.get(k) ?? k.slice(0, 8)).join(','), c);
    return out;
  }

  async pass(input: RelayPassInput): Promise<RelayPassResult> {
    const s = this.settings;
    const { mesh, device, nowWallMs: now } = input;
    const byName = new Map(input.nodes.map((n) => [n.metadata?.name ?? '', n]));
    this.names = new Map([...mesh.peers].map(([key, p]) => [key, p.nodeName]));
    // Only cluster members' own annotations count: a Node's requests are read from that Node.
    const requestsOf = new Map<string, Map<string, string[]>>();
    const allocationsOf = new Map<string, Map<string, [number, number]>>();
    for (const [key, peer] of mesh.peers) {
      const node = byName.get(peer.nodeName);
      if (!node) continue;
      requestsOf.set(key, parseRelayRequests(node));
      const offered = parseRelayAllocations(node);
      if (offered) allocationsOf.set(peer.nodeName, offered);
    }
    const relayEndpoints = new Set<string>();
    for (const [name, pairs] of allocationsOf) {
      const host = [...mesh.peers.values()].find((p) => p.nodeName === name)?.endpoint;
      if (!host) continue;
      for (const ports of pairs.values()) for (const port of ports) relayEndpoints.add(new Endpoint(Endpoint.parse(host).host, port).toString());
    }

    const seen = device.peers.map((p) => ({ key: keyToBase64(p.publicKey), rxBytes: p.rxBytes, lastHandshakeWallMs: p.lastHandshakeWallMs, endpoint: p.endpoint?.toString() }));
    // While a peer needs a relay (relayed, or without a working session), the relays are probed
    // (relay-probe.ts) and a silent one is judged by a short window; otherwise two keepalives
    // without a word. relaysToProbe says why the probes start before the first request.
    const probed = s.relay ? relaysToProbe(mesh.peers, new Set(allocationsOf.keys()), this.relayedPeers(), input.unreachable) : [];
    updateProbing(this.probing, probed, now);
    const routedPrefixes = new Set(mesh.tunnelRoutes);
    this.prober.setTargets(probed.flatMap((key) => probeAddress(mesh.peers.get(key)!, routedPrefixes) ?? []));
    const windowMs = Math.max(15_000, (2 * s.persistentKeepalive + 5) * 1000);
    const live = livePeers(seen, this.liveness, now, (key) => livenessWindow(key, this.probing, now, windowMs));
    this.live = s.persistentKeepalive > 0 ? live : undefined;
    // A session that worked and went silent needs a relay as much as one that never started
    // (the handshake age alone says so only after 180 s + keepalive).
    // A longer window than the candidates': a busy node that skips a keepalive must not look cut off.
    const stalledWindowMs = Math.max(20_000, (3 * s.persistentKeepalive + 5) * 1000);
    const stalled = this.live ? seen.filter((p) => p.lastHandshakeWallMs > 0 && now - (this.liveness.get(p.key)?.grewAt ?? now) > stalledWindowMs).map((p) => p.key) : [];
    const noPath = new Set([...input.unreachable, ...stalled]);
    const selfPublic = isPublicSelf(input.selfAddresses, mesh.selfNatPublicAddress);
    const candidates = s.relay ? relayCandidates(mesh.peers, new Set(allocationsOf.keys()), live) : [];
    const decision = decideRelays({
      selfKey: input.selfKey, selfPublic, selfNatEndpoint: mesh.selfNatEndpoint, peers: mesh.peers, unreachable: noPath,
      candidates, requestsOf, allocationsOf, device: new Map(seen.map((p) => [p.key, p])), nowWallMs: now,
      trialMs: Math.max(10_000, (s.persistentKeepalive + 5) * 1000), retryMs: DIRECT_RETRY_MS,
    }, this.client, this.routes);
    const waiting = [...noPath].filter((key) => !this.client.has(key) && mesh.peers.has(key));
    const noCandidate = s.relay && waiting.length > 0 && candidates.length === 0 && !selfPublic
      ? `offering=${[...allocationsOf.keys()].sort().join(',') || 'none'} live=${[...live].map((k) => this.names.get(k) ?? k.slice(0, 8)).sort().join(',') || 'none'}`
      : '';
    if (noCandidate !== this.noCandidateLogged) {
      this.noCandidateLogged = noCandidate;
      if (noCandidate) this.log.info('peers without a working session, and no relay to ask: no relay-offering node has a live session with this one', { peers: waiting.map((k) => this.names.get(k) ?? k.slice(0, 8)).join(','), why: noCandidate });
    }
    for (const e of decision.events) {
      if (e.kind === 'relay-needed') this.log.info('no direct path to a peer: asking for a relay', { node: e.node, key: e.key.slice(0, 8), candidates });
      else if (e.kind === 'relayed') this.log.info('reaching a peer through a relay', { node: e.node, key: e.key.slice(0, 8), via: e.via, endpoint: e.endpoint });
      else if (e.kind === 'direct-trial') this.log.info('trying the direct path to a relayed peer again', { node: e.node, key: e.key.slice(0, 8) });
      else if (e.kind === 'direct-trial-failed') this.log.info('the direct path to a relayed peer still does not work: back to the relay', { node: e.node, key: e.key.slice(0, 8) });
      else this.log.info('a relayed peer is reachable directly: left the relay', { node: e.node, key: e.key.slice(0, 8) });
    }
    this.routes = decision.routes;

    const peers = this.routed(mesh.peers);

    const offer = s.relay && s.relayMaxPairs > 0 && selfPublic;
    await this.serve(offer, input.selfKey, requestsOf, mesh, device);

    const patch: AnnotationPatch = {};
    const requests = formatRelayRequests(decision.requests) ?? null;
    if (requests !== this.publishedRequests) patch[ANNOTATION.relayRequests] = requests;
    const allocations = offer ? formatRelayAllocations(this.allocations) : null;
    if (allocations !== this.publishedAllocations) patch[ANNOTATION.relayAllocations] = allocations;
    return { peers, patch: Object.keys(patch).length > 0 ? patch : undefined, relayEndpoints, directNow: decision.directNow };
  }

  /**
   * The peers with the relay routes of the last pass applied: what a pass planned from the agent's
   * model of the data plane uses (liveness, and so every relay decision, needs a fresh read).
   */
  routed(peers: ReadonlyMap<string, DesiredPeer>): Map<string, DesiredPeer> {
    const out = new Map(peers);
    for (const [key, route] of this.routes) {
      const peer = out.get(key);
      if (peer) out.set(key, { ...peer, endpoint: route.endpoint, endpointSource: 'relay', relayVia: route.via });
    }
    return out;
  }

  /** The patch returned by `pass` reached the Node. */
  published(patch: AnnotationPatch): void {
    if (ANNOTATION.relayRequests in patch) this.publishedRequests = patch[ANNOTATION.relayRequests];
    if (ANNOTATION.relayAllocations in patch) this.publishedAllocations = patch[ANNOTATION.relayAllocations];
  }

  close(): void {
    this.prober.close();
    this.closeForwarder();
  }

  private closeForwarder(): void {
    this.forwarder?.close();
    this.forwarder = undefined;
  }

  /** As a public node: the pairs the rule gives this node, their ports, and the sockets. */
  private async serve(offer: boolean, selfKey: string, requestsOf: ReadonlyMap<string, ReadonlyMap<string, readonly string[]>>, mesh: MeshState, device: DeviceSnapshot): Promise<void> {
    const s = this.settings;
    if (!offer) {
      if (this.forwarder) this.log.info('stopped relaying', { pairs: this.allocations.size });
      this.closeForwarder();
      this.allocations = new Map();
      return;
    }
    if (this.forwarder && !this.forwarder.alive) {
      // Its sockets went with it; a new thread binds the pairs' ports again (they keep them).
      this.log.warn('the relay forwarding thread died; starting a new one', { pairs: this.allocations.size });
      this.closeForwarder();
    }
    this.forwarder ??= new RelayForwarderThread({
      bytesPerSecond: s.relayPairMbit * 125_000,
      onError: (port, err) => this.log.warn('a relay port cannot be used; the next free one is taken instead', { port, error: err.message }),
    });
    const wanted = relayAssignments(s.nodeName, selfKey, requestsOf);
    const { allocations, refused } = allocateRelayPorts(this.allocations, wanted, { portMin: s.relayPorts.min, portMax: s.relayPorts.max, maxPairs: s.relayMaxPairs }, this.forwarder.unusable);
    const refusedText = refused.join(' ');
    if (refused.length > 0 && refusedText !== this.refusedLogged) {
      this.log.warn('not relaying some pairs: RELAY_MAX_PAIRS or RELAY_PORTS reached (they use another relay when one has room)', { refused: refused.length, serving: allocations.size });
    }
    this.refusedLogged = refusedText;
    const seenAt = new Map(device.peers.map((p) => [keyToBase64(p.publicKey), p.endpoint?.host]));
    const sources = (key: string): Set<string> => {
      const peer = mesh.peers.get(key);
      return new Set([seenAt.get(key), peer?.natPublicAddress, ...(peer?.addresses ?? [])].filter((x): x is string => x !== undefined));
    };
    const configs = [...allocations].map(([id, ports]) => {
      const [a, b] = id.split(',');
      return { id, ports, allowedSources: [sources(a), sources(b)] as const };
    });
    const ready = await this.forwarder.setPairs(configs);
    const before = this.allocations;
    this.allocations = new Map(ready.map((c) => [c.id, [c.ports[0], c.ports[1]]]));
    const nameOf = (key: string) => mesh.peers.get(key)?.nodeName ?? key.slice(0, 8);
    for (const [id, ports] of this.allocations) {
      if (!before.has(id)) this.log.info('relaying for a pair of nodes that cannot meet', { pair: id.split(',').map(nameOf), ports: ports.join(',') });
    }
    for (const id of before.keys()) if (!this.allocations.has(id)) this.log.info('stopped relaying for a pair', { pair: id.split(',').map(nameOf) });
    for (const [id, c] of this.forwarder.counters()) {
      const text = JSON.stringify(c);
      if (this.countersLogged.get(id) === text) continue;
      this.countersLogged.set(id, text);
      const dropped = Object.entries(c.dropped).filter(([, n]) => n > 0).map(([r, n]) => `${r}:${n}`).join(',') || 'none';
      this.log.debug('relay counters', { pair: id.split(',').map(nameOf).join('<->'), datagrams: c.datagrams[0] + c.datagrams[1], bytes: c.bytes[0] + c.bytes[1], dropped });
    }
    for (const id of [...this.countersLogged.keys()]) if (!this.allocations.has(id)) this.countersLogged.delete(id);
  }
}

