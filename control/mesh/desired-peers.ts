/**
 * From the cluster's Node objects to the peers this node wants, keyed by public key.
 *
 * The rules that keep a mesh behind NAT working (lessons from Flannel PR #2073, Calico, Cilium):
 * - A peer is its public key. Any number of peers may share an endpoint address; nothing here
 *   ever compares endpoints between nodes.
 * - Claims are resolved in a stable order (oldest Node first, then by name), so a newcomer can
 *   never take over what an existing node holds: a node claiming a public key or pod CIDR that an
 *   earlier node (or this node) already holds is rejected with a reason, and the earlier node
 *   keeps working.
 * - A node address claimed by several nodes (nodes behind one NAT publishing the same public IP)
 *   is an ambiguous identity, so it goes into nobody's AllowedIPs; it can still be an endpoint.
 *
 * Endpoints behind NAT (see `chooseEndpoint`): every node publishes where its data plane sees its
 * peers (`discovered-endpoints`). A node seen at an address that is none of its own is behind NAT,
 * and that address is its public one. Peers use the observed `ip:port` to reach it — except peers
 * behind the same public address, which use its LAN address, since many routers cannot hairpin.
 */
import { Endpoint } from '../../dataplane/net/endpoint.ts';
import { parsePrefix, type Prefix } from '../../dataplane/net/ip.ts';
import { ANNOTATION, canonicalIp, parseDiscoveredEndpoints, parseNodeAnnotations, type AnnotationResult, type NodeObject } from './annotations.ts';
import { isSiteLocalAddress, nodeIpRefusal, parseAllowedRanges, podCidrRefusal, type RefusedClaim } from './claims.ts';
import type { IpFamilyChoice, PerFamily } from '../config/settings.ts';
import { PrefixIndex } from './prefix-index.ts';
import { parsedAddress, parsedPrefix } from './interned.ts';
import { TextCache } from './text-cache.ts';

export interface DesiredPeer {
  nodeName: string;
  publicKey: string;
  publicKeyBytes: Uint8Array;
  /** The endpoint to start from (`ip:port`); undefined when the node publishes no usable address. */
  endpoint?: string;
  /** Where `endpoint` came from (for logs and status). */
  endpointSource?: EndpointSource;
  /** The relay node's name when `endpointSource` is `relay`. */
  relayVia?: string;
  /** The node's own addresses (Node status + node-ips annotation), canonical order. */
  addresses?: string[];
  /** The node's public address when it is behind NAT (seen by others at an address not its own). */
  natPublicAddress?: string;
  /** Canonical, sorted, unique. */
  allowedIps: string[];
  persistentKeepalive: number;
}

/** `relay`: set by the agent for a peer reached through a relay node (control/mesh/relay.ts). */
export type EndpointSource = 'forced' | 'discovered' | 'lan' | 'published' | 'relay';

/**
 * Sources of endpoints the cluster states (an operator's force-endpoint, the address a node
 * publishes, its LAN address), as against what others observe (`discovered`) or a relay's port.
 */
export const STATED_SOURCES: ReadonlySet<EndpointSource | undefined> = new Set<EndpointSource>(['forced', 'published', 'lan']);

export interface Rejection { node: string; reason: string }

export interface MeshState {
  /** By base64 public key. */
  peers: Map<string, DesiredPeer>;
  /** Nodes left out because of what they publish; every other node is unaffected. */
  rejected: Rejection[];
  /**
   * Single claims left out (see claims.ts); the node keeps its other claims. Always set by
   * `desiredMesh` (optional only so hand-made states in tests need not list it).
   */
  refused?: RefusedClaim[];
  /** Nodes that publish no roamguard key yet (agent not started there): no peer, no warning. */
  waiting: string[];
  /** Every node's pod CIDRs, this node's included (firewall sets), canonical order. */
  clusterPodCidrs: string[];
  /** Remote pod CIDRs routed into the tunnel (families without native routing). */
  tunnelRoutes: string[];
  /** This node's public address when others see it behind NAT. */
  selfNatPublicAddress?: string;
  /** Where others see this node behind NAT (`ip:port`). */
  selfNatEndpoint?: string;
}

export interface SelfView {
  nodeName: string;
  /** This node's public key (base64). */
  publicKey: string;
  podCidrs: readonly string[];
  /** This node's own addresses: never put into a peer's AllowedIPs. */
  addresses: readonly string[];
}

