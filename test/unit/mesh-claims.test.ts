/**
 * What a Node may claim (control/mesh/claims.ts) and how desiredMesh applies it: pod CIDRs within
 * the node's spec (or the allow-list for a family without one), never over reserved ranges, node
 * addresses or other nodes' CIDRs; node addresses never inside a pod CIDR. One refused claim
 * leaves the node's other claims, and every other node, as they were.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { keyToBase64 } from '../../dataplane/noise/keys.ts';
import { parseIp, parsePrefix } from '../../dataplane/net/ip.ts';
import { ANNOTATION, formatOwnAnnotations, type NodeObject } from '../../control/mesh/annotations.ts';
import { desiredMesh, type MeshOptions, type SelfView } from '../../control/mesh/desired-peers.ts';
import { nodeIpRefusal, podCidrRefusal, prefixContains, prefixesOverlap } from '../../control/mesh/claims.ts';

const newKey = () => keyToBase64(randomBytes(32));
const options: MeshOptions = { wgIpFamily: 'ipv4', nativeRouting: { ipv4: false, ipv6: false }, defaultListenPort: 51820, persistentKeepalive: 25 };
const self: SelfView = { nodeName: 'node-1', publicKey: newKey(), podCidrs: ['10.244.1.0/24', 'fd00:244:1::/64'], addresses: ['10.77.0.1', 'fd77::1'] };

interface Spec { name: string; claims?: string[]; spec?: string[]; nodeIps?: string[]; ip?: string; created?: string }
function node(s: Spec): NodeObject {
  return {
    metadata: {
      name: s.name, creationTimestamp: s.created ?? '2026-01-01T00:00:00Z',
      annotations: formatOwnAnnotations({ publicKey: newKey(), listenPort: 51820, podCidrs: s.claims ?? s.spec ?? [], nodeIps: s.nodeIps ?? [] }),
    },
    spec: s.spec === undefined ? undefined : { podCIDRs: s.spec },
    status: { addresses: s.ip ? [{ type: 'InternalIP', address: s.ip }] : [] },
  };
}
const peerOf = (mesh: ReturnType<typeof desiredMesh>, name: string) => [...mesh.peers.values()].find((p) => p.nodeName === name);

describe('claims: the prefix rules', () => {
  test('containment and overlap, per family', () => {
    assert.ok(prefixContains(parsePrefix('10.244.0.0/16'), parsePrefix('10.244.3.0/24')));
    assert.ok(!prefixContains(parsePrefix('10.244.3.0/24'), parsePrefix('10.244.0.0/16')));
    assert.ok(prefixesOverlap(parsePrefix('10.244.3.0/24'), parsePrefix('10.244.0.0/16')));
    assert.ok(!prefixesOverlap(parsePrefix('10.244.3.0/24'), parsePrefix('10.244.4.0/24')));
    assert.ok(!prefixesOverlap(parsePrefix('10.0.0.0/8'), parsePrefix('fd00::/8')), 'families never overlap');
  });

  test('a pod CIDR: within spec, else within the allow-list; reserved ranges only where spec or allow-list cover them', () => {
    const none = { spec: [], allowed: [], nodeAddresses: [], held: [] };
    const spec = [parsePrefix('10.244.3.0/24')];
    assert.equal(podCidrRefusal(parsePrefix('10.244.3.0/24'), { ...none, spec }), undefined);
    assert.match(podCidrRefusal(parsePrefix('10.244.4.0/24'), { ...none, spec })!, /not within this node's spec.podCIDRs \(10.244.3.0\/24\)/);
    assert.match(podCidrRefusal(parsePrefix('8.0.0.0/8'), { ...none, spec })!, /not within this node's spec/);
    assert.match(podCidrRefusal(parsePrefix('169.254.0.0/16'), { ...none, spec })!, /link-local range 169.254.0.0\/16/);
    assert.match(podCidrRefusal(parsePrefix('fe80::/64'), none)!, /link-local/);
    assert.match(podCidrRefusal(parsePrefix('127.0.0.0/8'), none)!, /loopback/);
    assert.match(podCidrRefusal(parsePrefix('224.0.0.0/8'), none)!, /multicast/);
    assert.match(podCidrRefusal(parsePrefix('192.0.2.0/24'), none)!, /documentation/);
    assert.match(podCidrRefusal(parsePrefix('2001:db8:5::/64'), none)!, /documentation/);
    assert.match(podCidrRefusal(parsePrefix('10.250.0.0/24'), none)!, /POD_CIDR_ALLOWED_RANGES allows none/);
    // The spec of the other family does not bound this one: the allow-list does.
    const allowed = [parsePrefix('10.250.0.0/16'), parsePrefix('192.0.2.0/24')];
    assert.equal(podCidrRefusal(parsePrefix('10.250.3.0/24'), { ...none, spec: [parsePrefix('fd00:244:3::/64')], allowed }), undefined);
    assert.match(podCidrRefusal(parsePrefix('10.251.3.0/24'), { ...none, allowed })!, /not within POD_CIDR_ALLOWED_RANGES \(10.250.0.0\/16, 192.0.2.0\/24\)/);
    assert.equal(podCidrRefusal(parsePrefix('192.0.2.0/25'), { ...none, allowed }), undefined, 'an allow-list entry covering a documentation range allows it');
    assert.equal(podCidrRefusal(parsePrefix('198.51.100.0/24'), { ...none, spec: [parsePrefix('198.51.100.0/24')] }), undefined, 'so does the spec');
    assert.ok(podCidrRefusal(parsePrefix('10.250.3.0/24'), { ...none, spec: [parsePrefix('10.244.3.0/24')], allowed }), 'with a spec of that family, the allow-list does not widen it');
  });

  test('a pod CIDR never covers a node address or another node\'s CIDR', () => {
    const spec = [parsePrefix('192.168.1.0/24'), parsePrefix('10.244.0.0/16')];
    const ctx = { spec, allowed: [], nodeAddresses: [{ address: parseIp('192.168.1.20'), node: 'lan-node' }], held: [{ prefix: parsePrefix('10.244.3.0/24'), node: 'node-3' }] };
    assert.match(podCidrRefusal(parsePrefix('192.168.1.0/24'), ctx)!, /covers an address of node lan-node/);
    assert.match(podCidrRefusal(parsePrefix('10.244.3.128/25'), ctx)!, /overlaps a pod CIDR of node node-3/);
    assert.equal(podCidrRefusal(parsePrefix('10.244.4.0/24'), ctx), undefined);
  });

  test('a node address: global unicast, outside every pod CIDR and the allow-list', () => {
    const ctx = { podCidrs: [{ prefix: parsePrefix('10.244.3.0/24'), node: 'node-3' }], allowed: [parsePrefix('10.250.0.0/16')] };
    assert.equal(nodeIpRefusal(parseIp('10.77.0.5'), ctx), undefined);
    assert.equal(nodeIpRefusal(parseIp('203.0.113.5'), ctx), undefined, 'documentation ranges are fine as node addresses (labs use them)');
    assert.match(nodeIpRefusal(parseIp('10.244.3.7'), ctx)!, /inside a pod CIDR of node node-3/);
    assert.match(nodeIpRefusal(parseIp('10.250.1.1'), ctx)!, /inside POD_CIDR_ALLOWED_RANGES/);
    for (const bad of ['127.0.0.1', '169.254.1.1', '224.0.0.5', '0.0.0.0', '255.255.255.255', '::', '::1', 'fe80::1', 'ff02::1', '::ffff:10.0.0.1']) {
      assert.match(nodeIpRefusal(parseIp(bad), ctx)!, /not global unicast/, bad);
    }
  });
});

describe('claims: applied to the mesh', () => {
  test('a hostile node\'s refused claims are left out one by one; its legitimate ones and everyone else stay', () => {
    const lan = node({ name: 'node-2', spec: ['10.244.2.0/24'], ip: '192.168.1.20' });
    const third = node({ name: 'node-3', spec: ['10.244.3.0/24'], ip: '10.77.0.3', created: '2026-02-01T00:00:00Z' });
    const hostile = node({
      name: 'node-4', spec: ['10.244.4.0/24'], ip: '10.77.0.4', created: '2026-01-02T00:00:00Z', // older than node-3: age buys nothing
      claims: ['10.244.4.0/24', '10.244.3.0/24', '169.254.0.0/16', '192.168.1.0/24', '8.0.0.0/8'],
      nodeIps: ['10.77.0.4', '10.244.3.5', '10.244.1.9', '169.254.9.9'],
    });
    const mesh = desiredMesh([lan, third, hostile], self, options);
    assert.deepEqual(mesh.rejected, []);
    assert.deepEqual(peerOf(mesh, 'node-4')?.allowedIps, ['10.77.0.4/32', '10.244.4.0/24'], 'only what the cluster gave it');
    assert.deepEqual(peerOf(mesh, 'node-3')?.allowedIps, ['10.77.0.3/32', '10.244.3.0/24'], 'the victim keeps its range');
    assert.deepEqual(peerOf(mesh, 'node-2')?.allowedIps, ['10.244.2.0/24', '192.168.1.20/32']);
    const refused = mesh.refused!.filter((r) => r.node === 'node-4');
    assert.deepEqual(refused.map((r) => `${r.field} ${r.claim}`).sort(), [
      `${ANNOTATION.nodeIps} 10.244.1.9`, `${ANNOTATION.nodeIps} 10.244.3.5`, `${ANNOTATION.nodeIps} 169.254.9.9`,
      `${ANNOTATION.podCidrs} 10.244.3.0/24`, `${ANNOTATION.podCidrs} 169.254.0.0/16`, `${ANNOTATION.podCidrs} 192.168.1.0/24`, `${ANNOTATION.podCidrs} 8.0.0.0/8`,
    ]);
    assert.ok(refused.every((r) => r.reason.startsWith(r.claim)), 'each reason names the claim');
    assert.deepEqual(mesh.clusterPodCidrs, ['10.244.1.0/24', '10.244.2.0/24', '10.244.3.0/24', '10.244.4.0/24', 'fd00:244:1::/64']);
    assert.deepEqual(mesh.refused!.filter((r) => r.node !== 'node-4'), [], 'nobody else loses anything');
  });

  test('file source: a family without spec takes its pod CIDRs from the allow-list only', () => {
    const fileNode = node({ name: 'node-5', spec: ['fd00:244:5::/64'], claims: ['10.250.5.0/24', 'fd00:244:5::/64'], ip: '10.77.0.5' });
    const refusedWithout = desiredMesh([fileNode], self, options);
    assert.deepEqual(peerOf(refusedWithout, 'node-5')?.allowedIps, ['10.77.0.5/32', 'fd00:244:5::/64']);
    assert.match(refusedWithout.refused![0].reason, /no spec.podCIDRs of that family/);
    const allowed = desiredMesh([fileNode], self, { ...options, podCidrAllowedRanges: ['10.250.0.0/16'] });
    assert.deepEqual(peerOf(allowed, 'node-5')?.allowedIps, ['10.77.0.5/32', '10.250.5.0/24', 'fd00:244:5::/64']);
    assert.deepEqual(allowed.refused, []);
  });

  test('a node address equal to another node\'s pod IP is refused, whichever node is older', () => {
    const younger = node({ name: 'b', spec: ['10.244.7.0/24'], ip: '10.77.0.7', created: '2026-03-01T00:00:00Z' });
    const older = node({ name: 'a', spec: ['10.244.6.0/24'], ip: '10.77.0.6', nodeIps: ['10.244.7.10'], created: '2026-01-01T00:00:00Z' });
    const mesh = desiredMesh([younger, older], self, options);
    assert.deepEqual(peerOf(mesh, 'a')?.allowedIps, ['10.77.0.6/32', '10.244.6.0/24']);
    assert.deepEqual(peerOf(mesh, 'b')?.allowedIps, ['10.77.0.7/32', '10.244.7.0/24']);
    assert.match(mesh.refused![0].reason, /10.244.7.10 is inside a pod CIDR of node b/);
    // A status address inside another node's spec is no allowed-IP either.
    const odd = node({ name: 'c', spec: ['10.244.8.0/24'], ip: '10.244.7.99' });
    assert.deepEqual(peerOf(desiredMesh([younger, odd], self, options), 'c')?.allowedIps, ['10.244.8.0/24']);
  });
});
