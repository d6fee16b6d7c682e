/**
 * The simulated cluster of the agent-scale run: N Node objects as kubelets, the node IPAM
 * controller and roamguard agents would leave them, kept in a model of its own so that what the
 * one real agent's data plane must show is worked out here, independently of control/mesh/.
 *
 * Simulated node i:
 *   pod CIDRs      10.(128 + i / 256).(i % 256).0/24 and fd00:245:0:i::/64 (spec and annotation)
 *   addresses      InternalIP 172.(16 + i / 65536).x.y and fd78::(i + 1) (site-local, as in a VPC)
 *   annotations    public-key (a real X25519 key), listen-port, pod-cidrs, node-ips
 *   behind NAT     every `natEvery`-th node: three other simulated nodes publish, in their
 *                  discovered-endpoints, the same public mapping 198.18.x.y:port for it, which
 *                  then wins over its (site-local) published address
 *
 * Churn changes the model and the API server together: a node added, a node deleted, a node's
 * listen-port changed, a node's key rotated, or a NAT mapping that moved (its observers
 * re-publish it). Each change says what the data plane must show afterwards.
 */
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import { formatPrefix, parsePrefix } from '../../dataplane/net/ip.ts';
import { generatePrivateKey, keyToBase64 } from '../../dataplane/noise/keys.ts';
import type { KubeApiServer, NodeInput } from '../../lab/kube-api-server.ts';

/** The annotations (as control/mesh/annotations.ts names them; spelled out so the model stays independent). */
const A = {
  publicKey: 'roamguard.io/public-key',
  listenPort: 'roamguard.io/listen-port',
  podCidrs: 'roamguard.io/pod-cidrs',
  nodeIps: 'roamguard.io/node-ips',
  discovered: 'roamguard.io/discovered-endpoints',
} as const;

/** Observers that report each NAT'd node's mapping. */
export const NAT_OBSERVERS = 3;
/** Most simulated nodes (the address plan's bound). */
export const MAX_SIMULATED_NODES = 32_768;

export interface SimNode {
  index: number;
  name: string;
  publicKey: string;
  listenPort: number;
  podCidrs: string[];
  addresses: { v4: string; v6: string };
  /** For a NAT'd node: the public mapping its observers report. */
  natEndpoint?: string;
  /** Names of the nodes reporting this one's mapping. */
  observers: string[];
}

/** What the data plane must hold for one peer. */
export interface ExpectedPeer {
  node: string;
  /** Canonical, sorted. */
  allowedIps: string[];
  endpoint: string;
}

/** One peer as the data plane reports it (canonical text). */
export interface SeenPeer {
  allowedIps: string[];
  endpoint?: string;
}

export type ChangeKind = 'add' | 'delete' | 'port' | 'rotate' | 'remap';
export const CHANGE_KINDS: readonly ChangeKind[] = ['add', 'delete', 'port', 'rotate', 'remap'];

/** A change made to the cluster, and how to tell that the data plane has it. */
export interface Change {
  kind: ChangeKind;
  node: string;
  /** performance.now() when the API server had committed it. */
  at: number;
  /** The public key the change removes from the data plane (a deleted Node's). */
  removedKey?: string;
  /** True once `peers` reflects the change. */
  landed(peers: ReadonlyMap<string, SeenPeer>): boolean;
}

const canonical = (text: string) => formatPrefix(parsePrefix(text));
const sameList = (a: readonly string[], b: readonly string[]) => a.length === b.length && a.every((x, i) => x === b[i]);

export function simulatedPodCidrs(i: number): string[] {
  return [canonical(`10.${128 + (i >> 8)}.${i & 255}.0/24`), canonical(`fd00:245:0:${i.toString(16)}::/64`)];
}

export function simulatedAddresses(i: number): { v4: string; v6: string } {
  return { v4: `172.${16 + (i >> 16)}.${(i >> 8) & 255}.${i & 255}`, v6: formatPrefix(parsePrefix(`fd78::${(i + 1).toString(16)}/128`)).split('/')[0] };
}

function natEndpointFor(i: number, generation: number): string {
  return `198.18.${(i >> 8) & 255}.${i & 255}:${30000 + ((i * 7 + generation * 1009) % 20000)}`;
}

export class SimulatedCluster {
  readonly nodes = new Map<string, SimNode>();
  private nextIndex = 0;
  private remaps = 0;

  private constructor(private readonly api: KubeApiServer, private readonly crypto: Awaited<ReturnType<typeof selectCrypto>>, private readonly natEvery: number) {}

  static async create(api: KubeApiServer, options: { natEvery: number }): Promise<SimulatedCluster> {
    return new SimulatedCluster(api, await selectCrypto(), options.natEvery);
  }

  private newKey(): string {
    const key = generatePrivateKey(this.crypto);
    const pub = keyToBase64(this.crypto.publicKey(key));
    key.fill(0);
    return pub;
  }