export interface MeshOptions {
  wgIpFamily: IpFamilyChoice;
  nativeRouting: PerFamily<boolean>;
  /** Used when a node does not publish its port. */
  defaultListenPort: number;
  persistentKeepalive: number;
  /** `POD_CIDR_ALLOWED_RANGES`: where pod CIDRs of a family without `spec.podCIDRs` may lie. */
  podCidrAllowedRanges?: readonly string[];
  /**
   * Peers (base64 keys) this node has a working session with at one of the peer's own addresses:
   * what others observe cannot move them (see `observedMayOverride`).
   */
  workingAtOwnAddress?: ReadonlySet<string>;
}

/** IPv4 before IPv6, then by address bytes, then by prefix length. */
export function compareAddressText(a: string, b: string): number {
  const pa = parsedText(a), pb = parsedText(b);
  return comparePrefixes(pa, pb);
}

function comparePrefixes(a: Prefix, b: Prefix): number {
  if (a.address.length !== b.address.length) return a.address.length - b.address.length;
  for (let i = 0; i < a.address.length; i++) if (a.address[i] !== b.address[i]) return a.address[i] - b.address[i];
  return a.bits - b.bits;
}

/** Addresses and prefixes parsed before (shared: never modify them). */
const parsedText = parsedPrefix;

/** Short lists sorted before (a node's addresses and allowed IPs, the same every pass), by their joined text. */
const sortedShortLists = new TextCache((joined: string): readonly string[] => sortTexts(joined.split('\n')));
const SHORT_LIST = 16;

/** Canonical order, duplicates dropped. Do not modify the result: short lists are shared between calls. */
export function sortAddresses(list: Iterable<string>): string[] {
  const texts = Array.isArray(list) ? list as string[] : [...list];
  if (texts.length === 0) return [];
  if (texts.length > SHORT_LIST) return sortTexts(texts);
  return sortedShortLists.get(texts.join('\n')) as string[];
}

function sortTexts(list: readonly string[]): string[] {
  // Each text parsed once (not once per comparison, and not again next pass): the cluster's pod
  // CIDRs are 10 000 texts at 5 000 Nodes.
  return [...new Set(list)]
    .map((text) => ({ text, prefix: parsedText(text) }))
    .sort((a, b) => comparePrefixes(a.prefix, b.prefix))
    .map((e) => e.text);
}

function familyOfText(text: string): 4 | 6 {
  return text.includes(':') ? 6 : 4;
}

/** InternalIP and ExternalIP entries of the Node plus its `node-ips` annotation, canonical order. */
export function nodeAddresses(node: NodeObject, annotatedIps: readonly string[]): string[] {
  return sortAddresses([...annotatedIps, ...statusAddresses(node)]);
}

/** The first address of the chosen family (dualstack: IPv4 first, else IPv6). */
export function selectEndpointHost(addresses: readonly string[], family: IpFamilyChoice): string | undefined {
  const sorted = sortAddresses(addresses);
  const v4 = sorted.find((a) => familyOfText(a) === 4);
  const v6 = sorted.find((a) => familyOfText(a) === 6);
  if (family === 'ipv4') return v4;
  if (family === 'ipv6') return v6;
  return v4 ?? v6;
}

function creationOrder(node: NodeObject): number {
  const t = node.metadata?.creationTimestamp;
  const ms = t === undefined ? NaN : new Date(t).getTime();
  return Number.isFinite(ms) ? ms : Number.MAX_SAFE_INTEGER;
}

/** A Node's `spec.podCIDRs` (or `spec.podCIDR`), parsed; what is not a prefix is skipped. */
export function specPodCidrs(node: NodeObject): Prefix[] {
  const texts = node.spec?.podCIDRs ?? (node.spec?.podCIDR ? [node.spec.podCIDR] : []);
  const out: Prefix[] = [];
  for (const text of Array.isArray(texts) ? texts : []) {
    try {
      if (typeof text === 'string') out.push(parsedText(text));
    } catch { /* not a prefix: the controller manager never writes that */ }
  }
  return out;
}

/** The InternalIP and ExternalIP entries of a Node's status that parse as addresses. */
function statusAddresses(node: NodeObject): string[] {
  const out: string[] = [];
  for (const entry of node.status?.addresses ?? []) {
    if (entry?.type !== 'InternalIP' && entry?.type !== 'ExternalIP') continue;
    if (typeof entry.address !== 'string') continue;
    try {
      out.push(canonicalIp(entry.address, 'status.addresses'));
    } catch { /* kubelet wrote something odd: not an address we can use */ }
  }
  return out;
}

