/**
 * Relays for pairs that cannot meet: the annotations (bounded, validated), which peers need one,
 * which relay both sides pick, the relay's allocation table and its limits, leaving the relay when
 * a direct path works, and nodes that try to steer pairs they are not part of.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { keyToBase64 } from '../../dataplane/noise/keys.ts';
import {
  ANNOTATION, formatDiscoveredEndpoints, formatOwnAnnotations, formatRelayAllocations, formatRelayRequests, parseNodeAnnotations,
  parseRelayAllocations, parseRelayRequests, relayPairId, type NodeObject,
} from '../../control/mesh/annotations.ts';
import { desiredMesh, type DesiredPeer, type MeshOptions } from '../../control/mesh/desired-peers.ts';
import { keepLiveEndpoints } from '../../control/agent/observed-endpoints.ts';
import { Endpoint } from '../../dataplane/net/endpoint.ts';
import type { DeviceSnapshot } from '../../dataplane/uapi/uapi-protocol.ts';
import {
  allocateRelayPorts, chooseRelay, decideRelays, isPublicPeer, isPublicSelf, livenessWindow, livePeers, PROBED_SILENCE_MS, RELAY_PROBE_INTERVAL_MS,
  relayAssignments, relayCandidates, relaysToProbe, updateProbing, type LivenessMemory, type ProbingMemory, type RelayClientInput, type RelayClientMemory,
} from '../../control/mesh/relay.ts';

const newKey = () => keyToBase64(randomBytes(32));
const options: MeshOptions = { wgIpFamily: 'ipv4', nativeRouting: { ipv4: false, ipv6: false }, defaultListenPort: 51820, persistentKeepalive: 5 };

interface Spec {
  name: string; key: string; ip: string; port: number; cidr: string;
  discovered?: Record<string, string>; requests?: Map<string, string[]>; allocations?: Map<string, [number, number]>;
}
function node(spec: Spec): NodeObject {
  const annotations: Record<string, string> = formatOwnAnnotations({ publicKey: spec.key, listenPort: spec.port, podCidrs: [spec.cidr], nodeIps: [] });
  if (spec.discovered) annotations[ANNOTATION.discoveredEndpoints] = formatDiscoveredEndpoints(new Map(Object.entries(spec.discovered)));
  if (spec.requests) annotations[ANNOTATION.relayRequests] = formatRelayRequests(spec.requests)!;
  if (spec.allocations) annotations[ANNOTATION.relayAllocations] = formatRelayAllocations(spec.allocations);
  return {
    metadata: { name: spec.name, annotations, creationTimestamp: '2026-01-01T00:00:00Z' },
    spec: { podCIDRs: [spec.cidr] },
    status: { addresses: [{ type: 'InternalIP', address: spec.ip }] },
  };
}

// Two cloud relays, two sites behind port-randomising NATs (each cloud node sees them at a
// different port), an office with two nodes behind one NAT.
const k = { c1: newKey(), c2: newKey(), r1: newKey(), r2: newKey(), o1: newKey(), o2: newKey() };
const R1_NAT = '198.51.100.30', R2_NAT = '198.51.100.40', OFFICE = '198.51.100.7';
const seenBy = (port: number) => ({ [k.r1]: `${R1_NAT}:${port}`, [k.r2]: `${R2_NAT}:${port + 1}`, [k.o1]: `${OFFICE}:51821`, [k.o2]: `${OFFICE}:51822` });
const ips: Record<keyof typeof k, string> = { c1: '203.0.113.1', c2: '203.0.113.2', r1: '192.168.3.11', r2: '192.168.4.11', o1: '192.168.1.11', o2: '192.168.1.12' };
function world(extra: Partial<Record<keyof typeof k, Partial<Spec>>> = {}): NodeObject[] {
  const base: Spec[] = [
    { name: 'c1', key: k.c1, ip: ips.c1, port: 51820, cidr: '10.244.1.0/24', discovered: seenBy(40001), allocations: new Map() },
    { name: 'c2', key: k.c2, ip: ips.c2, port: 51820, cidr: '10.244.2.0/24', discovered: seenBy(50001), allocations: new Map() },
    { name: 'r1', key: k.r1, ip: ips.r1, port: 51825, cidr: '10.244.3.0/24' },
    { name: 'r2', key: k.r2, ip: ips.r2, port: 51826, cidr: '10.244.4.0/24' },
    { name: 'o1', key: k.o1, ip: ips.o1, port: 51821, cidr: '10.244.5.0/24' },
    { name: 'o2', key: k.o2, ip: ips.o2, port: 51822, cidr: '10.244.6.0/24' },
  ];
  return base.map((s) => node({ ...s, ...extra[s.name as keyof typeof k] }));
}
const meshOf = (nodes: NodeObject[], name: keyof typeof k) => desiredMesh(nodes, { nodeName: name, publicKey: k[name], podCidrs: [], addresses: [ips[name]] }, options);

/** The inputs of decideRelays for `name`, from the Node objects as every agent reads them. */
function clientInput(nodes: NodeObject[], name: keyof typeof k, over: Partial<RelayClientInput> = {}): RelayClientInput {
  const mesh = meshOf(nodes, name);
  const byName = new Map(nodes.map((n) => [n.metadata!.name!, n]));
  const requestsOf = new Map([...mesh.peers].map(([key, p]) => [key, parseRelayRequests(byName.get(p.nodeName)!)]));
  const allocationsOf = new Map<string, Map<string, [number, number]>>();
  for (const n of nodes) { const a = parseRelayAllocations(n); if (a) allocationsOf.set(n.metadata!.name!, a); }
  const offering = new Set(allocationsOf.keys());
  return {
    selfKey: k[name], selfPublic: isPublicSelf([ips[name]], mesh.selfNatPublicAddress), selfNatEndpoint: mesh.selfNatEndpoint,
    peers: mesh.peers, unreachable: new Set(), candidates: relayCandidates(mesh.peers, offering, new Set(mesh.peers.keys())),
    requestsOf, allocationsOf, device: new Map(), nowWallMs: 1_000_000, trialMs: 10_000, retryMs: 600_000, ...over,
  };
}

