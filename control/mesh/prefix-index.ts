/**
 * Prefixes with a value each, answering "the first one (in the order they were added) that
 * overlaps this prefix" without scanning them all. desiredMesh checks every claim of every Node
 * against every other Node's through these, which keeps a pass over 5 000 Nodes from being
 * quadratic (claims.ts).
 *
 * Two CIDR prefixes overlap exactly when one contains the other. Entries are kept in buckets by
 * family and prefix length, each a map from the entry's network bits to the first entry with
 * them. A query of length Q then finds
 * - the entries containing it: in each bucket of length L <= Q, the query cut to L bits;
 * - the entries inside it: in each bucket of length L > Q, the entries cut to Q bits, a view of
 *   that bucket built on the first such query and kept up to date by later adds.
 * A cluster uses a handful of lengths (a /24 and a /64 per node, /32 and /128 addresses), so a
 * query is a few map lookups. (A bit trie answers the same, but at 20 000 IPv6 prefixes it builds
 * a million trie nodes on every pass, and its garbage collection cost more than the lookups.)
 */
import type { Prefix } from '../../dataplane/net/ip.ts';

interface Entry<T> { order: number; value: T }

/**
 * The first `bits` bits of `address` as a map key (the rest are zero): a number for IPv4, eight
 * 16-bit characters at most for IPv6. Keys are only compared within one family and length.
 */
export function networkKey(address: Uint8Array, bits: number): number | string {
  if (address.length === 4) {
    if (bits === 0) return 0;
    const value = ((address[0] << 24) | (address[1] << 16) | (address[2] << 8) | address[3]) >>> 0;
    return (value & (0xffffffff << (32 - bits))) >>> 0;
  }
  let key = '';
  const whole = bits >> 4;
  for (let i = 0; i < whole; i++) key += String.fromCharCode((address[2 * i] << 8) | address[2 * i + 1]);
  const rest = bits & 15;
  if (rest > 0) key += String.fromCharCode(((address[2 * whole] << 8) | address[2 * whole + 1]) & ((0xffff << (16 - rest)) & 0xffff));
  return key;
}

interface Bucket<T> {
  family: number;
  bits: number;
  /** Network key at `bits` → the first entry with that network. */
  first: Map<number | string, Entry<T>>;
  /** Every entry with its address, for views at shorter lengths. */
  entries: Array<{ address: Uint8Array; entry: Entry<T> }>;
  /** Shorter length Q → network key at Q → the first entry of this bucket inside that network. */
  views: Map<number, Map<number | string, Entry<T>>>;
}

export class PrefixIndex<T> {
  /** By family (4 or 16 bytes) and prefix length: `family * 256 + bits`. */
  private readonly buckets = new Map<number, Bucket<T>>();
  private added = 0;

  get size(): number { return this.added; }

  add(prefix: Prefix, value: T): void {
    const entry: Entry<T> = { order: this.added++, value };
    const id = prefix.address.length * 256 + prefix.bits;
    let bucket = this.buckets.get(id);
    if (!bucket) this.buckets.set(id, bucket = { family: prefix.address.length, bits: prefix.bits, first: new Map(), entries: [], views: new Map() });
    const key = networkKey(prefix.address, prefix.bits);
    if (!bucket.first.has(key)) bucket.first.set(key, entry);
    bucket.entries.push({ address: prefix.address, entry });
    for (const [shorter, view] of bucket.views) {
      const cut = networkKey(prefix.address, shorter);
      if (!view.has(cut)) view.set(cut, entry);
    }
  }

  /** The first value added whose prefix overlaps `query` (contains it or lies within it). */
  firstOverlapping(query: Prefix): T | undefined {
    let best: Entry<T> | undefined;
    for (const bucket of this.buckets.values()) {
      if (bucket.family !== query.address.length) continue;
      let found: Entry<T> | undefined;
      if (bucket.bits <= query.bits) found = bucket.first.get(networkKey(query.address, bucket.bits));
      else found = this.view(bucket, query.bits).get(networkKey(query.address, query.bits));
      if (found && (!best || found.order < best.order)) best = found;
    }
    return best?.value;
  }

  private view(bucket: Bucket<T>, shorter: number): Map<number | string, Entry<T>> {
    let view = bucket.views.get(shorter);
    if (!view) {
      view = new Map();
      // Entries are in the order added, so the first one seen per network is the first added.
      for (const { address, entry } of bucket.entries) {
        const cut = networkKey(address, shorter);
        if (!view.has(cut)) view.set(cut, entry);
      }
      bucket.views.set(shorter, view);
    }
    return view;
  }
}