/** What desiredMesh reads from one Node object, parsed. Shared between passes: never modified. */
export interface NodeFacts {
  resourceVersion: string;
  /** creationTimestamp in ms (claims are resolved oldest first). */
  created: number;
  annotations: AnnotationResult;
  statusAddresses: string[];
  specPodCidrs: Prefix[];
  discovered: Map<string, string>;
}

/**
 * Parsed facts per Node object, reused while the object (the informer's cached one) and its
 * resourceVersion stay the same: a pass over 5 000 Nodes then parses only the Nodes that changed.
 * Objects without a resourceVersion (made by hand) are parsed every time.
 */
const factsCache = new WeakMap<object, NodeFacts>();

export function nodeFacts(node: NodeObject): NodeFacts {
  const resourceVersion = node.metadata?.resourceVersion;
  const cached = resourceVersion ? factsCache.get(node) : undefined;
  if (cached && cached.resourceVersion === resourceVersion) return cached;
  const facts: NodeFacts = {
    resourceVersion: resourceVersion ?? '',
    created: creationOrder(node),
    annotations: parseNodeAnnotations(node),
    statusAddresses: statusAddresses(node),
    specPodCidrs: specPodCidrs(node),
    discovered: parseDiscoveredEndpoints(node),
  };
  if (resourceVersion) factsCache.set(node, facts);
  return facts;
}

/**
 * Every prefix a Node's object names, whether or not the claim is accepted: its annotated pod
 * CIDRs and node IPs (when its annotations parse), its spec.podCIDRs and its status addresses
 * (addresses as /32 and /128). Two Nodes whose prefixes never overlap cannot change each other's
 * claims (MeshTracker).
 */
export function namedPrefixes(facts: NodeFacts): Prefix[] {
  const host = (text: string): Prefix => {
    const address = parsedAddress(text);
    return { address, bits: address.length * 8 };
  };
  const out: Prefix[] = [...facts.specPodCidrs, ...facts.statusAddresses.map(host)];
  if (facts.annotations.ok) {
    for (const claim of facts.annotations.value.podCidrs) out.push(parsedText(claim));
    for (const ip of facts.annotations.value.nodeIps) out.push(host(ip));
  }
  return out;
}

/** Computes the desired mesh from every Node. Never throws on what Nodes contain. */
export function desiredMesh(nodes: readonly NodeObject[], self: SelfView, options: MeshOptions): MeshState {
  return meshDecisions(nodes, self, options).state;
}

/** A node whose key and annotations were accepted, with the claims it holds. */
export interface AcceptedNode {
  name: string;
  publicKey: string;
  publicKeyBytes: Uint8Array;
  /** Accepted pod CIDR claims, in the order claimed. */
  podCidrs: string[];
  /** Accepted addresses, canonical order. */
  addresses: string[];
  published?: string;
  forced?: string;
  discovered: Map<string, string>;
}

/**
 * What other nodes report, for a pass over only some of the cluster's nodes (MeshTracker): the
 * observations of each key by every accepted node, and where others see this node.
 */
export interface ClusterObservations {
  observationsOf(key: string): ReadonlyArray<{ observer: string; endpoint: string }>;
  selfNat: NatObservation | undefined;
}

/**
 * desiredMesh, also returning the accepted nodes. With `observed`, NAT views come from there
 * instead of from `nodes`: MeshTracker decides a node that shares nothing with any other node by
 * passing only that node (and this node's own object) plus what the whole cluster observes.
 */
