/**
 * `roamguard status`: what the local data plane reports per peer, with the node each peer is,
 * from two sources only — the control socket (`get=1`, plus roamguard's counters when the data
 * plane has them) and the cluster's Node objects (names, published endpoints). The Node list is
 * optional: when the API server cannot be reached the table still shows, with '-' for names.
 *
 * `buildStatus` is pure (tested on its own); `collectStatus` does the I/O.
 */
import type { KubeConfig } from '../kube/kube-client.ts';
import { CoreV1Api } from '../kube/kube-client.ts';
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import { formatPrefix } from '../../dataplane/net/ip.ts';
import { keyToBase64 } from '../../dataplane/noise/keys.ts';
import type { DeviceSnapshot } from '../../dataplane/uapi/uapi-protocol.ts';
import type { DeviceStats } from '../../dataplane/uapi/uapi-stats.ts';
import type { IpFamilyChoice } from '../config/settings.ts';
import { parseNodeAnnotations, parseRelayAllocations, relayPairId, type NodeObject } from '../mesh/annotations.ts';
import { Endpoint } from '../../dataplane/net/endpoint.ts';
import { desiredMesh, nodeAddresses, type EndpointSource } from '../mesh/desired-peers.ts';
import { peerState, type PeerState } from './peer-state.ts';

/** A peer's state, plus `not configured`: a Node publishes it but the data plane lacks it. */
export type StatusState = PeerState | 'not configured';

export interface PeerStatus {
  /** The Node that publishes this key; '-' when unknown (API unreachable, or no Node claims it). */
  node: string;
  /** The public key (public, not a secret) and its short form (first 8 base64 characters). */
  publicKey: string;
  key: string;
  /** What the data plane sends to now (`ip:port`), or null. */
  endpoint: string | null;
  /** The endpoint the agent computes from the Node objects (what it writes for a new peer). */
  expectedEndpoint: string | null;
  /** Where that came from: forced (annotation), discovered (seen behind NAT), lan, published. */
  expectedSource: EndpointSource | null;
  /** The data plane's endpoint differs from the expected one: learned from the peer's packets. */
  roamed: boolean;
  /** The node whose relay port the data plane sends this peer's traffic to; null when direct. */
  relayVia: string | null;
  allowedIps: string[];
  /** Wall-clock ms; 0 = never. */
  lastHandshakeWallMs: number;
  rxBytes: number;
  txBytes: number;
  persistentKeepalive: number;
  state: StatusState;
  /**
   * What fits through the tunnel to this peer: the MTU of the agent's routes to its pod CIDRs
   * (its learned path MTU), else the tunnel's. Only when the routes could be read.
   */
  pathMtu?: number;
  /** roamguard's counters, when the data plane has them. */
  counters?: { handshakeAttempts: number; handshakeFailures: number; handshakesCompleted: number; endpointChanges: number };
}

export interface StatusReport {
  interface: string;
  /** This node's public key (derived from the data plane's private key, which is never shown). */
  publicKey: string | null;
  /** This node's name, when a Node publishes our key (or NODE_NAME says so). */
  node: string | null;
  listenPort: number;
  /** Whether the Node objects could be read, and why not. */
  api: { reachable: boolean; error?: string };
  countersAvailable: boolean;
  /** Drops by reason (non-zero only), from roamguard's counters. */
  drops: Record<string, number>;
  peers: PeerStatus[];
  /** Nodes whose annotations the mesh cannot use, and why. */
  rejected: Array<{ node: string; reason: string }>;
  /** The tunnel interface's MTU, when it could be read (then every peer has a pathMtu). */
  tunnelMtu?: number;
}

export interface StatusInput {
  interfaceName: string;
  snapshot: DeviceSnapshot;
  stats?: DeviceStats;
  /** This node's public key (base64), if known. */
  publicKey?: string;
  /** Undefined when the API could not be read. */
  nodes?: readonly NodeObject[];
  apiError?: string;
  /** NODE_NAME, when set. */
  nodeName?: string;
  /** The tunnel's MTU and the agent's routes on it (`ip route`), when they could be read. */
  routes?: { tunnelMtu: number; own: ReadonlyArray<{ dst: string; mtu?: number }> };
  /** As the agent computes endpoints (WG_IP_FAMILY, WG_LISTEN_PORT). */
  wgIpFamily: IpFamilyChoice;
  defaultListenPort: number;
  nowWallMs: number;
}