describe('relay annotations', () => {
  test('requests and allocations read back what was written; bad entries are dropped one by one', () => {
    const requests = new Map([[k.r2, ['c2', 'c1']]]);
    const n = node({ name: 'r1', key: k.r1, ip: ips.r1, port: 1, cidr: '10.244.3.0/24', requests });
    assert.deepEqual(parseRelayRequests(n), new Map([[k.r2, ['c1', 'c2']]]));
    const id = relayPairId(k.r1, k.r2);
    const relay = node({ name: 'c1', key: k.c1, ip: ips.c1, port: 1, cidr: '10.244.1.0/24', allocations: new Map([[id, [51900, 51901]]]) });
    assert.deepEqual(parseRelayAllocations(relay), new Map([[id, [51900, 51901]]]));
    assert.equal(parseRelayAllocations(n), undefined, 'no annotation: the node does not offer to relay');

    const bad = (field: string, value: string) => ({ metadata: { name: 'x', annotations: { [field]: value } } });
    const [lo, hi] = [k.r1, k.r2].sort();
    assert.deepEqual([...parseRelayAllocations(bad(ANNOTATION.relayAllocations, JSON.stringify({
      [`${hi},${lo}`]: [1, 2], // keys out of order
      [`${lo},${hi}`]: [70000, 2], // not a port
      [`${lo},${lo.slice(1)}x`]: [3, 4], // not a key
      [`${lo},${hi},${k.c1}`]: [5, 6], // three keys
    })))!], []);
    assert.deepEqual([...parseRelayAllocations(bad(ANNOTATION.relayAllocations, '{"a":'))!], [], 'not JSON: offers, allocates nothing');
    assert.deepEqual([...parseRelayRequests(bad(ANNOTATION.relayRequests, JSON.stringify({
      [k.r2]: ['c1', 'Not A Name'], [k.o1]: [], [k.o2]: Array.from({ length: 9 }, (_, i) => `n${i}`), notakey: ['c1'], [k.c1]: ['c2'],
    })))], [[k.c1, ['c2']]]);
  });

  test('oversized relay annotations are ignored without rejecting the node', () => {
    const n = node({ name: 'r1', key: k.r1, ip: ips.r1, port: 1, cidr: '10.244.3.0/24' });
    const many = Object.fromEntries(Array.from({ length: 3000 }, () => [newKey(), ['c1']]));
    n.metadata!.annotations![ANNOTATION.relayRequests] = JSON.stringify(many);
    n.metadata!.annotations![ANNOTATION.relayAllocations] = 'x'.repeat(200 * 1024);
    assert.equal(parseRelayRequests(n).size, 0, 'over the length bound: nothing read');
    assert.deepEqual([...parseRelayAllocations(n)!], []);
    assert.equal(parseNodeAnnotations(n).ok, true, 'the node itself stays in the mesh');
  });
});