export function meshDecisions(nodes: readonly NodeObject[], self: SelfView, options: MeshOptions, observed?: ClusterObservations): { state: MeshState; accepted: AcceptedNode[] } {
  const rejected: Rejection[] = [];
  const refused: RefusedClaim[] = [];
  const waiting: string[] = [];
  const ordered = nodes
    .filter((n) => typeof n.metadata?.name === 'string' && n.metadata.name !== self.nodeName)
    .map((node) => ({ node, created: nodeFacts(node).created }))
    .sort((a, b) => a.created - b.created || (a.node.metadata!.name! < b.node.metadata!.name! ? -1 : 1))
    .map((entry) => entry.node);
  const allowed = parseAllowedRanges(options.podCidrAllowedRanges ?? []);

  const keyOwner = new Map<string, string>([[self.publicKey, self.nodeName]]);
  // Claims and addresses are looked up through prefix indexes (same first match as a scan in
  // this order), so a pass is not quadratic in the number of Nodes.
  const cidrClaims: Array<{ prefix: Prefix; node: string }> = self.podCidrs.map((c) => ({ prefix: parsePrefix(c), node: self.nodeName }));
  const heldClaims = new PrefixIndex<{ prefix: Prefix; node: string }>();
  for (const c of cidrClaims) heldClaims.add(c.prefix, c);
  const ownAddresses = new Set(self.addresses.map((a) => canonicalIp(a, 'own address')));
  // Addresses the kubelet reports (and ours): no pod CIDR claim may cover one.
  const knownAddresses = new PrefixIndex<{ address: Uint8Array; node: string }>();
  for (const entry of [
    ...[...ownAddresses].map((a) => ({ address: parsedAddress(a), node: self.nodeName })),
    ...ordered.flatMap((n) => nodeFacts(n).statusAddresses.map((a) => ({ address: parsedAddress(a), node: n.metadata!.name! }))),
  ]) knownAddresses.add({ address: entry.address, bits: entry.address.length * 8 }, entry);

  interface Candidate {
    node: NodeObject; name: string; publicKey: string; publicKeyBytes: Uint8Array; podCidrs: string[]; nodeIps: string[];
    listenPort?: number; forced?: string;
  }
  const candidates: Candidate[] = [];
  for (const node of ordered) {
    const name = node.metadata!.name!;
    const parsed = nodeFacts(node).annotations;
    if (!parsed.ok) {
      if (parsed.missing) waiting.push(name);
      else rejected.push({ node: name, reason: parsed.reason });
      continue;
    }
    const a = parsed.value;
    const owner = keyOwner.get(a.publicKey);
    if (owner !== undefined) {
      rejected.push({ node: name, reason: owner === self.nodeName
        ? `${ANNOTATION.publicKey} is this node's own public key`
        : `${ANNOTATION.publicKey} is already used by node ${owner}` });
      continue;
    }
    keyOwner.set(a.publicKey, name);
    const spec = nodeFacts(node).specPodCidrs;
    const podCidrs: string[] = [];
    for (const claim of a.podCidrs) {
      const prefix = parsedText(claim);
      const reason = podCidrRefusal(prefix, { spec, allowed, nodeAddresses: knownAddresses, held: heldClaims });
      if (reason !== undefined) {
        refused.push({ node: name, field: ANNOTATION.podCidrs, claim, reason: `${claim} ${reason}` });
        continue;
      }
      cidrClaims.push({ prefix, node: name });
      heldClaims.add(prefix, { prefix, node: name });
      podCidrs.push(claim);
    }
    candidates.push({ node, name, publicKey: a.publicKey, publicKeyBytes: a.publicKeyBytes, podCidrs, nodeIps: a.nodeIps, listenPort: a.listenPort, forced: a.forceEndpoint });
  }

  // Node addresses become /32 and /128 allowed-IPs: none may take a pod's address.
  const everyPodCidr = new PrefixIndex<{ prefix: Prefix; node: string }>();
  for (const entry of [
    ...cidrClaims,
    ...nodes.flatMap((n) => nodeFacts(n).specPodCidrs.map((prefix) => ({ prefix, node: n.metadata?.name ?? '?' }))),
  ]) everyPodCidr.add(entry.prefix, entry);
  const checkAddresses = (name: string, field: string, list: readonly string[]): string[] => list.filter((ip) => {
    const reason = nodeIpRefusal(parsedAddress(ip), { podCidrs: everyPodCidr, allowed });
    if (reason !== undefined) refused.push({ node: name, field, claim: ip, reason: `${ip} ${reason}` });
    return reason === undefined;
  });

  const accepted: AcceptedNode[] = [];
  for (const c of candidates) {
    const status = nodeFacts(c.node).statusAddresses;
    const addresses = sortAddresses([
      ...checkAddresses(c.name, ANNOTATION.nodeIps, c.nodeIps),
      ...checkAddresses(c.name, 'status.addresses', status.filter((ip) => !c.nodeIps.includes(ip))),
    ]);
    let published: string | undefined;
    const host = selectEndpointHost(addresses, options.wgIpFamily);
    if (host !== undefined) published = new Endpoint(host, c.listenPort ?? options.defaultListenPort).toString();
    accepted.push({ name: c.name, publicKey: c.publicKey, publicKeyBytes: c.publicKeyBytes, podCidrs: c.podCidrs, addresses, published, forced: c.forced, discovered: nodeFacts(c.node).discovered });
  }

  const observations = observed?.observationsOf ?? observationIndex(accepted);
  const natView = (key: string, ownAddresses: readonly string[]) => natObservation(observations(key), ownAddresses, options.wgIpFamily);
  const selfNat = observed ? observed.selfNat : natView(self.publicKey, [...ownAddresses]);

  // Addresses published by more than one node identify none of them.
  const addressCount = new Map<string, number>();
  for (const node of accepted) for (const ip of node.addresses) addressCount.set(ip, (addressCount.get(ip) ?? 0) + 1);

  const routed = (cidr: string) => routedThroughTunnel(cidr, options.nativeRouting);
  const peers = new Map<string, DesiredPeer>();
  const tunnelRoutes: string[] = [];
  for (const node of accepted) {
    const podCidrs = node.podCidrs.filter(routed);
    tunnelRoutes.push(...podCidrs);
    const hostRoutes = node.addresses
      .filter((ip) => addressCount.get(ip) === 1 && !ownAddresses.has(ip))
      .map((ip) => `${ip}/${familyOfText(ip) === 4 ? 32 : 128}`);
    const nat = natView(node.publicKey, node.addresses);
    const mayOverride = observedMayOverride({ published: node.published, workingAtOwnAddress: options.workingAtOwnAddress?.has(node.publicKey) ?? false });
    const { endpoint, source } = chooseEndpoint({ forced: node.forced, published: node.published, nat: mayOverride ? nat : undefined, selfNat });
    peers.set(node.publicKey, {
      nodeName: node.name,
      publicKey: node.publicKey,
      publicKeyBytes: node.publicKeyBytes,
      endpoint,
      endpointSource: source,
      addresses: node.addresses,
      natPublicAddress: nat?.address,
      allowedIps: sortAddresses([...podCidrs, ...hostRoutes]),
      persistentKeepalive: options.persistentKeepalive,
    });
  }
  const state: MeshState = {
    peers,
    rejected,
    refused,
    waiting,
    clusterPodCidrs: sortAddresses([...self.podCidrs, ...accepted.flatMap((n) => n.podCidrs)]),
    tunnelRoutes: sortAddresses(tunnelRoutes),
    selfNatPublicAddress: selfNat?.address,
    selfNatEndpoint: selfNat?.endpoint,
  };
  return { state, accepted };
}

