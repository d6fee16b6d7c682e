/**
 * Node addresses: which interface addresses count as usable, canonical order, and the endpoint
 * choice per family setting. (Real `ip -j addr` output is read in the system test.)
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { parseIp } from '../../dataplane/net/ip.ts';
import {
  globalUnicastAddresses, isUsableUnicast, parseUsableAddresses, selectEndpointAddress, sortAddresses,
} from '../../control/host/node-addresses.ts';
import type { CommandRunner } from '../../control/host/runner.ts';

describe('usable unicast addresses', () => {
  test('classification', () => {
    for (const a of ['10.0.0.1', '192.0.2.1', '100.64.0.1', '203.0.113.9', '2001:db8::1', 'fd00::1', 'fc00::5', '2a00:1450::1']) {
      assert.equal(isUsableUnicast(parseIp(a)), true, a);
    }
    for (const a of ['0.0.0.0', '0.1.2.3', '127.0.0.1', '127.1.2.3', '169.254.1.1', '224.0.0.1', '239.255.255.250', '255.255.255.255',
      '::', '::1', 'fe80::1', 'febf::1', 'ff02::1', '::ffff:10.0.0.1']) {
      assert.equal(isUsableUnicast(parseIp(a)), false, a);
    }
  });

  test('from `ip -j addr` output: global scope, not deprecated, tentative or failed DAD; sorted', () => {
    const json = JSON.stringify([
      { ifname: 'eth0', addr_info: [
        { family: 'inet6', local: '2001:db8::20', prefixlen: 64, scope: 'global' },
        { family: 'inet6', local: '2001:db8::30', prefixlen: 64, scope: 'global', deprecated: true },
        { family: 'inet6', local: '2001:db8::40', prefixlen: 64, scope: 'global', tentative: true },
        { family: 'inet6', local: '2001:db8::50', prefixlen: 64, scope: 'global', dadfailed: true, tentative: true },
        { family: 'inet6', local: 'fe80::1', prefixlen: 64, scope: 'link' },
        { family: 'inet6', local: 'fd12::1', prefixlen: 64, scope: 'global' },
        { family: 'inet', local: '192.0.2.10', prefixlen: 24, scope: 'global' },
        { family: 'inet', local: '10.1.1.1', prefixlen: 8, scope: 'host' },
        { family: 'inet', local: '169.254.3.3', prefixlen: 16, scope: 'global' },
        { family: 'inet', local: '10.0.0.5', prefixlen: 8, scope: 'global' },
      ] },
    ]);
    assert.deepEqual(parseUsableAddresses(json), ['10.0.0.5', '192.0.2.10', '2001:db8::20', 'fd12::1']);
    assert.deepEqual(parseUsableAddresses('[]'), []);
    assert.throws(() => parseUsableAddresses('nope'), /cannot parse `ip -j addr` output/);
  });

  test('globalUnicastAddresses asks `ip` once per interface and merges', async () => {
    const calls: string[] = [];
    const runner: CommandRunner = async (cmd, args) => {
      calls.push([cmd, ...args].join(' '));
      const local = args[4] === 'eth0' ? '192.0.2.10' : '2001:db8::1';
      return { command: '', code: 0, signal: null, stderr: '', stdout: JSON.stringify([{ addr_info: [
        { family: local.includes(':') ? 'inet6' : 'inet', local, prefixlen: 24, scope: 'global' },
        { family: 'inet', local: '192.0.2.10', prefixlen: 24, scope: 'global' },
      ] }]) };
    };
    assert.deepEqual(await globalUnicastAddresses(['eth1', 'eth0'], runner), ['192.0.2.10', '2001:db8::1']);
    assert.deepEqual(calls, ['ip -j addr show dev eth1', 'ip -j addr show dev eth0']);
    await assert.rejects(globalUnicastAddresses(['eth0;reboot'], runner), /bad interface name/);
    const failing: CommandRunner = async () => ({ command: 'ip -j addr show dev nope', code: 1, signal: null, stdout: '', stderr: 'Device "nope" does not exist.' });
    await assert.rejects(globalUnicastAddresses(['nope'], failing), /cannot read the addresses of interface nope: [\s\S]*does not exist/);
  });
});

describe('selectEndpointAddress', () => {
  const addresses = ['fd00::9', '2001:db8::1', '192.0.2.10', '10.0.0.5'];

  test('first of the family in canonical order; dualstack prefers IPv4', () => {
    assert.equal(selectEndpointAddress(addresses, 'ipv4'), '10.0.0.5');
    assert.equal(selectEndpointAddress(addresses, 'ipv6'), '2001:db8::1');
    assert.equal(selectEndpointAddress(addresses, 'dualstack'), '10.0.0.5');
    assert.equal(selectEndpointAddress(['fd00::9', '2001:DB8::1'], 'dualstack'), '2001:db8::1', 'falls back to IPv6');
  });

  test('nothing of the family → undefined; bad input → error', () => {
    assert.equal(selectEndpointAddress(['10.0.0.5'], 'ipv6'), undefined);
    assert.equal(selectEndpointAddress([], 'dualstack'), undefined);
    assert.throws(() => selectEndpointAddress(addresses, 'both' as never), /must be ipv4, ipv6 or dualstack/);
    assert.throws(() => selectEndpointAddress(['10.0.0.300'], 'ipv4'), /not a numeric IP address/);
  });

  test('sortAddresses: numeric order, IPv4 first, duplicates removed', () => {
    assert.deepEqual(sortAddresses(['10.0.0.10', '10.0.0.9', '::1', '10.0.0.9', '0:0::1']), ['10.0.0.9', '10.0.0.10', '::1']);
  });
});