describe('which relay', () => {
  test('public peers that offer and are live are the candidates; nodes behind NAT never are', () => {
    const mesh = meshOf(world(), 'r1');
    assert.equal(isPublicPeer(mesh.peers.get(k.c1)!), true);
    assert.equal(isPublicPeer(mesh.peers.get(k.r2)!), false, 'seen behind NAT');
    assert.equal(isPublicPeer(mesh.peers.get(k.o1)!), false);
    assert.deepEqual(relayCandidates(mesh.peers, new Set(['c1', 'c2', 'o1']), new Set([k.c1, k.c2, k.o1])), ['c1', 'c2']);
    assert.deepEqual(relayCandidates(mesh.peers, new Set(['c1', 'c2']), new Set([k.c2])), ['c2'], 'c1 is not live from here');
    assert.equal(isPublicSelf([ips.c1], undefined), true);
    assert.equal(isPublicSelf([ips.r1], R1_NAT), false);
  });

  test('both sides and the relays compute the same relay, from the relays both reach', () => {
    const id = relayPairId(k.r1, k.r2);
    const both = chooseRelay(id, ['c1', 'c2'], ['c2', 'c1']);
    assert.ok(both === 'c1' || both === 'c2');
    assert.equal(chooseRelay(id, ['c2', 'c1'], ['c1', 'c2']), both, 'order does not matter');
    assert.equal(chooseRelay(id, ['c1'], ['c2']), undefined, 'no relay both reach');
    assert.equal(chooseRelay(id, ['c1', 'c2'], ['c2']), 'c2');
    // Pairs spread over relays: with 40 pairs and 4 relays, every relay serves some.
    const relays = ['c1', 'c2', 'c3', 'c4'];
    const used = new Set(Array.from({ length: 40 }, () => chooseRelay(relayPairId(newKey(), newKey()), relays, relays)));
    assert.equal(used.size, 4);
  });

  test('a relay serves only pairs whose members both ask for each other and that the rule gives it', () => {
    const id = relayPairId(k.r1, k.r2);
    const chosen = chooseRelay(id, ['c1', 'c2'], ['c1', 'c2'])!;
    const other = chosen === 'c1' ? 'c2' : 'c1';
    const requestsOf = new Map([
      [k.r1, new Map([[k.r2, ['c1', 'c2']], [k.o1, ['c1', 'c2']]])],
      [k.r2, new Map([[k.r1, ['c1', 'c2']]])],
      [k.o1, new Map<string, string[]>()], // o1 never asked for r1
    ]);
    assert.deepEqual(relayAssignments(chosen, k[chosen as 'c1'], requestsOf), [id]);
    assert.deepEqual(relayAssignments(other, k[other as 'c1'], requestsOf), []);
  });
});

