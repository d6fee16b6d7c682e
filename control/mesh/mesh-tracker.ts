/**
 * The desired mesh kept from pass to pass, so that a Node change costs the agent work for that
 * Node, not for the cluster: at 5 000 Nodes a full `desiredMesh` takes 120-200 ms and allocates
 * 15-25 MB, on each of the 10 changes a second a large cluster sees.
 *
 * Why a change can be decided alone: `desiredMesh` resolves conflicts between Nodes (a public
 * key, a pod CIDR or an address that two Nodes name) and aggregates over Nodes (which addresses
 * several Nodes share, who sees whom behind NAT). A Node whose key and prefixes (claimed pod
 * CIDRs and node IPs, spec.podCIDRs, status addresses; see `namedPrefixes`) overlap those of no
 * other Node takes part in no conflict, before its change and after: its decision is what
 * `desiredMesh` makes of it with only this node's own object beside it, given what the cluster
 * observes of its key (kept here, `ClusterObservations`), and no other Node's decision depends on
 * it but through those observations. So for each changed Node (added, modified, deleted):
 *
 * 1. its old and new facts must share no key and no prefix with any other Node (`PrefixOwners`,
 *    key counts; both kept up to date on every pass from the Nodes' facts alone);
 * 2. it is decided alone (`meshDecisions` over this node's object and it);
 * 3. the observations it makes are updated, and every accepted Node whose key it observes
 *    differently (or whose session at its own address came or went: `workingAtOwnAddress`) is
 *    decided again alone, under the same condition as in 1.
 *
 * Anything else is a full pass: the first pass, a change of this node's view or of the options,
 * this node's own Node object changing, a change to what anyone observes of this node, a Node
 * that shares a key or a prefix with another, more changes at once than `fullPassAbove`, or a
 * caller's resync (`full`). A cluster of disjoint Nodes, the normal case, takes the fast path;
 * nodes behind one NAT that publish the same public address as a node IP, or a conflict, make
 * passes touching them full ones, as before. The model test (mesh-tracker.test.ts) checks that the
 * result always equals `desiredMesh` over random clusters full of such conflicts.
 */
import type { Prefix } from '../../dataplane/net/ip.ts';
import type { NodeObject } from './annotations.ts';
import {
  compareAddressText, keepUnchangedPeers, meshDecisions, sameList, namedPrefixes, nodeFacts, routedThroughTunnel,
  type AcceptedNode, type ClusterObservations, type DesiredPeer, type MeshOptions, type MeshState, type NodeFacts, type SelfView,
} from './desired-peers.ts';
import { PrefixOwners } from './prefix-owners.ts';

interface KnownNode {
  object: NodeObject;
  /** Position in the list the caller passed (the relative order of this node's object and it matters for messages). */
  position: number;
}

/** What the last pass decided, for the next one to start from. */
interface Decided {
  self: SelfView;
  options: MeshOptions;
  nodes: Map<string, KnownNode>;
  selfNode: NodeObject | undefined;
  selfPosition: number;
  /** Accepted nodes by name, and their names by public key. */
  accepted: Map<string, AcceptedNode>;
  nameOfKey: Map<string, string>;
  /** Observed key → observer name → endpoint, from accepted observers (never of themselves). */
  observations: Map<string, Map<string, string>>;
  state: MeshState;
}

export interface TrackedPass {
  state: MeshState;
  /** False when the pass decided every Node (the first, a resync, or a change that needed it). */
  incremental: boolean;
  /** Nodes decided in this pass (all of them in a full pass). */
  decided: number;
}

export class MeshTracker {
  /** Every named Node's facts as last indexed (not this node's own). */
  private readonly indexed = new Map<string, NodeFacts>();
  private readonly owners = new PrefixOwners();
  /** Public key → how many Nodes (accepted or not) publish it. */
  private readonly keyCount = new Map<string, number>();
  private last: Decided | undefined;

  /** @param fullPassAbove more changed Nodes than this in one pass make it a full pass (default: an eighth of the cluster, at least 64). */
  constructor(private readonly fullPassAbove?: number) {}

