import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { AllowedIps } from '../../dataplane/allowedips/allowedips.ts';
import { flatLookup4, flatLookup6, flatLookupDestination, flatLookupSource } from '../../dataplane/allowedips/flat-allowedips.ts';
import { formatPrefix, maskAddress, parseIp, parsePrefix, type Prefix } from '../../dataplane/net/ip.ts';
import { prng } from '../helpers/prng.ts';

interface Peer { readonly name: string }
const peerA: Peer = { name: 'a' };
const peerB: Peer = { name: 'b' };
const peerC: Peer = { name: 'c' };

function tableOf(entries: Array<[string, Peer]>): AllowedIps<Peer> {
  const table = new AllowedIps<Peer>();
  for (const [prefix, peer] of entries) table.insert(parsePrefix(prefix), peer);
  return table;
}

function owner(table: AllowedIps<Peer>, address: string): string | undefined {
  return table.lookup(parseIp(address))?.name;
}

function listed(table: AllowedIps<Peer>, peer: Peer): string[] {
  return table.entriesFor(peer).map(formatPrefix);
}

/** A trie with n entries needs at most 2n − 1 nodes; more means removal left debris behind. */
function assertCompact(table: AllowedIps<unknown>): void {
  const bound = table.size === 0 ? 0 : 2 * table.size - 1;
  assert.ok(table.nodeCount <= bound, `nodeCount ${table.nodeCount} exceeds bound ${bound} for size ${table.size}`);
  if (table.size === 0) assert.equal(table.nodeCount, 0);
}

