/**
 * Cryptokey routing table: maps IP prefixes to peers and answers longest-prefix-match queries.
 *
 * The same table does both jobs WireGuard needs: on send, the destination address of an inner
 * packet picks the peer to encrypt for; on receive, the source address of a decrypted packet must
 * map back to the peer it came from (reverse-path check). A prefix belongs to at most one peer.
 *
 * Structure: one binary, path-compressed trie per address family. Each node stores its prefix as
 * 32-bit words with matching masks, so checking "does this address lie in the node's prefix" is a
 * few XOR/AND operations, and lookups read the address straight out of a packet into local
 * integers: the per-packet path allocates nothing.
 *
 * Invariant kept by insert and remove: a node without a peer always has two children (it exists
 * only to split paths), so the tries never hold more than 2·size − 1 nodes in all.
 */
import { maskAddress, type Prefix } from '../net/ip.ts';
import {
  IPV4_DESTINATION_OFFSET, IPV4_MIN_HEADER, IPV4_SOURCE_OFFSET, IPV6_DESTINATION_OFFSET, IPV6_HEADER, IPV6_SOURCE_OFFSET, readWord,
  FLAT_HEADER_INTS, FLAT_NODES, FLAT_NODE_INTS, FLAT_ROOT4, FLAT_ROOT6, F_BRANCH_SHIFT, F_BRANCH_WORD, F_CHILD0, F_CHILD1, F_M0, F_M1, F_M2,
  F_M3, F_PEER, F_W0, F_W1, F_W2, F_W3,
} from './flat-allowedips.ts';

/** A 32-bit mask with the top `bits` bits set (bits clamped to 0..32). */
function leadingOnes(bits: number): number {
  if (bits <= 0) return 0;
  if (bits >= 32) return -1;
  return -1 << (32 - bits);
}

class TrieNode<P> {
  // Field order is deliberate: what an IPv4 lookup reads comes first, so it shares a cache line.
  // The masked prefix is kept as big-endian 32-bit words w0..w3 (IPv4 uses w0 only) with a mask
  // per word.
  readonly w0: number;
  readonly m0: number;
  /**
   * Where the bit that picks the child lives: bit number `bits` of the address, i.e. word
   * `branchWord`, shifted right by `branchShift`. Meaningless for full-length nodes, which have no
   * children (the values are then kept in range so the shift stays harmless).
   */
  readonly branchShift: number;
  child0: TrieNode<P> | null = null;
  child1: TrieNode<P> | null = null;
  /** The owning peer, or undefined for a path-splitting node (which then has two children). */
  peer: P | undefined = undefined;
  readonly branchWord: number;
  readonly w1: number;
  readonly m1: number;
  readonly w2: number;
  readonly m2: number;
  readonly w3: number;
  readonly m3: number;
  /** Back-reference so removal can unlink a node without searching from the root. */
  parent: TrieNode<P> | null = null;
  /** Prefix length in bits. */
  readonly bits: number;
  /** 4 for IPv4, 16 for IPv6. */
  readonly byteLength: number;

  constructor(words: readonly number[], bits: number, byteLength: number) {
    this.bits = bits;
    this.byteLength = byteLength;
    this.m0 = leadingOnes(bits);
    this.m1 = leadingOnes(bits - 32);
    this.m2 = leadingOnes(bits - 64);
    this.m3 = leadingOnes(bits - 96);
    this.w0 = words[0] & this.m0;
    this.w1 = words[1] & this.m1;
    this.w2 = words[2] & this.m2;
    this.w3 = words[3] & this.m3;
    const branch = Math.min(bits, byteLength * 8 - 1);
    this.branchWord = branch >>> 5;
    this.branchShift = 31 - (branch & 31);
  }

  /** The node's prefix as a fresh Prefix (callers may keep or mutate it). */
  toPrefix(): Prefix {
    const address = new Uint8Array(this.byteLength);
    const words = [this.w0, this.w1, this.w2, this.w3];
    for (let i = 0; i < this.byteLength; i++) address[i] = (words[i >> 2] >>> (24 - 8 * (i & 3))) & 0xff;
    return { address, bits: this.bits };
  }
}

/** A prefix in the word form used inside the trie; built once per insert/remove, never per packet. */
interface Key {
  readonly words: readonly number[];
  readonly bits: number;
  readonly byteLength: number;
}

/** Bit number `bit` (0 = most significant) of the key. */
function keyBit(key: Key, bit: number): 0 | 1 {
  return ((key.words[bit >>> 5] >>> (31 - (bit & 31))) & 1) as 0 | 1;
}

