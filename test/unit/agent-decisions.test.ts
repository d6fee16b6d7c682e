/**
 * The agent's decisions, without root, a data plane or an API server: reachability with an
 * injected clock, what the data plane's view publishes, which peers observations cannot move,
 * this Node's annotations restored after tampering (force-endpoint only reported), "report once
 * while it lasts", and the counters the metrics expose.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { Endpoint } from '../../dataplane/net/endpoint.ts';
import { keyFromBase64, keyToBase64 } from '../../dataplane/noise/keys.ts';
import type { DeviceSnapshot, PeerSnapshot } from '../../dataplane/uapi/uapi-protocol.ts';
import type { DesiredPeer } from '../../control/mesh/desired-peers.ts';
import { ANNOTATION } from '../../control/mesh/annotations.ts';
import { judgeReachability, newReachabilityMemory } from '../../control/agent/reachability.ts';
import { observedEndpoints, workingAtOwnAddress } from '../../control/agent/observed-endpoints.ts';
import { annotationDrift, forceEndpointChange, ownAnnotations, restorePatch } from '../../control/agent/own-annotations.ts';
import { newOnes } from '../../control/agent/once.ts';
import { AgentMetrics } from '../../control/metrics/metrics.ts';

const NOW = Date.UTC(2026, 11, 2, 12, 0, 0);
const keys = Array.from({ length: 3 }, () => keyToBase64(randomBytes(32)));

function desired(key: string, nodeName: string, addresses: string[]): DesiredPeer {
  return { nodeName, publicKey: key, publicKeyBytes: keyFromBase64(key), addresses, allowedIps: [], persistentKeepalive: 25, endpoint: `${addresses[0]}:51820` };
}
function device(peers: Array<{ key: string; endpoint?: string; handshake?: number }>): DeviceSnapshot {
  return {
    listenPort: 51820, fwmark: 0,
    peers: peers.map((p): PeerSnapshot => ({
      publicKey: keyFromBase64(p.key), presharedKey: new Uint8Array(32), endpoint: p.endpoint ? Endpoint.parse(p.endpoint) : undefined,
      lastHandshakeWallMs: p.handshake ?? 0, txBytes: 0, rxBytes: 0, persistentKeepalive: 25, allowedIps: [],
    })),
  };
}
const mesh = new Map([
  [keys[0], desired(keys[0], 'node-2', ['10.77.0.2'])],
  [keys[1], desired(keys[1], 'office-1', ['192.168.1.11'])],
]);

describe('agent decisions: reachability (injected clock)', () => {
  test('no first handshake within three keepalives (at least 15 s) is unreachable; a handshake brings it back; one report each', () => {
    const memory = newReachabilityMemory();
    const opts = (t: number) => ({ nowWallMs: t, persistentKeepaliveS: 25 });
    const none = device([{ key: keys[0] }, { key: keys[1] }]);
    assert.deepEqual(judgeReachability(mesh, none, memory, opts(NOW)), []);
    assert.deepEqual(judgeReachability(mesh, none, memory, opts(NOW + 75_000)), [], 'exactly three keepalives: not yet');
    const down = judgeReachability(mesh, none, memory, opts(NOW + 75_001));
    assert.deepEqual(down.map((c) => [c.kind, c.peer.nodeName]), [['unreachable', 'node-2'], ['unreachable', 'office-1']]);
    assert.deepEqual(judgeReachability(mesh, none, memory, opts(NOW + 80_000)), [], 'said once');
    const up = judgeReachability(mesh, device([{ key: keys[0], handshake: NOW + 79_000 }, { key: keys[1] }]), memory, opts(NOW + 80_000));
    assert.deepEqual(up.map((c) => [c.kind, c.peer.nodeName]), [['reachable', 'node-2']]);
    assert.deepEqual([...memory.unreachable], [keys[1]]);
  });

  test('a session older than 180 s + a keepalive is unreachable; peers leaving the mesh are forgotten', () => {
    const memory = newReachabilityMemory();
    const opts = (t: number) => ({ nowWallMs: t, persistentKeepaliveS: 0 });
    const dev = device([{ key: keys[0], handshake: NOW }]);
    const one = new Map([[keys[0], mesh.get(keys[0])!]]);
    assert.deepEqual(judgeReachability(one, dev, memory, opts(NOW + 180_000)), []);
    assert.equal(judgeReachability(one, dev, memory, opts(NOW + 180_001))[0]?.kind, 'unreachable');
    assert.deepEqual(judgeReachability(new Map(), dev, memory, opts(NOW + 200_000)), []);
    assert.equal(memory.unreachable.size + memory.configuredAt.size, 0);
  });
});

describe('agent decisions: what the data plane\'s view says about endpoints', () => {
  test('observed: recent handshakes at an address not the peer\'s own; working at own address: the rest of the recent ones', () => {
    const dev = device([
      { key: keys[0], endpoint: '10.77.0.2:51820', handshake: NOW - 1000 }, // at its own address
      { key: keys[1], endpoint: '198.51.100.7:40001', handshake: NOW - 1000 }, // behind NAT
      { key: keys[2], endpoint: '198.51.100.9:1', handshake: NOW - 1000 }, // not in the mesh
    ]);
    assert.deepEqual([...observedEndpoints(mesh, dev, NOW)], [[keys[1], '198.51.100.7:40001']]);
    assert.deepEqual([...workingAtOwnAddress(mesh, dev, NOW)], [keys[0]]);
    // 180 s after the handshake nothing is known to work any more.
    assert.equal(observedEndpoints(mesh, dev, NOW + 179_000).size, 0);
    assert.equal(workingAtOwnAddress(mesh, dev, NOW + 179_000).size, 0);
    assert.equal(observedEndpoints(mesh, device([{ key: keys[1], endpoint: '198.51.100.7:40001' }]), NOW).size, 0, 'never handshook: no evidence');
  });
});

/** An annotation patch as the Node then carries it (null = absent). */
const applied = (patch: Record<string, string | null>): Record<string, string> =>
  Object.fromEntries(Object.entries(patch).filter((e): e is [string, string] => e[1] !== null));

