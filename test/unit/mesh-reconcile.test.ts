/**
 * The mesh's decisions: Node objects → desired peers → the `set` request for a data plane.
 * A small in-memory data plane applies the requests with WireGuard's rules (a prefix belongs to
 * one peer; `-` removes; update_only never creates), so each test checks the resulting device,
 * not just the request text.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { Endpoint } from '../../dataplane/net/endpoint.ts';
import { formatPrefix } from '../../dataplane/net/ip.ts';
import { keyToBase64 } from '../../dataplane/noise/keys.ts';
import {
  formatSetRequest, parseSetRequest, type DeviceSnapshot, type PeerSnapshot, type SetRequest,
} from '../../dataplane/uapi/uapi-protocol.ts';
import { ANNOTATION, formatOwnAnnotations, parseNodeAnnotations, type NodeObject } from '../../control/mesh/annotations.ts';
import { desiredMesh, keepUnchangedPeers, type DesiredPeer, type MeshOptions, type SelfView } from '../../control/mesh/desired-peers.ts';
import { applySetToSnapshot } from '../../control/mesh/device-model.ts';
import { prng } from '../helpers/prng.ts';
import { newReconcileMemory, planReconcile, RECENT_HANDSHAKE_MS, type ReconcileMemory } from '../../control/mesh/reconcile.ts';

const newKey = () => keyToBase64(randomBytes(32));

interface NodeSpec {
  name: string;
  key?: string;
  podCidrs?: string[];
  internalIp?: string;
  externalIp?: string;
  port?: number;
  created?: string;
  extra?: Record<string, string>;
}

function node(spec: NodeSpec): NodeObject {
  const annotations: Record<string, string> = spec.key === undefined ? {} : formatOwnAnnotations({
    publicKey: spec.key, listenPort: spec.port ?? 51820, podCidrs: spec.podCidrs ?? [], nodeIps: [],
  });
  Object.assign(annotations, spec.extra ?? {});
  const addresses = [];
  if (spec.internalIp) addresses.push({ type: 'InternalIP', address: spec.internalIp });
  if (spec.externalIp) addresses.push({ type: 'ExternalIP', address: spec.externalIp });
  addresses.push({ type: 'Hostname', address: spec.name });
  return {
    metadata: { name: spec.name, annotations, creationTimestamp: spec.created ?? '2026-01-01T00:00:00Z' },
    spec: { podCIDRs: spec.podCidrs },
    status: { addresses },
  };
}

const self: SelfView = { nodeName: 'self', publicKey: newKey(), podCidrs: ['10.244.0.0/24', 'fd00:244::/64'], addresses: ['192.0.2.1'] };
const options: MeshOptions = { wgIpFamily: 'dualstack', nativeRouting: { ipv4: false, ipv6: false }, defaultListenPort: 51820, persistentKeepalive: 25 };

/** Applies `set` requests with the data plane's semantics, via the real text protocol. */
class FakeDevice {
  peers: PeerSnapshot[] = [];
  requests: string[] = [];
  constructor(readonly canRemove = true) {}

  apply(request: SetRequest | undefined): void {
    if (!request) return;
    const text = formatSetRequest(request);
    this.requests.push(text);
    const parsed = parseSetRequest(text.split('\n').slice(1));
    assert.ok(parsed.ok, `the request parses: ${!parsed.ok ? parsed.message : ''}`);
    for (const change of parsed.request.peers) {
      const key = keyToBase64(change.publicKey);
      let peer = this.peers.find((p) => keyToBase64(p.publicKey) === key);
      if (change.remove) {
        this.peers = this.peers.filter((p) => p !== peer);
        continue;
      }
      if (!peer) {
        if (change.updateOnly) continue;
        peer = { publicKey: change.publicKey, presharedKey: new Uint8Array(32), lastHandshakeWallMs: 0, txBytes: 0, rxBytes: 0, persistentKeepalive: 0, allowedIps: [] };
        this.peers.push(peer);
      }
      if (change.endpoint) peer.endpoint = change.endpoint;
      if (change.persistentKeepalive !== undefined) peer.persistentKeepalive = change.persistentKeepalive;
      if (change.replaceAllowedIps) peer.allowedIps = [];
      for (const a of change.allowedIps) {
        const text = formatPrefix(a.prefix);
        if (a.remove) {
          assert.ok(this.canRemove, 'a daemon without "-" support was sent a removal');
          peer.allowedIps = peer.allowedIps.filter((p) => formatPrefix(p) !== text);
        } else {
          for (const other of this.peers) other.allowedIps = other.allowedIps.filter((p) => formatPrefix(p) !== text);
          peer.allowedIps.push(a.prefix);
        }
      }
    }
  }