describe('AllowedIps table', () => {
  test('exact and nested IPv4 prefixes pick the longest match', () => {
    const t = tableOf([
      ['10.0.0.0/8', peerA],
      ['10.1.0.0/16', peerB],
      ['10.1.2.0/24', peerC],
      ['10.1.2.3/32', peerA],
    ]);
    assert.equal(owner(t, '10.9.9.9'), 'a');
    assert.equal(owner(t, '10.1.9.9'), 'b');
    assert.equal(owner(t, '10.1.2.4'), 'c');
    assert.equal(owner(t, '10.1.2.3'), 'a');
    assert.equal(owner(t, '11.0.0.0'), undefined);
    assert.equal(owner(t, '9.255.255.255'), undefined);
    assert.equal(t.size, 4);
    assertCompact(t);
  });

  test('insertion order does not change the answers', () => {
    const t = tableOf([
      ['10.1.2.3/32', peerA],
      ['10.1.2.0/24', peerC],
      ['10.1.0.0/16', peerB],
      ['10.0.0.0/8', peerA],
    ]);
    assert.equal(owner(t, '10.9.9.9'), 'a');
    assert.equal(owner(t, '10.1.9.9'), 'b');
    assert.equal(owner(t, '10.1.2.4'), 'c');
    assert.equal(owner(t, '10.1.2.3'), 'a');
  });

  test('sibling prefixes that split at a common ancestor', () => {
    const t = tableOf([
      ['192.168.4.0/24', peerA],
      ['192.168.5.0/24', peerB],
      ['192.168.6.0/23', peerC],
    ]);
    assert.equal(owner(t, '192.168.4.200'), 'a');
    assert.equal(owner(t, '192.168.5.1'), 'b');
    assert.equal(owner(t, '192.168.6.1'), 'c');
    assert.equal(owner(t, '192.168.7.255'), 'c');
    assert.equal(owner(t, '192.168.8.0'), undefined);
    assert.equal(owner(t, '192.168.3.255'), undefined);
  });

  test('/0 catches everything of its family only', () => {
    const t = tableOf([['0.0.0.0/0', peerA], ['10.0.0.0/8', peerB]]);
    assert.equal(owner(t, '1.2.3.4'), 'a');
    assert.equal(owner(t, '255.255.255.255'), 'a');
    assert.equal(owner(t, '10.0.0.1'), 'b');
    assert.equal(owner(t, '::1'), undefined);
    t.insert(parsePrefix('::/0'), peerC);
    assert.equal(owner(t, '::1'), 'c');
    assert.equal(owner(t, 'ffff::'), 'c');
    assert.equal(owner(t, '1.2.3.4'), 'a');
  });

  test('/32 and /128 host routes match only their address', () => {
    const t = tableOf([['203.0.113.7/32', peerA], ['2001:db8::7/128', peerB]]);
    assert.equal(owner(t, '203.0.113.7'), 'a');
    assert.equal(owner(t, '203.0.113.6'), undefined);
    assert.equal(owner(t, '203.0.113.135'), undefined);
    assert.equal(owner(t, '2001:db8::7'), 'b');
    assert.equal(owner(t, '2001:db8::6'), undefined);
    assert.equal(owner(t, '2001:db8::8007'), undefined);
    assert.equal(owner(t, '2001:db8:0:0:8000::7'), undefined);
  });

  test('nested IPv6 prefixes across word boundaries', () => {
    const t = tableOf([
      ['2001:db8::/32', peerA],
      ['2001:db8:1::/48', peerB],
      ['2001:db8:1:2::/64', peerC],
      ['2001:db8:1:2:8000::/65', peerA],
      ['2001:db8:1:2:0:0:0:1/128', peerB],
    ]);
    assert.equal(owner(t, '2001:db8:ffff::1'), 'a');
    assert.equal(owner(t, '2001:db8:1:ffff::1'), 'b');
    assert.equal(owner(t, '2001:db8:1:2::2'), 'c');
    assert.equal(owner(t, '2001:db8:1:2:8000::2'), 'a');
    assert.equal(owner(t, '2001:db8:1:2::1'), 'b');
    assert.equal(owner(t, '2001:db9::'), undefined);
  });

  test('the address is masked on insert', () => {
    const t = new AllowedIps<Peer>();
    t.insert({ address: parseIp('10.1.2.3'), bits: 8 }, peerA);
    assert.deepEqual(listed(t, peerA), ['10.0.0.0/8']);
    assert.equal(owner(t, '10.200.0.1'), 'a');
  });

  test('inserting an exact prefix of another peer moves it', () => {
    const t = tableOf([['10.0.0.0/24', peerA], ['10.0.1.0/24', peerA], ['10.0.0.0/16', peerC]]);
    t.insert(parsePrefix('10.0.0.0/24'), peerB);
    assert.equal(owner(t, '10.0.0.5'), 'b');
    assert.equal(owner(t, '10.0.1.5'), 'a');
    assert.deepEqual(listed(t, peerA), ['10.0.1.0/24']);
    assert.deepEqual(listed(t, peerB), ['10.0.0.0/24']);
    assert.equal(t.size, 3);
    // The old owner can no longer remove it; the new one can.
    assert.equal(t.remove(parsePrefix('10.0.0.0/24'), peerA), false);
    assert.equal(owner(t, '10.0.0.5'), 'b');
    assert.equal(t.remove(parsePrefix('10.0.0.0/24'), peerB), true);
    assert.equal(owner(t, '10.0.0.5'), 'c');
    assert.deepEqual(listed(t, peerB), []);
    assert.equal(t.size, 2);
    assertCompact(t);
  });

  test('re-inserting a prefix for the same peer is a no-op and keeps its list position', () => {
    const t = tableOf([['10.0.0.0/8', peerA], ['fd00::/8', peerA], ['192.0.2.0/24', peerA]]);
    t.insert(parsePrefix('10.0.0.0/8'), peerA);
    assert.deepEqual(listed(t, peerA), ['10.0.0.0/8', 'fd00::/8', '192.0.2.0/24']);
    assert.equal(t.size, 3);
  });

  test('remove only removes an exact prefix owned by the given peer', () => {
    const t = tableOf([['10.0.0.0/8', peerA], ['10.1.0.0/16', peerB]]);
    assert.equal(t.remove(parsePrefix('10.0.0.0/9'), peerA), false);
    assert.equal(t.remove(parsePrefix('10.0.0.0/8'), peerB), false);
    assert.equal(t.remove(parsePrefix('11.0.0.0/8'), peerA), false);
    assert.equal(t.remove(parsePrefix('10.0.0.0/8'), peerA), true);
    assert.equal(t.remove(parsePrefix('10.0.0.0/8'), peerA), false);
    assert.equal(owner(t, '10.0.0.1'), undefined);
    assert.equal(owner(t, '10.1.0.1'), 'b');
    assert.equal(t.size, 1);
    assertCompact(t);
  });

  test('removing a peerless split point is refused and keeps routing intact', () => {
    const t = tableOf([['10.0.0.0/24', peerA], ['10.0.1.0/24', peerB]]);
    // The trie has a peerless node at 10.0.0.0/23 joining the two; it is not an entry.
    assert.equal(t.remove(parsePrefix('10.0.0.0/23'), peerA), false);
    assert.equal(owner(t, '10.0.0.1'), 'a');
    assert.equal(owner(t, '10.0.1.1'), 'b');
    assert.equal(t.size, 2);
  });

  test('removeByPeer drops all entries of that peer and nothing else', () => {
    const t = tableOf([
      ['10.0.0.0/8', peerA],
      ['10.1.0.0/16', peerB],
      ['10.1.1.0/24', peerA],
      ['fd00::/8', peerA],
      ['fd00:1::/32', peerB],
    ]);
    assert.equal(t.removeByPeer(peerA), 3);
    assert.equal(t.removeByPeer(peerA), 0);
    assert.equal(owner(t, '10.2.0.0'), undefined);
    assert.equal(owner(t, '10.1.1.1'), 'b');
    assert.equal(owner(t, 'fd00:1::1'), 'b');
    assert.equal(owner(t, 'fd00:2::1'), undefined);
    assert.deepEqual(listed(t, peerA), []);
    assert.equal(t.size, 2);
    assertCompact(t);
    t.removeByPeer(peerB);
    assert.equal(t.size, 0);
    assert.equal(t.nodeCount, 0);
  });

  test('entriesFor lists in insertion order across families, and returns copies', () => {
    const order = ['fd00::/64', '10.0.0.0/8', '192.0.2.1/32', '10.5.0.0/16', '::/0', '0.0.0.0/0'];
    const t = tableOf(order.map((p): [string, Peer] => [p, peerA]));
    t.insert(parsePrefix('172.16.0.0/12'), peerB);
    assert.deepEqual(listed(t, peerA), order);
    assert.deepEqual(listed(t, peerB), ['172.16.0.0/12']);
    assert.deepEqual(listed(t, peerC), []);
    const first = t.entriesFor(peerA)[1];
    first.address[0] = 99;
    assert.deepEqual(listed(t, peerA), order);
    // A moved prefix goes to the end of its new owner's list.
    t.insert(parsePrefix('10.0.0.0/8'), peerB);
    assert.deepEqual(listed(t, peerB), ['172.16.0.0/12', '10.0.0.0/8']);
    assert.deepEqual(listed(t, peerA), order.filter((p) => p !== '10.0.0.0/8'));
  });

  test('clear empties everything', () => {
    const t = tableOf([['10.0.0.0/8', peerA], ['::/0', peerB]]);
    t.clear();
    assert.equal(t.size, 0);
    assert.equal(t.nodeCount, 0);
    assert.equal(owner(t, '10.0.0.1'), undefined);
    assert.equal(owner(t, '::1'), undefined);
    assert.deepEqual(listed(t, peerA), []);
    t.insert(parsePrefix('10.0.0.0/8'), peerB);
    assert.equal(owner(t, '10.0.0.1'), 'b');
  });

  test('bad input is rejected with a descriptive error', () => {
    const t = new AllowedIps<Peer>();
    assert.throws(() => t.insert({ address: new Uint8Array(5), bits: 8 }, peerA), /4 or 16 bytes, got 5 bytes/);
    assert.throws(() => t.insert({ address: new Uint8Array(4), bits: 33 }, peerA), /integer 0\.\.32, got 33/);
    assert.throws(() => t.insert({ address: new Uint8Array(16), bits: 129 }, peerA), /integer 0\.\.128, got 129/);
    assert.throws(() => t.insert({ address: new Uint8Array(4), bits: -1 }, peerA), /got -1/);
    assert.throws(() => t.insert({ address: new Uint8Array(4), bits: 1.5 }, peerA), /got 1\.5/);
    assert.throws(() => t.remove({ address: new Uint8Array(4), bits: 40 }, peerA), /AllowedIps\.remove/);
    assert.throws(() => t.insert(parsePrefix('10.0.0.0/8'), undefined as unknown as Peer), /peer must not be undefined/);
    assert.throws(() => t.lookup(new Uint8Array(6)), /4 or 16 bytes, got 6/);
    assert.equal(t.size, 0);
  });
});

