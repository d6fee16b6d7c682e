/**
 * CIDR lists as the node agent handles them: pod CIDRs of this node and of the whole cluster.
 *
 * Everything that ends up in host state (nftables sets, routes, the CNI conflist) goes through a
 * canonical order — IPv4 before IPv6, then by address, then by prefix length — so the same set of
 * prefixes always renders to the same text and a mere reordering of Node objects never causes a
 * rewrite (Wigglenet learned this the hard way, PR #22).
 *
 * Parsing is strict: a CIDR needs an explicit prefix length and no host bits. "10.244.1.5/24" is
 * far more likely a typo (or an address pasted where a range was meant) than a request for
 * 10.244.1.0/24, so it is refused with a hint instead of being silently masked.
 */
import {
  familyOf, formatIp, formatPrefix, isIpv4Mapped, maskAddress, parseIp, type IpFamily, type Prefix,
} from '../../dataplane/net/ip.ts';

/** Parses one CIDR such as "10.244.1.0/24" or "fd00:10:244:1::/64" (surrounding blanks allowed). */
export function parseCidr(text: string): Prefix {
  if (typeof text !== 'string') throw new TypeError(`a CIDR must be a string, got ${typeof text}`);
  const trimmed = text.trim();
  const slash = trimmed.indexOf('/');
  if (slash < 0) throw new Error(`${JSON.stringify(text)} is not a CIDR: the prefix length ("/24", "/64") is missing`);
  let address: Uint8Array;
  try {
    address = parseIp(trimmed.slice(0, slash));
  } catch {
    throw new Error(`${JSON.stringify(text)} is not a CIDR: ${JSON.stringify(trimmed.slice(0, slash))} is not a numeric IP address`);
  }
  const lengthText = trimmed.slice(slash + 1);
  const max = address.length * 8;
  if (!/^\d{1,3}$/.test(lengthText) || Number(lengthText) > max) {
    throw new Error(`${JSON.stringify(text)} is not a CIDR: the prefix length must be 0..${max}`);
  }
  const bits = Number(lengthText);
  // ::ffff:a.b.c.d is how a dual-stack socket shows an IPv4 peer; as a range it would be an
  // IPv4 range written in IPv6 and match nothing in an ip6 rule or route.
  if (bits >= 96 && isIpv4Mapped(address)) {
    throw new Error(`${JSON.stringify(text)} is an IPv4-mapped IPv6 range; write the IPv4 CIDR instead`);
  }
  const masked = maskAddress(address, bits);
  if (!bytesEqual(masked, address)) {
    throw new Error(`${JSON.stringify(text)} has host bits set; the network is ${formatIp(masked)}/${bits}`);
  }
  return { address: masked, bits };
}

/**
 * Parses every entry of `texts`; throws one error naming every bad entry (so a user fixes them all
 * at once). `what` names the list in the message, e.g. "node.spec.podCIDRs".
 */
export function parseCidrList(texts: readonly string[], what = 'CIDR list'): Prefix[] {
  if (!Array.isArray(texts)) throw new TypeError(`${what} must be an array of strings`);
  const out: Prefix[] = [];
  const problems: string[] = [];
  texts.forEach((text, i) => {
    try {
      out.push(parseCidr(text));
    } catch (err) {
      problems.push(`[${i}] ${(err as Error).message}`);
    }
  });
  if (problems.length > 0) throw new Error(`bad ${what}:\n  ${problems.join('\n  ')}`);
  return out;
}

export function prefixFamily(prefix: Prefix): IpFamily {
  return familyOf(prefix.address);
}