describe('relay needed, relayed, and back to direct', () => {
  test('an unreachable pair of NAT\'d nodes asks, and goes through the relay both pick once it allocates', () => {
    let nodes = world();
    const memory1: RelayClientMemory = new Map();
    const d1 = decideRelays(clientInput(nodes, 'r1', { unreachable: new Set([k.r2]) }), memory1);
    assert.deepEqual([...d1.requests], [[k.r2, ['c1', 'c2']]]);
    assert.equal(d1.routes.size, 0, 'the peer has not asked yet');
    assert.deepEqual(d1.events.map((e) => e.kind), ['relay-needed']);
    const memory2: RelayClientMemory = new Map();
    const d2 = decideRelays(clientInput(nodes, 'r2', { unreachable: new Set([k.r1]) }), memory2);
    nodes = world({ r1: { requests: d1.requests }, r2: { requests: d2.requests } });

    // The chosen relay sees both requests and allocates; the other one does not.
    const requestsOf = new Map(nodes.map((n) => [parseNodeAnnotations(n).ok ? (parseNodeAnnotations(n) as { value: { publicKey: string } }).value.publicKey : '', parseRelayRequests(n)]));
    const id = relayPairId(k.r1, k.r2);
    const via = chooseRelay(id, ['c1', 'c2'], ['c1', 'c2'])! as 'c1' | 'c2';
    const wanted = relayAssignments(via, k[via], requestsOf);
    assert.deepEqual(wanted, [id]);
    const { allocations } = allocateRelayPorts(new Map(), wanted, { portMin: 51900, portMax: 51999, maxPairs: 4 });
    nodes = world({ r1: { requests: d1.requests }, r2: { requests: d2.requests }, [via]: { allocations } });

    const r1 = decideRelays(clientInput(nodes, 'r1', { unreachable: new Set([k.r2]) }), memory1);
    const r2 = decideRelays(clientInput(nodes, 'r2', { unreachable: new Set([k.r1]) }), memory2);
    const [portLow, portHigh] = allocations.get(id)!;
    const relayIp = ips[via];
    assert.deepEqual(r1.routes.get(k.r2), { endpoint: `${relayIp}:${k.r1 < k.r2 ? portLow : portHigh}`, via });
    assert.deepEqual(r2.routes.get(k.r1), { endpoint: `${relayIp}:${k.r2 < k.r1 ? portLow : portHigh}`, via });
    assert.notEqual(r1.routes.get(k.r2)!.endpoint, r2.routes.get(k.r1)!.endpoint, 'each side has its own port');
    assert.deepEqual(r1.events.map((e) => e.kind), ['relayed']);
  });

  test('nodes behind the same NAT, public nodes and reachable peers never use a relay', () => {
    const input = clientInput(world(), 'o1', { unreachable: new Set([k.o2, k.c1]) });
    assert.equal(input.peers.get(k.o2)?.endpointSource, 'lan');
    const d = decideRelays(input, new Map());
    assert.deepEqual([...d.requests.keys()], [], 'o2 is on the LAN, c1 is public');
    const cloud = decideRelays(clientInput(world(), 'c1', { unreachable: new Set([k.r1]) }), new Map());
    assert.equal(cloud.requests.size, 0, 'a public node is reached directly by everyone');
    const fine = decideRelays(clientInput(world(), 'r1'), new Map());
    assert.equal(fine.requests.size, 0, 'a mesh that needs no relay asks for none');
  });

  test('when the direct endpoints change, the pair tries direct and leaves the relay when it works', () => {
    const id = relayPairId(k.r1, k.r2);
    const via = chooseRelay(id, ['c1', 'c2'], ['c1', 'c2'])! as 'c1' | 'c2';
    const allocations = new Map([[id, [51900, 51901] as [number, number]]]);
    const asked = (self: string, peer: string) => new Map([[peer, ['c1', 'c2']]]);
    let nodes = world({ r1: { requests: asked(k.r1, k.r2) }, r2: { requests: asked(k.r2, k.r1) }, [via]: { allocations } });
    const memory: RelayClientMemory = new Map();
    let now = 1_000_000;
    const step = (device: Map<string, { endpoint?: string; rxBytes: number }>, previous?: Map<string, { endpoint: string; via: string }>) =>
      decideRelays(clientInput(nodes, 'r1', { unreachable: new Set([k.r2]), device, nowWallMs: now }), memory, previous);
    const first = step(new Map());
    const relayed = first.routes.get(k.r2)!;
    assert.ok(relayed);

    // r2's NAT keeps ports again: both clouds now see it at the same port.
    nodes = world({ r1: { requests: asked(k.r1, k.r2) }, r2: { requests: asked(k.r2, k.r1) }, [via]: { allocations } })
      .map((n) => (n.metadata!.name === 'c1' || n.metadata!.name === 'c2' ? node({
        name: n.metadata!.name!, key: k[n.metadata!.name as 'c1'], ip: ips[n.metadata!.name as 'c1'], port: 51820, cidr: n.metadata!.name === 'c1' ? '10.244.1.0/24' : '10.244.2.0/24',
        discovered: { ...seenBy(40001), [k.r2]: `${R2_NAT}:51826` }, allocations: n.metadata!.name === via ? allocations : new Map(),
      }) : n));
    now += 5000;
    const trial = step(new Map([[k.r2, { endpoint: relayed.endpoint, rxBytes: 1000 }]]), first.routes);
    assert.deepEqual(trial.events.map((e) => e.kind), ['direct-trial']);
    assert.equal(trial.routes.has(k.r2), false, 'during the trial the peer is at its direct endpoint');
    assert.ok(trial.requests.has(k.r2), 'and the relay stays allocated meanwhile');
    now += 11_000;
    const done = step(new Map([[k.r2, { endpoint: `${R2_NAT}:51826`, rxBytes: 1300 }]]), trial.routes);
    assert.deepEqual(done.events.map((e) => e.kind), ['direct-again']);
    assert.equal(done.routes.size + done.requests.size, 0, 'left the relay: nothing asked any more');
  });

  /**
   * r1 and r2 asking for each other, the relay the rule picks allocating their pair; `step` is r1's
   * decision with the data plane at `endpoint` having received `rx` bytes from r2, at `clock.now`.
   */
  function relayedPair() {
    const id = relayPairId(k.r1, k.r2);
    const via = chooseRelay(id, ['c1', 'c2'], ['c1', 'c2'])! as 'c1' | 'c2';
    const allocations = new Map([[id, [51900, 51901] as [number, number]]]);
    const nodes = world({ r1: { requests: new Map([[k.r2, ['c1', 'c2']]]) }, r2: { requests: new Map([[k.r1, ['c1', 'c2']]]) }, [via]: { allocations } });
    const memory: RelayClientMemory = new Map();
    const clock = { now: 1_000_000 };
    const step = (rx: number, endpoint: string, previous?: Map<string, { endpoint: string; via: string }>) =>
      decideRelays(clientInput(nodes, 'r1', { unreachable: new Set([k.r2]), nowWallMs: clock.now, retryMs: 60_000, device: new Map([[k.r2, { endpoint, rxBytes: rx }]]) }), memory, previous);
    return { step, clock, direct: clientInput(nodes, 'r1').peers.get(k.r2)!.endpoint! };
  }

  test('a direct trial that hears nothing goes back to the relay, and tries again only on a change or after retryMs', () => {
    const { step, clock } = relayedPair();
    const first = step(0, '');
    const relayEndpoint = first.routes.get(k.r2)!.endpoint;
    clock.now += 30_000;
    assert.deepEqual(step(100, relayEndpoint, first.routes).events, [], 'nothing changed: no trial before retryMs');
    clock.now += 30_000;
    const trial = step(100, relayEndpoint, first.routes);
    assert.deepEqual(trial.events.map((e) => e.kind), ['direct-trial']);
    clock.now += 10_000;
    // Packets kept coming only through the relay (the data plane roamed back to it): failed.
    const failed = step(200, relayEndpoint, trial.routes);
    assert.deepEqual(failed.events.map((e) => e.kind), ['direct-trial-failed', 'relayed']);
    assert.equal(failed.routes.get(k.r2)?.endpoint, relayEndpoint, 'back on the relay');
  });

  test('a datagram through the relay landing after the switch does not end a direct trial: direct is written again, and only what arrives after counts', () => {
    /** One trial in which a relayed datagram roams r1 back; then `rxAtEnd` bytes in all, the data plane at the direct endpoint. */
    const trialWithLateRelayDatagram = (rxAtEnd: number) => {
      const { step, clock, direct } = relayedPair();
      const first = step(0, '');
      const relayEndpoint = first.routes.get(k.r2)!.endpoint;
      assert.equal(first.directNow.size, 0, 'relayed: nothing direct to write');
      clock.now += 60_000;
      const trial = step(100, relayEndpoint, first.routes);
      assert.deepEqual(trial.events.map((e) => e.kind), ['direct-trial']);
      assert.deepEqual([...trial.directNow], [k.r2], 'a trial starts: written, with a packet');
      clock.now += 2000;
      assert.equal(step(150, direct, trial.routes).directNow.size, 0, 'still at the direct endpoint: nothing to write again');
      clock.now += 2000;
      // A keepalive the peer sent through the relay before its own switch lands: the data plane roamed back.
      const roamedBack = step(180, relayEndpoint, trial.routes);
      assert.deepEqual(roamedBack.events, [], 'the trial goes on');
      assert.deepEqual([...roamedBack.directNow], [k.r2], 'direct is written again');
      assert.equal(roamedBack.routes.has(k.r2), false, 'and not the relay');
      clock.now += 7000;
      return step(rxAtEnd, direct, trial.routes).events.map((e) => e.kind);
    };
    // The 180 bytes came through the relay; nothing since: failed.
    assert.deepEqual(trialWithLateRelayDatagram(180), ['direct-trial-failed', 'relayed']);
    // The peer's packets came directly after the rewrite: it leaves the relay.
    assert.deepEqual(trialWithLateRelayDatagram(260), ['direct-again']);
  });

  test('a relay that stops answering drops out of the candidates, and the pair moves to the other relay', () => {
    const memory: LivenessMemory = new Map();
    let now = 100_000;
    const peers = (rxC1: number, rxC2: number) => [
      { key: k.c1, rxBytes: rxC1, lastHandshakeWallMs: now - 1000 }, { key: k.c2, rxBytes: rxC2, lastHandshakeWallMs: now - 1000 },
    ];
    assert.deepEqual([...livePeers(peers(10, 10), memory, now, () => 15_000)].sort(), [k.c1, k.c2].sort());
    for (let i = 0; i < 4; i++) { now += 5000; livePeers(peers(10, 10 + i + 1), memory, now, () => 15_000); }
    assert.deepEqual([...livePeers(peers(10, 20), memory, now, () => 15_000)], [k.c2], 'c1 sent nothing for 20 s');
    const fresh: LivenessMemory = new Map();
    assert.deepEqual([...livePeers([{ key: k.r1, rxBytes: 0, lastHandshakeWallMs: 0 }], fresh, now, () => 15_000)], [], 'never heard from: not live');

    const id = relayPairId(k.r1, k.r2);
    const via = chooseRelay(id, ['c1', 'c2'], ['c1', 'c2'])!;
    const survivor = via === 'c1' ? 'c2' : 'c1';
    assert.equal(chooseRelay(id, [survivor], [survivor]), survivor, 'the lists without the dead relay pick the survivor');
  });
});

