/**
 * Roams the agent takes back (control/mesh/roam-back.ts): the rule itself, its place in a plan,
 * and a model of two agents and their data planes over random interleavings of pings, crossing
 * packets, agent passes, a force-endpoint put on and taken off, and a router restart that loses
 * its IPv6 address. The playground test found the pair stuck on the old family after the
 * force-endpoint went, and then on a dead IPv6 path after the restart; this model finds both
 * without the rule.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { Endpoint } from '../../dataplane/net/endpoint.ts';
import { parsePrefix } from '../../dataplane/net/ip.ts';
import { keyFromBase64, keyToBase64 } from '../../dataplane/noise/keys.ts';
import type { DeviceSnapshot } from '../../dataplane/uapi/uapi-protocol.ts';
import type { DesiredPeer, EndpointSource } from '../../control/mesh/desired-peers.ts';
import { newReconcileMemory, peersToKick, planReconcile, type ReconcileMemory } from '../../control/mesh/reconcile.ts';
import { roamToTakeBack } from '../../control/mesh/roam-back.ts';
import { applySetToSnapshot } from '../../control/mesh/device-model.ts';
import { livePeers, type LivenessMemory } from '../../control/mesh/relay.ts';
import { keepLiveEndpoints } from '../../control/agent/observed-endpoints.ts';
import { prng } from '../helpers/prng.ts';

const e = (text: string) => Endpoint.parse(text);

describe('roamToTakeBack', () => {
  const base = { wanted: e('203.0.113.2:51820'), current: e('[2001:db8:1::2]:51820'), live: true, everHandshook: true };
  test('a roam into the other family is taken back for stated endpoints only, working or not', () => {
    for (const source of ['forced', 'published', 'lan'] as const) {
      for (const live of [true, false, undefined]) assert.equal(roamToTakeBack({ ...base, source, live }), 'other-family', `${source} ${live}`);
    }
    for (const source of ['discovered', 'relay', undefined] as const) assert.equal(roamToTakeBack({ ...base, source }), undefined, String(source));
  });
  test('kept: a roam within the family (NAT rebinding), and one into the family of this node\'s own force-endpoint', () => {
    assert.equal(roamToTakeBack({ ...base, source: 'published', current: e('203.0.113.9:40000') }), undefined);
    assert.equal(roamToTakeBack({ ...base, source: 'published', ownForcedFamily: 6 }), undefined);
    assert.equal(roamToTakeBack({ ...base, source: 'published', ownForcedFamily: 4 }), 'other-family');
  });
  test('a roam whose session stopped is taken back; not without a liveness window, nor before a first handshake', () => {
    const sameFamily = { ...base, source: 'published' as const, current: e('203.0.113.9:40000') };
    assert.equal(roamToTakeBack({ ...sameFamily, live: false }), 'stopped');
    assert.equal(roamToTakeBack({ ...base, source: 'lan', live: false, ownForcedFamily: 6 }), 'stopped');
    assert.equal(roamToTakeBack({ ...sameFamily, live: undefined }), undefined);
    assert.equal(roamToTakeBack({ ...sameFamily, live: false, everHandshook: false }), undefined);
    assert.equal(roamToTakeBack({ ...base, source: 'discovered', live: false }), undefined);
  });
  test('no roam, nothing to take back', () => {
    assert.equal(roamToTakeBack({ ...base, source: 'published', current: base.wanted, live: false }), undefined);
  });
});

const newKey = () => keyToBase64(randomBytes(32));
const ALLOWED = ['10.244.2.0/24'];

function desiredPeer(key: string, endpoint: string, endpointSource: EndpointSource): DesiredPeer {
  return { nodeName: 'peer', publicKey: key, publicKeyBytes: keyFromBase64(key), endpoint, endpointSource, allowedIps: ALLOWED, persistentKeepalive: 10 };
}

function device(key: string, endpoint: string, lastHandshakeWallMs: number): DeviceSnapshot {
  return {
    listenPort: 51820, fwmark: 0,
    peers: [{ publicKey: keyFromBase64(key), presharedKey: new Uint8Array(32), endpoint: e(endpoint), lastHandshakeWallMs, txBytes: 0, rxBytes: 0, persistentKeepalive: 10, allowedIps: ALLOWED.map(parsePrefix) }],
  };
}

describe('planReconcile takes roams back', () => {
  const T = Date.UTC(2026, 11, 6, 1);
  test('a kept roam is planned again when its session stops, although peer and entry are unchanged', () => {
    const key = newKey();
    const memory = newReconcileMemory();
    const want = new Map([[key, desiredPeer(key, '203.0.113.2:51820', 'published')]]);
    planReconcile(want, device(key, '203.0.113.2:51820', T), memory, { collectGarbage: true, canRemoveAllowedIp: true, nowWallMs: T, live: new Set([key]) });
    const roamed = device(key, '203.0.113.7:51820', T);
    const kept = planReconcile(want, roamed, memory, { collectGarbage: true, canRemoveAllowedIp: true, nowWallMs: T + 5000, live: new Set([key]) });
    assert.deepEqual(kept.actions, []);
    assert.equal(memory.settled.size, 1, 'the kept roam is settled');
    const quiet = planReconcile(want, roamed, memory, { collectGarbage: true, canRemoveAllowedIp: true, nowWallMs: T + 40_000, live: new Set() });
    assert.equal(quiet.actions.length, 1);
    const action = quiet.actions[0];
    assert.ok(action.kind === 'update' && action.endpoint === '203.0.113.2:51820' && action.roamTakenBack === 'stopped', JSON.stringify(action));
    assert.deepEqual(peersToKick(quiet.actions).map((p) => p.publicKey), [key], 'and the peer is sent a packet there');
  });

  test('without a liveness window (keepalive off), a roam within the family is kept however old; one across families is not', () => {
    const key = newKey();
    const memory = newReconcileMemory();
    const want = new Map([[key, desiredPeer(key, '203.0.113.2:51820', 'published')]]);
    planReconcile(want, device(key, '203.0.113.2:51820', T), memory, { collectGarbage: true, canRemoveAllowedIp: true, nowWallMs: T });
    assert.deepEqual(planReconcile(want, device(key, '203.0.113.7:51820', T), memory, { collectGarbage: true, canRemoveAllowedIp: true, nowWallMs: T + 10 * 180_000 }).actions, []);
    const across = planReconcile(want, device(key, '[2001:db8:1::2]:51820', T), memory, { collectGarbage: true, canRemoveAllowedIp: true, nowWallMs: T + 10 * 180_000 }).actions[0];
    assert.ok(across?.kind === 'update' && across.roamTakenBack === 'other-family', JSON.stringify(across));
  });

  test('a settled cross-family roam is taken back once this node\'s own force-endpoint goes', () => {
    const key = newKey();
    const memory = newReconcileMemory();
    const want = new Map([[key, desiredPeer(key, '203.0.113.1:51820', 'published')]]);
    const live = new Set([key]);
    planReconcile(want, device(key, '203.0.113.1:51820', T), memory, { collectGarbage: true, canRemoveAllowedIp: true, nowWallMs: T, live });
    const roamed = device(key, '[2001:db8:1::1]:51820', T);
    assert.deepEqual(planReconcile(want, roamed, memory, { collectGarbage: true, canRemoveAllowedIp: true, nowWallMs: T + 5000, live, ownForcedFamily: 6 }).actions, []);
    const after = planReconcile(want, roamed, memory, { collectGarbage: true, canRemoveAllowedIp: true, nowWallMs: T + 10_000, live }).actions[0];
    assert.ok(after?.kind === 'update' && after.endpoint === '203.0.113.1:51820' && after.roamTakenBack === 'other-family', JSON.stringify(after));
  });
});

/**
 * The model. Node A reaches node B, a public dual-stack node (c2 in the playground). A is either
 * behind a home NAT that maps both families and lets in only what A sent to within the last 30 s
 * (h1: B sees A at observed mappings, and its desired endpoint for A is `discovered`) or public
 * itself (c1: `published`). Each end is a real plan (keepLiveEndpoints, planReconcile,
 * peersToKick, the relays' livePeers) over a DeviceSnapshot; the data planes roam as WireGuard
 * does, to the source of each packet received (every packet stands for a working session: the
 * handshake time moves with it).
 */
