/**
 * Prefixes with a value each, answering "the first one (in the order they were added) that
 * overlaps this prefix" without scanning them all: a binary trie per address family, where every
 * trie node remembers the first value added at it and the first value added anywhere below it.
 *
 * Two CIDR prefixes overlap exactly when one contains the other, so the prefixes overlapping a
 * query are the ones on the query's path from the root (they contain it) and the ones in the
 * subtree at the query (it contains them). A lookup walks at most the query's length in bits;
 * an insert the same. desiredMesh checks every claim of every Node against every other Node's
 * through these, which keeps a pass over 5 000 Nodes from being quadratic (claims.ts).
 */
import type { Prefix } from '../../dataplane/net/ip.ts';

interface TrieNode<T> {
  zero?: TrieNode<T>;
  one?: TrieNode<T>;
  /** The first entry added with exactly this prefix. */
  here?: Entry<T>;
  /** The first entry added at this node or below it. */
  below?: Entry<T>;
}

interface Entry<T> { order: number; value: T }

function bit(address: Uint8Array, i: number): number {
  return (address[i >> 3] >> (7 - (i & 7))) & 1;
}

export class PrefixIndex<T> {
  private readonly roots = new Map<number, TrieNode<T>>();
  private added = 0;

  get size(): number { return this.added; }

  add(prefix: Prefix, value: T): void {
    const entry: Entry<T> = { order: this.added++, value };
    let node = this.roots.get(prefix.address.length);
    if (!node) this.roots.set(prefix.address.length, node = {});
    node.below ??= entry;
    for (let i = 0; i < prefix.bits; i++) {
      const next: TrieNode<T> = (bit(prefix.address, i) === 0 ? node.zero ??= {} : node.one ??= {});
      next.below ??= entry;
      node = next;
    }
    node.here ??= entry;
  }

  /** The first value added whose prefix overlaps `query` (contains it or lies within it). */
  firstOverlapping(query: Prefix): T | undefined {
    let node = this.roots.get(query.address.length);
    let best: Entry<T> | undefined;
    const consider = (e: Entry<T> | undefined) => { if (e && (!best || e.order < best.order)) best = e; };
    for (let i = 0; node && i < query.bits; i++) {
      consider(node.here);
      node = bit(query.address, i) === 0 ? node.zero : node.one;
    }
    if (node) consider(node.below);
    return best?.value;
  }
}
