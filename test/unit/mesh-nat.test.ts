/**
 * Endpoints behind NAT: observed mappings from `discovered-endpoints`, nodes behind the same
 * public address talking over their LAN, majority votes between observers, and bad data ignored.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { keyToBase64 } from '../../dataplane/noise/keys.ts';
import { ANNOTATION, formatDiscoveredEndpoints, formatOwnAnnotations, parseDiscoveredEndpoints, type NodeObject } from '../../control/mesh/annotations.ts';
import { chooseEndpoint, desiredMesh, natObservation, type MeshOptions } from '../../control/mesh/desired-peers.ts';

const key = () => keyToBase64(randomBytes(32));
const options: MeshOptions = { wgIpFamily: 'ipv4', nativeRouting: { ipv4: false, ipv6: false }, defaultListenPort: 51820, persistentKeepalive: 25 };

interface Spec { name: string; key: string; ip: string; port: number; cidr: string; discovered?: Record<string, string>; created?: string }
function node(spec: Spec): NodeObject {
  const annotations = formatOwnAnnotations({ publicKey: spec.key, listenPort: spec.port, podCidrs: [spec.cidr], nodeIps: [] });
  if (spec.discovered) annotations[ANNOTATION.discoveredEndpoints] = formatDiscoveredEndpoints(new Map(Object.entries(spec.discovered)));
  return {
    metadata: { name: spec.name, annotations, creationTimestamp: spec.created ?? '2026-01-01T00:00:00Z' },
    status: { addresses: [{ type: 'InternalIP', address: spec.ip }] },
  };
}

// The world of the NAT scenario: two cloud nodes, an office NAT (198.51.100.7) with two nodes, a home NAT (198.51.100.20).
const k = { c1: key(), c2: key(), o1: key(), o2: key(), h1: key() };
const OFFICE = '198.51.100.7', HOME = '198.51.100.20';
const seenByCloud = { [k.o1]: `${OFFICE}:51821`, [k.o2]: `${OFFICE}:51822`, [k.h1]: `${HOME}:51824` };
const nodes = [
  node({ name: 'c1', key: k.c1, ip: '203.0.113.1', port: 51820, cidr: '10.244.1.0/24', discovered: seenByCloud }),
  node({ name: 'c2', key: k.c2, ip: '203.0.113.2', port: 51820, cidr: '10.244.2.0/24', discovered: { ...seenByCloud, [k.c1]: '203.0.113.1:51820' } }),
  node({ name: 'o1', key: k.o1, ip: '192.168.1.11', port: 51821, cidr: '10.244.3.0/24', discovered: { [k.o2]: '192.168.1.12:51822' } }),
  node({ name: 'o2', key: k.o2, ip: '192.168.1.12', port: 51822, cidr: '10.244.4.0/24' }),
  node({ name: 'h1', key: k.h1, ip: '192.168.2.11', port: 51824, cidr: '10.244.5.0/24' }),
];

function viewOf(name: keyof typeof k) {
  const self = nodes.find((n) => n.metadata!.name === name)!;
  const ip = (self.status!.addresses as Array<{ address: string }>)[0].address;
  return desiredMesh(nodes, { nodeName: name, publicKey: k[name], podCidrs: [], addresses: [ip] }, options);
}

describe('mesh: endpoints behind NAT', () => {
  test('a cloud node reaches NAT\'d nodes at the mappings observed by the cloud nodes', () => {
    const mesh = viewOf('c2');
    assert.deepEqual(mesh.peers.get(k.o1)?.endpoint, `${OFFICE}:51821`);
    assert.equal(mesh.peers.get(k.o1)?.endpointSource, 'discovered');
    assert.equal(mesh.peers.get(k.o1)?.natPublicAddress, OFFICE);
    assert.equal(mesh.peers.get(k.c1)?.endpoint, '203.0.113.1:51820', 'seen at its own address: not NAT\'d');
    assert.equal(mesh.peers.get(k.c1)?.endpointSource, 'published');
    assert.equal(mesh.selfNatPublicAddress, undefined);
  });

  test('nodes behind the same public address use each other\'s LAN address (no hairpin needed)', () => {
    const mesh = viewOf('o1');
    assert.equal(mesh.selfNatPublicAddress, OFFICE);
    assert.equal(mesh.peers.get(k.o2)?.endpoint, '192.168.1.12:51822');
    assert.equal(mesh.peers.get(k.o2)?.endpointSource, 'lan');
    assert.equal(mesh.peers.get(k.h1)?.endpoint, `${HOME}:51824`, 'another site: its public mapping');
    assert.equal(mesh.peers.get(k.c1)?.endpoint, '203.0.113.1:51820');
  });

  test('a node at another NAT\'d site reaches the office nodes at their public mappings', () => {
    const mesh = viewOf('h1');
    assert.equal(mesh.selfNatPublicAddress, HOME);
    assert.equal(mesh.peers.get(k.o1)?.endpoint, `${OFFICE}:51821`);
    assert.equal(mesh.peers.get(k.o2)?.endpoint, `${OFFICE}:51822`);
  });

  test('observers that disagree: the endpoint most see wins, ties by observer name; own addresses are no evidence', () => {
    assert.deepEqual(natObservation([
      { observer: 'b', endpoint: '198.51.100.7:4000' },
      { observer: 'c', endpoint: '198.51.100.7:5000' },
      { observer: 'a', endpoint: '198.51.100.7:5000' },
    ], ['10.0.0.1']), { address: '198.51.100.7', endpoint: '198.51.100.7:5000' });
    assert.deepEqual(natObservation([
      { observer: 'z', endpoint: '198.51.100.7:4000' },
      { observer: 'y', endpoint: '198.51.100.7:5000' },
    ], []), { address: '198.51.100.7', endpoint: '198.51.100.7:5000' });
    assert.equal(natObservation([{ observer: 'a', endpoint: '10.0.0.1:51820' }], ['10.0.0.1']), undefined);
  });

  test('force-endpoint beats everything; no address and no observation means no endpoint', () => {
    assert.deepEqual(chooseEndpoint({ forced: '1.2.3.4:5', published: '10.0.0.1:1', nat: { address: '9.9.9.9', endpoint: '9.9.9.9:1' } }), { endpoint: '1.2.3.4:5', source: 'forced' });
    assert.deepEqual(chooseEndpoint({}), {});
  });

  test('a node cannot vouch for itself, and bad discovered data is ignored without rejecting the node', () => {
    const liar = node({ name: 'liar', key: key(), ip: '192.168.9.9', port: 51820, cidr: '10.244.9.0/24' });
    liar.metadata!.annotations![ANNOTATION.discoveredEndpoints] = JSON.stringify({ [liar.metadata!.annotations![ANNOTATION.publicKey]]: '203.0.113.99:1', bogus: 'x', [k.o1]: 'not-an-endpoint' });
    const broken = node({ name: 'broken', key: key(), ip: '192.168.9.10', port: 51820, cidr: '10.244.10.0/24' });
    broken.metadata!.annotations![ANNOTATION.discoveredEndpoints] = '{not json';
    const mesh = desiredMesh([...nodes, liar, broken], { nodeName: 'c2', publicKey: k.c2, podCidrs: [], addresses: ['203.0.113.2'] }, options);
    const liarKey = liar.metadata!.annotations![ANNOTATION.publicKey];
    assert.equal(mesh.peers.get(liarKey)?.endpoint, '192.168.9.9:51820', 'its own claim is no evidence');
    assert.ok(mesh.peers.has(broken.metadata!.annotations![ANNOTATION.publicKey]), 'a node with a broken discovered annotation is still a peer');
    assert.equal(mesh.peers.get(k.o1)?.endpoint, `${OFFICE}:51821`);
    assert.equal(parseDiscoveredEndpoints(broken).size, 0);
    assert.equal(parseDiscoveredEndpoints(liar).size, 1);
  });
});
