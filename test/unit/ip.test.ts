import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { formatIp, formatPrefix, maskAddress, parseIp, parsePrefix } from '../../dataplane/net/ip.ts';
import { Endpoint } from '../../dataplane/net/endpoint.ts';

describe('IP addresses and prefixes', () => {
  test('round trips in canonical form', () => {
    for (const [input, canonical] of [
      ['10.1.2.3', '10.1.2.3'], ['::', '::'], ['::1', '::1'], ['FD00:0:0:0:0:0:0:1', 'fd00::1'],
      ['2001:db8:0:0:1:0:0:1', '2001:db8::1:0:0:1'], ['2001:db8:1:2:3:4:5:6', '2001:db8:1:2:3:4:5:6'],
      ['::ffff:192.0.2.1', '::ffff:192.0.2.1'], ['fe80::1:2', 'fe80::1:2'], ['1::', '1::'],
    ]) assert.equal(formatIp(parseIp(input)), canonical, input);
  });

  test('prefixes are masked; bad input is refused with the reason', () => {
    assert.equal(formatPrefix(parsePrefix('10.1.2.3/8')), '10.0.0.0/8');
    assert.equal(formatPrefix(parsePrefix('fd00::1:2/64')), 'fd00::/64');
    assert.equal(formatPrefix(parsePrefix('10.1.2.3')), '10.1.2.3/32');
    assert.throws(() => parsePrefix('10.0.0.0/33'), /bad prefix length/);
    assert.throws(() => parsePrefix('10.0.0.0/-1'), /bad prefix length/);
    assert.throws(() => parseIp('example.com'), /not a numeric IP address/);
    assert.throws(() => parseIp('fe80::1%eth0'), /not a numeric IP address/);
    assert.throws(() => maskAddress(new Uint8Array(4), 40), /out of range/);
  });

  test('endpoints: ip:port and [ipv6]:port only', () => {
    assert.equal(Endpoint.parse('192.0.2.1:51820').toString(), '192.0.2.1:51820');
    assert.equal(Endpoint.parse('[FD00::1]:1').toString(), '[fd00::1]:1');
    assert.ok(Endpoint.parse('[fd00::1]:1').equals(new Endpoint('fd00:0::1', 1)));
    for (const bad of ['192.0.2.1', 'fd00::1:51820', '[fd00::1]', 'host:1', '1.2.3.4:65536', '1.2.3.4:x', '[1.2.3.4]:1x']) {
      assert.throws(() => Endpoint.parse(bad), /bad endpoint|bad UDP port/, bad);
    }
  });
});