  private newNode(nat: boolean): SimNode {
    const index = this.nextIndex++;
    if (index >= MAX_SIMULATED_NODES) throw new Error(`the address plan has room for ${MAX_SIMULATED_NODES} simulated nodes`);
    return {
      index, name: `sim-${String(index).padStart(5, '0')}`, publicKey: this.newKey(), listenPort: 51820,
      podCidrs: simulatedPodCidrs(index), addresses: simulatedAddresses(index), observers: [],
      natEndpoint: nat ? natEndpointFor(index, 0) : undefined,
    };
  }

  /** The Node object of `node` as the API server stores it. */
  private nodeObject(node: SimNode): NodeInput {
    const observed: Record<string, string> = {};
    for (const other of this.nodes.values()) {
      if (other.natEndpoint && other.observers.includes(node.name)) observed[other.publicKey] = other.natEndpoint;
    }
    const annotations: Record<string, string> = {
      [A.publicKey]: node.publicKey,
      [A.listenPort]: String(node.listenPort),
      [A.podCidrs]: JSON.stringify(node.podCidrs),
      [A.nodeIps]: '[]',
    };
    if (Object.keys(observed).length > 0) annotations[A.discovered] = JSON.stringify(Object.fromEntries(Object.entries(observed).sort()));
    return {
      metadata: {
        name: node.name,
        labels: { 'kubernetes.io/hostname': node.name, 'kubernetes.io/os': 'linux', 'node.kubernetes.io/instance-type': 'sim.large' },
        annotations,
      },
      spec: { podCIDR: node.podCidrs[0], podCIDRs: node.podCidrs, providerID: `sim://${node.name}` },
      status: {
        addresses: [
          { type: 'InternalIP', address: node.addresses.v4 },
          { type: 'InternalIP', address: node.addresses.v6 },
          { type: 'Hostname', address: node.name },
        ],
        conditions: [{ type: 'Ready', status: 'True', reason: 'KubeletReady', message: 'kubelet is posting ready status' }],
        nodeInfo: { kubeletVersion: 'v1.34.0', containerRuntimeVersion: 'containerd://2.1.0', operatingSystem: 'linux', architecture: 'amd64' },
      },
    };
  }

  /** Fills the cluster with `count` nodes (before the agent starts); every `natEvery`-th is behind NAT. */
  populate(count: number): void {
    const fresh: SimNode[] = [];
    for (let k = 0; k < count; k++) {
      const node = this.newNode(this.natEvery > 0 && k % this.natEvery === this.natEvery - 1);
      this.nodes.set(node.name, node);
      fresh.push(node);
    }
    // Observers: the next NAT_OBSERVERS nodes that are not behind NAT themselves.
    const plain = fresh.filter((n) => !n.natEndpoint);
    for (const node of fresh) {
      if (!node.natEndpoint || plain.length === 0) continue;
      const start = plain.findIndex((p) => p.index > node.index);
      for (let j = 0; j < Math.min(NAT_OBSERVERS, plain.length); j++) node.observers.push(plain[(Math.max(start, 0) + j) % plain.length].name);
    }
    for (const node of fresh) this.api.createNode(this.nodeObject(node));
  }

  /** What the data plane of the real node must hold: base64 key → peer. */
  expectedPeers(): Map<string, ExpectedPeer> {
    const out = new Map<string, ExpectedPeer>();
    for (const node of this.nodes.values()) out.set(node.publicKey, this.expected(node));
    return out;
  }

  private expected(node: SimNode): ExpectedPeer {
    const observed = node.natEndpoint !== undefined && node.observers.some((o) => this.nodes.has(o));
    return {
      node: node.name,
      allowedIps: [...node.podCidrs, `${node.addresses.v4}/32`, `${node.addresses.v6}/128`].map(canonical).sort(compareCanonical),
      endpoint: observed ? node.natEndpoint! : `${node.addresses.v4}:${node.listenPort}`,
    };
  }

  private matches(node: SimNode, seen: SeenPeer | undefined): boolean {
    if (!seen) return false;
    const want = this.expected(node);
    return seen.endpoint === want.endpoint && sameList(seen.allowedIps, want.allowedIps);
  }

  /**
   * Nodes a change may pick: not changed yet in this run (so each change is judged alone), and
   * neither an observer of a NAT'd node nor observed (so it moves exactly one peer).
   */
  private pickable(touched: ReadonlySet<string>, want: 'plain' | 'nat', random: () => number): SimNode | undefined {
    const observers = new Set<string>();
    for (const n of this.nodes.values()) for (const o of n.observers) observers.add(o);
    const candidates = [...this.nodes.values()].filter((n) => !touched.has(n.name) && !observers.has(n.name)
      && (want === 'nat' ? n.natEndpoint !== undefined && n.observers.every((o) => this.nodes.has(o) && !touched.has(o)) : n.natEndpoint === undefined));
    return candidates.length === 0 ? undefined : candidates[Math.floor(random() * candidates.length)];
  }