/** An IPv4 packet header (20 bytes) at `offset` inside a larger buffer. */
function ipv4Packet(source: string, destination: string, offset = 0, extra = 0): Uint8Array {
  const packet = new Uint8Array(offset + 20 + extra);
  packet[offset] = 0x45;
  packet.set(parseIp(source), offset + 12);
  packet.set(parseIp(destination), offset + 16);
  return packet;
}

function ipv6Packet(source: string, destination: string, offset = 0): Uint8Array {
  const packet = new Uint8Array(offset + 40);
  packet[offset] = 0x60;
  packet.set(parseIp(source), offset + 8);
  packet.set(parseIp(destination), offset + 24);
  return packet;
}

describe('AllowedIps packet lookups', () => {
  const t = tableOf([
    ['10.0.0.0/8', peerA],
    ['10.0.0.2/32', peerB],
    ['fd00::/16', peerA],
    ['fd00::2/128', peerB],
  ]);

  test('IPv4 source and destination', () => {
    const p = ipv4Packet('10.0.0.2', '10.7.7.7');
    assert.equal(t.lookupPacketSource(p)?.name, 'b');
    assert.equal(t.lookupPacketDestination(p)?.name, 'a');
    const q = ipv4Packet('192.0.2.1', '10.0.0.2', 0, 100);
    assert.equal(t.lookupPacketSource(q), undefined);
    assert.equal(t.lookupPacketDestination(q)?.name, 'b');
  });

  test('IPv6 source and destination', () => {
    const p = ipv6Packet('fd00::2', 'fd00::99');
    assert.equal(t.lookupPacketSource(p)?.name, 'b');
    assert.equal(t.lookupPacketDestination(p)?.name, 'a');
    const q = ipv6Packet('2001:db8::1', 'fd00::2');
    assert.equal(t.lookupPacketSource(q), undefined);
    assert.equal(t.lookupPacketDestination(q)?.name, 'b');
  });

  test('packets at an offset inside a larger buffer', () => {
    const p = ipv4Packet('10.0.0.2', '10.0.0.9', 16);
    p.fill(0xff, 0, 16); // bytes before the packet must not be read
    assert.equal(t.lookupPacketSource(p, 16)?.name, 'b');
    assert.equal(t.lookupPacketDestination(p, 16)?.name, 'a');
    const q = ipv6Packet('fd00::7', 'fd00::2', 32);
    assert.equal(t.lookupPacketSource(q, 32)?.name, 'a');
    assert.equal(t.lookupPacketDestination(q, 32)?.name, 'b');
    // A subarray view works the same way as an offset.
    assert.equal(t.lookupPacketDestination(q.subarray(32))?.name, 'b');
  });

  test('short packets give undefined', () => {
    const v4 = ipv4Packet('10.0.0.2', '10.0.0.2');
    assert.equal(t.lookupPacketDestination(v4.subarray(0, 19)), undefined);
    assert.equal(t.lookupPacketSource(v4.subarray(0, 19)), undefined);
    assert.equal(t.lookupPacketDestination(v4.subarray(0, 20))?.name, 'b');
    const v6 = ipv6Packet('fd00::2', 'fd00::2');
    assert.equal(t.lookupPacketDestination(v6.subarray(0, 39)), undefined);
    assert.equal(t.lookupPacketSource(v6.subarray(0, 39)), undefined);
    assert.equal(t.lookupPacketDestination(v6.subarray(0, 40))?.name, 'b');
    assert.equal(t.lookupPacketDestination(new Uint8Array(0)), undefined);
    assert.equal(t.lookupPacketDestination(v4, 1), undefined);
    const withOffset = ipv4Packet('10.0.0.2', '10.0.0.2', 8);
    assert.equal(t.lookupPacketDestination(withOffset.subarray(0, 27), 8), undefined);
    assert.equal(t.lookupPacketDestination(withOffset, 28), undefined);
    assert.equal(t.lookupPacketDestination(withOffset, -1), undefined);
  });

  test('versions other than 4 and 6 give undefined', () => {
    for (const first of [0x00, 0x15, 0x55, 0x75, 0xf6]) {
      const p = ipv6Packet('fd00::2', 'fd00::2');
      p[0] = first;
      assert.equal(t.lookupPacketDestination(p), undefined, `first byte 0x${first.toString(16)}`);
    }
    // The version nibble alone decides the layout: a buffer labelled 4 is read at the IPv4 offsets.
    const p = ipv6Packet('fd00::2', 'fd00::2');
    p[0] = 0x45;
    p.set(parseIp('10.0.0.2'), 16);
    assert.equal(t.lookupPacketDestination(p)?.name, 'b');
  });

  test('the flattened form (flat-allowedips.ts) answers every packet lookup above the same way', () => {
    const numbers = new Map([[peerA, 0], [peerB, 1]]);
    const flat = t.flatten((peer) => numbers.get(peer)!);
    const v4 = ipv4Packet('10.0.0.2', '10.0.0.9', 16);
    const v6 = ipv6Packet('fd00::7', 'fd00::2', 32);
    const odd = ipv6Packet('fd00::2', 'fd00::2');
    odd[0] = 0x15;
    const cases: Array<[Uint8Array, number]> = [
      [ipv4Packet('10.0.0.2', '10.7.7.7'), 0], [ipv4Packet('192.0.2.1', '10.0.0.2', 0, 100), 0], [ipv6Packet('fd00::2', 'fd00::99'), 0],
      [ipv6Packet('2001:db8::1', 'fd00::2'), 0], [v4, 16], [v6, 32], [v4.subarray(0, 35), 16], [v6.subarray(0, 71), 32],
      [v4, -1], [v4, v4.length], [new Uint8Array(0), 0], [odd, 0],
    ];
    for (const [packet, offset] of cases) {
      const number = (peer: Peer | undefined) => (peer === undefined ? -1 : numbers.get(peer));
      assert.equal(flatLookupSource(flat, packet, offset), number(t.lookupPacketSource(packet, offset)), `source at ${offset} of ${packet.length} bytes`);
      assert.equal(flatLookupDestination(flat, packet, offset), number(t.lookupPacketDestination(packet, offset)), `destination at ${offset} of ${packet.length} bytes`);
    }
    assert.throws(() => t.flatten(() => -2), /peer number -2/, 'a peer needs a number');
  });
});

