/** PrefixOwners: which nodes name which prefixes, checked against scanning a list (adds and removes in random order). */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { formatPrefix, parsePrefix, type Prefix } from '../../dataplane/net/ip.ts';
import { prefixesOverlap } from '../../control/mesh/claims.ts';
import { PrefixOwners } from '../../control/mesh/prefix-owners.ts';
import { prng } from '../helpers/prng.ts';

test('overlaps by another owner: containing, contained and equal prefixes; the asking owner and other families never count', () => {
  const owners = new PrefixOwners();
  owners.add(parsePrefix('10.244.0.0/16'), 'wide');
  owners.add(parsePrefix('10.244.3.0/24'), 'n3');
  owners.add(parsePrefix('fd00:244:3::/64'), 'n3');
  assert.equal(owners.overlapsOtherThan(parsePrefix('10.244.3.0/24'), 'n3'), true, 'the /16 of another owner contains it');
  assert.equal(owners.overlapsOtherThan(parsePrefix('10.244.0.0/16'), 'wide'), true, 'a /24 of another owner lies within it');
  assert.equal(owners.overlapsOtherThan(parsePrefix('fd00:244:3::1/128'), 'n3'), false, 'only its own prefix');
  assert.equal(owners.overlapsOtherThan(parsePrefix('::/0'), 'x'), true);
  assert.equal(owners.overlapsOtherThan(parsePrefix('10.245.0.0/16'), 'x'), false);
  owners.remove(parsePrefix('10.244.0.0/16'), 'wide');
  assert.equal(owners.overlapsOtherThan(parsePrefix('10.244.3.0/24'), 'n3'), false, 'gone with its removal');
  owners.add(parsePrefix('10.244.3.0/24'), 'n3');
  owners.remove(parsePrefix('10.244.3.0/24'), 'n3');
  assert.equal(owners.overlapsOtherThan(parsePrefix('10.244.0.0/16'), 'x'), true, 'an owner that named a prefix twice still names it after one removal');
  owners.remove(parsePrefix('10.244.3.0/24'), 'someone-else');
  assert.equal(owners.overlapsOtherThan(parsePrefix('10.244.0.0/16'), 'x'), true, 'removing what an owner never added changes nothing');
});

test('always answers as scanning the list would, over random adds and removes of both families', () => {
  const random = prng(11);
  const randomPrefix = (): Prefix => {
    const v6 = random() < 0.3;
    const address = new Uint8Array(v6 ? 16 : 4);
    address[0] = v6 ? 0xfd : 10;
    for (let i = 1; i < address.length; i++) address[i] = i < 3 ? Math.floor(random() * 8) : Math.floor(random() * 256);
    const lengths = v6 ? [0, 32, 48, 64, 80, 128] : [0, 8, 16, 20, 24, 32];
    const bits = lengths[Math.floor(random() * lengths.length)];
    return parsePrefix(`${formatPrefix({ address, bits: address.length * 8 }).split('/')[0]}/${bits}`);
  };
  const owners = new PrefixOwners();
  const list: Array<{ prefix: Prefix; owner: string }> = [];
  for (let step = 0; step < 6000; step++) {
    const roll = random();
    if (roll < 0.4 || list.length === 0) {
      const entry = { prefix: randomPrefix(), owner: `n${Math.floor(random() * 6)}` };
      list.push(entry);
      owners.add(entry.prefix, entry.owner);
    } else if (roll < 0.7) {
      const [entry] = list.splice(Math.floor(random() * list.length), 1);
      owners.remove(entry.prefix, entry.owner);
    } else {
      const query = randomPrefix();
      const asking = `n${Math.floor(random() * 6)}`;
      const expected = list.some((e) => e.owner !== asking && prefixesOverlap(e.prefix, query));
      assert.equal(owners.overlapsOtherThan(query, asking), expected, `step ${step}: ${formatPrefix(query)} asked by ${asking}`);
    }
  }
});