function nodeWord(node: TrieNode<unknown>, index: number): number {
  return index === 0 ? node.w0 : index === 1 ? node.w1 : index === 2 ? node.w2 : node.w3;
}

/** Bit number `bit` of the node's prefix (only meaningful for bit < node.bits). */
function nodeBit(node: TrieNode<unknown>, bit: number): 0 | 1 {
  return ((nodeWord(node, bit >>> 5) >>> (31 - (bit & 31))) & 1) as 0 | 1;
}

/** Length of the common leading bits of the node's prefix and the key, at most `limit`. */
function commonBits(node: TrieNode<unknown>, key: Key, limit: number): number {
  const words = key.byteLength >> 2;
  for (let i = 0; i < words; i++) {
    const differ = nodeWord(node, i) ^ key.words[i];
    if (differ !== 0) return Math.min(limit, i * 32 + Math.clz32(differ));
    if ((i + 1) * 32 >= limit) break;
  }
  return limit;
}

export class AllowedIps<P> {
  private root4: TrieNode<P> | null = null;
  private root6: TrieNode<P> | null = null;
  /** Per-peer entries in insertion order; a peer with no entries has no key here (no stale references). */
  private readonly byPeer = new Map<P, Set<TrieNode<P>>>();
  private entryCount = 0;
  private nodes = 0;
  /**
   * Called by every insert, remove, removeByPeer and clear (before it changes anything, and also
   * when it turns out to change nothing): whoever publishes the flattened form re-publishes.
   */
  onChange: (() => void) | undefined = undefined;

  /** Number of prefixes in the table. */
  get size(): number {
    return this.entryCount;
  }

  /**
   * Number of trie nodes including path-splitting ones: at most 2·size − 1, since a family's trie
   * with n entries has at most n − 1 splitting nodes. Exposed for tests and diagnostics (it shows
   * that removals leave no dead nodes behind).
   */
  get nodeCount(): number {
    return this.nodes;
  }

  /**
   * Routes `prefix` to `peer`. The address is masked to the prefix length first. If another peer
   * owned exactly this prefix, it moves to `peer` (and to the end of `peer`'s entry list); inserting
   * a prefix the peer already owns changes nothing.
   */
  insert(prefix: Prefix, peer: P): void {
    this.onChange?.();
    if (peer === undefined) throw new TypeError('AllowedIps.insert: peer must not be undefined');
    const key = toKey(prefix, 'insert');
    let parent: TrieNode<P> | null = null;
    let node = key.byteLength === 4 ? this.root4 : this.root6;
    for (;;) {
      if (node === null) {
        this.attach(parent, key, this.newNode(key.words, key.bits, key.byteLength, peer));
        return;
      }
      const common = commonBits(node, key, Math.min(node.bits, key.bits));
      if (common === node.bits && common === key.bits) {
        this.assignPeer(node, peer);
        return;
      }
      if (common === node.bits) {
        // The node's prefix contains the new one: descend.
        parent = node;
        node = keyBit(key, node.bits) === 0 ? node.child0 : node.child1;
        continue;
      }
      if (common === key.bits) {
        // The new prefix contains the node's: it goes between the parent and the node.
        const added = this.newNode(key.words, key.bits, key.byteLength, peer);
        this.replaceInParent(node, added);
        this.setChild(added, nodeBit(node, key.bits), node);
        return;
      }
      // Neither contains the other: split at their common prefix with a peerless node.
      const split = this.newNode(key.words, common, key.byteLength, undefined);
      const added = this.newNode(key.words, key.bits, key.byteLength, peer);
      this.replaceInParent(node, split);
      this.setChild(split, nodeBit(node, common), node);
      this.setChild(split, keyBit(key, common), added);
      return;
    }
  }

  /** Removes `prefix` if (and only if) `peer` owns exactly it. Returns whether anything was removed. */
  remove(prefix: Prefix, peer: P): boolean {
    this.onChange?.();
    const key = toKey(prefix, 'remove');
    const node = this.findExact(key);
    if (node === null || node.peer === undefined || node.peer !== peer) return false;
    this.removeNode(node);
    return true;
  }

  /** Removes every prefix owned by `peer`; returns how many there were. */
  removeByPeer(peer: P): number {
    this.onChange?.();
    const entries = this.byPeer.get(peer);
    if (entries === undefined) return 0;
    const count = entries.size;
    for (const node of [...entries]) this.removeNode(node);
    return count;
  }

  /** The prefixes owned by `peer`, in the order they were added (copies; safe to keep). */
  entriesFor(peer: P): Prefix[] {
    const entries = this.byPeer.get(peer);
    if (entries === undefined) return [];
    const out: Prefix[] = [];
    for (const node of entries) out.push(node.toPrefix());
    return out;
  }

