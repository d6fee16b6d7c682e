/**
 * MeshTracker decides only the Nodes that changed; this model test checks, over random
 * interleavings of Node changes, that each pass equals `desiredMesh` over every Node. The clusters
 * are full of what makes a change reach other Nodes: shared and duplicate keys, this node's own
 * key, overlapping and reserved pod CIDR claims, addresses inside pod CIDRs, a public address that
 * several nodes publish, observations of each other and of this node, forced endpoints added and
 * removed, bad and missing annotations, relists, sessions at own addresses coming and going.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { keyToBase64 } from '../../dataplane/noise/keys.ts';
import { ANNOTATION, type NodeObject } from '../../control/mesh/annotations.ts';
import { desiredMesh, type MeshOptions, type MeshState, type SelfView } from '../../control/mesh/desired-peers.ts';
import { MeshTracker } from '../../control/mesh/mesh-tracker.ts';
import { prng } from '../helpers/prng.ts';

const keyOf = (n: number) => { const b = new Uint8Array(32); b[0] = n & 0xff; b[1] = n >> 8; b[31] = 9; return keyToBase64(b); };
const SELF_KEY = keyOf(0);
const self: SelfView = { nodeName: 'self', publicKey: SELF_KEY, podCidrs: ['10.244.0.0/24', 'fd00:244::/64'], addresses: ['192.168.9.1'] };
const baseOptions: MeshOptions = { wgIpFamily: 'dualstack', nativeRouting: { ipv4: false, ipv6: false }, defaultListenPort: 51820, persistentKeepalive: 25 };

let version = 0;

/** A random Node: usually one that shares nothing with others, often one that does. */
function randomNode(name: string, index: number, random: () => number, tangledChance = 0.2): NodeObject {
  const pick = <T>(list: readonly T[]): T => list[Math.floor(random() * list.length)];
  const tangled = random() < tangledChance;
  /** Prefixes that overlap every other node's: rare, or no change could be decided alone. */
  const wide = tangled && random() < 0.15;
  const annotations: Record<string, string> = {};
  const keyChoice = random();
  const key = !tangled ? keyOf(1000 + index * 7 + Math.floor(random() * 5)) : keyChoice < 0.15 ? SELF_KEY : keyOf(1 + Math.floor(random() * 3));
  if (random() < 0.08) { /* no key: waiting */ } else if (random() < 0.05) annotations[ANNOTATION.publicKey] = 'not-a-key';
  else annotations[ANNOTATION.publicKey] = key;
  const own = [`10.1.${index}.0/24`, `fd00:1:${index.toString(16)}::/64`];
  const claims = wide ? ['10.1.0.0/16', 'fd00:1::/48'] : tangled ? [pick([own[0], '10.1.3.0/24', '10.244.0.0/24', '127.0.0.0/24', '10.1.3.5/32']), own[1]] : own;
  annotations[ANNOTATION.podCidrs] = JSON.stringify(claims);
  annotations[ANNOTATION.listenPort] = String(pick([51820, 51821, 40000]));
  annotations[ANNOTATION.nodeIps] = JSON.stringify(tangled && random() < 0.5 ? [pick(['203.0.113.7', '8.8.4.4', '10.1.3.9', '192.168.9.1'])] : []);
  if (random() < 0.15) annotations[ANNOTATION.forceEndpoint] = pick(['198.18.0.1:51820', '[2001:db8::5]:51820']);
  if (random() < 0.4) {
    const seen: Record<string, string> = {};
    for (let k = 0; k < 1 + Math.floor(random() * 3); k++) {
      const target = random() < 0.15 ? SELF_KEY : keyOf(1000 + Math.floor(random() * 12) * 7 + Math.floor(random() * 5));
      seen[target] = pick(['198.51.100.1:4000', '198.51.100.2:4000', '192.168.1.5:51820', '[2001:db8::1]:4000']);
    }
    annotations[ANNOTATION.discoveredEndpoints] = JSON.stringify(seen);
  }
  const addresses = [{ type: 'InternalIP', address: tangled && random() < 0.3 ? pick(['192.168.0.100', '10.1.3.5', '192.168.9.1']) : `192.168.0.${index + 1}` }];
  if (random() < 0.5) addresses.push({ type: 'InternalIP', address: `fd00:9::${(index + 1).toString(16)}` });
  if (tangled && random() < 0.3) addresses.push({ type: 'ExternalIP', address: '203.0.113.7' });
  return {
    metadata: {
      name, resourceVersion: String(++version), annotations,
      creationTimestamp: `2026-01-0${1 + Math.floor(random() * 3)}T00:00:00Z`,
    },
    spec: random() < 0.85 ? { podCIDRs: wide && random() < 0.5 ? ['10.1.0.0/16', 'fd00:1::/48'] : own } : {},
    status: { addresses },
  };
}

function selfNode(random: () => number): NodeObject {
  return { metadata: { name: 'self', resourceVersion: String(++version) }, spec: { podCIDRs: random() < 0.5 ? self.podCidrs as string[] : ['10.244.0.0/16'] }, status: { addresses: [{ type: 'InternalIP', address: '192.168.9.1' }] } };
}

