/**
 * An attacker on the path forges transport data under the all-zero key while two daemons rekey
 * (roamguard issue 12).
 *
 *   A (daemon) — R (router, IP forwarding; the attacker) — B (daemon)
 *
 * The attack: a keypair that falls out of use has its keys wiped in place (zero-filled). A daemon
 * that still opens a datagram under such a keypair after the wipe (e.g. one grouped for a batch
 * before a handshake message of the same event-loop turn installed a new keypair) opens it with
 * 32 zero bytes, and anyone can seal for that key. Receiver indices and counters travel in clear,
 * so an attacker who sees the traffic knows which indices are live.
 *
 * Here the attacker (onpath-attacker.ts) sits on R: it sniffs the WireGuard messages crossing R,
 * learns every receiver index, and forges at every index seen in the last seconds, a few thousand
 * datagrams per second: valid structure, plausible unused counters, sealed under the zero key,
 * carrying an inner IPv4 UDP packet from the peer's allowed address to a canary behind the
 * daemon's TUN with a marker payload; half from the attacker's own address on R, half from the
 * genuine peer's address and port. Meanwhile both daemons rekey every 2 s (ROAMGUARD_TEST_TIMINGS)
 * and genuine traffic flows both ways (1200-byte pings every 5 ms each way, so batches are in the
 * pipeline when handshake messages arrive; plus 10 pings/s each way that are counted).
 *
 * Nothing forged may be accepted:
 *   - no marker packet reaches either canary,
 *   - neither daemon's endpoint for its peer ever shows anything but the genuine one (sampled
 *     twice a second) and roamguard's roam counter (endpoint_changes) does not move,
 *   - no datagram reaches the attacker's own address,
 *   - the genuine pings are mostly answered, rekeys kept happening,
 *   - every forgery is in roamguard's inbound drop counters (any reason: unknown-index,
 *     expired-keypair, decryption-failed, …), or in the kernel's count of datagrams dropped before
 *     the daemon saw them.
 *
 * The same attack against Debian's wireguard-go paired with upstream's newest wireguard-go
 * (../shared/anchors/wireguard-go-modern; Debian's on both sides where it is absent) is the
 * reference: it delivers nothing either. wireguard-go's timers cannot be shortened, so there the
 * handshakes come from removing and re-adding the peer on one side every 2 s (the other side
 * then installs a new keypair as the responder and drops its previous one, as in a rekey).
 *
 * Knobs: ROAMGUARD_ONPATH_SECONDS (default 60), ROAMGUARD_ONPATH_RATE (forgeries/s, default 4000),
 * ROAMGUARD_ONPATH_REFERENCE_SECONDS (default 20).
 *
 * Needs root, iproute2, wireguard-tools, wireguard-go, iputils-ping and /dev/net/tun.
 */
import { after, before, describe, test, type TestContext } from 'node:test';
import assert from 'node:assert/strict';
import { reapStale, Scope, type Namespace, type PairTopology } from './netns.ts';
import { Canary } from './hostile-peer.ts';
import { FORGERY_MARKER, OnPathAttacker, type AttackResult } from './onpath-attacker.ts';
import { daemonStats, dropsDelta, udpReceiveQueueDrops } from './robustness-helpers.ts';
import {
  assertPing, describeTunnel, hasWireGuardGoModern, INNER, requireDaemonPrerequisites, startContinuousPing, startTunnel,
  type Implementation, type PingTrace, type Tunnel, type UserspaceWgOptions,
} from './userspace-wg.ts';
import type { DeviceStats } from '../../dataplane/uapi/uapi-stats.ts';

const envNumber = (name: string, fallback: number) => {
  const n = Number(process.env[name]);
  return Number.isFinite(n) && n > 0 ? n : fallback;
};
const SECONDS = envNumber('ROAMGUARD_ONPATH_SECONDS', 60);
const RATE = envNumber('ROAMGUARD_ONPATH_RATE', 4000);
const REFERENCE_SECONDS = envNumber('ROAMGUARD_ONPATH_REFERENCE_SECONDS', 20);
/** A rekey every 2 s (an initiation at most every 500 ms); keys stay acceptable for the usual 180 s. */
const TIMINGS = { rekeyAfterTime: 2000, rekeyTimeout: 500 };