  clear(): void {
    this.onChange?.();
    this.root4 = null;
    this.root6 = null;
    this.byPeer.clear();
    this.entryCount = 0;
    this.nodes = 0;
  }

  /** Longest-prefix match for a 4- or 16-byte address. */
  lookup(address: Uint8Array): P | undefined {
    if (address.length === 4) return this.lookup4(readWord(address, 0));
    if (address.length === 16) {
      return this.lookup6(readWord(address, 0), readWord(address, 4), readWord(address, 8), readWord(address, 12));
    }
    throw new RangeError(`AllowedIps.lookup: an IP address has 4 or 16 bytes, got ${address.length}`);
  }

  /**
   * The peer for the destination address of the IP packet starting at `offset` (send path).
   * Undefined for packets too short for their IP header or with a version other than 4 or 6.
   */
  lookupPacketDestination(packet: Uint8Array, offset = 0): P | undefined {
    return this.lookupPacketAddress(packet, offset, IPV4_DESTINATION_OFFSET, IPV6_DESTINATION_OFFSET);
  }

  /** The peer for the source address of the IP packet at `offset` (receive-path reverse check). */
  lookupPacketSource(packet: Uint8Array, offset = 0): P | undefined {
    return this.lookupPacketAddress(packet, offset, IPV4_SOURCE_OFFSET, IPV6_SOURCE_OFFSET);
  }

  private lookupPacketAddress(packet: Uint8Array, offset: number, v4At: number, v6At: number): P | undefined {
    if (!(offset >= 0) || offset >= packet.length) return undefined;
    const version = packet[offset] >>> 4;
    if (version === 4) {
      if (packet.length - offset < IPV4_MIN_HEADER) return undefined;
      return this.lookup4(readWord(packet, offset + v4At));
    }
    if (version === 6) {
      if (packet.length - offset < IPV6_HEADER) return undefined;
      const at = offset + v6At;
      return this.lookup6(readWord(packet, at), readWord(packet, at + 4), readWord(packet, at + 8), readWord(packet, at + 12));
    }
    return undefined;
  }

  /** Walks down while the address stays inside each node's prefix, remembering the deepest peer. */
  private lookup4(a0: number): P | undefined {
    let node = this.root4;
    let found: P | undefined;
    while (node !== null) {
      if (((a0 ^ node.w0) & node.m0) !== 0) break;
      if (node.peer !== undefined) found = node.peer;
      node = ((a0 >>> node.branchShift) & 1) === 0 ? node.child0 : node.child1;
    }
    return found;
  }

  private lookup6(a0: number, a1: number, a2: number, a3: number): P | undefined {
    let node = this.root6;
    let found: P | undefined;
    while (node !== null) {
      if ((((a0 ^ node.w0) & node.m0) | ((a1 ^ node.w1) & node.m1) | ((a2 ^ node.w2) & node.m2) | ((a3 ^ node.w3) & node.m3)) !== 0) break;
      if (node.peer !== undefined) found = node.peer;
      const w = node.branchWord;
      const word = w === 0 ? a0 : w === 1 ? a1 : w === 2 ? a2 : a3;
      node = ((word >>> node.branchShift) & 1) === 0 ? node.child0 : node.child1;
    }
    return found;
  }

  /**
   * The tries as one Int32Array for other threads (flat-allowedips.ts reads it): a header, then
   * the nodes depth-first, each as NODE_INTS words. `numberOf` names each node's peer by a number
   * (>= 0) the reader understands.
   */
  flatten(numberOf: (peer: P) => number): Int32Array {
    const flat = new Int32Array(new SharedArrayBuffer((FLAT_HEADER_INTS + this.nodes * FLAT_NODE_INTS) * 4));
    let next = 0;
    const place = (node: TrieNode<P> | null): number => {
      if (node === null) return -1;
      const at = next++;
      const w = FLAT_HEADER_INTS + at * FLAT_NODE_INTS;
      flat[w + F_W0] = node.w0; flat[w + F_M0] = node.m0;
      flat[w + F_W1] = node.w1; flat[w + F_M1] = node.m1;
      flat[w + F_W2] = node.w2; flat[w + F_M2] = node.m2;
      flat[w + F_W3] = node.w3; flat[w + F_M3] = node.m3;
      flat[w + F_BRANCH_WORD] = node.branchWord;
      flat[w + F_BRANCH_SHIFT] = node.branchShift;
      const peer = node.peer === undefined ? -1 : numberOf(node.peer);
      if (node.peer !== undefined && !(Number.isInteger(peer) && peer >= 0)) throw new RangeError(`allowed IPs: peer number ${peer} is not a non-negative integer`);
      flat[w + F_PEER] = peer;
      flat[w + F_CHILD0] = place(node.child0);
      flat[w + F_CHILD1] = place(node.child1);
      return at;
    };
    flat[FLAT_ROOT4] = place(this.root4);
    flat[FLAT_ROOT6] = place(this.root6);
    flat[FLAT_NODES] = next;
    return flat;
  }