  /**
   * The desired mesh for `nodes`, equal to `desiredMesh(nodes, self, options)`. Unchanged peers
   * keep their objects. `options.workingAtOwnAddress` is compared by identity first: pass a new
   * set when it changes, never a modified one.
   */
  update(nodes: readonly NodeObject[], self: SelfView, options: MeshOptions, full = false): TrackedPass {
    const current = new Map<string, KnownNode>();
    let selfNode: NodeObject | undefined;
    let selfPosition = -1;
    let orderly = true;
    for (let i = 0; i < nodes.length; i++) {
      const name = nodes[i].metadata?.name;
      if (typeof name !== 'string') { orderly = false; continue; }
      if (name === self.nodeName) { selfNode = nodes[i]; selfPosition = i; continue; }
      if (current.has(name)) orderly = false;
      current.set(name, { object: nodes[i], position: i });
    }
    const changed = this.reindex(current);
    const last = this.last;
    const limit = this.fullPassAbove ?? Math.max(64, current.size >> 3);
    const fast = !full && orderly && last !== undefined && changed.length <= limit
      && last.selfNode === selfNode && sameSelf(last.self, self) && sameOptions(last.options, options)
      && this.incremental(last, changed, current, selfPosition, self, options);
    if (!fast) this.full(nodes, current, selfNode, selfPosition, self, options);
    return { state: this.last!.state, incremental: fast, decided: fast ? changed.length : current.size };
  }

  // --- the facts index (every pass) --------------------------------------------------------------

  /** Brings the key counts and prefix owners up to date; returns the changed names with their old facts. */
  private reindex(current: Map<string, KnownNode>): Array<{ name: string; before?: NodeFacts }> {
    const changed: Array<{ name: string; before?: NodeFacts }> = [];
    const previous = this.last?.nodes;
    for (const [name, known] of current) {
      const before = previous?.get(name);
      if (before && sameObject(before.object, known.object)) continue;
      changed.push({ name, before: this.indexed.get(name) });
    }
    for (const name of this.indexed.keys()) if (!current.has(name)) changed.push({ name, before: this.indexed.get(name) });
    return changed;
  }

  private unindex(name: string, facts: NodeFacts): void {
    for (const prefix of namedPrefixes(facts)) this.owners.remove(prefix, name);
    if (facts.annotations.ok) count(this.keyCount, facts.annotations.value.publicKey, -1);
    this.indexed.delete(name);
  }

  private index(name: string, facts: NodeFacts): void {
    for (const prefix of namedPrefixes(facts)) this.owners.add(prefix, name);
    if (facts.annotations.ok) count(this.keyCount, facts.annotations.value.publicKey, +1);
    this.indexed.set(name, facts);
  }

  /** True when nothing of `facts` (key, prefixes) is named by any Node but `name`. */
  private alone(name: string, facts: NodeFacts): boolean {
    if (facts.annotations.ok && (this.keyCount.get(facts.annotations.value.publicKey) ?? 0) > 1) return false;
    return namedPrefixes(facts).every((prefix: Prefix) => !this.owners.overlapsOtherThan(prefix, name));
  }

  // --- the two kinds of pass ---------------------------------------------------------------------

  private full(nodes: readonly NodeObject[], current: Map<string, KnownNode>, selfNode: NodeObject | undefined, selfPosition: number, self: SelfView, options: MeshOptions): void {
    for (const [name, facts] of [...this.indexed]) if (!current.has(name) || nodeFacts(current.get(name)!.object) !== facts) this.unindex(name, facts);
    for (const [name, known] of current) if (!this.indexed.has(name)) this.index(name, nodeFacts(known.object));
    const { state, accepted } = meshDecisions(nodes, self, options);
    const decided: Decided = {
      self, options, nodes: current, selfNode, selfPosition, accepted: new Map(), nameOfKey: new Map(), observations: new Map(), state,
    };
    for (const node of accepted) admit(decided, node);
    keepUnchangedPeers(state.peers, this.last?.state.peers);
    this.last = decided;
  }

