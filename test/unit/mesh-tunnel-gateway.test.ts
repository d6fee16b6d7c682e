/**
 * A peer's tunnel gateway address (control/mesh/tunnel-gateway.ts), where path-MTU and relay
 * probes go: network + 1 of its first pod CIDR that the tunnel routes.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { keyFromBase64, keyToBase64 } from '../../dataplane/noise/keys.ts';
import type { DesiredPeer } from '../../control/mesh/desired-peers.ts';
import { probeAddress } from '../../control/mesh/tunnel-gateway.ts';

function peer(allowedIps: string[]): DesiredPeer {
  const key = keyToBase64(randomBytes(32));
  return { nodeName: 'n', publicKey: key, publicKeyBytes: keyFromBase64(key), addresses: [], allowedIps, persistentKeepalive: 25 };
}

describe('tunnel gateway address', () => {
  const routed = new Set(['10.244.2.0/24', 'fd00:10:244:2::/64', 'fd00:10:244:3::/64', '10.244.9.0/31', 'fd00:10:244:9::/127']);

  test('the gateway of the first routed pod CIDR (IPv4 first); node addresses and unrouted CIDRs are passed over', () => {
    assert.equal(probeAddress(peer(['10.244.2.0/24', '203.0.113.20/32', 'fd00:10:244:2::/64']), routed), '10.244.2.1');
    assert.equal(probeAddress(peer(['203.0.113.20/32', 'fd00:10:244:3::/64']), routed), 'fd00:10:244:3::1');
    assert.equal(probeAddress(peer(['10.244.4.0/24']), routed), undefined, 'natively routed: no tunnel route');
  });

  test('a routed prefix too small to hold a gateway is passed over, not an error', () => {
    assert.equal(probeAddress(peer(['10.244.9.0/31', 'fd00:10:244:2::/64']), routed), 'fd00:10:244:2::1');
    assert.equal(probeAddress(peer(['10.244.9.0/31', 'fd00:10:244:9::/127']), routed), undefined);
  });

  test('asked again, the same answer (remembered per CIDR)', () => {
    const p = peer(['10.244.2.0/24']);
    assert.equal(probeAddress(p, routed), probeAddress(p, routed));
  });
});