// ---- randomized differential test against a linear longest-prefix search ----

/** A lookup in the flattened form, from an address's bytes. */
function flatLookup(flat: Int32Array, address: Uint8Array): number {
  const word = (at: number) => (address[at] << 24) | (address[at + 1] << 16) | (address[at + 2] << 8) | address[at + 3];
  return address.length === 4 ? flatLookup4(flat, word(0)) : flatLookup6(flat, word(0), word(4), word(8), word(12));
}


function prefixContains(prefix: Prefix, address: Uint8Array): boolean {
  if (prefix.address.length !== address.length) return false;
  const masked = maskAddress(address, prefix.bits);
  for (let i = 0; i < masked.length; i++) if (masked[i] !== prefix.address[i]) return false;
  return true;
}

/** The obviously-correct model: a list of entries, searched linearly. */
class NaiveTable {
  readonly entries = new Map<string, { prefix: Prefix; peer: number }>();
  readonly order = new Map<number, string[]>();
  insert(prefix: Prefix, peer: number): void {
    const key = formatPrefix(prefix);
    const old = this.entries.get(key);
    if (old?.peer === peer) return;
    if (old !== undefined) this.dropFromOrder(old.peer, key);
    this.entries.set(key, { prefix, peer });
    this.order.set(peer, [...(this.order.get(peer) ?? []), key]);
  }
  remove(prefix: Prefix, peer: number): boolean {
    const key = formatPrefix(prefix);
    if (this.entries.get(key)?.peer !== peer) return false;
    this.entries.delete(key);
    this.dropFromOrder(peer, key);
    return true;
  }
  removeByPeer(peer: number): number {
    const keys = this.order.get(peer) ?? [];
    for (const key of keys) this.entries.delete(key);
    this.order.delete(peer);
    return keys.length;
  }
  lookup(address: Uint8Array): number | undefined {
    let best: { prefix: Prefix; peer: number } | undefined;
    for (const entry of this.entries.values()) {
      if (prefixContains(entry.prefix, address) && (best === undefined || entry.prefix.bits > best.prefix.bits)) best = entry;
    }
    return best?.peer;
  }
  private dropFromOrder(peer: number, key: string): void {
    const list = (this.order.get(peer) ?? []).filter((k) => k !== key);
    if (list.length === 0) this.order.delete(peer);
    else this.order.set(peer, list);
  }
}