  /**
   * Decides only the changed Nodes (and the Nodes whose observations they change), when each of
   * them is alone (see the header). False when the pass must be a full one; `last` may then be
   * half updated, which the full pass replaces.
   */
  private incremental(last: Decided, changed: Array<{ name: string; before?: NodeFacts }>, current: Map<string, KnownNode>, selfPosition: number, self: SelfView, options: MeshOptions): boolean {
    // 1. Before and after its change, each changed Node shares nothing with any other Node.
    for (const c of changed) if (c.before && !this.alone(c.name, c.before)) return false;
    for (const c of changed) if (c.before) this.unindex(c.name, c.before);
    for (const c of changed) {
      const known = current.get(c.name);
      if (known) this.index(c.name, nodeFacts(known.object));
    }
    for (const c of changed) if (current.has(c.name) && !this.alone(c.name, this.indexed.get(c.name)!)) return false;

    const next: Decided = {
      ...last, options, nodes: current, selfPosition,
      state: {
        ...last.state,
        peers: new Map(last.state.peers),
        rejected: last.state.rejected, refused: last.state.refused, waiting: last.state.waiting,
      },
    };
    const names = new Set(changed.map((c) => c.name));
    /** Observed key → observer → endpoint, for what the changed Nodes observed before and observe now. */
    const observedBefore = new Map<string, Map<string, string>>();
    const observedNow = new Map<string, Map<string, string>>();
    let clusterPodCidrs = [...next.state.clusterPodCidrs];
    let tunnelRoutes = [...next.state.tunnelRoutes];

    // 2. Take the changed Nodes' old decisions out, then decide each of them alone.
    for (const name of names) {
      const before = next.accepted.get(name);
      if (!before) continue;
      dismiss(next, before);
      note(observedBefore, before);
      clusterPodCidrs = withoutSorted(clusterPodCidrs, before.podCidrs);
      tunnelRoutes = withoutSorted(tunnelRoutes, before.podCidrs.filter((c) => routedThroughTunnel(c, options.nativeRouting)));
    }
    next.state.rejected = next.state.rejected.filter((r) => !names.has(r.node));
    next.state.refused = (next.state.refused ?? []).filter((r) => !names.has(r.node));
    next.state.waiting = next.state.waiting.filter((w) => !names.has(w));
    for (const name of names) {
      const known = current.get(name);
      if (!known) continue;
      const alone = decideAlone(next, known, self, options);
      next.state.rejected.push(...alone.state.rejected);
      next.state.refused!.push(...(alone.state.refused ?? []));
      next.state.waiting.push(...alone.state.waiting);
      const node = alone.accepted[0];
      if (!node) continue;
      admit(next, node);
      note(observedNow, node);
      clusterPodCidrs = withSorted(clusterPodCidrs, node.podCidrs);
      tunnelRoutes = withSorted(tunnelRoutes, node.podCidrs.filter((c) => routedThroughTunnel(c, options.nativeRouting)));
      next.state.peers.set(node.publicKey, alone.state.peers.get(node.publicKey)!);
    }
    next.state.clusterPodCidrs = clusterPodCidrs;
    next.state.tunnelRoutes = tunnelRoutes;

    // 3. Nodes whose view changed are decided again. What is seen of this node decides every
    // endpoint (selfNat): that needs a full pass.
    const observedAgain = new Set<string>();
    for (const key of new Set([...observedBefore.keys(), ...observedNow.keys()])) {
      if (!sameEntries(observedBefore.get(key), observedNow.get(key))) observedAgain.add(key);
    }
    if (observedAgain.has(self.publicKey)) return false;
    for (const key of changedKeys(last.options.workingAtOwnAddress, options.workingAtOwnAddress)) observedAgain.add(key);
    for (const key of observedAgain) {
      const name = next.nameOfKey.get(key);
      if (name === undefined) continue;
      const known = current.get(name)!;
      if (!names.has(name) && !this.alone(name, this.indexed.get(name)!)) return false;
      const peer = decideAlone(next, known, self, options).state.peers.get(key);
      if (peer) next.state.peers.set(key, peer);
    }
    keepUnchangedPeers(next.state.peers, last.state.peers);
    this.last = next;
    return true;
  }
}

/** desiredMesh over one Node (beside this node's own object, in the caller's order) with the cluster's observations. */
function decideAlone(d: Decided, known: KnownNode, self: SelfView, options: MeshOptions): { state: MeshState; accepted: AcceptedNode[] } {
  const nodes = d.selfNode === undefined ? [known.object] : d.selfPosition < known.position ? [d.selfNode, known.object] : [known.object, d.selfNode];
  const observed: ClusterObservations = {
    observationsOf: (key) => [...(d.observations.get(key) ?? [])].map(([observer, endpoint]) => ({ observer, endpoint })),
    selfNat: d.state.selfNatPublicAddress === undefined ? undefined : { address: d.state.selfNatPublicAddress, endpoint: d.state.selfNatEndpoint! },
  };
  return meshDecisions(nodes, self, options, observed);
}