  private findExact(key: Key): TrieNode<P> | null {
    let node = key.byteLength === 4 ? this.root4 : this.root6;
    while (node !== null && node.bits <= key.bits) {
      if (commonBits(node, key, node.bits) !== node.bits) return null;
      if (node.bits === key.bits) return node;
      node = keyBit(key, node.bits) === 0 ? node.child0 : node.child1;
    }
    return null;
  }

  private newNode(words: readonly number[], bits: number, byteLength: number, peer: P | undefined): TrieNode<P> {
    const node = new TrieNode<P>(words, bits, byteLength);
    this.nodes++;
    if (peer !== undefined) this.assignPeer(node, peer);
    return node;
  }

  /** Gives the node to `peer`, taking it from its previous owner if there was one. */
  private assignPeer(node: TrieNode<P>, peer: P): void {
    if (node.peer === peer) return;
    if (node.peer === undefined) this.entryCount++;
    else this.forgetEntry(node.peer, node);
    node.peer = peer;
    let entries = this.byPeer.get(peer);
    if (entries === undefined) {
      entries = new Set();
      this.byPeer.set(peer, entries);
    }
    entries.add(node);
  }

  private forgetEntry(peer: P, node: TrieNode<P>): void {
    const entries = this.byPeer.get(peer)!;
    entries.delete(node);
    if (entries.size === 0) this.byPeer.delete(peer);
  }

  /** Clears the node's peer and restores the "peerless nodes have two children" invariant. */
  private removeNode(node: TrieNode<P>): void {
    this.forgetEntry(node.peer as P, node);
    node.peer = undefined;
    this.entryCount--;
    if (node.child0 !== null && node.child1 !== null) return; // still needed to split paths
    const only = node.child0 ?? node.child1;
    const parent = node.parent;
    this.replaceInParent(node, only);
    this.nodes--;
    // Unlinking a leaf can leave a peerless parent with a single child: splice it out too.
    if (only === null && parent !== null && parent.peer === undefined) {
      this.replaceInParent(parent, parent.child0 ?? parent.child1);
      this.nodes--;
    }
  }

  private attach(parent: TrieNode<P> | null, key: Key, node: TrieNode<P>): void {
    if (parent === null) this.setRoot(key.byteLength, node);
    else this.setChild(parent, keyBit(key, parent.bits), node);
  }

  private setChild(parent: TrieNode<P>, side: 0 | 1, child: TrieNode<P>): void {
    if (side === 0) parent.child0 = child;
    else parent.child1 = child;
    child.parent = parent;
  }

  private setRoot(byteLength: number, node: TrieNode<P> | null): void {
    if (byteLength === 4) this.root4 = node;
    else this.root6 = node;
    if (node !== null) node.parent = null;
  }

  /** Puts `replacement` (possibly nothing) where `node` hangs and detaches `node`. */
  private replaceInParent(node: TrieNode<P>, replacement: TrieNode<P> | null): void {
    const parent = node.parent;
    if (parent === null) {
      this.setRoot(node.byteLength, replacement);
    } else {
      if (parent.child0 === node) parent.child0 = replacement;
      else parent.child1 = replacement;
      if (replacement !== null) replacement.parent = parent;
    }
    node.parent = null;
  }
}

function toKey(prefix: Prefix, operation: string): Key {
  const { address, bits } = prefix;
  if (!(address instanceof Uint8Array) || (address.length !== 4 && address.length !== 16)) {
    const got = address instanceof Uint8Array ? `${address.length} bytes` : typeof address;
    throw new RangeError(`AllowedIps.${operation}: a prefix address has 4 or 16 bytes, got ${got}`);
  }
  const max = address.length * 8;
  if (!Number.isInteger(bits) || bits < 0 || bits > max) {
    throw new RangeError(`AllowedIps.${operation}: prefix length must be an integer 0..${max}, got ${bits}`);
  }
  const masked = maskAddress(address, bits);
  const words = [0, 0, 0, 0];
  for (let i = 0; i < address.length; i += 4) words[i >> 2] = readWord(masked, i);
  return { words, bits, byteLength: address.length };
}