interface Side {
  key: string;
  device: DeviceSnapshot;
  memory: ReconcileMemory;
  liveness: LivenessMemory;
  writes: number;
}

type Fault = 'none' | 'router restart' | 'renumbered';

const KEEPALIVE_S = 10;
const LIVENESS_WINDOW_MS = Math.max(15_000, (2 * KEEPALIVE_S + 5) * 1000);
const NAT_TIMEOUT_MS = 30_000;
const B4 = '203.0.113.2:51820', B4_NEW = '203.0.113.3:51820', B6 = '[2001:db8:1::2]:51820';

function runWorld(seed: number, options: { natted: boolean; fault: Fault; takeBack: boolean }): string[] {
  const random = prng(seed);
  const between = (lo: number, hi: number) => lo + Math.floor(random() * (hi - lo));
  const T0 = Date.UTC(2026, 11, 6, 1);
  // A's addresses as B sees them: its home NAT's mappings, or its own.
  let a4 = options.natted ? '203.0.113.20:51824' : '203.0.113.1:51820';
  const a6 = options.natted ? '[2001:db8:1::14]:51824' : '[2001:db8:1::1]:51820';
  const dead = new Set<string>(); // addresses (ip:port) nothing reaches any more
  let v6Works = true;
  /** B's published IPv4 endpoint, and the source of its IPv4 packets that are not answers (the routing table's choice). */
  let bPublished4 = B4;
  let bSource4 = B4;
  /** A's NAT: the remote endpoints A sent to, and when last. */
  const opened = new Map<string, number>();
  const keys = { A: newKey(), B: newKey() };
  const side = (name: 'A' | 'B', peerEndpoint: string): Side => ({
    key: keys[name], memory: newReconcileMemory(), liveness: new Map(), writes: 0,
    device: {
      listenPort: 51820, fwmark: 0,
      peers: [{ publicKey: keyFromBase64(keys[name === 'A' ? 'B' : 'A']), presharedKey: new Uint8Array(32), endpoint: e(peerEndpoint), lastHandshakeWallMs: T0, txBytes: 0, rxBytes: 0, persistentKeepalive: KEEPALIVE_S, allowedIps: ALLOWED.map(parsePrefix) }],
    },
  });
  const A = side('A', B4), B = side('B', a4);
  const other = (s: Side) => (s === A ? B : A);
  const peerOf = (s: Side) => s.device.peers[0];

  // The cluster's view: B's force-endpoint (IPv6) on or off. Observers report A's IPv4 mapping
  // (dualstack prefers it).
  let forced = false;
  const wantOfA = (): DesiredPeer => desiredPeer(keys.A, a4, options.natted ? 'discovered' : 'published');
  const wantOfB = (): DesiredPeer => (forced ? desiredPeer(keys.B, B6, 'forced') : desiredPeer(keys.B, bPublished4, 'published'));

  const queue: Array<{ at: number; run: () => void }> = [];
  const at = (time: number, run: () => void) => {
    let i = queue.length;
    while (i > 0 && queue[i - 1].at > time) i--;
    queue.splice(i, 0, { at: time, run });
  };
  let now = T0;

  /** `answering`: the address a packet being answered arrived at (sticky source), if any. */
  const send = (from: Side, ping: boolean, answering?: string) => {
    const to = peerOf(from).endpoint!.toString();
    const family = peerOf(from).endpoint!.family;
    if (dead.has(to) || (family === 6 && !v6Works)) return;
    if (from === A) opened.set(to, now);
    const source = from === A ? (family === 4 ? a4 : a6) : answering ?? (family === 4 ? bSource4 : B6);
    if (dead.has(source)) return;
    // Each packet takes 1-40 ms: one in flight while an agent moves an endpoint crosses it.
    at(now + between(1, 40), () => deliver(other(from), to, source, family, ping));
  };
  const deliver = (to: Side, address: string, source: string, family: 4 | 6, ping: boolean) => {
    if (dead.has(address) || dead.has(source) || (family === 6 && !v6Works)) return;
    if (to === A && options.natted && !(now - (opened.get(source) ?? -Infinity) <= NAT_TIMEOUT_MS)) return;
    const entry = peerOf(to);
    // WireGuard: an authenticated packet moves the peer's endpoint to its source.
    to.device = { ...to.device, peers: [{ ...entry, endpoint: e(source), rxBytes: entry.rxBytes + 100, lastHandshakeWallMs: now }] };
    if (ping) send(to, false, to === B ? address : undefined);
  };

  const pass = (s: Side) => {
    const entry = peerOf(s);
    const live = livePeers([{ key: other(s).key, rxBytes: entry.rxBytes, lastHandshakeWallMs: entry.lastHandshakeWallMs }], s.liveness, now, () => LIVENESS_WINDOW_MS);
    const want = s === A ? wantOfB() : wantOfA();
    const desired = keepLiveEndpoints(new Map([[want.publicKey, want]]), s.device, live, new Set());
    const plan = planReconcile(desired, s.device, s.memory, {
      collectGarbage: true, canRemoveAllowedIp: true, nowWallMs: now, live, ownForcedFamily: s === B && forced ? 6 : undefined,
    });
    // The control leaves the rule out: a plan whose only change takes a roam back is not applied.
    if (!options.takeBack && plan.actions.some((a) => a.kind === 'update' && a.roamTakenBack !== undefined)) return;
    if (plan.request) {
      s.device = applySetToSnapshot(s.device, plan.request);
      if (plan.actions.some((a) => a.kind === 'update' && a.endpoint !== undefined)) s.writes++;
    }
    if (peersToKick(plan.actions).length > 0) send(s, false);
  };

  // Traffic: each end pings the other every 0.3-2 s (the playground's matrix, keepalives).
  for (const s of [A, B]) {
    const ping = () => { send(s, true); at(now + between(300, 2000), ping); };
    at(now + between(0, 2000), ping);
  }
  // Agents: a pass every 5 s (the discovery read), and one soon after each Node event.
  for (const s of [A, B]) {
    const loop = () => { pass(s); at(now + 5000, loop); };
    at(now + between(0, 5000), loop);
  }
  const nodeEvent = () => {
    at(now + between(0, 60), () => pass(A));
    at(now + between(0, 60), () => pass(B));
  };

  const failures: string[] = [];
  const endpoints = () => `A→B ${peerOf(A).endpoint} B→A ${peerOf(B).endpoint}`;
  const forcedAt = T0 + between(10_000, 30_000);
  const unforcedAt = forcedAt + between(30_000, 60_000);
  const faultAt = unforcedAt + between(0, 30_000);
  const endAt = faultAt + 150_000;

  at(forcedAt, () => { forced = true; nodeEvent(); });
  at(unforcedAt - 1, () => {
    // The phase lasts 30-60 s: both ends are on the forced family when it is taken off.
    if (peerOf(A).endpoint!.toString() !== B6 || peerOf(B).endpoint!.family !== 6) failures.push(`forced phase ended on ${endpoints()}`);
  });
  at(unforcedAt, () => { forced = false; nodeEvent(); });
  if (options.fault === 'router restart') {
    at(faultAt, () => {
      // A's router restarts (A's own uplink, when A is public): IPv6 gone for good, state lost,
      // new IPv4 mappings, which observers publish a few seconds later.
      v6Works = false;
      opened.clear();
      if (options.natted) {
        a4 = '203.0.113.20:40239';
        at(now + between(2000, 10_000), nodeEvent);
      }
    });
  } else if (options.fault === 'renumbered') {
    // B gets a new address and publishes it, but sends its own packets from the old one until
    // that is removed: A is written the new one, follows B's packets back to the old one (a roam
    // within the family of a working session, kept), and A's NAT forgets the new one. Then the old
    // one goes, and B's packets from the new one no longer get in.
    at(faultAt, () => { bPublished4 = B4_NEW; nodeEvent(); });
    at(faultAt + between(NAT_TIMEOUT_MS + 10_000, 60_000), () => { dead.add(B4); bSource4 = B4_NEW; });
  }
  // At rest: both ends on IPv4, A at B's published endpoint, nothing rewritten in the last 30 s.
  let writesBefore = 0;
  at(endAt - 30_000, () => { writesBefore = A.writes + B.writes; });

  while (queue.length > 0 && queue[0].at <= endAt) {
    const next = queue.shift()!;
    now = next.at;
    next.run();
  }
  if (peerOf(A).endpoint!.toString() !== bPublished4 || peerOf(B).endpoint!.family !== 4) failures.push(`ended on ${endpoints()}`);
  if (A.writes + B.writes !== writesBefore) failures.push(`still rewriting endpoints at the end (${A.writes + B.writes - writesBefore} writes in 30 s)`);
  return failures;
}