/** What every accepted node sees every other node at: key → observations (observer name, endpoint). */
function observationIndex(accepted: readonly AcceptedNode[]): (key: string) => ReadonlyArray<{ observer: string; endpoint: string }> {
  const observations = new Map<string, Array<{ observer: string; endpoint: string }>>();
  for (const observer of accepted) {
    for (const [key, endpoint] of observer.discovered) {
      if (key === observer.publicKey) continue; // nobody vouches for itself
      let list = observations.get(key);
      if (!list) observations.set(key, list = []);
      list.push({ observer: observer.name, endpoint });
    }
  }
  return (key) => observations.get(key) ?? [];
}

/** Whether a pod CIDR of a family is routed into the tunnel (the family has no native routing). */
export function routedThroughTunnel(cidr: string, nativeRouting: PerFamily<boolean>): boolean {
  return !(familyOfText(cidr) === 4 ? nativeRouting.ipv4 : nativeRouting.ipv6);
}

/** Equal lists, element by element (the same array, or both absent, count as equal). */
export function sameList(a: readonly string[] | undefined, b: readonly string[] | undefined): boolean {
  if (a === b) return true;
  if (a === undefined || b === undefined || a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/** Whether two desired peers say the same in every field. */
export function samePeer(a: DesiredPeer, b: DesiredPeer): boolean {
  return a.publicKey === b.publicKey && a.nodeName === b.nodeName && a.endpoint === b.endpoint
    && a.endpointSource === b.endpointSource && a.relayVia === b.relayVia && a.natPublicAddress === b.natPublicAddress
    && a.persistentKeepalive === b.persistentKeepalive && sameList(a.allowedIps, b.allowedIps) && sameList(a.addresses, b.addresses);
}

/**
 * `next` with every peer that says what it said in `previous` replaced by the previous object.
 * The plan skips a peer whose desired object and data-plane entry are both the ones it already
 * found in agreement (planReconcile), so at 5 000 peers a Node change plans the peers it touched.
 */
export function keepUnchangedPeers(next: Map<string, DesiredPeer>, previous: ReadonlyMap<string, DesiredPeer> | undefined): Map<string, DesiredPeer> {
  if (!previous) return next;
  for (const [key, peer] of next) {
    const before = previous.get(key);
    if (before !== undefined && before !== peer && samePeer(before, peer)) next.set(key, before);
  }
  return next;
}

/** A node seen behind NAT: its public address and the endpoint others see it at. */
export interface NatObservation { address: string; endpoint: string }

/**
 * From what other nodes see a node at, whether it is behind NAT: observations at one of its own
 * addresses say nothing (a LAN neighbour sees the LAN address); any other address is its NAT's.
 * Several observers may disagree (a symmetric NAT maps each destination differently): the
 * endpoint most of them see wins, ties broken by observer name, so every node picks the same.
 * Only mappings of the endpoint family count (`WG_IP_FAMILY`); with dualstack, IPv4 ones first,
 * IPv6 ones only when there are none. Without that, one observer that reaches the node over the
 * other family (a forced IPv6 endpoint of its own) can tip the vote, peers follow, their views
 * change, and the vote swings back: endpoints flapping between families.
 */
export function natObservation(observations: ReadonlyArray<{ observer: string; endpoint: string }>, ownAddresses: readonly string[], family: IpFamilyChoice = 'dualstack'): NatObservation | undefined {
  const own = new Set(ownAddresses);
  const isV4 = (endpoint: string) => Endpoint.parse(endpoint).family === 4;
  const usable = observations.filter(({ endpoint }) => (family === 'ipv4' ? isV4(endpoint) : family === 'ipv6' ? !isV4(endpoint) : true));
  const preferred = family === 'dualstack' && usable.some(({ endpoint }) => isV4(endpoint) && !own.has(Endpoint.parse(endpoint).host))
    ? usable.filter(({ endpoint }) => isV4(endpoint))
    : usable;
  const votes = new Map<string, { count: number; first: string }>();
  for (const { observer, endpoint } of preferred) {
    const host = Endpoint.parse(endpoint).host;
    if (own.has(host)) continue;
    const v = votes.get(endpoint);
    if (!v) votes.set(endpoint, { count: 1, first: observer });
    else {
      v.count++;
      if (observer < v.first) v.first = observer;
    }
  }
  let best: [string, { count: number; first: string }] | undefined;
  for (const entry of votes) {
    if (!best || entry[1].count > best[1].count || (entry[1].count === best[1].count && entry[1].first < best[1].first)) best = entry;
  }
  return best ? { address: Endpoint.parse(best[0]).host, endpoint: best[0] } : undefined;
}

/**
 * When what other nodes observe (`discovered-endpoints`) may replace the address a peer publishes.
 * Any node can write any observation, so an observation is only believed where the published
 * address cannot be the way in:
 *
 * - the peer publishes no address, or only a site-local one (RFC 1918, 100.64.0.0/10, fc00::/7),
 *   which nobody outside its site can reach; a peer publishing a globally routable address is
 *   reached there, whatever anyone reports; and
 * - this node has no working session with the peer at one of the peer's own addresses (a peer
 *   that answers us where it says it is stays there).
 *
 * Among believed observations the endpoint most observers report wins (`natObservation`), and a
 * node's observation of itself is never counted. A single lying node can therefore only point
 * others at a peer that they could not reach at its published address anyway, and WireGuard's
 * authentication still keeps the liar from reading or forging that traffic.
 */
export function observedMayOverride(input: { published?: string; workingAtOwnAddress: boolean }): boolean {
  if (input.workingAtOwnAddress) return false;
  if (input.published === undefined) return true;
  return isSiteLocalAddress(Endpoint.parse(input.published).host);
}

/**
 * The endpoint to reach a peer at: an operator's force-endpoint; else, for a peer behind NAT, its
 * LAN address when we sit behind the same public address (no hairpin needed) or the endpoint
 * others observe; else the address it publishes.
 */
export function chooseEndpoint(input: { forced?: string; published?: string; nat?: NatObservation; selfNat?: NatObservation }): { endpoint?: string; source?: EndpointSource } {
  if (input.forced !== undefined) return { endpoint: input.forced, source: 'forced' };
  if (input.nat) {
    if (input.selfNat && input.selfNat.address === input.nat.address && input.published !== undefined) return { endpoint: input.published, source: 'lan' };
    return { endpoint: input.nat.endpoint, source: 'discovered' };
  }
  return input.published === undefined ? {} : { endpoint: input.published, source: 'published' };
}