/** The attacker's own address (on R's loopback) and the UDP port its own-address forgeries come from. */
const ATTACKER = '203.0.113.66';
const ATTACKER_PORT = 47000;
const CANARY_PORT = 7777;
const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

interface RoutedWorld {
  /** A and B with their links to R (A: 192.0.2.2, B: 198.51.100.2), as startTunnel takes them. */
  topo: PairTopology;
  r: Namespace;
  /** R's interface towards A: everything between A and B crosses it. */
  sniffIfindex: number;
}

/** A — R — B: two links, default routes through R, forwarding on R, the attacker's address on R. */
async function routedWorld(scope: Scope): Promise<RoutedWorld> {
  const a = await scope.namespace();
  const r = await scope.namespace();
  const b = await scope.namespace();
  const [rA, linkA] = await scope.veth(r, a, { ipv4: ['192.0.2.1/24', '192.0.2.2/24'], ipv6: ['2001:db8:a::1/64', '2001:db8:a::2/64'] });
  const [, linkB] = await scope.veth(r, b, { ipv4: ['198.51.100.1/24', '198.51.100.2/24'], ipv6: ['2001:db8:b::1/64', '2001:db8:b::2/64'] });
  await a.ip(['route', 'add', 'default', 'via', '192.0.2.1']);
  await a.ip(['-6', 'route', 'add', 'default', 'via', '2001:db8:a::1']);
  await b.ip(['route', 'add', 'default', 'via', '198.51.100.1']);
  await b.ip(['-6', 'route', 'add', 'default', 'via', '2001:db8:b::1']);
  await r.exec('sysctl', ['-q', '-w', 'net.ipv4.ip_forward=1', 'net.ipv6.conf.all.forwarding=1']);
  await r.ip(['addr', 'add', `${ATTACKER}/32`, 'dev', 'lo']);
  const link = JSON.parse((await r.ip(['-j', 'link', 'show', 'dev', rA.ifname])).stdout) as Array<{ ifindex: number }>;
  return { topo: { a, b, linkA: linkA as PairTopology['linkA'], linkB: linkB as PairTopology['linkB'] }, r, sniffIfindex: link[0].ifindex };
}

/** `wg show IF endpoints`, sampled every 500 ms until stopped: every endpoint each side reported. */
function sampleEndpoints(t: Tunnel): { stop: () => Promise<Record<'a' | 'b', Set<string>>>; samples: () => number } {
  const seen = { a: new Set<string>(), b: new Set<string>() };
  let running = true;
  let samples = 0;
  const done = (async () => {
    while (running) {
      for (const side of ['a', 'b'] as const) {
        const d = t[side];
        const out = await d.wg(['show', d.ifname, 'endpoints']).catch(() => undefined);
        for (const line of out?.stdout.split('\n') ?? []) {
          const endpoint = line.trim().split(/\s+/)[1];
          if (endpoint) seen[side].add(endpoint);
        }
      }
      samples++;
      await sleep(500);
    }
  })();
  return { stop: async () => { running = false; await done; return seen; }, samples: () => samples };
}

/** Genuine traffic both ways for `seconds`: bulk pings (batches in the pipeline) and counted pings. */
function genuineTraffic(scope: Scope, t: Tunnel, seconds: number): Promise<[PingTrace, PingTrace]> {
  for (const [ns, dst] of [[t.topo.a, INNER.b.ipv4], [t.topo.b, INNER.a.ipv4]] as const) {
    scope.spawn(ns, 'ping', ['-n', '-q', '-i', '0.005', '-s', '1200', '-w', String(seconds), dst], { label: `bulk ping ${dst} in ${ns.name}` });
  }
  return Promise.all([
    startContinuousPing(scope, t.topo.a, INNER.b.ipv4, { durationS: seconds, intervalS: 0.1 }),
    startContinuousPing(scope, t.topo.b, INNER.a.ipv4, { durationS: seconds, intervalS: 0.1 }),
  ]);
}

