/**
 * What a node publishes about itself on its Node object, and reading it back from other Nodes.
 *
 * | annotation                     | value                                                        |
 * |--------------------------------|--------------------------------------------------------------|
 * | `roamguard.io/public-key`      | WireGuard public key, base64                                 |
 * | `roamguard.io/listen-port`     | the data plane's UDP port (nodes may use different ports)    |
 * | `roamguard.io/pod-cidrs`       | JSON array of this node's pod CIDRs, both families           |
 * | `roamguard.io/node-ips`        | JSON array of addresses found on NODE_IP_INTERFACES          |
 * | `roamguard.io/force-endpoint`  | set by an operator: `ip:port` other nodes must use (a port   |
 * |                                | forward on a NAT router); overrides the computed endpoint     |
 * | `roamguard.io/discovered-endpoints` | JSON object: public key → `ip:port` this node's data    |
 * |                                | plane sees that peer at, when that is none of the peer's own  |
 * |                                | addresses (the peer is behind NAT; others may use it)         |
 * | `roamguard.io/relay-requests`  | JSON object: public key of a peer this node cannot reach →    |
 * |                                | the relay nodes this node has a live session with (relay.ts)  |
 * | `roamguard.io/relay-allocations` | present on a node that offers to relay: JSON object         |
 * |                                | `"keyLow,keyHigh"` → `[portForLow, portForHigh]`, the UDP     |
 * |                                | ports it forwards between for that pair (`{}` = none yet)     |
 *
 * Everything read here comes from objects anyone with patch rights on Nodes can write, so each
 * value is checked and bounded; a bad value rejects that one node (with a reason) and never
 * throws past `parseNodeAnnotations`.
 */
import { Endpoint } from '../../dataplane/net/endpoint.ts';
import { formatIp, formatPrefix, parseIp, parsePrefix } from '../../dataplane/net/ip.ts';
import { keyFromBase64 } from '../../dataplane/noise/keys.ts';

export const ANNOTATION = {
  publicKey: 'roamguard.io/public-key',
  listenPort: 'roamguard.io/listen-port',
  podCidrs: 'roamguard.io/pod-cidrs',
  nodeIps: 'roamguard.io/node-ips',
  forceEndpoint: 'roamguard.io/force-endpoint',
  discoveredEndpoints: 'roamguard.io/discovered-endpoints',
  relayRequests: 'roamguard.io/relay-requests',
  relayAllocations: 'roamguard.io/relay-allocations',
} as const;

/** Annotations read on their own, dropped entry by entry when bad: never a reason to reject a node. */
const ADVISORY: ReadonlySet<string> = new Set([ANNOTATION.discoveredEndpoints, ANNOTATION.relayRequests, ANNOTATION.relayAllocations]);

/** Bounds on what one Node may claim: enough for any real node, small enough to be harmless. */
export const LIMITS = {
  valueLength: 8192,
  /** discovered-endpoints lists one entry per NAT'd peer: room for about a thousand. */
  discoveredLength: 96 * 1024,
  discoveredEntries: 1024,
  /** relay-requests: one entry per unreachable peer, each naming a few relays. */
  relayRequestsLength: 96 * 1024,
  relayRequestEntries: 1024,
  relayCandidatesPerRequest: 8,
  /** relay-allocations: one entry per relayed pair. */
  relayAllocationsLength: 128 * 1024,
  relayAllocationEntries: 1024,
  podCidrs: 16,
  nodeIps: 32,
  /** Shorter prefixes would let one node claim most of an address family. */
  minPrefixLength: { 4: 8, 6: 16 } as Record<4 | 6, number>,
} as const;

/** The subset of a Kubernetes Node the mesh reads (plain JSON, as the API server sends it). */
export interface NodeObject {
  metadata?: { name?: string; resourceVersion?: string; annotations?: Record<string, string> | null; creationTimestamp?: string | Date; deletionTimestamp?: string | Date | null };
  spec?: { podCIDR?: string; podCIDRs?: string[] } | null;
  status?: { addresses?: Array<{ type?: string; address?: string }> | null } | null;
}

/** A node's published mesh facts, validated and in canonical text form. */
export interface NodeAnnotations {
  publicKey: string;
  publicKeyBytes: Uint8Array;
  listenPort?: number;
  podCidrs: string[];
  nodeIps: string[];
  forceEndpoint?: string;
}

export type AnnotationResult =
  | { ok: true; value: NodeAnnotations }
  /** `missing`: the node does not run roamguard (yet); not an error worth a warning. */
  | { ok: false; missing: boolean; reason: string };

function jsonStringArray(text: string, what: string, max: number): string[] {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw new Error(`${what} is not JSON`);
  }
  if (!Array.isArray(value) || !value.every((v) => typeof v === 'string')) throw new Error(`${what} is not a JSON array of strings`);
  if (value.length > max) throw new Error(`${what} has ${value.length} entries (at most ${max})`);
  return value as string[];
}