describe('probing the relays while a pair needs one', () => {
  /**
   * At the default keepalive (25 s) the keepalive window is 55 s. A relay that dies while probed
   * must drop out within PROBED_SILENCE_MS + a look; a live one answering every probe never may,
   * nor may one whose last word was a keepalive 20 s before probing began.
   */
  const keepaliveWindowMs = (2 * 25 + 5) * 1000;
  const LOOK_MS = 5000; // the agent reads the data plane every 5 s

  test('only relay-offering public peers are probed, and only while a peer is relayed or unreachable', () => {
    const c1 = newKey(), h1 = newKey();
    const peers = new Map<string, DesiredPeer>([
      [c1, { nodeName: 'c1', endpoint: '203.0.113.1:51820', endpointSource: 'published' } as DesiredPeer],
      [h1, { nodeName: 'h1', endpoint: '198.51.100.20:40000', endpointSource: 'discovered', natPublicAddress: '198.51.100.20' } as DesiredPeer],
    ]);
    const none = new Set<string>();
    assert.deepEqual(relaysToProbe(peers, new Set(['c1', 'h1']), none, none), [], 'every peer reached directly: nothing probed');
    assert.deepEqual(relaysToProbe(peers, new Set(['c1', 'h1']), new Set([h1]), none), [c1], 'a node behind NAT is never a relay');
    assert.deepEqual(relaysToProbe(peers, new Set(), new Set([h1]), none), [], 'a public node that does not offer is not probed');
    // Before any relay is asked for: a peer without a working session is enough (else a relay
    // whose keepalives ours keep suppressing looks dead, and is never asked).
    assert.deepEqual(relaysToProbe(peers, new Set(['c1', 'h1']), none, new Set([h1])), [c1], 'an unreachable peer starts the probes');
    assert.deepEqual(relaysToProbe(peers, new Set(['c1', 'h1']), none, new Set([newKey()])), [], 'a key that is no mesh peer does not');
  });

  for (const [what, answers] of [['answers every probe', true], ['dies', false]] as const) {
    test(`a probed relay that ${what}`, () => {
      const memory: LivenessMemory = new Map();
      const probing: ProbingMemory = new Map();
      const relay = newKey();
      let now = 1_000_000;
      let rx = 1000;
      // Its last keepalive came 20 s before probing started.
      livePeers([{ key: relay, rxBytes: rx, lastHandshakeWallMs: now }], memory, now, () => keepaliveWindowMs);
      now += 20_000;
      updateProbing(probing, [relay], now);
      const deadAt = now;
      let droppedAt: number | undefined;
      for (let t = 0; t < 60_000; t += LOOK_MS) {
        now = deadAt + t;
        updateProbing(probing, [relay], now);
        if (answers) rx += 64 * Math.floor(LOOK_MS / RELAY_PROBE_INTERVAL_MS);
        const live = livePeers([{ key: relay, rxBytes: rx, lastHandshakeWallMs: now - 30_000 }], memory, now, (k) => livenessWindow(k, probing, now, keepaliveWindowMs));
        if (!live.has(relay) && droppedAt === undefined) droppedAt = now;
      }
      if (answers) {
        assert.equal(droppedAt, undefined, 'a relay answering its probes stays a candidate');
      } else {
        // Dead from the moment probing began (its last word 20 s before): the short window
        // applies once probing has run PROBED_SILENCE_MS, so it drops at the first look after.
        assert.ok(droppedAt !== undefined, 'a silent relay drops out');
        assert.ok(droppedAt - deadAt <= PROBED_SILENCE_MS + LOOK_MS, `dropped ${droppedAt - deadAt} ms after it died`);
        assert.ok(droppedAt - deadAt >= PROBED_SILENCE_MS, 'not before probing had a fair chance');
      }
    });
  }

  test('probing ended: the keepalive window applies again', () => {
    const probing: ProbingMemory = new Map();
    updateProbing(probing, ['a'], 0);
    assert.equal(livenessWindow('a', probing, PROBED_SILENCE_MS, 55_000), PROBED_SILENCE_MS);
    updateProbing(probing, [], PROBED_SILENCE_MS + 1);
    assert.equal(livenessWindow('a', probing, PROBED_SILENCE_MS + 1, 55_000), 55_000);
    updateProbing(probing, ['a'], 100_000);
    assert.equal(livenessWindow('a', probing, 100_000 + PROBED_SILENCE_MS - 1, 55_000), 55_000, 'probing again starts the clock again');
  });
});