function bytesEqual(a: Uint8Array, b: Uint8Array): boolean {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

function compareBytes(a: Uint8Array, b: Uint8Array): number {
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return a[i] - b[i];
  return 0;
}

/** The canonical order: IPv4 before IPv6, then by address, then shorter prefixes first. */
export function comparePrefixes(a: Prefix, b: Prefix): number {
  if (a.address.length !== b.address.length) return a.address.length - b.address.length;
  return compareBytes(a.address, b.address) || a.bits - b.bits;
}

export function prefixesEqual(a: Prefix, b: Prefix): boolean {
  return a.bits === b.bits && bytesEqual(a.address, b.address);
}

/** Sorted canonically with exact duplicates removed (overlaps are kept; see {@link summarizePrefixes}). */
export function canonicalPrefixes(prefixes: readonly Prefix[]): Prefix[] {
  const sorted = [...prefixes].sort(comparePrefixes);
  return sorted.filter((p, i) => i === 0 || !prefixesEqual(p, sorted[i - 1]));
}

/** True when every address of `inner` lies in `outer` (same family, `outer` no longer than `inner`). */
export function prefixContains(outer: Prefix, inner: Prefix): boolean {
  return outer.address.length === inner.address.length
    && outer.bits <= inner.bits
    && bytesEqual(maskAddress(inner.address, outer.bits), outer.address);
}

/** True when `address` (4 or 16 bytes) lies in `prefix`. */
export function prefixContainsAddress(prefix: Prefix, address: Uint8Array): boolean {
  return prefix.address.length === address.length && bytesEqual(maskAddress(address, prefix.bits), prefix.address);
}

/** True when the two prefixes share at least one address. */
export function prefixesOverlap(a: Prefix, b: Prefix): boolean {
  return prefixContains(a, b) || prefixContains(b, a);
}

/** The two halves of one parent: same length, same parent, different last prefix bit. */
function areSiblings(a: Prefix, b: Prefix): boolean {
  return a.address.length === b.address.length
    && a.bits === b.bits
    && a.bits > 0
    && !bytesEqual(a.address, b.address)
    && bytesEqual(maskAddress(a.address, a.bits - 1), maskAddress(b.address, b.bits - 1));
}

/**
 * The smallest canonical list covering exactly the same addresses: prefixes covered by another
 * are dropped and sibling halves are merged into their parent, repeatedly (two /25 → one /24, and
 * that /24 with its sibling → one /23). Interval sets in nftables refuse overlapping elements, so
 * anything put into a set goes through this first.
 */
export function summarizePrefixes(prefixes: readonly Prefix[]): Prefix[] {
  // In canonical order a covering prefix sorts before everything it covers, and the kept list is
  // disjoint and ascending, so only the last kept prefix can cover the next one.
  const disjoint: Prefix[] = [];
  for (const p of canonicalPrefixes(prefixes)) {
    const last = disjoint[disjoint.length - 1];
    if (last && prefixContains(last, p)) continue;
    disjoint.push(p);
  }
  // Siblings are neighbours in a disjoint ascending list; a merged parent may in turn be the
  // sibling of the prefix before it, hence the inner loop.
  const merged: Prefix[] = [];
  for (const p of disjoint) {
    let current = p;
    for (;;) {
      const top = merged[merged.length - 1];
      if (!top || !areSiblings(top, current)) break;
      merged.pop();
      current = { address: maskAddress(top.address, top.bits - 1), bits: top.bits - 1 };
    }
    merged.push(current);
  }
  return merged;
}

export interface ByFamily<T> {
  v4: T[];
  v6: T[];
}

/** Splits prefixes into IPv4 and IPv6, keeping their order. */
export function splitByFamily(prefixes: readonly Prefix[]): ByFamily<Prefix> {
  const out: ByFamily<Prefix> = { v4: [], v6: [] };
  for (const p of prefixes) (prefixFamily(p) === 4 ? out.v4 : out.v6).push(p);
  return out;
}

/**
 * The network address + 1 of `prefix` (10.244.1.0/24 → 10.244.1.1): the pod gateway that
 * host-local hands out and that the tunnel interface carries. The prefix must leave room for the
 * network address, the gateway and at least one pod (IPv4 /30, IPv6 /126 at most).
 */
export function gatewayAddress(prefix: Prefix): Uint8Array {
  const max = prefix.address.length * 8;
  if (prefix.bits > max - 2) {
    throw new Error(`${formatPrefix(prefix)} is too small for pods: a pod CIDR needs room for a gateway and a pod (at most /${max - 2})`);
  }
  const out = maskAddress(prefix.address, prefix.bits);
  // Adding 1 to a masked network address with at least two host bits never carries.
  out[out.length - 1] += 1;
  return out;
}

// ---------------------------------------------------------------------------------------------
// the same operations on text, which is what configuration, Node objects and commands carry

/** Parses, sorts canonically and de-duplicates; returns canonical text ("fd00::/64", not "FD00:0::/64"). */
export function canonicalCidrs(texts: readonly string[], what?: string): string[] {
  return canonicalPrefixes(parseCidrList(texts, what)).map(formatPrefix);
}

/** Parses and summarizes (see {@link summarizePrefixes}); returns canonical text. */
export function summarizeCidrs(texts: readonly string[], what?: string): string[] {
  return summarizePrefixes(parseCidrList(texts, what)).map(formatPrefix);
}

/** Splits CIDR texts by family, each canonical and de-duplicated. */
export function splitCidrsByFamily(texts: readonly string[], what?: string): ByFamily<string> {
  const split = splitByFamily(canonicalPrefixes(parseCidrList(texts, what)));
  return { v4: split.v4.map(formatPrefix), v6: split.v6.map(formatPrefix) };
}

/** The gateway address (network + 1) of a CIDR, as text. */
export function gatewayOf(cidr: string): string {
  return formatIp(gatewayAddress(parseCidr(cidr)));
}

/** The family of a CIDR text: 4 or 6. */
export function cidrFamily(cidr: string): IpFamily {
  return prefixFamily(parseCidr(cidr));
}