/** The state in a form that compares regardless of list order where order means nothing. */
function comparable(state: MeshState) {
  return {
    peers: [...state.peers.entries()].sort(([a], [b]) => (a < b ? -1 : 1)),
    rejected: state.rejected.map((r) => `${r.node}: ${r.reason}`).sort(),
    refused: (state.refused ?? []).map((r) => `${r.node} ${r.field} ${r.claim}: ${r.reason}`).sort(),
    waiting: [...state.waiting].sort(),
    clusterPodCidrs: state.clusterPodCidrs,
    tunnelRoutes: state.tunnelRoutes,
    selfNat: [state.selfNatPublicAddress, state.selfNatEndpoint],
  };
}

describe('MeshTracker', () => {
  test('equals desiredMesh over every Node on each pass of random Node changes, and decides most passes incrementally', () => {
    const SEEDS = 60, STEPS = 150, NAMES = 12;
    let passes = 0, incremental = 0, incrementalWithChange = 0;
    for (let seed = 1; seed <= SEEDS; seed++) {
      const random = prng(seed);
      const tracker = new MeshTracker();
      const nodes = new Map<string, NodeObject>();
      let own = selfNode(random);
      for (let i = 0; i < 8; i++) nodes.set(`n${i}`, randomNode(`n${i}`, i, random));
      let options: MeshOptions = { ...baseOptions };
      let previous: MeshState | undefined;
      for (let step = 0; step < STEPS; step++) {
        const roll = random();
        if (roll < 0.02) own = selfNode(random);
        else if (roll < 0.04) options = { ...options, nativeRouting: { ipv4: random() < 0.5, ipv6: false } };
        else if (roll < 0.07) {
          // Sessions at peers' own addresses came or went (a new set each time, as the agent does).
          const keys = [...nodes.values()].map((n) => n.metadata!.annotations?.[ANNOTATION.publicKey]).filter((k): k is string => !!k);
          options = { ...options, workingAtOwnAddress: new Set(keys.filter(() => random() < 0.5)) };
        } else if (roll < 0.09) {
          for (const [name, n] of nodes) nodes.set(name, structuredClone(n)); // a relist: same versions, new objects
        } else {
          for (let k = 0, changes = 1 + Math.floor(random() * 3); k < changes; k++) {
            const index = Math.floor(random() * NAMES);
            const name = `n${index}`;
            if (nodes.has(name) && random() < 0.25) nodes.delete(name);
            else nodes.set(name, randomNode(name, index, random));
          }
        }
        // The caller's order changes too (an informer's list is in no particular order).
        const list = [...nodes.values()];
        list.splice(Math.floor(random() * (list.length + 1)), 0, own);
        const full = random() < 0.03;
        const pass = tracker.update(list, self, options, full);
        const expected = desiredMesh(list, self, options);
        assert.deepEqual(comparable(pass.state), comparable(expected), `seed ${seed} step ${step} (${pass.incremental ? 'incremental' : 'full'} pass)`);
        passes++;
        if (pass.incremental) {
          incremental++;
          if (previous && comparable(previous).peers.length !== pass.state.peers.size) incrementalWithChange++;
        }
        // Unchanged peers keep their objects (the reconcile plan skips them by identity).
        if (previous && pass.incremental) {
          for (const [key, peer] of pass.state.peers) {
            const before = previous.peers.get(key);
            if (before && JSON.stringify(before) === JSON.stringify(peer)) assert.equal(peer, before, `seed ${seed} step ${step}: ${key} kept`);
          }
        }
        previous = pass.state;
      }
    }
    console.log(`${passes} passes, ${incremental} incremental (${incrementalWithChange} of them adding or removing a peer)`);
    assert.ok(incremental > passes * 0.25, `only ${incremental} of ${passes} passes were incremental: the test no longer exercises the fast path`);
    assert.ok(incrementalWithChange > 50, 'incremental passes that add or remove peers');
  });

  test('a force-endpoint annotation removed (kubectl annotate node X key-) reaches the peer', () => {
    const tracker = new MeshTracker();
    const random = prng(7);
    const nodes = Array.from({ length: 20 }, (_, i) => randomNode(`n${i}`, i, random, 0));
    const clean = (n: NodeObject): NodeObject => {
      const a = { ...n.metadata!.annotations! };
      delete a[ANNOTATION.forceEndpoint];
      delete a[ANNOTATION.discoveredEndpoints];
      return { ...n, metadata: { ...n.metadata, annotations: a, resourceVersion: String(++version) } };
    };
    const list = nodes.map(clean);
    list[4].metadata!.annotations![ANNOTATION.publicKey] = keyOf(4444);
    const key = keyOf(4444);
    tracker.update(list, self, baseOptions);
    const forced = clean(list[4]);
    forced.metadata!.annotations![ANNOTATION.forceEndpoint] = '198.18.7.7:51820';
    list[4] = forced;
    let pass = tracker.update(list, self, baseOptions);
    assert.equal(pass.incremental, true, 'a lone Node change is decided alone');
    assert.equal(pass.decided, 1);
    assert.equal(pass.state.peers.get(key)?.endpoint, '198.18.7.7:51820');
    list[4] = clean(list[4]);
    pass = tracker.update(list, self, baseOptions);
    assert.equal(pass.incremental, true);
    assert.equal(pass.state.peers.get(key)?.endpointSource, 'published');
    assert.deepEqual(comparable(pass.state), comparable(desiredMesh(list, self, baseOptions)));
  });
});