describe('limits', () => {
  test('pairs keep their ports; new pairs get free ones until the pair limit or the range runs out', () => {
    const ids = Array.from({ length: 5 }, () => relayPairId(newKey(), newKey())).sort();
    const limits = { portMin: 51900, portMax: 51907, maxPairs: 3 };
    const first = allocateRelayPorts(new Map(), ids.slice(0, 2), limits);
    assert.deepEqual([...first.allocations.values()], [[51900, 51901], [51902, 51903]]);
    const second = allocateRelayPorts(first.allocations, ids.slice(1), limits);
    assert.deepEqual(second.allocations.get(ids[1]), [51902, 51903], 'kept');
    assert.equal(second.allocations.size, 3, 'at most maxPairs');
    assert.equal(second.refused.length, 1);
    assert.ok(!second.allocations.has(ids[0]), 'a pair nobody wants any more is freed');
    const small = allocateRelayPorts(new Map(), ids, { portMin: 51900, portMax: 51904, maxPairs: 10 }, new Set([51901]));
    assert.deepEqual([...small.allocations.values()], [[51900, 51902], [51903, 51904]], 'a port that could not be bound is skipped; the range ends');
    assert.equal(small.refused.length, 3);
  });
});

describe('attacks through annotations', () => {
  test('a node that is not the pair\'s relay cannot redirect the pair by publishing allocations for it', () => {
    const id = relayPairId(k.r1, k.r2);
    const via = chooseRelay(id, ['c1', 'c2'], ['c1', 'c2'])! as 'c1' | 'c2';
    const attacker = via === 'c1' ? 'c2' : 'c1';
    const requests = { r1: { requests: new Map([[k.r2, ['c1', 'c2']]]) }, r2: { requests: new Map([[k.r1, ['c1', 'c2']]]) } };
    // The attacker (a cluster member that does offer relaying) claims the pair at its own ports,
    // and o1 (behind NAT, not offering) claims it too; the honest relay has not allocated yet.
    const forged = new Map([[id, [6000, 6001] as [number, number]]]);
    let nodes = world({ ...requests, [attacker]: { allocations: forged }, o1: { allocations: forged } });
    const d = decideRelays(clientInput(nodes, 'r1', { unreachable: new Set([k.r2]) }), new Map());
    assert.equal(d.routes.size, 0, 'no route through a node the pair did not pick');
    // Once the honest relay allocates, the pair uses it and only it.
    nodes = world({ ...requests, [attacker]: { allocations: forged }, [via]: { allocations: new Map([[id, [51900, 51901]]]) } });
    const after = decideRelays(clientInput(nodes, 'r1', { unreachable: new Set([k.r2]) }), new Map());
    assert.equal(after.routes.get(k.r2)?.via, via);
    assert.doesNotMatch(after.routes.get(k.r2)!.endpoint, /:600[01]$/);
  });

  test('requests on a node speak only for that node: nobody can make a relay serve a pair that did not ask', () => {
    // o1 asks for a relay with r2 "on behalf of" r1 by listing r1's key as the peer: that is o1's
    // own pair (o1, r1) and r1 never asked for it, so no relay serves it; r1 and r2 did not ask either.
    const nodes = world({ o1: { requests: new Map([[k.r1, ['c1', 'c2']], [k.r2, ['c1', 'c2']]]) } });
    const requestsOf = new Map(nodes.map((n) => [(parseNodeAnnotations(n) as { value: { publicKey: string } }).value.publicKey, parseRelayRequests(n)]));
    for (const relay of ['c1', 'c2'] as const) assert.deepEqual(relayAssignments(relay, k[relay], requestsOf), []);
  });
});