describe('agent decisions: this Node\'s own annotations', () => {
  const facts = { publicKey: keys[0], listenPort: 51820, podCidrs: ['10.244.1.0/24'], nodeIps: [], firewallOnly: false };

  test('a stolen-token patch of public-key and pod-cidrs is found field by field and restored with exactly those fields', () => {
    const written = { ...ownAnnotations(facts), [ANNOTATION.discoveredEndpoints]: null };
    const tampered = { ...applied(written), [ANNOTATION.publicKey]: keys[2], [ANNOTATION.podCidrs]: '["10.244.0.0/16"]', [ANNOTATION.discoveredEndpoints]: JSON.stringify({ [keys[1]]: '6.6.6.6:1' }) };
    const drift = annotationDrift(written, tampered);
    assert.deepEqual(drift.map((d) => d.field).sort(), [ANNOTATION.discoveredEndpoints, ANNOTATION.podCidrs, ANNOTATION.publicKey].sort());
    assert.deepEqual(restorePatch(drift), {
      [ANNOTATION.publicKey]: keys[0], [ANNOTATION.podCidrs]: '["10.244.1.0/24"]', [ANNOTATION.discoveredEndpoints]: null,
    });
    assert.deepEqual(annotationDrift(written, applied({ ...tampered, ...restorePatch(drift) })), [], 'after the restore nothing differs');
    assert.deepEqual(annotationDrift(written, { ...applied(written), 'roamguard.io/other': 'x', [ANNOTATION.forceEndpoint]: '1.2.3.4:5' }), [],
      'force-endpoint and annotations the agent never wrote are not its to restore');
  });

  test('a deleted annotation is put back; a firewall-only node keeps its key absent', () => {
    const written = ownAnnotations(facts);
    const without = applied(written);
    delete without[ANNOTATION.listenPort];
    assert.deepEqual(annotationDrift(written, without), [{ field: ANNOTATION.listenPort, expected: '51820', found: null }]);
    const fw = ownAnnotations({ ...facts, firewallOnly: true });
    assert.equal(fw[ANNOTATION.publicKey], null);
    assert.deepEqual(annotationDrift(fw, { [ANNOTATION.publicKey]: keys[1], [ANNOTATION.listenPort]: '51820', [ANNOTATION.podCidrs]: '["10.244.1.0/24"]', [ANNOTATION.nodeIps]: '[]' }).map((d) => d.field), [ANNOTATION.publicKey]);
  });

  test('force-endpoint: a change is reported (never restored); the first look only records it', () => {
    assert.equal(forceEndpointChange(undefined, { [ANNOTATION.forceEndpoint]: '203.0.113.5:4000' }), undefined);
    assert.equal(forceEndpointChange('203.0.113.5:4000', { [ANNOTATION.forceEndpoint]: '203.0.113.5:4000' }), undefined);
    assert.deepEqual(forceEndpointChange(null, { [ANNOTATION.forceEndpoint]: '6.6.6.6:1' }), { from: null, to: '6.6.6.6:1' });
    assert.deepEqual(forceEndpointChange('203.0.113.5:4000', {}), { from: '203.0.113.5:4000', to: null });
  });
});

describe('agent decisions: report once while it lasts', () => {
  test('new ids are returned once; an id that went away and came back is new again', () => {
    const seen = new Set<string>();
    assert.deepEqual(newOnes(seen, [{ id: 'a', item: 1 }, { id: 'b', item: 2 }]), [1, 2]);
    assert.deepEqual(newOnes(seen, [{ id: 'a', item: 1 }, { id: 'b', item: 2 }]), []);
    assert.deepEqual(newOnes(seen, [{ id: 'b', item: 2 }]), []);
    assert.deepEqual(newOnes(seen, [{ id: 'a', item: 1 }, { id: 'b', item: 2 }]), [1]);
  });
});

describe('agent decisions: the counters reach /metrics', () => {
  test('refused claims, route conflicts and restored annotations are exposed', async () => {
    const source = {
      nodeName: 'node-1', state: 'running' as const, ready: true, lastMesh: undefined, reconciles: 1, reconcileErrors: 0,
      reconcileDurationMsTotal: 1, lastReconcileDurationMs: 1, informer: undefined, dataplane: undefined,
      refusedClaims: 5, routeConflicts: 2, annotationsRestored: 3,
    };
    const text = await new AgentMetrics(source, { defaultMetrics: false }).scrape();
    assert.match(text, /^roamguard_mesh_refused_claims_total 5$/m);
    assert.match(text, /^roamguard_route_conflicts_total 2$/m);
    assert.match(text, /^roamguard_own_annotations_restored_total 3$/m);
  });
});