/** Records an accepted node's decision and what it observes. */
function admit(d: Decided, node: AcceptedNode): void {
  d.accepted.set(node.name, node);
  d.nameOfKey.set(node.publicKey, node.name);
  note(d.observations, node);
}

/** Takes an accepted node's decision, its peer and what it observes out. */
function dismiss(d: Decided, node: AcceptedNode): void {
  d.accepted.delete(node.name);
  if (d.nameOfKey.get(node.publicKey) === node.name) d.nameOfKey.delete(node.publicKey);
  d.state.peers.delete(node.publicKey);
  for (const key of node.discovered.keys()) {
    const seen = d.observations.get(key);
    if (seen?.delete(node.name) && seen.size === 0) d.observations.delete(key);
  }
}

/** Adds what an accepted node observes (not of itself) to `into`: key → observer → endpoint. */
function note(into: Map<string, Map<string, string>>, node: AcceptedNode): void {
  for (const [key, endpoint] of node.discovered) {
    if (key === node.publicKey) continue; // nobody vouches for itself
    let seen = into.get(key);
    if (!seen) into.set(key, seen = new Map());
    seen.set(node.name, endpoint);
  }
}

function sameEntries(a: ReadonlyMap<string, string> | undefined, b: ReadonlyMap<string, string> | undefined): boolean {
  if ((a?.size ?? 0) !== (b?.size ?? 0)) return false;
  for (const [k, v] of a ?? []) if (b!.get(k) !== v) return false;
  return true;
}

/** Keys in one set and not the other. */
function changedKeys(a: ReadonlySet<string> | undefined, b: ReadonlySet<string> | undefined): string[] {
  if (a === b) return [];
  const out: string[] = [];
  for (const k of a ?? []) if (!b?.has(k)) out.push(k);
  for (const k of b ?? []) if (!a?.has(k)) out.push(k);
  return out;
}

function count(counts: Map<string, number>, key: string, delta: number): void {
  const n = (counts.get(key) ?? 0) + delta;
  if (n > 0) counts.set(key, n);
  else counts.delete(key);
}

/** The same Node object, or a copy of it with the same resourceVersion (an informer's relist). */
function sameObject(a: NodeObject, b: NodeObject): boolean {
  if (a === b) return true;
  const version = a.metadata?.resourceVersion;
  return version !== undefined && version !== '' && version === b.metadata?.resourceVersion;
}

function sameSelf(a: SelfView, b: SelfView): boolean {
  return a.nodeName === b.nodeName && a.publicKey === b.publicKey && sameList(a.podCidrs, b.podCidrs) && sameList(a.addresses, b.addresses);
}

function sameOptions(a: MeshOptions, b: MeshOptions): boolean {
  return a.wgIpFamily === b.wgIpFamily && a.nativeRouting.ipv4 === b.nativeRouting.ipv4 && a.nativeRouting.ipv6 === b.nativeRouting.ipv6
    && a.defaultListenPort === b.defaultListenPort && a.persistentKeepalive === b.persistentKeepalive
    && sameList(a.podCidrAllowedRanges, b.podCidrAllowedRanges);
}

/** Where `text` is in a canonically sorted list of canonical texts, or where it would go. */
function search(list: readonly string[], text: string): { found: boolean; at: number } {
  let lo = 0, hi = list.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (compareAddressText(list[mid], text) < 0) lo = mid + 1;
    else hi = mid;
  }
  return { found: list[lo] === text, at: lo };
}

/** A canonically sorted list with `texts` added (each once). */
function withSorted(list: string[], texts: readonly string[]): string[] {
  for (const text of texts) {
    const { found, at } = search(list, text);
    if (!found) list.splice(at, 0, text);
  }
  return list;
}

/** A canonically sorted list with `texts` taken out. */
function withoutSorted(list: string[], texts: readonly string[]): string[] {
  for (const text of texts) {
    const { found, at } = search(list, text);
    if (found) list.splice(at, 1);
  }
  return list;
}
