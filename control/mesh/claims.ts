/**
 * What one Node may claim for itself, and why a claim is refused. Pure functions over prefixes
 * and addresses; `desiredMesh` applies them to every Node it reads.
 *
 * A node's annotations are written by whoever holds a token that may patch that Node, so what
 * they claim is checked against what the cluster itself gave out:
 *
 * - A pod CIDR (`roamguard.io/pod-cidrs`) must lie within the node's own `spec.podCIDRs` of that
 *   family (what the controller manager allocated); a family without any `spec.podCIDRs` (the
 *   `file` source) must lie within the operator's allow-list (`POD_CIDR_ALLOWED_RANGES`, the same
 *   on every agent). It must not overlap a reserved range (loopback, link-local, multicast,
 *   unspecified, the documentation ranges) unless the spec or an allow-list entry covers it, nor a
 *   node address (any Node's InternalIP/ExternalIP, this node's own addresses), nor a pod CIDR an
 *   earlier node (or this node) holds.
 * - A node address that becomes a /32 or /128 allowed-IP (`roamguard.io/node-ips`, and the
 *   status addresses) must be global unicast and outside every pod CIDR (claimed or in any
 *   Node's spec) and outside the allow-list: it must never take a pod's address by longest prefix.
 *
 * Precedence when a pod CIDR and a node address overlap: the kubelet's status addresses beat pod
 * CIDR claims, and pod CIDRs beat `node-ips`. A refused claim is one claim: the node keeps every
 * other claim (see `RefusedClaim`).
 */
import { formatPrefix, parseIp, parsePrefix, type Prefix } from '../../dataplane/net/ip.ts';
import type { PrefixIndex } from './prefix-index.ts';

/** One claim left out of the mesh: which node, which field, what it claimed and why not. */
export interface RefusedClaim {
  node: string;
  field: string;
  claim: string;
  reason: string;
}

/** Ranges no pod CIDR may overlap unless the node's spec or the allow-list covers it. */
export const RESERVED_RANGES: ReadonlyArray<{ prefix: string; name: string }> = [
  { prefix: '0.0.0.0/8', name: 'unspecified ("this network")' },
  { prefix: '127.0.0.0/8', name: 'loopback' },
  { prefix: '169.254.0.0/16', name: 'link-local' },
  { prefix: '192.0.2.0/24', name: 'documentation (TEST-NET-1)' },
  { prefix: '198.51.100.0/24', name: 'documentation (TEST-NET-2)' },
  { prefix: '203.0.113.0/24', name: 'documentation (TEST-NET-3)' },
  { prefix: '224.0.0.0/4', name: 'multicast' },
  { prefix: '255.255.255.255/32', name: 'broadcast' },
  { prefix: '::/128', name: 'unspecified' },
  { prefix: '::1/128', name: 'loopback' },
  { prefix: '::ffff:0:0/96', name: 'IPv4-mapped' },
  { prefix: '2001:db8::/32', name: 'documentation' },
  { prefix: 'fe80::/10', name: 'link-local' },
  { prefix: 'ff00::/8', name: 'multicast' },
];

/** Addresses that are never a node's address: another host cannot send to them. */
const NOT_UNICAST = RESERVED_RANGES.filter((r) => !r.name.startsWith('documentation'));

const parsedReserved = RESERVED_RANGES.map((r) => ({ prefix: parsePrefix(r.prefix), name: r.name }));
const parsedNotUnicast = NOT_UNICAST.map((r) => ({ prefix: parsePrefix(r.prefix), name: r.name }));

/** Addresses that only mean something inside one site: RFC 1918, shared (CGNAT) space, ULA. */
const SITE_LOCAL = ['10.0.0.0/8', '172.16.0.0/12', '192.168.0.0/16', '100.64.0.0/10', 'fc00::/7'].map((p) => parsePrefix(p));

function sameFamily(a: Prefix, b: Prefix): boolean {
  return a.address.length === b.address.length;
}

/** True when both prefixes share at least one address. */
export function prefixesOverlap(a: Prefix, b: Prefix): boolean {
  if (!sameFamily(a, b)) return false;
  return prefixContains(a.bits <= b.bits ? a : b, a.bits <= b.bits ? b : a);
}

/** True when every address of `inner` is in `outer`. */
export function prefixContains(outer: Prefix, inner: Prefix): boolean {
  if (!sameFamily(outer, inner) || outer.bits > inner.bits) return false;
  for (let i = 0; i * 8 < outer.bits; i++) {
    const keep = Math.min(8, outer.bits - i * 8);
    const mask = (0xff << (8 - keep)) & 0xff;
    if ((outer.address[i] & mask) !== (inner.address[i] & mask)) return false;
  }
  return true;
}