interface Outcome {
  attack: AttackResult;
  delivered: { a: number; b: number };
  endpoints: Record<'a' | 'b', Set<string>>;
  traces: [PingTrace, PingTrace];
  kernelDrops: { a: number; b: number };
}

/**
 * Builds the world and the tunnel, lets the attacker learn, runs the attack with genuine traffic
 * and endpoint sampling, and collects what every assertion needs. `during` runs alongside the
 * attack (wireguard-go's peer churn); `snapshot` is taken before and after (roamguard's counters).
 */
async function runAttack<S>(
  scope: Scope, tc: TestContext, sides: { a: UserspaceWgOptions; b: UserspaceWgOptions }, seconds: number,
  hooks: { snapshot?: (t: Tunnel) => Promise<S>; during?: (t: Tunnel, attacking: () => boolean) => Promise<void> } = {},
): Promise<{ t: Tunnel; outcome: Outcome; before?: S; after?: S }> {
  const world = await routedWorld(scope);
  const t = await startTunnel(scope, world.topo, sides);
  const ctx = () => describeTunnel(t);
  const canaryA = await Canary.start(scope, t.topo.a, CANARY_PORT, [INNER.a.ipv4]);
  const canaryB = await Canary.start(scope, t.topo.b, CANARY_PORT, [INNER.b.ipv4]);
  await assertPing(t.topo.a, INNER.b.ipv4, { count: 2 }, ctx());
  await assertPing(t.topo.b, INNER.a.ipv4, { count: 2 }, ctx());
  const attacker = await OnPathAttacker.start(scope, world.r, {
    sniffIfindex: world.sniffIfindex, address: ATTACKER, port: ATTACKER_PORT,
    victims: {
      [world.topo.linkA.ipv4]: { src: INNER.b.ipv4, dst: INNER.a.ipv4, port: CANARY_PORT },
      [world.topo.linkB.ipv4]: { src: INNER.a.ipv4, dst: INNER.b.ipv4, port: CANARY_PORT },
    },
  });

  const traffic = genuineTraffic(scope, t, seconds + 6);
  await sleep(3000); // traffic flows, a rekey or two: the attacker learns the live indices
  const before = await hooks.snapshot?.(t);
  const kernelBefore = { a: await udpReceiveQueueDrops(t.topo.a), b: await udpReceiveQueueDrops(t.topo.b) };
  const sampler = sampleEndpoints(t);
  let attacking = true;
  const during = hooks.during?.(t, () => attacking);
  let attack: AttackResult;
  try {
    attack = await attacker.attack({ seconds, rate: RATE });
  } finally {
    attacking = false;
    await during;
  }
  await sleep(2500); // what was in flight lands; a moved endpoint would have been used by now
  const endpoints = await sampler.stop();
  const after = await hooks.snapshot?.(t);
  const kernelDrops = { a: await udpReceiveQueueDrops(t.topo.a) - kernelBefore.a, b: await udpReceiveQueueDrops(t.topo.b) - kernelBefore.b };
  attack = { ...attack, ...pick(await attacker.stats(), ['toAttacker', 'toAttackerSniffed', 'toAttackerFrom']) };
  const traces = await traffic;
  const delivered = { a: canaryA.count(FORGERY_MARKER), b: canaryB.count(FORGERY_MARKER) };
  tc.diagnostic(`${t.a.label} <-> ${t.b.label}: ${attack.sent} forgeries in ${attack.seconds.toFixed(1)} s `
    + `(${attack.sendErrors} send errors), by victim ${JSON.stringify(attack.byVictim)}; sniffed ${attack.sniffed} packets `
    + `(WireGuard by type ${JSON.stringify(attack.sniffedByType)}), ${attack.indicesLearned} indices learned`);
  tc.diagnostic(`delivered to the TUN: A ${delivered.a}, B ${delivered.b}; datagrams to the attacker's address: ${attack.toAttacker} `
    + `(sniffed on A's link ${attack.toAttackerSniffed}) from ${JSON.stringify(attack.toAttackerFrom)}; endpoints seen in `
    + `${sampler.samples()} samples: A ${JSON.stringify([...endpoints.a])}, B ${JSON.stringify([...endpoints.b])}`);
  tc.diagnostic(`genuine pings (10/s each way): A->B ${traces[0].replies.length}/${traces[0].transmitted}, B->A ${traces[1].replies.length}/${traces[1].transmitted}; `
    + `kernel receive-queue drops A ${kernelDrops.a}, B ${kernelDrops.b}`);
  return { t, outcome: { attack, delivered, endpoints, traces, kernelDrops }, before, after };
}