/** Canonical text of a CIDR, or an error naming it. Host bits must be zero, as in `.spec.podCIDRs`. */
export function canonicalCidr(text: string, what: string): string {
  const trimmed = text.trim();
  const shown = JSON.stringify(trimmed.slice(0, 64));
  const slash = trimmed.indexOf('/');
  if (slash < 0) throw new Error(`${what}: ${shown} is not a CIDR (no prefix length)`);
  let prefix, address;
  try {
    prefix = parsePrefix(trimmed);
    address = parseIp(trimmed.slice(0, slash));
  } catch (err) {
    throw new Error(`${what}: ${shown} is not a CIDR (${(err as Error).message})`);
  }
  const canonical = formatPrefix(prefix);
  if (formatIp(address) !== formatIp(prefix.address)) throw new Error(`${what}: ${shown} has host bits set (did you mean ${canonical}?)`);
  const family = prefix.address.length === 4 ? 4 : 6;
  if (prefix.bits < LIMITS.minPrefixLength[family]) {
    throw new Error(`${what}: ${canonical} is wider than /${LIMITS.minPrefixLength[family]}`);
  }
  return canonical;
}

/** Canonical text of an IP address, or an error naming it. */
export function canonicalIp(text: string, what: string): string {
  try {
    return formatIp(parseIp(text.trim()));
  } catch (err) {
    throw new Error(`${what}: ${JSON.stringify(text.slice(0, 64))} is not an IP address (${(err as Error).message})`);
  }
}

/** Reads and checks a Node's roamguard annotations. */
export function parseNodeAnnotations(node: NodeObject): AnnotationResult {
  const annotations = node.metadata?.annotations ?? {};
  const key = annotations[ANNOTATION.publicKey];
  if (key === undefined || key === '') return { ok: false, missing: true, reason: `no ${ANNOTATION.publicKey} annotation` };
  try {
    for (const name of Object.values(ANNOTATION)) {
      if (ADVISORY.has(name)) continue; // read on its own (bounded there), never rejects the node
      const v = annotations[name];
      if (v !== undefined && v.length > LIMITS.valueLength) throw new Error(`${name} is ${v.length} characters long (at most ${LIMITS.valueLength})`);
    }
    let publicKeyBytes: Uint8Array;
    try {
      publicKeyBytes = keyFromBase64(key);
    } catch (err) {
      throw new Error(`${ANNOTATION.publicKey}: ${(err as Error).message}`);
    }
    const portText = annotations[ANNOTATION.listenPort];
    let listenPort: number | undefined;
    if (portText !== undefined) {
      if (!/^\d{1,5}$/.test(portText) || Number(portText) < 1 || Number(portText) > 65535) {
        throw new Error(`${ANNOTATION.listenPort}: ${JSON.stringify(portText.slice(0, 16))} is not a port (1-65535)`);
      }
      listenPort = Number(portText);
    }
    const cidrText = annotations[ANNOTATION.podCidrs];
    const podCidrs = cidrText === undefined ? [] : jsonStringArray(cidrText, ANNOTATION.podCidrs, LIMITS.podCidrs)
      .map((c) => canonicalCidr(c, ANNOTATION.podCidrs));
    const ipText = annotations[ANNOTATION.nodeIps];
    const nodeIps = ipText === undefined ? [] : jsonStringArray(ipText, ANNOTATION.nodeIps, LIMITS.nodeIps)
      .map((ip) => canonicalIp(ip, ANNOTATION.nodeIps));
    const forceText = annotations[ANNOTATION.forceEndpoint];
    let forceEndpoint: string | undefined;
    if (forceText !== undefined && forceText.trim() !== '') {
      try {
        forceEndpoint = Endpoint.parse(forceText.trim()).toString();
      } catch (err) {
        throw new Error(`${ANNOTATION.forceEndpoint}: ${(err as Error).message}`);
      }
    }
    return { ok: true, value: { publicKey: key.trim(), publicKeyBytes, listenPort, podCidrs: [...new Set(podCidrs)], nodeIps: [...new Set(nodeIps)], forceEndpoint } };
  } catch (err) {
    return { ok: false, missing: false, reason: (err as Error).message };
  }
}

/**
 * Reads a node's `discovered-endpoints`: base64 key → canonical `ip:port`. Advisory data, so a
 * bad entry (or a bad annotation) is dropped, not an error; the count and size are bounded.
 */