function hostPrefix(address: Uint8Array): Prefix {
  return { address, bits: address.length * 8 };
}

/** True for an address inside RFC 1918, 100.64.0.0/10 or fc00::/7. */
export function isSiteLocalAddress(text: string): boolean {
  const host = hostPrefix(parseIp(text));
  return SITE_LOCAL.some((p) => prefixContains(p, host));
}

/** Parses an operator's allow-list entry list (settings validated it already). */
export function parseAllowedRanges(list: readonly string[]): Prefix[] {
  return list.map((text) => parsePrefix(text));
}

/**
 * Claims held by nodes: a list (scanned in order) or a PrefixIndex of the same entries in the same
 * order (what desiredMesh passes, so a pass over many Nodes is not quadratic); both name the same
 * first match.
 */
export type Holdings<E> = ReadonlyArray<E> | PrefixIndex<E>;

function firstOverlap<E>(holdings: Holdings<E>, query: Prefix, prefixOf: (e: E) => Prefix): E | undefined {
  if (Array.isArray(holdings)) return (holdings as ReadonlyArray<E>).find((e) => prefixesOverlap(prefixOf(e), query));
  return (holdings as PrefixIndex<E>).firstOverlapping(query);
}

export interface PodCidrContext {
  /** This node's `spec.podCIDRs` (both families). */
  spec: readonly Prefix[];
  /** `POD_CIDR_ALLOWED_RANGES`. */
  allowed: readonly Prefix[];
  /** Every node address the claim must not cover (status addresses of all Nodes, our own). */
  nodeAddresses: Holdings<{ address: Uint8Array; node: string }>;
  /** Pod CIDRs already held (this node's own and every earlier node's accepted claims). */
  held: Holdings<{ prefix: Prefix; node: string }>;
}

/** Why `claim` may not be this node's pod CIDR, or undefined when it may. */
export function podCidrRefusal(claim: Prefix, ctx: PodCidrContext): string | undefined {
  const spec = ctx.spec.filter((p) => sameFamily(p, claim));
  const bounds = spec.length > 0 ? spec : ctx.allowed.filter((p) => sameFamily(p, claim));
  const covered = bounds.some((p) => prefixContains(p, claim));
  if (!covered) {
    const reserved = parsedReserved.find((r) => prefixesOverlap(r.prefix, claim));
    if (reserved) return `overlaps the ${reserved.name} range ${formatPrefix(reserved.prefix)}`;
    if (spec.length > 0) return `is not within this node's spec.podCIDRs (${spec.map(formatPrefix).join(', ')})`;
    return bounds.length > 0
      ? `is not within POD_CIDR_ALLOWED_RANGES (${bounds.map(formatPrefix).join(', ')}) and the node has no spec.podCIDRs of that family`
      : 'the node has no spec.podCIDRs of that family and POD_CIDR_ALLOWED_RANGES allows none';
  }
  const address = firstOverlap(ctx.nodeAddresses, claim, (a) => hostPrefix(a.address));
  if (address) return `covers an address of node ${address.node}`;
  const other = firstOverlap(ctx.held, claim, (h) => h.prefix);
  if (other) return `overlaps a pod CIDR of node ${other.node}`;
  return undefined;
}

export interface NodeIpContext {
  /** Every pod CIDR in the cluster: accepted claims and every Node's spec.podCIDRs. */
  podCidrs: Holdings<{ prefix: Prefix; node: string }>;
  allowed: readonly Prefix[];
}

/** Why `address` may not become a host allowed-IP of its node, or undefined when it may. */
export function nodeIpRefusal(address: Uint8Array, ctx: NodeIpContext): string | undefined {
  const host = hostPrefix(address);
  const reserved = parsedNotUnicast.find((r) => prefixContains(r.prefix, host));
  if (reserved) return `is not global unicast (${reserved.name})`;
  const pod = firstOverlap(ctx.podCidrs, host, (p) => p.prefix);
  if (pod) return `is inside a pod CIDR of node ${pod.node} (${formatPrefix(pod.prefix)})`;
  const allowed = ctx.allowed.find((p) => prefixContains(p, host));
  if (allowed) return `is inside POD_CIDR_ALLOWED_RANGES (${formatPrefix(allowed)})`;
  return undefined;
}