describe('endpoints of live sessions', () => {
  test('a live session keeps the endpoint it learned over one other nodes observed; forced, relayed and silent peers do not', () => {
    const mesh = meshOf(world(), 'c1');
    const device = (entries: Array<[string, string]>): DeviceSnapshot => ({ listenPort: 51820, fwmark: 0, peers: entries.map(([key, endpoint]) => ({
      publicKey: Buffer.from(key, 'base64'), presharedKey: new Uint8Array(32), endpoint: Endpoint.parse(endpoint), lastHandshakeWallMs: 1, txBytes: 0, rxBytes: 0, persistentKeepalive: 5, allowedIps: [],
    })) });
    assert.equal(mesh.peers.get(k.r1)?.endpointSource, 'discovered');
    assert.equal(mesh.peers.get(k.r1)?.endpoint, `${R1_NAT}:50001`, 'c2 sees r1 there (c1 does not count its own view)');
    const seen = device([[k.r1, `${R1_NAT}:40001`], [k.r2, `${R2_NAT}:40002`], [k.c2, '203.0.113.2:51820']]);
    const kept = keepLiveEndpoints(mesh.peers, seen, new Set([k.r1, k.c2]), new Set());
    assert.equal(kept.get(k.r1)?.endpoint, `${R1_NAT}:40001`, 'live: kept where it talks from');
    assert.equal(kept.get(k.r2)?.endpoint, mesh.peers.get(k.r2)?.endpoint, 'silent: others\' observation is tried');
    assert.equal(kept.get(k.c2)?.endpoint, '203.0.113.2:51820', 'published addresses are not observations');
    assert.equal(keepLiveEndpoints(mesh.peers, seen, new Set([k.r1]), new Set([k.r1])).get(k.r1)?.endpoint, `${R1_NAT}:50001`, 'a peer in relay mode is left to the relay decisions');
  });
});

// Keeps the DesiredPeer import honest (type used by the fixtures above through desiredMesh).
export type { DesiredPeer };
