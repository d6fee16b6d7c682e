/**
 * Endpoints behind NAT: observed mappings from `discovered-endpoints`, nodes behind the same
 * public address talking over their LAN, majority votes between observers, and bad data ignored.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { keyToBase64 } from '../../dataplane/noise/keys.ts';
import { ANNOTATION, formatDiscoveredEndpoints, formatOwnAnnotations, parseDiscoveredEndpoints, type NodeObject } from '../../control/mesh/annotations.ts';
import { chooseEndpoint, desiredMesh, natObservation, observedMayOverride, type MeshOptions } from '../../control/mesh/desired-peers.ts';

const key = () => keyToBase64(randomBytes(32));
const options: MeshOptions = { wgIpFamily: 'ipv4', nativeRouting: { ipv4: false, ipv6: false }, defaultListenPort: 51820, persistentKeepalive: 25 };

interface Spec { name: string; key: string; ip: string; port: number; cidr: string; discovered?: Record<string, string>; created?: string }
function node(spec: Spec): NodeObject {
  const annotations = formatOwnAnnotations({ publicKey: spec.key, listenPort: spec.port, podCidrs: [spec.cidr], nodeIps: [] });
  if (spec.discovered) annotations[ANNOTATION.discoveredEndpoints] = formatDiscoveredEndpoints(new Map(Object.entries(spec.discovered)));
  return {
    metadata: { name: spec.name, annotations, creationTimestamp: spec.created ?? '2026-01-01T00:00:00Z' },
    spec: { podCIDRs: [spec.cidr] },
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

  test('observations count only in the endpoint family; dualstack prefers IPv4 mappings even when more observers report IPv6 ones', () => {
    const seen = [
      { observer: 'c1', endpoint: '203.0.113.10:51821' },
      { observer: 'c2', endpoint: '[2001:db8:1::a]:51821' },
      { observer: 'h1', endpoint: '[2001:db8:1::a]:51821' },
    ];
    assert.equal(natObservation(seen, [])?.endpoint, '203.0.113.10:51821');
    assert.equal(natObservation(seen, [], 'ipv6')?.endpoint, '[2001:db8:1::a]:51821');
    assert.equal(natObservation(seen.slice(1), [], 'ipv4'), undefined, 'no IPv4 mapping: none for IPv4 endpoints');
    assert.equal(natObservation(seen.slice(1), [])?.endpoint, '[2001:db8:1::a]:51821', 'dualstack without any IPv4 mapping takes IPv6');
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

  test('a lying node cannot redirect everyone to a peer that publishes a reachable address', () => {
    // One node reports the cloud node c1 (public address) and the flat-LAN node o1 at its own box.
    const liar = node({ name: 'liar', key: key(), ip: '192.168.9.9', port: 51820, cidr: '10.244.9.0/24',
      discovered: { [k.c1]: '198.51.100.66:4444', [k.o1]: '198.51.100.66:5555' } });
    const liarsWorld = [...nodes.filter((n) => n.metadata!.name !== 'c2'), liar];
    const mesh = desiredMesh(liarsWorld, { nodeName: 'c2', publicKey: k.c2, podCidrs: [], addresses: ['203.0.113.2'] }, options);
    assert.equal(mesh.peers.get(k.c1)?.endpoint, '203.0.113.1:51820', 'a globally routable published address is used whatever anyone reports');
    assert.equal(mesh.peers.get(k.c1)?.endpointSource, 'published');
    // o1 publishes only a site-local address: nobody outside its site could reach it there, so
    // observations count (c1's, today's NAT case). With c1 and the liar disagreeing, the vote is
    // a tie broken by name: 'c1' < 'liar'.
    assert.equal(mesh.peers.get(k.o1)?.endpoint, `${OFFICE}:51821`, 'the honest observer wins the tie');
    // A peer answering us where it says it is stays there, even if every observer lies.
    const working = desiredMesh([...liarsWorld.filter((n) => n.metadata!.name !== 'c1'), liar], { nodeName: 'c2', publicKey: k.c2, podCidrs: [], addresses: ['203.0.113.2'] },
      { ...options, workingAtOwnAddress: new Set([k.o1]) });
    assert.equal(working.peers.get(k.o1)?.endpoint, '192.168.1.11:51821', 'a working session at its own address is not moved by a report');
    const notWorking = desiredMesh([...liarsWorld.filter((n) => n.metadata!.name !== 'c1'), liar], { nodeName: 'c2', publicKey: k.c2, podCidrs: [], addresses: ['203.0.113.2'] }, options);
    assert.equal(notWorking.peers.get(k.o1)?.endpoint, '198.51.100.66:5555', 'without a session and with one observer, the observation is all there is (the NAT case)');
  });

  test('the rule itself: observations only where the published address cannot be the way in', () => {
    assert.equal(observedMayOverride({ published: '203.0.113.1:51820', workingAtOwnAddress: false }), false);
    assert.equal(observedMayOverride({ published: '[2001:db8:1::1]:51820', workingAtOwnAddress: false }), false);
    for (const p of ['10.1.2.3:1', '172.20.0.1:1', '192.168.1.11:1', '100.64.1.1:1', '[fd10:1::b]:1']) {
      assert.equal(observedMayOverride({ published: p, workingAtOwnAddress: false }), true, p);
      assert.equal(observedMayOverride({ published: p, workingAtOwnAddress: true }), false, `${p} with a working session`);
    }
    assert.equal(observedMayOverride({ published: undefined, workingAtOwnAddress: false }), true);
    assert.equal(observedMayOverride({ published: '172.32.0.1:1', workingAtOwnAddress: false }), false, '172.32/16 is outside 172.16/12');
  });
});
