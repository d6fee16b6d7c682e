/**
 * Which nodes name which prefixes, kept up to date as Nodes come, change and go: MeshTracker asks
 * it whether a prefix of one node overlaps a prefix of any other node. Unlike PrefixIndex (built
 * afresh in each full pass, first match in claim order), entries here are also removed, and a
 * query ignores one owner (the node asking).
 *
 * Layout as in PrefixIndex: buckets by family and prefix length, each a map from network bits to
 * the owners naming that network; queries for longer entries go through a view of the bucket at
 * the query's length, built on first use and kept up to date by later adds and removes.
 */
import type { Prefix } from '../../dataplane/net/ip.ts';
import { networkKey } from './prefix-index.ts';

/** One owner (the common case, no allocation) or owner → how many of its prefixes land here. */
type Owners = string | Map<string, number>;

function addOwner(owners: Owners | undefined, owner: string): Owners {
  if (owners === undefined) return owner;
  if (typeof owners === 'string') return new Map([[owners, 1]]).set(owner, (owners === owner ? 2 : 1));
  owners.set(owner, (owners.get(owner) ?? 0) + 1);
  return owners;
}

/** The owners left after taking one entry of `owner` away; undefined when none. */
function removeOwner(owners: Owners | undefined, owner: string): Owners | undefined {
  if (owners === undefined || owners === owner) return undefined;
  if (typeof owners === 'string') return owners;
  const n = owners.get(owner) ?? 0;
  if (n <= 1) owners.delete(owner);
  else owners.set(owner, n - 1);
  if (owners.size === 0) return undefined;
  if (owners.size === 1) {
    const [[only, count]] = owners;
    if (count === 1) return only;
  }
  return owners;
}

function hasOtherThan(owners: Owners | undefined, owner: string): boolean {
  if (owners === undefined) return false;
  if (typeof owners === 'string') return owners !== owner;
  for (const name of owners.keys()) if (name !== owner) return true;
  return false;
}

interface Bucket {
  family: number;
  bits: number;
  owners: Map<number | string, Owners>;
  /** Shorter length → network key at that length → owners of this bucket's entries inside it. */
  views: Map<number, Map<number | string, Owners>>;
}

export class PrefixOwners {
  private readonly buckets = new Map<number, Bucket>();

  add(prefix: Prefix, owner: string): void {
    const bucket = this.bucket(prefix);
    const key = networkKey(prefix.address, prefix.bits);
    bucket.owners.set(key, addOwner(bucket.owners.get(key), owner));
    for (const [shorter, view] of bucket.views) {
      const cut = networkKey(prefix.address, shorter);
      view.set(cut, addOwner(view.get(cut), owner));
    }
  }

  /** Takes away one entry added with the same prefix and owner (none: nothing happens). */
  remove(prefix: Prefix, owner: string): void {
    const bucket = this.buckets.get(bucketId(prefix));
    if (!bucket) return;
    const key = networkKey(prefix.address, prefix.bits);
    const owners = bucket.owners.get(key);
    if (owners === undefined || !(typeof owners === 'string' ? owners === owner : owners.has(owner))) return;
    const left = removeOwner(owners, owner);
    if (left === undefined) bucket.owners.delete(key);
    else bucket.owners.set(key, left);
    for (const [shorter, view] of bucket.views) {
      const cut = networkKey(prefix.address, shorter);
      const rest = removeOwner(view.get(cut), owner);
      if (rest === undefined) view.delete(cut);
      else view.set(cut, rest);
    }
  }

  /** True when a prefix of any owner but `owner` overlaps `query` (contains it or lies within it). */
  overlapsOtherThan(query: Prefix, owner: string): boolean {
    for (const bucket of this.buckets.values()) {
      if (bucket.family !== query.address.length) continue;
      const owners = bucket.bits <= query.bits
        ? bucket.owners.get(networkKey(query.address, bucket.bits))
        : this.view(bucket, query.bits).get(networkKey(query.address, query.bits));
      if (hasOtherThan(owners, owner)) return true;
    }
    return false;
  }

  private bucket(prefix: Prefix): Bucket {
    const id = bucketId(prefix);
    let bucket = this.buckets.get(id);
    if (!bucket) this.buckets.set(id, bucket = { family: prefix.address.length, bits: prefix.bits, owners: new Map(), views: new Map() });
    return bucket;
  }

  private view(bucket: Bucket, shorter: number): Map<number | string, Owners> {
    let view = bucket.views.get(shorter);
    if (!view) {
      view = new Map();
      for (const [key, owners] of bucket.owners) {
        const cut = cutKey(key, bucket, shorter);
        const names = typeof owners === 'string' ? [[owners, 1] as const] : [...owners];
        for (const [name, count] of names) for (let i = 0; i < count; i++) view.set(cut, addOwner(view.get(cut), name));
      }
      bucket.views.set(shorter, view);
    }
    return view;
  }
}

function bucketId(prefix: Prefix): number {
  return prefix.address.length * 256 + prefix.bits;
}

/** A bucket's network key cut to a shorter length (the key is what networkKey made of the address). */
function cutKey(key: number | string, bucket: Bucket, shorter: number): number | string {
  return networkKey(addressOfKey(key, bucket.family), shorter);
}

function addressOfKey(key: number | string, family: number): Uint8Array {
  const address = new Uint8Array(family);
  if (typeof key === 'number') {
    address[0] = key >>> 24; address[1] = (key >>> 16) & 0xff; address[2] = (key >>> 8) & 0xff; address[3] = key & 0xff;
    return address;
  }
  for (let i = 0; i < key.length; i++) {
    const c = key.charCodeAt(i);
    address[2 * i] = c >> 8;
    address[2 * i + 1] = c & 0xff;
  }
  return address;
}
