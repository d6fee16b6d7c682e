/**
 * CIDR lists: strict parsing, canonical order, de-duplication, summarizing (checked against a
 * brute-force address coverage on random inputs), family split and the gateway address.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { formatPrefix, maskAddress, parseIp, type Prefix } from '../../dataplane/net/ip.ts';
import {
  canonicalCidrs, cidrFamily, comparePrefixes, gatewayOf, parseCidr, parseCidrList, prefixContains,
  prefixContainsAddress, prefixesOverlap, splitCidrsByFamily, summarizeCidrs, summarizePrefixes,
} from '../../control/host/cidrs.ts';
import { prng } from '../helpers/prng.ts';

describe('parseCidr', () => {
  test('accepts canonical and non-canonical spellings, returns the masked prefix', () => {
    assert.equal(formatPrefix(parseCidr('10.244.1.0/24')), '10.244.1.0/24');
    assert.equal(formatPrefix(parseCidr('  FD00:10:244:1:0::/64 ')), 'fd00:10:244:1::/64');
    assert.equal(formatPrefix(parseCidr('0.0.0.0/0')), '0.0.0.0/0');
    assert.equal(formatPrefix(parseCidr('192.0.2.7/32')), '192.0.2.7/32');
  });

  test('refuses what is not a CIDR, saying why', () => {
    assert.throws(() => parseCidr('10.244.1.0'), /prefix length .* is missing/);
    assert.throws(() => parseCidr('10.244.1.5/24'), /host bits set; the network is 10\.244\.1\.0\/24/);
    assert.throws(() => parseCidr('10.244.1.0/33'), /prefix length must be 0\.\.32/);
    assert.throws(() => parseCidr('fd00::/129'), /prefix length must be 0\.\.128/);
    assert.throws(() => parseCidr('10.244.1.0/'), /prefix length/);
    assert.throws(() => parseCidr('10.244.1.0/2a'), /prefix length/);
    assert.throws(() => parseCidr('pods/24'), /"pods" is not a numeric IP address/);
    assert.throws(() => parseCidr('10.1/16'), /not a numeric IP address/);
    assert.throws(() => parseCidr('::ffff:10.0.0.0/104'), /IPv4-mapped/);
    assert.throws(() => parseCidr(42 as unknown as string), /must be a string/);
  });

  test('parseCidrList names every bad entry at once', () => {
    assert.throws(() => parseCidrList(['10.0.0.0/8', 'x', '10.0.0.1/8'], 'spec.podCIDRs'), (err: Error) => {
      assert.match(err.message, /^bad spec\.podCIDRs:/);
      assert.match(err.message, /\[1\] "x"/);
      assert.match(err.message, /\[2\] "10\.0\.0\.1\/8" has host bits set/);
      assert.doesNotMatch(err.message, /\[0\]/);
      return true;
    });
  });
});

describe('canonical order', () => {
  test('IPv4 before IPv6, then address, then length; duplicates removed', () => {
    const input = ['fd00::/64', '10.244.2.0/24', '10.244.0.0/16', '2001:db8::/32', '10.244.2.0/24', '9.0.0.0/8', 'FD00:0::/64', '10.244.0.0/24'];
    assert.deepEqual(canonicalCidrs(input), ['9.0.0.0/8', '10.244.0.0/16', '10.244.0.0/24', '10.244.2.0/24', '2001:db8::/32', 'fd00::/64']);
  });

  test('the order does not depend on the input order', () => {
    const input = ['fd00:1::/64', '10.1.0.0/16', '10.0.0.0/16', 'fd00::/64', '172.16.0.0/12'];
    const expected = canonicalCidrs(input);
    const random = prng(7);
    for (let i = 0; i < 20; i++) {
      const shuffled = [...input].sort(() => random() - 0.5);
      assert.deepEqual(canonicalCidrs(shuffled), expected);
    }
  });

  test('comparePrefixes compares numerically, not as text', () => {
    assert.ok(comparePrefixes(parseCidr('9.0.0.0/8'), parseCidr('10.0.0.0/8')) < 0);
    assert.ok(comparePrefixes(parseCidr('255.0.0.0/8'), parseCidr('::/0')) < 0);
    assert.equal(comparePrefixes(parseCidr('10.0.0.0/8'), parseCidr('10.0.0.0/8')), 0);
  });
});

describe('summarize', () => {
  test('drops covered prefixes and merges siblings, repeatedly', () => {
    assert.deepEqual(summarizeCidrs(['10.244.0.0/16', '10.244.3.0/24']), ['10.244.0.0/16']);
    assert.deepEqual(summarizeCidrs(['10.244.0.0/25', '10.244.0.128/25']), ['10.244.0.0/24']);
    assert.deepEqual(summarizeCidrs(['10.0.0.0/24', '10.0.1.0/24', '10.0.2.0/24', '10.0.3.0/24']), ['10.0.0.0/22']);
    assert.deepEqual(summarizeCidrs(['10.0.3.0/24', '10.0.2.0/23', '10.0.0.0/23']), ['10.0.0.0/22']);
    assert.deepEqual(summarizeCidrs(['fd00::/65', 'fd00:0:0:0:8000::/65', 'fd00:0:0:1::/64']), ['fd00::/63']);
  });

  test('keeps neighbours that are not siblings, and families apart', () => {
    assert.deepEqual(summarizeCidrs(['10.0.1.0/24', '10.0.2.0/24']), ['10.0.1.0/24', '10.0.2.0/24']);
    assert.deepEqual(summarizeCidrs(['0.0.0.0/1', '128.0.0.0/1', '::/1', '8000::/1']), ['0.0.0.0/0', '::/0']);
    assert.deepEqual(summarizeCidrs(['10.0.0.0/24', '10.0.0.0/24']), ['10.0.0.0/24']);
    assert.deepEqual(summarizeCidrs([]), []);
  });

  test('covers exactly the same addresses and is minimal (random lists in a /24)', () => {
    const random = prng(20260601);
    for (let round = 0; round < 300; round++) {
      const prefixes: Prefix[] = [];
      const count = 1 + Math.floor(random() * 8);
      for (let i = 0; i < count; i++) {
        const bits = 24 + Math.floor(random() * 9);
        const last = Math.floor(random() * 256);
        prefixes.push(parseCidr(`10.0.0.${last & (bits === 24 ? 0 : (0xff << (32 - bits)) & 0xff)}/${bits}`));
      }
      const summary = summarizePrefixes(prefixes);
      const label = `${prefixes.map(formatPrefix).join(' ')} → ${summary.map(formatPrefix).join(' ')}`;
      for (let host = 0; host < 256; host++) {
        const address = parseIp(`10.0.0.${host}`);
        const before = prefixes.some((p) => prefixContainsAddress(p, address));
        const after = summary.filter((p) => prefixContainsAddress(p, address)).length;
        assert.equal(after, before ? 1 : 0, `${label}: 10.0.0.${host}`);
      }
      for (let i = 0; i < summary.length; i++) {
        if (i > 0) assert.ok(comparePrefixes(summary[i - 1], summary[i]) < 0, `${label}: not sorted`);
        for (let j = i + 1; j < summary.length; j++) {
          const a = summary[i], b = summary[j];
          const parent = (p: Prefix) => formatPrefix({ address: maskAddress(p.address, p.bits - 1), bits: p.bits - 1 });
          const siblings = a.bits === b.bits && a.bits > 0 && parent(a) === parent(b);
          assert.ok(!siblings, `${label}: ${formatPrefix(a)} and ${formatPrefix(b)} should have been merged`);
        }
      }
    }
  });
});

describe('families, containment, gateways', () => {
  test('split by family keeps each canonical', () => {
    assert.deepEqual(splitCidrsByFamily(['fd00::/64', '10.1.0.0/16', '10.0.0.0/16', '10.0.0.0/16']), {
      v4: ['10.0.0.0/16', '10.1.0.0/16'], v6: ['fd00::/64'],
    });
    assert.deepEqual(splitCidrsByFamily([]), { v4: [], v6: [] });
    assert.equal(cidrFamily('10.0.0.0/8'), 4);
    assert.equal(cidrFamily('fd00::/8'), 6);
  });

  test('containment and overlap', () => {
    assert.ok(prefixContains(parseCidr('10.0.0.0/8'), parseCidr('10.244.0.0/16')));
    assert.ok(!prefixContains(parseCidr('10.244.0.0/16'), parseCidr('10.0.0.0/8')));
    assert.ok(!prefixContains(parseCidr('::/0'), parseCidr('10.0.0.0/8')), 'families never contain each other');
    assert.ok(prefixesOverlap(parseCidr('10.244.0.0/16'), parseCidr('10.0.0.0/8')));
    assert.ok(!prefixesOverlap(parseCidr('10.244.0.0/16'), parseCidr('10.245.0.0/16')));
  });

  test('gateway = network address + 1; too-small CIDRs are refused', () => {
    assert.equal(gatewayOf('10.244.1.0/24'), '10.244.1.1');
    assert.equal(gatewayOf('10.244.0.0/16'), '10.244.0.1');
    assert.equal(gatewayOf('10.244.1.4/30'), '10.244.1.5');
    assert.equal(gatewayOf('fd00:10:244:1::/64'), 'fd00:10:244:1::1');
    assert.equal(gatewayOf('2001:db8::/126'), '2001:db8::1');
    assert.throws(() => gatewayOf('10.244.1.0/31'), /too small for pods.*at most \/30/);
    assert.throws(() => gatewayOf('fd00::/127'), /at most \/126/);
  });
});
