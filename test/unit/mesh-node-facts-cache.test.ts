/**
 * desiredMesh reuses what it parsed from a Node object while the object and its resourceVersion
 * stay the same (the informer's cache hands out the same objects every pass); any change the API
 * server makes comes with a new resourceVersion or a new object, and must be seen.
 */
import { before, test } from 'node:test';
import assert from 'node:assert/strict';
import type { Crypto } from '../../dataplane/crypto/primitives.ts';
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import { generatePrivateKey, keyToBase64 } from '../../dataplane/noise/keys.ts';
import { desiredMesh, type MeshOptions } from '../../control/mesh/desired-peers.ts';
import type { NodeObject } from '../../control/mesh/annotations.ts';

let crypto: Crypto;
before(async () => { crypto = await selectCrypto(); });

const self = { nodeName: 'self', publicKey: 'c2VsZi1rZXktbm90LXVzZWQtZm9yLWNyeXB0b2dyYXBoeT0=', podCidrs: ['10.244.0.0/24'], addresses: ['192.0.2.1'] };
const options: MeshOptions = { wgIpFamily: 'ipv4', nativeRouting: { ipv4: false, ipv6: false }, defaultListenPort: 51820, persistentKeepalive: 0 };

function node(rv: string | undefined, key: string, podCidr: string, port: string): NodeObject {
  return {
    metadata: {
      name: 'peer', resourceVersion: rv, creationTimestamp: '2026-01-01T00:00:00Z',
      annotations: { 'roamguard.io/public-key': key, 'roamguard.io/listen-port': port, 'roamguard.io/pod-cidrs': JSON.stringify([podCidr]) },
    },
    spec: { podCIDRs: ['10.244.0.0/16'] },
    status: { addresses: [{ type: 'InternalIP', address: '198.51.100.7' }] },
  };
}

test('a changed resourceVersion, a new object, or no resourceVersion at all: the Node is read afresh', () => {
  const key1 = keyToBase64(crypto.publicKey(generatePrivateKey(crypto)));
  const key2 = keyToBase64(crypto.publicKey(generatePrivateKey(crypto)));
  const peerOf = (n: NodeObject) => [...desiredMesh([n], self, options).peers.values()][0];

  const a = node('5', key1, '10.244.1.0/24', '51820');
  assert.deepEqual(peerOf(a).allowedIps, ['10.244.1.0/24', '198.51.100.7/32']);
  // The same object, changed with a new resourceVersion (as an API update would arrive).
  a.metadata!.annotations!['roamguard.io/pod-cidrs'] = JSON.stringify(['10.244.2.0/24']);
  a.metadata!.annotations!['roamguard.io/listen-port'] = '51999';
  a.metadata!.resourceVersion = '6';
  assert.deepEqual(peerOf(a).allowedIps, ['10.244.2.0/24', '198.51.100.7/32']);
  assert.equal(peerOf(a).endpoint, '198.51.100.7:51999');
  // A new object with the old resourceVersion (a relist): its own content counts.
  const b = node('6', key2, '10.244.3.0/24', '51820');
  assert.equal(peerOf(b).publicKey, key2);
  assert.deepEqual(peerOf(b).allowedIps, ['10.244.3.0/24', '198.51.100.7/32']);
  // Objects made by hand without a resourceVersion are never cached.
  const c = node(undefined, key1, '10.244.4.0/24', '51820');
  peerOf(c);
  c.metadata!.annotations!['roamguard.io/pod-cidrs'] = JSON.stringify(['10.244.5.0/24']);
  assert.deepEqual(peerOf(c).allowedIps, ['10.244.5.0/24', '198.51.100.7/32']);
});