function runDifferential(seed: number, byteLength: 4 | 16): void {
  const random = prng(seed);
  const int = (n: number) => Math.floor(random() * n);
  const maxBits = byteLength * 8;
  const peers = 24;
  // Prefixes grow from a few random "bases" so that nesting, siblings and exact repeats are common.
  const bases: Uint8Array[] = [];
  for (let i = 0; i < 8; i++) bases.push(Uint8Array.from({ length: byteLength }, () => int(256)));
  const randomAddress = (): Uint8Array => {
    const a = Uint8Array.from(bases[int(bases.length)]);
    const flips = int(4);
    for (let i = 0; i < flips; i++) a[int(byteLength)] ^= 1 << int(8);
    if (random() < 0.2) for (let i = int(byteLength); i < byteLength; i++) a[i] = int(256);
    return a;
  };
  const randomBits = (): number => (random() < 0.05 ? int(3) : random() < 0.1 ? maxBits : int(maxBits + 1));
  const randomPrefix = (): Prefix => {
    const bits = randomBits();
    return { address: maskAddress(randomAddress(), bits), bits };
  };
  const trie = new AllowedIps<number>();
  const naive = new NaiveTable();
  const inserted: Prefix[] = [];
  /** The flattened form other threads read (flat-allowedips.ts), rebuilt when the trie changed. */
  let flat: Int32Array | undefined;
  const compare = (address: Uint8Array, step: string): void => {
    const expected = naive.lookup(address);
    assert.equal(trie.lookup(address), expected, `${step}: lookup of ${Array.from(address).join('.')}`);
    flat ??= trie.flatten((peer) => peer);
    assert.equal(flatLookup(flat, address), expected ?? -1, `${step}: flat lookup of ${Array.from(address).join('.')}`);
  };
  for (let step = 0; step < 4000; step++) {
    const action = random();
    flat = undefined;
    if (action < 0.7) {
      const prefix = randomPrefix();
      const peer = int(peers);
      trie.insert(prefix, peer);
      naive.insert(prefix, peer);
      inserted.push(prefix);
    } else if (action < 0.97 && inserted.length > 0) {
      // Remove a previously inserted prefix, sometimes naming the wrong peer.
      const prefix = inserted[int(inserted.length)];
      const peer = random() < 0.5 ? (naive.entries.get(formatPrefix(prefix))?.peer ?? int(peers)) : int(peers);
      assert.equal(trie.remove(prefix, peer), naive.remove(prefix, peer), `step ${step}: remove ${formatPrefix(prefix)}`);
    } else {
      const peer = int(peers);
      assert.equal(trie.removeByPeer(peer), naive.removeByPeer(peer), `step ${step}: removeByPeer ${peer}`);
    }
    assert.equal(trie.size, naive.entries.size, `step ${step}: size`);
    if (step % 10 === 0) {
      for (let i = 0; i < 10; i++) compare(randomAddress(), `step ${step}`);
      if (inserted.length > 0) {
        // Probe right at the edges of a known prefix: first and last address inside, and just outside.
        const prefix = inserted[int(inserted.length)];
        const last = Uint8Array.from(prefix.address);
        for (let bit = prefix.bits; bit < maxBits; bit++) last[bit >> 3] |= 0x80 >> (bit & 7);
        compare(prefix.address, `step ${step} edge`);
        compare(last, `step ${step} edge`);
      }
    }
  }
  for (let i = 0; i < 3000; i++) compare(randomAddress(), 'final');
  for (let peer = 0; peer < peers; peer++) {
    assert.deepEqual(trie.entriesFor(peer).map(formatPrefix), naive.order.get(peer) ?? [], `entries of peer ${peer}`);
  }
  assertCompact(trie);
  for (let peer = 0; peer < peers; peer++) trie.removeByPeer(peer);
  assert.equal(trie.size, 0);
  assert.equal(trie.nodeCount, 0);
}

describe('AllowedIps randomized differential test', () => {
  const envSeed = process.env.ALLOWEDIPS_SEED;
  const baseSeed = envSeed !== undefined ? Number(envSeed) : (Math.random() * 2 ** 32) >>> 0;
  for (const [family, byteLength] of [['IPv4', 4], ['IPv6', 16]] as const) {
    test(`${family}: trie, and its flattened form for other threads, agree with a linear search`, () => {
      for (let round = 0; round < 3; round++) {
        const seed = (baseSeed + round) >>> 0;
        try {
          runDifferential(seed, byteLength);
        } catch (err) {
          const message = `${family} differential test failed with seed ${seed} (rerun with ALLOWEDIPS_SEED=${seed})`;
          console.error(message);
          throw new Error(`${message}: ${(err as Error).message}`, { cause: err });
        }
      }
    });
  }
});