describe('model: two agents and their data planes, random interleavings', () => {
  const SEEDS = 120;
  for (const natted of [true, false]) {
    for (const fault of ['none', 'router restart', 'renumbered'] as const) {
      const label = `${natted ? 'A behind a home NAT' : 'A public'}${fault === 'none' ? '' : `, then ${fault === 'router restart' ? 'a restart loses IPv6' : 'B is renumbered'}`}`;
      test(`${label}: the forced family while forced, then B's published IPv4 endpoint, and no rewriting at rest (${SEEDS} seeds)`, () => {
        const failed: string[] = [];
        for (let seed = 1; seed <= SEEDS; seed++) {
          const failures = runWorld(seed, { natted, fault, takeBack: true });
          if (failures.length > 0) failed.push(`seed ${seed}: ${failures.join('; ')}`);
        }
        assert.deepEqual(failed, []);
      });
    }
  }

  test('the control: without taking roams back, interleavings end on the wrong family, or on a removed address', () => {
    const failing = (fault: Fault, pattern: RegExp) => {
      let count = 0;
      for (let seed = 1; seed <= SEEDS; seed++) if (runWorld(seed, { natted: true, fault, takeBack: false }).some((f) => pattern.test(f))) count++;
      return count;
    };
    assert.ok(failing('none', /ended on A→B \[2001:db8:1::2\]/) > 0, 'a pair left on IPv6 after the force-endpoint went');
    assert.ok(failing('renumbered', /ended on A→B 203\.0\.113\.2:/) > 0, 'a pair left on a removed address');
  });
});