  /**
   * Makes one change of `kind` in the API server and the model. `touched` collects the nodes
   * involved; undefined when no node is left to change that way.
   */
  change(kind: ChangeKind, touched: Set<string>, random: () => number = Math.random): Change | undefined {
    switch (kind) {
      case 'add': {
        const node = this.newNode(false);
        this.nodes.set(node.name, node);
        touched.add(node.name);
        this.api.createNode(this.nodeObject(node));
        return { kind, node: node.name, at: performance.now(), landed: (peers) => this.matches(node, peers.get(node.publicKey)) };
      }
      case 'delete': {
        const node = this.pickable(touched, random() < 0.5 ? 'plain' : 'nat', random) ?? this.pickable(touched, 'plain', random);
        if (!node) return undefined;
        touched.add(node.name);
        this.nodes.delete(node.name);
        this.api.deleteNode(node.name);
        const key = node.publicKey;
        return { kind, node: node.name, at: performance.now(), removedKey: key, landed: (peers) => !peers.has(key) };
      }
      case 'port': {
        const node = this.pickable(touched, 'plain', random);
        if (!node) return undefined;
        touched.add(node.name);
        node.listenPort = node.listenPort === 51820 ? 51821 + (node.index % 1000) : 51820;
        this.api.updateNode(node.name, (n) => { n.metadata.annotations![A.listenPort] = String(node.listenPort); });
        return { kind, node: node.name, at: performance.now(), landed: (peers) => this.matches(node, peers.get(node.publicKey)) };
      }
      case 'rotate': {
        const node = this.pickable(touched, 'plain', random);
        if (!node) return undefined;
        touched.add(node.name);
        const old = node.publicKey;
        node.publicKey = this.newKey();
        this.api.updateNode(node.name, (n) => { n.metadata.annotations![A.publicKey] = node.publicKey; });
        return { kind, node: node.name, at: performance.now(), landed: (peers) => !peers.has(old) && this.matches(node, peers.get(node.publicKey)) };
      }
      case 'remap': {
        const node = this.pickable(touched, 'nat', random);
        if (!node) return undefined;
        touched.add(node.name);
        for (const o of node.observers) touched.add(o);
        node.natEndpoint = natEndpointFor(node.index, ++this.remaps);
        const at = performance.now();
        // Every observer sees the new mapping (the NAT restarted): each re-publishes it.
        for (const o of node.observers) {
          const observer = this.nodes.get(o)!;
          const wanted = this.nodeObject(observer).metadata.annotations![A.discovered];
          this.api.updateNode(o, (n) => { n.metadata.annotations![A.discovered] = wanted; });
        }
        return { kind, node: node.name, at, landed: (peers) => this.matches(node, peers.get(node.publicKey)) };
      }
    }
  }
}

/** IPv4 before IPv6, then by address and length (the order the checks sort both sides in). */
export function compareCanonical(a: string, b: string): number {
  const pa = parsePrefix(a), pb = parsePrefix(b);
  if (pa.address.length !== pb.address.length) return pa.address.length - pb.address.length;
  for (let i = 0; i < pa.address.length; i++) if (pa.address[i] !== pb.address[i]) return pa.address[i] - pb.address[i];
  return pa.bits - pb.bits;
}

export interface PeerSetDifference {
  /** Expected keys the data plane lacks. */
  missing: string[];
  /** Keys the data plane has that no Node carries. */
  extra: string[];
  /** Keys present on both sides whose allowed IPs or endpoint differ. */
  wrong: Array<{ key: string; node: string; want: ExpectedPeer; seen: SeenPeer }>;
  /** Allowed IPs the data plane lists on more than one peer (WireGuard never should). */
  duplicatedAllowedIps: string[];
}

/** Compares what the data plane holds with what the Nodes say. */
export function comparePeerSets(expected: ReadonlyMap<string, ExpectedPeer>, seen: ReadonlyMap<string, SeenPeer>): PeerSetDifference {
  const diff: PeerSetDifference = { missing: [], extra: [], wrong: [], duplicatedAllowedIps: [] };
  for (const [key, want] of expected) {
    const got = seen.get(key);
    if (!got) diff.missing.push(key);
    else if (got.endpoint !== want.endpoint || !sameList(got.allowedIps, want.allowedIps)) diff.wrong.push({ key, node: want.node, want, seen: got });
  }
  const owners = new Map<string, number>();
  for (const [key, got] of seen) {
    if (!expected.has(key)) diff.extra.push(key);
    for (const ip of got.allowedIps) owners.set(ip, (owners.get(ip) ?? 0) + 1);
  }
  diff.duplicatedAllowedIps = [...owners].filter(([, n]) => n > 1).map(([ip]) => ip);
  return diff;
}

export function isEmptyDifference(d: PeerSetDifference): boolean {
  return d.missing.length === 0 && d.extra.length === 0 && d.wrong.length === 0 && d.duplicatedAllowedIps.length === 0;
}