  snapshot(): DeviceSnapshot {
    return { listenPort: 51820, fwmark: 0, peers: this.peers.map((p) => ({ ...p, allowedIps: [...p.allowedIps] })) };
  }

  peer(key: string): PeerSnapshot | undefined {
    return this.peers.find((p) => keyToBase64(p.publicKey) === key);
  }

  allowed(key: string): string[] {
    return (this.peer(key)?.allowedIps ?? []).map(formatPrefix).sort();
  }
}

function reconcile(device: FakeDevice, nodes: NodeObject[], memory: ReconcileMemory, extra: { collectGarbage?: boolean; now?: number; self?: SelfView; rewriteEndpoints?: Set<string> } = {}) {
  const mesh = desiredMesh(nodes, extra.self ?? self, options);
  const plan = planReconcile(mesh.peers, device.snapshot(), memory, {
    collectGarbage: extra.collectGarbage ?? true, canRemoveAllowedIp: device.canRemove, nowWallMs: extra.now ?? Date.now(), rewriteEndpoints: extra.rewriteEndpoints,
  });
  device.apply(plan.request);
  return { mesh, plan };
}

describe('mesh: desired peers from Nodes', () => {
  test('each annotated node becomes a peer with its pod CIDRs and node addresses; own node and unannotated nodes are not peers', () => {
    const a = node({ name: 'a', key: newKey(), podCidrs: ['10.244.1.0/24', 'fd00:244:0:1::/64'], internalIp: '10.0.0.2', externalIp: '198.51.100.2' });
    const b = node({ name: 'b' });
    const mesh = desiredMesh([a, b, node({ name: 'self', key: self.publicKey })], self, options);
    assert.equal(mesh.peers.size, 1);
    const peer = [...mesh.peers.values()][0];
    assert.equal(peer.nodeName, 'a');
    assert.deepEqual(peer.allowedIps, ['10.0.0.2/32', '10.244.1.0/24', '198.51.100.2/32', 'fd00:244:0:1::/64']);
    assert.equal(peer.endpoint, '10.0.0.2:51820', 'dualstack: the lowest IPv4 address');
    assert.equal(peer.persistentKeepalive, 25);
    assert.deepEqual(mesh.waiting, ['b']);
    assert.deepEqual(mesh.rejected, []);
    assert.deepEqual(mesh.clusterPodCidrs, ['10.244.0.0/24', '10.244.1.0/24', 'fd00:244::/64', 'fd00:244:0:1::/64']);
    assert.deepEqual(mesh.tunnelRoutes, ['10.244.1.0/24', 'fd00:244:0:1::/64']);
  });

  test('endpoint family, published port and force-endpoint', () => {
    const a = node({ name: 'a', key: newKey(), internalIp: '10.0.0.2', externalIp: '2001:db8::2', port: 4000 });
    assert.equal([...desiredMesh([a], self, { ...options, wgIpFamily: 'ipv6' }).peers.values()][0].endpoint, '[2001:db8::2]:4000');
    assert.equal([...desiredMesh([a], self, { ...options, wgIpFamily: 'ipv4' }).peers.values()][0].endpoint, '10.0.0.2:4000');
    const v6only = node({ name: 'b', key: newKey(), externalIp: '2001:db8::3' });
    assert.equal([...desiredMesh([v6only], self, { ...options, wgIpFamily: 'ipv4' }).peers.values()][0].endpoint, undefined, 'no address of that family: no endpoint, still a peer');
    const forced = node({ name: 'c', key: newKey(), internalIp: '10.0.0.4', extra: { [ANNOTATION.forceEndpoint]: '203.0.113.9:30000' } });
    assert.equal([...desiredMesh([forced], self, options).peers.values()][0].endpoint, '203.0.113.9:30000');
  });

  test('native routing for a family keeps its pod CIDRs out of the tunnel', () => {
    const a = node({ name: 'a', key: newKey(), podCidrs: ['10.244.1.0/24', 'fd00:244:0:1::/64'] });
    const mesh = desiredMesh([a], self, { ...options, nativeRouting: { ipv4: true, ipv6: false } });
    assert.deepEqual([...mesh.peers.values()][0].allowedIps, ['fd00:244:0:1::/64']);
    assert.deepEqual(mesh.tunnelRoutes, ['fd00:244:0:1::/64']);
    assert.ok(mesh.clusterPodCidrs.includes('10.244.1.0/24'), 'still in the firewall sets');
  });

  test('Flannel regression: nodes behind one public IP are all peers; the shared address is in nobody\'s AllowedIPs', () => {
    const nat = '198.51.100.7';
    const office1 = node({ name: 'office1', key: newKey(), podCidrs: ['10.244.1.0/24'], internalIp: '192.168.1.10', externalIp: nat, created: '2026-01-01T00:00:00Z' });
    const office2 = node({ name: 'office2', key: newKey(), podCidrs: ['10.244.2.0/24'], internalIp: '192.168.1.11', externalIp: nat, created: '2026-01-02T00:00:00Z' });
    const mesh = desiredMesh([office1, office2], self, options);
    assert.equal(mesh.peers.size, 2);
    for (const peer of mesh.peers.values()) assert.ok(!peer.allowedIps.includes(`${nat}/32`), 'ambiguous address left out');
  });

  test('malformed annotations reject that node only, with a reason naming the annotation', () => {
    const good = node({ name: 'good', key: newKey(), podCidrs: ['10.244.9.0/24'] });
    const cases: Array<[NodeObject, RegExp]> = [
      [node({ name: 'badkey', extra: { [ANNOTATION.publicKey]: 'not-a-key' } }), /public-key: a key must be 32 bytes/],
      [node({ name: 'badjson', key: newKey(), extra: { [ANNOTATION.podCidrs]: '[10.0.0.0/8' } }), /pod-cidrs is not JSON/],
      [node({ name: 'notarray', key: newKey(), extra: { [ANNOTATION.podCidrs]: '{"a":1}' } }), /not a JSON array of strings/],
      [node({ name: 'badcidr', key: newKey(), extra: { [ANNOTATION.podCidrs]: '["10.244.300.0/24"]' } }), /is not a CIDR/],
      [node({ name: 'hostbits', key: newKey(), extra: { [ANNOTATION.podCidrs]: '["10.244.3.1/24"]' } }), /host bits set/],
      [node({ name: 'toowide', key: newKey(), extra: { [ANNOTATION.podCidrs]: '["0.0.0.0/0"]' } }), /wider than \/8/],
      [node({ name: 'huge', key: newKey(), extra: { [ANNOTATION.podCidrs]: JSON.stringify(Array.from({ length: 100 }, (_, i) => `10.${i}.0.0/16`)) } }), /100 entries/],
      [node({ name: 'longvalue', key: newKey(), extra: { [ANNOTATION.nodeIps]: JSON.stringify(Array.from({ length: 2000 }, () => '10.0.0.1')) } }), /characters long/],
      [node({ name: 'badip', key: newKey(), extra: { [ANNOTATION.nodeIps]: '["10.0.0.256"]' } }), /node-ips: .* is not an IP address/],
      [node({ name: 'badport', key: newKey(), extra: { [ANNOTATION.listenPort]: '99999' } }), /listen-port: .* is not a port/],
      [node({ name: 'badforce', key: newKey(), extra: { [ANNOTATION.forceEndpoint]: 'example.com:51820' } }), /force-endpoint: bad endpoint/],
      [node({ name: 'mykey', key: self.publicKey }), /this node's own public key/],
    ];
    const mesh = desiredMesh([good, ...cases.map(([n]) => n)], self, options);
    assert.deepEqual([...mesh.peers.values()].map((p) => p.nodeName), ['good']);
    for (const [n, reason] of cases) {
      const r = mesh.rejected.find((x) => x.node === n.metadata!.name);
      assert.ok(r, `${n.metadata!.name} rejected`);
      assert.match(r.reason, reason, n.metadata!.name);
    }
    assert.equal(parseNodeAnnotations(node({ name: 'x' })).ok, false);
  });

  test('a newcomer claiming an existing node\'s key is rejected, its pod CIDR refused; the existing node keeps both', () => {
    const key = newKey();
    const old = node({ name: 'zz-old', key, podCidrs: ['10.244.5.0/24'], created: '2026-01-01T00:00:00Z' });
    const thief = node({ name: 'aa-new', key, podCidrs: ['10.244.6.0/24'], created: '2026-03-01T00:00:00Z' });
    const squatter = node({ name: 'ab-new', key: newKey(), podCidrs: ['10.244.5.0/25'], created: '2026-03-01T00:00:00Z' });
    const overSelf = node({ name: 'ac-new', key: newKey(), podCidrs: ['10.244.0.128/25'], created: '2026-03-01T00:00:00Z' });
    const mesh = desiredMesh([thief, squatter, old, overSelf], self, options);
    assert.deepEqual([...mesh.peers.values()].map((p) => p.nodeName).sort(), ['ab-new', 'ac-new', 'zz-old']);
    assert.match(mesh.rejected.find((r) => r.node === 'aa-new')!.reason, /already used by node zz-old/);
    assert.match(mesh.refused!.find((r) => r.node === 'ab-new')!.reason, /overlaps a pod CIDR of node zz-old/);
    assert.match(mesh.refused!.find((r) => r.node === 'ac-new')!.reason, /overlaps a pod CIDR of node self/);
    const byName = (n: string) => [...mesh.peers.values()].find((p) => p.nodeName === n)!;
    assert.ok(byName('zz-old').allowedIps.includes('10.244.5.0/24'));
    assert.ok(!byName('ab-new').allowedIps.some((a) => a.startsWith('10.244.5.')), 'the squatter routes none of it');
  });
});

describe('mesh: reconcile against the data plane', () => {
  test('first reconcile adds every peer with endpoint, keepalive and AllowedIPs; the second changes nothing', () => {
    const device = new FakeDevice();
    const memory = newReconcileMemory();
    const a = node({ name: 'a', key: newKey(), podCidrs: ['10.244.1.0/24'], internalIp: '10.0.0.2' });
    reconcile(device, [a], memory);
    const key = a.metadata!.annotations![ANNOTATION.publicKey];
    assert.deepEqual(device.allowed(key), ['10.0.0.2/32', '10.244.1.0/24']);
    assert.equal(device.peer(key)!.endpoint!.toString(), '10.0.0.2:51820');
    assert.equal(device.peer(key)!.persistentKeepalive, 25);
    const again = reconcile(device, [a], memory);
    assert.equal(again.plan.request, undefined, 'nothing to do');
  });

  test('Flannel regression: adding a second node with the same public IP leaves the first peer untouched', () => {
    const device = new FakeDevice();
    const memory = newReconcileMemory();
    const nat = '198.51.100.7';
    const first = node({ name: 'office1', key: newKey(), podCidrs: ['10.244.1.0/24'], externalIp: nat, created: '2026-01-01T00:00:00Z' });
    reconcile(device, [first], memory);
    const k1 = first.metadata!.annotations![ANNOTATION.publicKey];
    const second = node({ name: 'office2', key: newKey(), podCidrs: ['10.244.2.0/24'], externalIp: nat, created: '2026-02-01T00:00:00Z' });
    const { plan } = reconcile(device, [first, second], memory);
    assert.equal(device.peers.length, 2);
    assert.ok(device.allowed(k1).includes('10.244.1.0/24'), 'the first node keeps its pod CIDR');
    assert.equal(device.peer(k1)!.endpoint!.toString(), `${nat}:51820`);
    // The first peer may only lose the now-ambiguous host address, never be removed or replaced.
    for (const action of plan.actions) {
      assert.notEqual(action.kind, 'remove');
      if (action.kind === 'update') assert.deepEqual(action.removed, [`${nat}/32`]);
    }
    assert.ok(!plan.request!.peers.some((p) => p.replaceAllowedIps), 'no replace of AllowedIPs');
  });

  test('AllowedIPs change as set differences', () => {
    const device = new FakeDevice();
    const memory = newReconcileMemory();
    const key = newKey();
    reconcile(device, [node({ name: 'a', key, podCidrs: ['10.244.1.0/24', '10.245.1.0/24'] })], memory);
    const { plan } = reconcile(device, [node({ name: 'a', key, podCidrs: ['10.244.1.0/24', '10.246.1.0/24'] })], memory);
    assert.deepEqual(device.allowed(key), ['10.244.1.0/24', '10.246.1.0/24']);
    const text = device.requests.at(-1)!;
    assert.match(text, /allowed_ip=-10\.245\.1\.0\/24/);
    assert.match(text, /allowed_ip=10\.246\.1\.0\/24/);
    assert.doesNotMatch(text, /allowed_ip=10\.244\.1\.0\/24/, 'unchanged prefixes are not re-sent');
    assert.doesNotMatch(text, /replace_allowed_ips|remove=true/);
    assert.equal(plan.actions[0].kind, 'update');
  });

  test('a daemon without "-" removal gets replace_allowed_ips with the full set', () => {
    const device = new FakeDevice(false);
    const memory = newReconcileMemory();
    const key = newKey();
    reconcile(device, [node({ name: 'a', key, podCidrs: ['10.244.1.0/24', '10.245.1.0/24'] })], memory);
    reconcile(device, [node({ name: 'a', key, podCidrs: ['10.244.1.0/24'] })], memory);
    assert.deepEqual(device.allowed(key), ['10.244.1.0/24']);
    assert.match(device.requests.at(-1)!, /replace_allowed_ips=true\nallowed_ip=10\.244\.1\.0\/24/);
  });

  test('key rotation: the new key becomes a peer with the prefixes, the old one is removed', () => {
    const device = new FakeDevice();
    const memory = newReconcileMemory();
    const oldKey = newKey(), rotated = newKey();
    reconcile(device, [node({ name: 'a', key: oldKey, podCidrs: ['10.244.1.0/24'] })], memory);
    const { plan } = reconcile(device, [node({ name: 'a', key: rotated, podCidrs: ['10.244.1.0/24'] })], memory);
    assert.equal(device.peer(oldKey), undefined);
    assert.deepEqual(device.allowed(rotated), ['10.244.1.0/24']);
    assert.deepEqual(plan.actions.map((a) => a.kind).sort(), ['add', 'remove']);
    assert.ok(device.requests.at(-1)!.indexOf('remove=true') < device.requests.at(-1)!.indexOf('allowed_ip=10.244.1.0/24'), 'removal first');
  });

  test('node deletion removes its peer, only once garbage collection is allowed', () => {
    const device = new FakeDevice();
    const memory = newReconcileMemory();
    const a = node({ name: 'a', key: newKey(), podCidrs: ['10.244.1.0/24'] });
    const b = node({ name: 'b', key: newKey(), podCidrs: ['10.244.2.0/24'] });
    reconcile(device, [a, b], memory);
    const early = reconcile(device, [a], memory, { collectGarbage: false });
    assert.equal(device.peers.length, 2, 'kept until the informer has synced');
    assert.deepEqual(early.plan.kept, [b.metadata!.annotations![ANNOTATION.publicKey]]);
    reconcile(device, [a], memory, { collectGarbage: true });
    assert.equal(device.peers.length, 1);
    assert.ok(device.peer(a.metadata!.annotations![ANNOTATION.publicKey]));
  });

  test('an endpoint learned by roaming is kept across resyncs; a changed annotation replaces it', () => {
    const device = new FakeDevice();
    const memory = newReconcileMemory();
    const key = newKey();
    const a = node({ name: 'a', key, internalIp: '10.0.0.2' });
    reconcile(device, [a], memory);
    const peer = device.peer(key)!;
    peer.endpoint = Endpoint.parse('203.0.113.50:40123'); // the data plane saw the peer's NAT mapping
    peer.lastHandshakeWallMs = Date.now();
    for (let i = 0; i < 3; i++) reconcile(device, [a], memory);
    assert.equal(device.peer(key)!.endpoint!.toString(), '203.0.113.50:40123');
    // Even without a recent handshake, an unchanged annotation does not reset a roamed endpoint.
    reconcile(device, [a], memory, { now: Date.now() + 10 * RECENT_HANDSHAKE_MS });
    assert.equal(device.peer(key)!.endpoint!.toString(), '203.0.113.50:40123');
    reconcile(device, [node({ name: 'a', key, internalIp: '10.0.0.3' })], memory);
    assert.equal(device.peer(key)!.endpoint!.toString(), '10.0.0.3:51820', 'only a changed annotation replaces it');
  });

  test('an endpoint first reached by roaming is the baseline: a later roam away from it is kept too', () => {
    const device = new FakeDevice();
    const memory = newReconcileMemory();
    const key = newKey();
    // Published first at a LAN address nobody can reach; then other nodes' observations say where it is.
    reconcile(device, [node({ name: 'a', key, internalIp: '192.168.1.11' })], memory);
    const peer = device.peer(key)!;
    peer.endpoint = Endpoint.parse('203.0.113.10:51821'); // roamed there (the peer's NAT mapping)
    peer.lastHandshakeWallMs = Date.now();
    const observed = node({ name: 'a', key, internalIp: '192.168.1.11', extra: { [ANNOTATION.forceEndpoint]: '203.0.113.10:51821' } });
    reconcile(device, [observed], memory); // desired now equals where it is
    peer.endpoint = Endpoint.parse('203.0.113.10:40001'); // the NAT rebinds; the data plane follows
    reconcile(device, [observed], memory); // the observation has not caught up yet
    assert.equal(device.peer(key)!.endpoint!.toString(), '203.0.113.10:40001', 'the fresh roam is not overwritten by the stale observation');
  });

  test('a peer named in rewriteEndpoints gets its wanted endpoint back over a roam (a direct trial); the others keep theirs', () => {
    const device = new FakeDevice();
    const memory = newReconcileMemory();
    const [trying, other] = [newKey(), newKey()];
    const nodes = [node({ name: 'a', key: trying, internalIp: '10.0.0.2' }), node({ name: 'b', key: other, internalIp: '10.0.0.3' })];
    reconcile(device, nodes, memory);
    for (const key of [trying, other]) {
      device.peer(key)!.endpoint = Endpoint.parse('203.0.113.2:51900'); // a datagram through a relay
      device.peer(key)!.lastHandshakeWallMs = Date.now();
    }
    reconcile(device, nodes, memory);
    const rewrite = new Set([trying]);
    const { plan } = reconcile(device, nodes, memory, { rewriteEndpoints: rewrite });
    assert.equal(device.peer(trying)!.endpoint!.toString(), '10.0.0.2:51820', 'written again');
    assert.equal(device.peer(other)!.endpoint!.toString(), '203.0.113.2:51900', 'a roam of a peer not named is kept');
    assert.deepEqual(plan.actions.map((a) => a.kind === 'update' && a.endpoint), ['10.0.0.2:51820']);
    const again = reconcile(device, nodes, memory, { rewriteEndpoints: rewrite });
    assert.equal(again.plan.request, undefined, 'already there: nothing to write');
  });

  test('after an agent restart (no memory): a recent handshake keeps the roamed endpoint, a stale one takes the annotation', () => {
    const device = new FakeDevice();
    const key = newKey();
    const a = node({ name: 'a', key, internalIp: '10.0.0.2' });
    reconcile(device, [a], newReconcileMemory());
    const peer = device.peer(key)!;
    peer.endpoint = Endpoint.parse('203.0.113.50:40123');
    peer.lastHandshakeWallMs = Date.now() - 5_000;
    const memory = newReconcileMemory();
    reconcile(device, [a], memory, { collectGarbage: false });
    assert.equal(device.peer(key)!.endpoint!.toString(), '203.0.113.50:40123');
    peer.lastHandshakeWallMs = Date.now() - 2 * RECENT_HANDSHAKE_MS;
    reconcile(device, [a], newReconcileMemory());
    assert.equal(device.peer(key)!.endpoint!.toString(), '10.0.0.2:51820');
  });

  test('a prefix moving between two peers in one reconcile lands on its new owner', () => {
    const device = new FakeDevice();
    const memory = newReconcileMemory();
    const ka = newKey(), kb = newKey();
    reconcile(device, [node({ name: 'a', key: ka, podCidrs: ['10.244.1.0/24'] }), node({ name: 'b', key: kb, podCidrs: ['10.244.2.0/24'] })], memory);
    reconcile(device, [node({ name: 'a', key: ka, podCidrs: ['10.244.2.0/24'] }), node({ name: 'b', key: kb, podCidrs: ['10.244.1.0/24'] })], memory);
    assert.deepEqual(device.allowed(ka), ['10.244.2.0/24']);
    assert.deepEqual(device.allowed(kb), ['10.244.1.0/24']);
  });

  test('a rejected node does not disturb existing peers', () => {
    const device = new FakeDevice();
    const memory = newReconcileMemory();
    const a = node({ name: 'a', key: newKey(), podCidrs: ['10.244.1.0/24'], created: '2026-01-01T00:00:00Z' });
    reconcile(device, [a], memory);
    const hostile = node({ name: 'evil', key: a.metadata!.annotations![ANNOTATION.publicKey], podCidrs: ['10.244.1.0/24'], created: '2026-05-01T00:00:00Z' });
    const { plan, mesh } = reconcile(device, [a, hostile], memory);
    assert.equal(plan.request, undefined);
    assert.equal(mesh.rejected.length, 1);
  });
});

describe('planning a Node change against the model, skipping settled peers', () => {
  test('never misses what a plan of every peer would change (random Node changes and fresh reads, 400 passes)', () => {
    const random = prng(18);
    const pick = <T>(list: readonly T[]) => list[Math.floor(random() * list.length)];
    const specs = new Map<string, NodeSpec>();
    let next = 0;
    const addNode = () => {
      const i = next++;
      specs.set(`n${i}`, { name: `n${i}`, key: newKey(), podCidrs: [`10.245.${i % 250}.0/24`], internalIp: `198.51.100.${1 + (i % 200)}`, port: 51820, created: new Date(Date.UTC(2026, 0, 1) + i * 1000).toISOString() });
    };
    for (let i = 0; i < 30; i++) addNode();
    const memory = newReconcileMemory();
    let model: DeviceSnapshot = { listenPort: 51820, fwmark: 0, peers: [] };
    let previous: Map<string, DesiredPeer> | undefined;
    for (let pass = 0; pass < 400; pass++) {
      for (let k = 0, n = Math.floor(random() * 4); k < n; k++) {
        const names = [...specs.keys()];
        const r = random();
        const name = pick(names);
        const spec = specs.get(name)!;
        if (r < 0.15) addNode();
        else if (r < 0.3 && names.length > 5) specs.delete(name);
        else if (r < 0.5) specs.set(name, { ...spec, port: 51820 + Math.floor(random() * 3) });
        else if (r < 0.6) specs.set(name, { ...spec, key: newKey() });
        else if (r < 0.75) specs.set(name, { ...spec, internalIp: `198.51.100.${1 + Math.floor(random() * 250)}` });
        else if (r < 0.9) specs.set(name, { ...spec, podCidrs: [`10.246.${Math.floor(random() * 250)}.0/24`] });
        // else: a pass with nothing changed
      }
      // Unchanged Nodes keep their objects (as the informer's cache does).
      const mesh = desiredMesh([...specs.values()].map(node), self, options);
      const peers = keepUnchangedPeers(mesh.peers, previous);
      previous = peers;
      if (pass % 7 === 6 && model.peers.length > 0) {
        // A fresh read (new objects for every entry), after someone took a prefix off one peer.
        const victim = Math.floor(random() * model.peers.length);
        model = { ...model, peers: model.peers.map((p, i) => ({ ...p, allowedIps: i === victim ? p.allowedIps.slice(1) : [...p.allowedIps] })) };
      }
      const now = Date.UTC(2026, 0, 2) + pass * 1000;
      const plan = planReconcile(peers, model, memory, { collectGarbage: true, canRemoveAllowedIp: true, nowWallMs: now });
      if (plan.request) model = applySetToSnapshot(model, plan.request);
      // A plan of every peer (nothing skipped) finds nothing more to do.
      const full: ReconcileMemory = { writtenEndpoint: new Map(memory.writtenEndpoint), settled: new Map() };
      const again = planReconcile(peers, model, full, { collectGarbage: true, canRemoveAllowedIp: true, nowWallMs: now });
      assert.deepEqual(again.actions.map((a) => `${a.kind} ${a.kind === 'remove' ? a.publicKey : a.peer.nodeName}`), [], `pass ${pass}`);
      // And the model holds exactly the desired peers and prefixes.
      assert.deepEqual(
        model.peers.map((p) => `${keyToBase64(p.publicKey)} ${p.allowedIps.map(formatPrefix).sort().join(',')}`).sort(),
        [...peers.values()].map((p) => `${p.publicKey} ${[...p.allowedIps].sort().join(',')}`).sort(),
        `pass ${pass}`,
      );
    }
    assert.ok(memory.settled.size > 0, 'settled peers should have been skipped');
  });

  test('keepUnchangedPeers keeps the previous object only when every field is the same', () => {
    const a = desiredMesh([node({ name: 'a', key: newKey(), podCidrs: ['10.245.1.0/24'], internalIp: '198.51.100.1' })], self, options);
    const same = desiredMesh([node({ name: 'a', key: [...a.peers.keys()][0], podCidrs: ['10.245.1.0/24'], internalIp: '198.51.100.1' })], self, options);
    const moved = desiredMesh([node({ name: 'a', key: [...a.peers.keys()][0], podCidrs: ['10.245.1.0/24'], internalIp: '198.51.100.1', port: 51999 })], self, options);
    const key = [...a.peers.keys()][0];
    assert.equal(keepUnchangedPeers(same.peers, a.peers).get(key), a.peers.get(key));
    assert.notEqual(keepUnchangedPeers(moved.peers, a.peers).get(key), a.peers.get(key));
  });
});
