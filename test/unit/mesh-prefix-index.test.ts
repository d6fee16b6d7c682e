import { test } from 'node:test';
import assert from 'node:assert/strict';
import { formatPrefix, parsePrefix, type Prefix } from '../../dataplane/net/ip.ts';
import { prefixesOverlap } from '../../control/mesh/claims.ts';
import { PrefixIndex } from '../../control/mesh/prefix-index.ts';

test('the first overlapping prefix: containing ones, contained ones, exact ones, in the order they were added', () => {
  const index = new PrefixIndex<string>();
  index.add(parsePrefix('10.244.0.0/16'), 'wide');
  index.add(parsePrefix('10.244.3.0/24'), 'node-3');
  index.add(parsePrefix('10.244.3.0/24'), 'node-3-again');
  index.add(parsePrefix('10.250.0.0/24'), 'node-9');
  index.add(parsePrefix('fd00:244:3::/64'), 'node-3-v6');
  assert.equal(index.size, 5);
  assert.equal(index.firstOverlapping(parsePrefix('10.244.3.7/32')), 'wide', 'a containing prefix added first wins');
  assert.equal(index.firstOverlapping(parsePrefix('10.250.0.0/16')), 'node-9', 'a prefix within the query overlaps it');
  assert.equal(index.firstOverlapping(parsePrefix('10.0.0.0/8')), 'wide');
  assert.equal(index.firstOverlapping(parsePrefix('10.251.0.0/16')), undefined);
  assert.equal(index.firstOverlapping(parsePrefix('0.0.0.0/0')), 'wide', 'everything of the family overlaps /0');
  assert.equal(index.firstOverlapping(parsePrefix('fd00:244:3::1/128')), 'node-3-v6');
  assert.equal(index.firstOverlapping(parsePrefix('::/0')), 'node-3-v6', 'families never mix');
  assert.equal(index.firstOverlapping(parsePrefix('fd00:244:4::/64')), undefined);
  assert.equal(new PrefixIndex<string>().firstOverlapping(parsePrefix('10.0.0.0/8')), undefined);
});

test('always names the same entry as scanning the list in order (random prefixes of both families)', () => {
  let seed = 7;
  const random = () => { seed = (seed * 1103515245 + 12345) & 0x7fffffff; return seed / 0x7fffffff; };
  const randomPrefix = (minBits: number): Prefix => {
    const v6 = random() < 0.3;
    const address = new Uint8Array(v6 ? 16 : 4);
    // Few distinct leading bytes, so overlaps are common.
    address[0] = v6 ? 0xfd : 10;
    for (let i = 1; i < address.length; i++) address[i] = i < 3 ? Math.floor(random() * 16) : Math.floor(random() * 256);
    const bits = v6 ? minBits + Math.floor(random() * (129 - minBits)) : minBits + Math.floor(random() * (33 - minBits));
    return parsePrefix(`${formatPrefix({ address, bits: address.length * 8 }).split('/')[0]}/${bits}`);
  };
  const list: Array<{ prefix: Prefix; name: string }> = [];
  const index = new PrefixIndex<{ prefix: Prefix; name: string }>();
  for (let i = 0; i < 400; i++) {
    const entry = { prefix: randomPrefix(20), name: `n${i}` };
    list.push(entry);
    index.add(entry.prefix, entry);
  }
  let hits = 0;
  for (let q = 0; q < 3000; q++) {
    const query = randomPrefix(8);
    const scanned = list.find((e) => prefixesOverlap(e.prefix, query));
    if (scanned) hits++;
    assert.equal(index.firstOverlapping(query)?.name, scanned?.name, `query ${formatPrefix(query)}`);
  }
  assert.ok(hits > 100 && hits < 2900, `the queries should both hit and miss (${hits} hits of 3000)`);
});