export function parseDiscoveredEndpoints(node: NodeObject): Map<string, string> {
  const out = new Map<string, string>();
  const text = node.metadata?.annotations?.[ANNOTATION.discoveredEndpoints];
  if (text === undefined || text.length > LIMITS.discoveredLength) return out;
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return out;
  }
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return out;
  for (const [key, endpoint] of Object.entries(value as Record<string, unknown>)) {
    if (out.size >= LIMITS.discoveredEntries) break;
    if (typeof endpoint !== 'string' || !/^[A-Za-z0-9+/]{43}=$/.test(key)) continue;
    try {
      out.set(key, Endpoint.parse(endpoint).toString());
    } catch { /* not an endpoint: ignored */ }
  }
  return out;
}

/** The annotation text for what this node's data plane observed (stable: sorted by key). */
export function formatDiscoveredEndpoints(observed: ReadonlyMap<string, string>): string {
  return JSON.stringify(Object.fromEntries([...observed].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))));
}

/** The annotations this node publishes (a merge patch of exactly these keys). */
export function formatOwnAnnotations(own: { publicKey: string; listenPort: number; podCidrs: readonly string[]; nodeIps: readonly string[] }): Record<string, string> {
  return {
    [ANNOTATION.publicKey]: own.publicKey,
    [ANNOTATION.listenPort]: String(own.listenPort),
    [ANNOTATION.podCidrs]: JSON.stringify(own.podCidrs),
    [ANNOTATION.nodeIps]: JSON.stringify(own.nodeIps),
  };
}

const BASE64_KEY = /^[A-Za-z0-9+/]{43}=$/;
const NODE_NAME = /^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/;

function jsonObject(text: string | undefined, maxLength: number): Record<string, unknown> | undefined {
  if (text === undefined || text.length > maxLength) return undefined;
  try {
    const value: unknown = JSON.parse(text);
    return typeof value === 'object' && value !== null && !Array.isArray(value) ? value as Record<string, unknown> : undefined;
  } catch {
    return undefined;
  }
}

/**
 * Reads a node's `relay-requests`: peer key → relay node names (sorted, unique). Advisory and
 * bounded like `discovered-endpoints`: a bad entry is dropped, never an error. What it says only
 * ever speaks for the node that carries it (see control/mesh/relay.ts).
 */
export function parseRelayRequests(node: NodeObject): Map<string, string[]> {
  const out = new Map<string, string[]>();
  const value = jsonObject(node.metadata?.annotations?.[ANNOTATION.relayRequests], LIMITS.relayRequestsLength);
  if (!value) return out;
  for (const [key, names] of Object.entries(value)) {
    if (out.size >= LIMITS.relayRequestEntries) break;
    if (!BASE64_KEY.test(key) || !Array.isArray(names) || names.length === 0 || names.length > LIMITS.relayCandidatesPerRequest) continue;
    if (!names.every((n) => typeof n === 'string' && NODE_NAME.test(n))) continue;
    out.set(key, [...new Set(names as string[])].sort());
  }
  return out;
}

/** The `relay-requests` text (stable: sorted by key); undefined when there is nothing to ask. */
export function formatRelayRequests(requests: ReadonlyMap<string, readonly string[]>): string | undefined {
  if (requests.size === 0) return undefined;
  return JSON.stringify(Object.fromEntries([...requests].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)).map(([k, v]) => [k, [...v].sort()])));
}

/** The two keys of a relayed pair in canonical order, joined: `keyLow,keyHigh`. */
export function relayPairId(a: string, b: string): string {
  return a < b ? `${a},${b}` : `${b},${a}`;
}

/**
 * Reads a node's `relay-allocations`: undefined when the node does not offer to relay, else pair
 * id → [port the lower key sends to, port the higher key sends to]. Bad entries are dropped.
 */
export function parseRelayAllocations(node: NodeObject): Map<string, [number, number]> | undefined {
  const text = node.metadata?.annotations?.[ANNOTATION.relayAllocations];
  if (text === undefined) return undefined;
  const out = new Map<string, [number, number]>();
  const value = jsonObject(text, LIMITS.relayAllocationsLength);
  if (!value) return out;
  const isPort = (p: unknown): p is number => Number.isInteger(p) && (p as number) >= 1 && (p as number) <= 65535;
  for (const [id, ports] of Object.entries(value)) {
    if (out.size >= LIMITS.relayAllocationEntries) break;
    const keys = id.split(',');
    if (keys.length !== 2 || !keys.every((k) => BASE64_KEY.test(k)) || !(keys[0] < keys[1])) continue;
    if (!Array.isArray(ports) || ports.length !== 2 || !isPort(ports[0]) || !isPort(ports[1]) || ports[0] === ports[1]) continue;
    out.set(id, [ports[0], ports[1]]);
  }
  return out;
}

/** The `relay-allocations` text (stable: sorted by pair id). */
export function formatRelayAllocations(allocations: ReadonlyMap<string, readonly [number, number]>): string {
  return JSON.stringify(Object.fromEntries([...allocations].sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))));
}