function pick<T, K extends keyof T>(o: T, keys: K[]): Pick<T, K> {
  return Object.fromEntries(keys.map((k) => [k, o[k]])) as Pick<T, K>;
}

/** The assertions both cases share: nothing forged was accepted, genuine traffic flowed. */
function assertNothingAccepted(t: Tunnel, o: Outcome, minReplyShare: number): void {
  const ctx = describeTunnel(t);
  assert.ok(o.attack.sent >= RATE * (o.attack.seconds / 2), `the attacker forged at a few thousand per second: ${o.attack.sent} in ${o.attack.seconds.toFixed(1)} s`);
  for (const side of ['a', 'b'] as const) {
    const victim = side === 'a' ? t.topo.linkA.ipv4 : t.topo.linkB.ipv4;
    const tally = o.attack.byVictim[victim];
    assert.ok(tally && tally.spoofed > 0 && tally.own > 0 && tally.indices >= 2, `forgeries reached ${side.toUpperCase()} at several indices from both sources: ${JSON.stringify(tally)}`);
  }
  assert.deepEqual(o.delivered, { a: 0, b: 0 }, `no forged packet reached either TUN${ctx}`);
  assert.deepEqual([...o.endpoints.a], [t.endpointB], `A's endpoint for B never moved${ctx}`);
  assert.deepEqual([...o.endpoints.b], [t.endpointA], `B's endpoint for A never moved${ctx}`);
  assert.equal(o.attack.toAttacker, 0, `no datagram reached the attacker's address: from ${JSON.stringify(o.attack.toAttackerFrom)}${ctx}`);
  assert.equal(o.attack.toAttackerSniffed, 0, 'no packet to the attacker\'s address crossed A\'s link');
  for (const [i, trace] of o.traces.entries()) {
    const share = trace.replies.length / Math.max(1, trace.transmitted);
    assert.ok(trace.transmitted >= o.attack.seconds * 5, `genuine pings ${i === 0 ? 'A->B' : 'B->A'} were sent: ${trace.transmitted}\n${trace.output.slice(-600)}`);
    assert.ok(share >= minReplyShare, `genuine pings ${i === 0 ? 'A->B' : 'B->A'} mostly answered: ${trace.replies.length}/${trace.transmitted}\n${trace.output.slice(-600)}${ctx}`);
  }
}