export function buildStatus(input: StatusInput): StatusReport {
  const nodes = input.nodes ?? [];
  // Who publishes which key (also nodes the mesh rejects, so a name is shown whenever one exists).
  const owners = new Map<string, string>();
  for (const node of nodes) {
    const name = node.metadata?.name;
    const parsed = parseNodeAnnotations(node);
    if (name && parsed.ok && !owners.has(parsed.value.publicKey)) owners.set(parsed.value.publicKey, name);
  }
  const ownName = input.nodeName || (input.publicKey ? owners.get(input.publicKey) : undefined);
  // This node as the agent sees it: its pod CIDRs and addresses decide conflicts and NAT views.
  const ownNode = nodes.find((n) => n.metadata?.name === ownName);
  const ownParsed = ownNode ? parseNodeAnnotations(ownNode) : undefined;
  const self = {
    nodeName: ownName ?? '', publicKey: input.publicKey ?? '-',
    podCidrs: ownParsed?.ok ? ownParsed.value.podCidrs : [],
    addresses: ownNode ? nodeAddresses(ownNode, ownParsed?.ok ? ownParsed.value.nodeIps : []) : [],
  };
  const mesh = desiredMesh(nodes, self, {
    wgIpFamily: input.wgIpFamily, nativeRouting: { ipv4: false, ipv6: false }, defaultListenPort: input.defaultListenPort, persistentKeepalive: 0,
  });
  const counters = new Map((input.stats?.peers ?? []).map((p) => [keyToBase64(p.publicKey), p]));
  const routeMtu = new Map((input.routes?.own ?? []).filter((r) => r.mtu !== undefined).map((r) => [r.dst, r.mtu!]));
  const pathMtuOf = (allowedIps: readonly string[]) => {
    if (!input.routes) return {};
    const mtus = allowedIps.map((c) => routeMtu.get(c)).filter((m): m is number => m !== undefined);
    return { pathMtu: Math.min(input.routes.tunnelMtu, ...mtus) };
  };
  // Relay ports for pairs with this node: `ip:port` → relay node (control/mesh/relay.ts).
  const relayPorts = new Map<string, string>();
  for (const relay of mesh.peers.values()) {
    const node = nodes.find((n) => n.metadata?.name === relay.nodeName);
    const allocations = node ? parseRelayAllocations(node) : undefined;
    if (!allocations || !relay.endpoint || !input.publicKey) continue;
    const host = Endpoint.parse(relay.endpoint).host;
    for (const peer of mesh.peers.keys()) {
      const ports = allocations.get(relayPairId(input.publicKey, peer));
      if (ports) relayPorts.set(`${peer}\n${new Endpoint(host, ports[input.publicKey < peer ? 0 : 1])}`, relay.nodeName);
    }
  }

  const peers: PeerStatus[] = [];
  const configured = new Set<string>();
  for (const peer of input.snapshot.peers) {
    const publicKey = keyToBase64(peer.publicKey);
    configured.add(publicKey);
    const desired = mesh.peers.get(publicKey);
    const endpoint = peer.endpoint?.toString() ?? null;
    const expected = desired?.endpoint ?? null;
    const c = counters.get(publicKey);
    const relayVia = endpoint === null ? null : relayPorts.get(`${publicKey}\n${endpoint}`) ?? null;
    peers.push({
      node: desired?.nodeName ?? owners.get(publicKey) ?? '-',
      publicKey,
      key: publicKey.slice(0, 8),
      endpoint,
      expectedEndpoint: expected,
      expectedSource: desired?.endpointSource ?? null,
      roamed: relayVia === null && endpoint !== null && expected !== null && endpoint !== expected,
      relayVia,
      allowedIps: peer.allowedIps.map(formatPrefix),
      ...pathMtuOf(peer.allowedIps.map(formatPrefix)),
      lastHandshakeWallMs: peer.lastHandshakeWallMs,
      rxBytes: peer.rxBytes,
      txBytes: peer.txBytes,
      persistentKeepalive: peer.persistentKeepalive,
      state: peerState({ hasEndpoint: endpoint !== null, lastHandshakeWallMs: peer.lastHandshakeWallMs, handshakePending: c?.handshakePending }, input.nowWallMs),
      ...(c ? { counters: { handshakeAttempts: c.handshakeAttempts, handshakeFailures: c.handshakeFailures, handshakesCompleted: c.handshakesCompleted, endpointChanges: c.endpointChanges } } : {}),
    });
  }
  for (const desired of mesh.peers.values()) {
    if (configured.has(desired.publicKey)) continue;
    peers.push({
      node: desired.nodeName, publicKey: desired.publicKey, key: desired.publicKey.slice(0, 8), endpoint: null,
      expectedEndpoint: desired.endpoint ?? null, expectedSource: desired.endpointSource ?? null, roamed: false, relayVia: null, allowedIps: desired.allowedIps, lastHandshakeWallMs: 0,
      rxBytes: 0, txBytes: 0, persistentKeepalive: 0, state: 'not configured',
    });
  }
  peers.sort((a, b) => (a.node === b.node ? (a.publicKey < b.publicKey ? -1 : 1) : a.node === '-' ? 1 : b.node === '-' ? -1 : a.node < b.node ? -1 : 1));
  const drops: Record<string, number> = {};
  for (const [reason, n] of Object.entries(input.stats?.drops ?? {})) if (n > 0) drops[reason] = n;
  return {
    interface: input.interfaceName,
    publicKey: input.publicKey ?? null,
    node: ownName ?? null,
    listenPort: input.snapshot.listenPort,
    api: input.nodes ? { reachable: true } : { reachable: false, ...(input.apiError ? { error: input.apiError } : {}) },
    countersAvailable: input.stats !== undefined,
    drops,
    peers,
    // Nodes left out and single claims refused: both are what an operator must look at.
    rejected: input.nodes ? [...mesh.rejected, ...(mesh.refused ?? []).map((r) => ({ node: r.node, reason: `${r.field}: ${r.reason}` }))] : [],
    ...(input.routes ? { tunnelMtu: input.routes.tunnelMtu } : {}),
  };
}

/** Lists the Node objects, giving up after `timeoutMs`. */
export async function listNodes(kc: KubeConfig, timeoutMs: number): Promise<NodeObject[]> {
  const api = kc.makeApiClient(CoreV1Api);
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer from the API server within ${timeoutMs} ms`)), timeoutMs);
  });
  try {
    const list = await Promise.race([api.listNode(), timeout]);
    return (list.items ?? []) as NodeObject[];
  } finally {
    clearTimeout(timer);
  }
}

/** Public key of a private key (the data plane reports ours in `get=1`). */
export async function publicKeyOf(privateKey: Uint8Array | undefined): Promise<string | undefined> {
  if (!privateKey || privateKey.every((b) => b === 0)) return undefined;
  const crypto = await selectCrypto();
  return keyToBase64(crypto.publicKey(privateKey));
}