describe('robustness: an on-path attacker forges transport data under the all-zero key during rekeys', () => {
  before(async () => {
    await requireDaemonPrerequisites(['roamguard-node', 'wireguard-go'], ['sysctl']);
    await reapStale();
  });
  const scopes: Scope[] = [];
  after(async () => { for (const s of scopes) await s.cleanup(); });

  test(`roamguard pair rekeying every 2 s, ${SECONDS} s of zero-key forgeries at ${RATE}/s: none accepted, all counted`, { timeout: (SECONDS + 90) * 1000 }, async (tc) => {
    const scope = new Scope();
    scopes.push(scope);
    const daemon: UserspaceWgOptions = { implementation: 'roamguard-node', timings: TIMINGS, startTimeoutMs: 60_000 };
    const { t, outcome, before: statsBefore, after: statsAfter } = await runAttack<{ a: DeviceStats; b: DeviceStats }>(scope, tc, { a: daemon, b: daemon }, SECONDS, {
      snapshot: async (tun) => ({ a: await daemonStats(tun.a), b: await daemonStats(tun.b) }),
    });
    const ctx = describeTunnel(t);
    const figures = (['a', 'b'] as const).map((side) => {
      const victim = side === 'a' ? t.topo.linkA.ipv4 : t.topo.linkB.ipv4;
      const tally = outcome.attack.byVictim[victim] ?? { spoofed: 0, own: 0, indices: 0 };
      const drops = dropsDelta(statsBefore![side], statsAfter![side], { inboundOnly: true });
      const peerBefore = statsBefore![side].peers[0];
      const peerAfter = statsAfter![side].peers[0];
      return {
        side, sent: tally.spoofed + tally.own, drops, dropped: Object.values(drops).reduce((s, n) => s + n, 0),
        kernel: outcome.kernelDrops[side],
        handshakes: peerAfter.handshakesCompleted - peerBefore.handshakesCompleted,
        endpointChanges: peerAfter.endpointChanges - peerBefore.endpointChanges,
      };
    });
    for (const f of figures) {
      tc.diagnostic(`${f.side.toUpperCase()}: ${f.sent} forgeries sent to it, inbound drops counted ${f.dropped} ${JSON.stringify(f.drops)}, `
        + `kernel drops ${f.kernel}, handshakes completed ${f.handshakes}, endpoint changes ${f.endpointChanges}`);
    }
    assertNothingAccepted(t, outcome, 0.7);
    for (const f of figures) {
      const name = f.side.toUpperCase();
      assert.ok(f.handshakes >= Math.floor(SECONDS / 4), `${name} kept rekeying during the attack: ${f.handshakes} handshakes in ${SECONDS} s${ctx}`);
      assert.equal(f.endpointChanges, 0, `${name}'s roam counter did not move${ctx}`);
      assert.ok(f.dropped + f.kernel >= f.sent, `every forgery sent to ${name} is counted: ${f.dropped} drops + ${f.kernel} kernel drops < ${f.sent} sent ${JSON.stringify(f.drops)}`);
    }
    assert.ok(t.a.process.running && t.b.process.running, `both daemons still run${ctx}`);
  });

  const modern = hasWireGuardGoModern();
  const peerSide: Implementation = modern ? 'wireguard-go-modern' : 'wireguard-go';
  test(`reference: wireguard-go with ${peerSide}, ${REFERENCE_SECONDS} s of the same attack with a handshake every 2 s: none accepted`, { timeout: (REFERENCE_SECONDS + 90) * 1000 }, async (tc) => {
    const scope = new Scope();
    scopes.push(scope);
    const { t, outcome } = await runAttack(scope, tc, { a: { implementation: 'wireguard-go' }, b: { implementation: peerSide } }, REFERENCE_SECONDS, {
      // Remove and re-add the peer on one side, alternately, every 2 s: the next packet starts a
      // new handshake, and the other side installs its keypair as the responder.
      during: async (tun, attacking) => {
        for (let round = 0; attacking(); round++) {
          await sleep(2000);
          if (!attacking()) break;
          const [d, peer, endpoint, inner] = round % 2 === 0 ? [tun.a, tun.keysB, tun.endpointB, INNER.b] : [tun.b, tun.keysA, tun.endpointA, INNER.a];
          await d.wg(['set', d.ifname, 'peer', peer.publicKey, 'remove']);
          await d.wg(['set', d.ifname, 'peer', peer.publicKey, 'endpoint', endpoint, 'allowed-ips', `${inner.ipv4}/32,${inner.ipv6}/128`]);
        }
      },
    });
    assertNothingAccepted(t, outcome, 0.5);
    const responses = outcome.attack.sniffedByType['2'] ?? 0;
    assert.ok(responses >= Math.floor(REFERENCE_SECONDS / 4), `handshakes kept happening: ${responses} responses crossed R during the attack${describeTunnel(t)}`);
  });
});
