/**
 * A handshake flood at a running `roamguard wg` daemon (issue 8, item 2).
 *
 *   A: roamguard daemon (Node.js), 192.0.2.1 / 2001:db8:77::1, port 51820, with the real peer B
 *      and twelve "flood peers" whose keys the flooder holds.
 *   B: wireguard-go, the real peer, silent until the flood runs; in the same namespace the
 *      flooder (hostile-peer.ts) with eight more IPv4 addresses and four IPv6 addresses in three
 *      /64s on B's interface.
 *
 * From every flooder address at once: initiations with a correct mac1 for A's key and a random
 * body, ignoring cookie replies ('blind', far above what A could answer with public-key work),
 * and genuine initiations from the flood peers that obey cookie replies ('peers'). Meanwhile B
 * starts talking to A. What must hold:
 *
 *   - load mode engages: blind flooders get cookie replies (never more bytes than they sent);
 *   - the per-address limiter holds: a cookie-obeying source gets at most its burst plus 20
 *     handshakes a second answered, an IPv6 /64 counts as one source;
 *   - the real peer's handshake completes after one cookie round (its first initiation gets a
 *     cookie, its retransmission 5 s later, with mac2, a session; on a starved host the next
 *     retransmission is allowed too) and its pings are answered;
 *   - the daemon's main thread is not saturated and its RSS stays bounded;
 *   - load mode ends after the flood: a fresh initiation without a cookie is answered directly.
 *
 * The second suite (issue 12, item 2; flood-rate.ts): 55 000 valid-mac1 initiations per second
 * (ROAMGUARD_FLOOD_HIGH_RATE) from 100 IPv4 addresses, sent by a small C program (flooder.c,
 * compiled here with gcc), at roamguard and then, the same way on the same machine, at
 * wireguard-go-modern (../shared/anchors, when present). For roamguard it asserts: the flood
 * really ran at >= 50 000/s; a legitimate peer coming up during the flood has a working tunnel
 * within 6 s (one cookie round); every flood message is a counted drop in the daemon's counters
 * (cookie replies included, and what the kernel dropped from the full socket queue, which the
 * daemon learns through SO_RXQ_OVFL); at least 90 % of the flood is answered or (overloaded)
 * shed by the daemon rather than dropped by the kernel; an established peer's pings keep being answered; RSS stays bounded; load mode ends
 * after the flood. For wireguard-go it reports the same figures.
 *
 * ROAMGUARD_SOAK=1: 60-second floods.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { cpuSeconds, memoryStatus } from '../../bench/suite/procfs.ts';
import { createPair, reapStale, Scope } from './netns.ts';
import { HostilePeer, type FloodSourceResult } from './hostile-peer.ts';
import { daemonStats, dropsDelta } from './robustness-helpers.ts';
import { buildFlooder, describeReport, FLOOD_SOURCES, runFlood } from './flood-rate.ts';
import {
  describeTunnel, hasWireGuardGoModern, INNER, PORT_A, requireDaemonPrerequisites, startContinuousPing, startTunnel, WIREGUARD_GO_MODERN,
} from './userspace-wg.ts';

const SOAK = process.env.ROAMGUARD_SOAK === '1';
const FLOOD_SECONDS = SOAK ? 60 : 14;
/**
 * Blind initiations per second per source (12 sources): 1200/s, about five times the rate above
 * which the daemon stops doing public-key work without a cookie (256/s). Much more and, on this
 * shared 2-core host, the daemon's UDP receive queue fills and everything waits in it for seconds
 * (see docs/robustness.md); ROAMGUARD_FLOOD_RATE overrides.
 */
const BLIND_RATE = Number(process.env.ROAMGUARD_FLOOD_RATE ?? 100);
/** Genuine, cookie-obeying initiations per second from four sources: five times what the limiter lets through. */
const PEERS_RATE = 100;
const PEERS_SOURCES = [0, 1, 8, 9]; // two IPv4 addresses, two IPv6 addresses in one /64
const BURST = 5;
const PER_SECOND = 20;

/** Main-thread CPU seconds of a process (its thread-group leader's own times). */
function mainThreadCpu(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/task/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return (Number(fields[11]) + Number(fields[12])) / 100;
}

/** The limiter's key for a source: the IPv4 address, or the IPv6 /64. */
function bucketOf(address: string): string {
  if (!address.includes(':')) return address;
  const [head] = address.split('::');
  return head.split(':').slice(0, 4).join(':');
}

describe('robustness: a handshake flood at a running daemon', () => {
  before(async () => {
    await requireDaemonPrerequisites(['roamguard-node', 'wireguard-go']);
    await reapStale();
  });
  const scopes: Scope[] = [];
  after(async () => { for (const s of scopes) await s.cleanup(); });

  test(`${FLOOD_SECONDS} s of valid-mac1 initiations from 12 IPv4 and IPv6 addresses: cookies, per-address limit, the real peer still gets through`, { timeout: (FLOOD_SECONDS + 90) * 1000 }, async (tc) => {
    const scope = new Scope();
    scopes.push(scope);
    const topo = await createPair(scope);
    const v4 = Array.from({ length: 8 }, (_, i) => `192.0.2.${20 + i}`);
    const v6 = ['2001:db8:77:1::20', '2001:db8:77:1::21', '2001:db8:77:2::20', '2001:db8:77:3::20'];
    for (const address of v4) await topo.b.ip(['addr', 'add', `${address}/24`, 'dev', topo.linkB.ifname]);
    for (const address of v6) await topo.b.ip(['addr', 'add', `${address}/64`, 'dev', topo.linkB.ifname, 'nodad']);
    await topo.a.ip(['-6', 'route', 'add', '2001:db8:77::/48', 'dev', topo.linkA.ifname]);

    const t = await startTunnel(scope, topo, { a: { implementation: 'roamguard-node', startTimeoutMs: 60_000, logLevel: 'verbose' }, b: { implementation: 'wireguard-go', logLevel: 'verbose' } });
    const ctx = () => `${describeTunnel(t)}\n--- the real peer's handshake log ---\n${(t.b.process.stdout + t.b.process.stderr).split('\n').filter((l) => /andshake|ookie/.test(l)).slice(-12).join('\n')}`;
    const sources = [...v4, ...v6];
    const flooder = await HostilePeer.start(scope, topo.b, {
      daemon: { publicKey: t.keysA.publicKey, endpoint4: `${topo.linkA.ipv4}:${PORT_A}`, endpoint6: `[${topo.linkA.ipv6}]:${PORT_A}` },
      sources,
      floodPeers: sources.length,
    });
    await t.a.configure({ peers: flooder.floodPeerKeys.map((publicKey) => ({ publicKey })) });

    const pid = t.a.process.pid;
    const rssBefore = memoryStatus(pid).rssBytes;
    const statsBefore = await daemonStats(t.a);
    const cpu0 = { all: cpuSeconds(pid), main: mainThreadCpu(pid), at: performance.now(), flooder: cpuSeconds(flooder.process.pid) };
    const everyone = sources.map((_, i) => i);
    const flood = flooder.flood(FLOOD_SECONDS, [
      { mode: 'blind', ratePerSource: BLIND_RATE, sources: everyone },
      { mode: 'peers', ratePerSource: PEERS_RATE, sources: PEERS_SOURCES },
    ]);
    // The real peer starts talking once the flood is on.
    await new Promise((r) => setTimeout(r, 1500));
    const pingStart = Date.now() / 1000;
    const trace = startContinuousPing(scope, topo.b, INNER.a.ipv4, { durationS: FLOOD_SECONDS - 3, intervalS: 0.1 });
    const results = await flood;
    const floodEnd = Date.now() / 1000;
    const cpu1 = { all: cpuSeconds(pid), main: mainThreadCpu(pid), at: performance.now(), flooder: cpuSeconds(flooder.process.pid) };
    const pings = await trace;
    const wall = (cpu1.at - cpu0.at) / 1000;
    const rssAfter = memoryStatus(pid).rssBytes;
    const statsAfter = await daemonStats(t.a);
    const counted = dropsDelta(statsBefore, statsAfter, { inboundOnly: true });
    tc.diagnostic(`drops counted during the flood: ${JSON.stringify(counted)}`);

    const show = (r: FloodSourceResult) => `${r.mode} ${r.address}: sent ${r.sent}, cookies ${r.cookieReplies}, responses ${r.responses} [${r.responsesPerSecond.join(' ')}]`;
    for (const r of results) tc.diagnostic(show(r));
    const blind = results.filter((r) => r.mode === 'blind');
    const peers = results.filter((r) => r.mode === 'peers');
    const sent = results.reduce((n, r) => n + r.sent, 0);
    tc.diagnostic(`${sent} initiations in ${wall.toFixed(1)} s; daemon CPU ${((cpu1.all - cpu0.all) / wall * 100).toFixed(0)} % (main thread ${((cpu1.main - cpu0.main) / wall * 100).toFixed(0)} %) of a core; flooder CPU ${((cpu1.flooder - cpu0.flooder) / wall * 100).toFixed(0)} %; load ${readFileSync('/proc/loadavg', 'utf8').trim()}; RSS ${(rssBefore / 1048576).toFixed(0)} → ${(rssAfter / 1048576).toFixed(0)} MiB`);

    assert.ok(t.a.process.running, `the daemon survived the flood${ctx()}`);
    // (The flooder shares two busy cores with everything else: it may fall short of its rate.)
    assert.ok(sent / wall >= 0.5 * (sources.length * BLIND_RATE + PEERS_SOURCES.length * PEERS_RATE), `the flood ran near its rate: ${(sent / wall).toFixed(0)}/s`);

    // Load mode engaged: the blind flood is answered with cookie replies, 64 bytes for 148.
    const cookies = blind.reduce((n, r) => n + r.cookieReplies, 0);
    const blindSent = blind.reduce((n, r) => n + r.sent, 0);
    for (const r of blind) assert.ok(r.cookieReplies > 0, `cookie replies engaged for ${r.address}: ${r.cookieReplies} for ${r.sent} blind initiations${ctx()}`);
    assert.ok(cookies * 64 <= blindSent * 148, 'no amplification');
    for (const r of blind) assert.equal(r.responses, 0, `a blind flooder never gets a handshake response (${r.address})`);
    // The counters agree: a cookie-required drop for each cookie reply (some replies may be lost
    // on the way back), public-key work for the blind flood only before load mode engaged.
    const repliesSeen = results.reduce((n, r) => n + r.cookieReplies, 0);
    assert.ok((counted['cookie-required'] ?? 0) >= repliesSeen, `cookie-required drops (${counted['cookie-required']}) cover the cookie replies seen (${repliesSeen})`);
    assert.ok((counted['handshake-failed'] ?? 0) <= blindSent * 0.1, `public-key work for ${counted['handshake-failed']} of ${blindSent} blind initiations`);
    assert.ok((counted['rate-limited'] ?? 0) > 0, 'the limiter turned away the obeying flooders\' excess');

    // The per-address limiter: per IPv4 address or IPv6 /64, per second, burst + 20.
    const perBucket = new Map<string, number[]>();
    for (const r of peers) {
      const bucket = bucketOf(r.address);
      const seconds = perBucket.get(bucket) ?? [];
      r.responsesPerSecond.forEach((n, i) => { seconds[i] = (seconds[i] ?? 0) + n; });
      perBucket.set(bucket, seconds);
      assert.ok(r.cookieReplies >= 1, `the obeying flooder ${r.address} had to fetch a cookie first`);
    }
    assert.equal(perBucket.size, 3, 'IPv6 sources are grouped by /64');
    let answered = 0;
    for (const [bucket, seconds] of perBucket) {
      const total = seconds.reduce((a, b) => a + (b ?? 0), 0);
      answered += total;
      // Per wall second, allowing for a second boundary splitting the refill: 2 × 20 + burst.
      for (const n of seconds) assert.ok((n ?? 0) <= 2 * PER_SECOND + BURST, `source ${bucket}: ${n} handshakes answered in one second (${JSON.stringify(seconds)})`);
      assert.ok(total <= BURST + PER_SECOND * (FLOOD_SECONDS + 1), `source ${bucket}: ${total} handshakes answered in ${FLOOD_SECONDS} s (${JSON.stringify(seconds)})`);
    }
    const asked = peers.reduce((n, r) => n + r.sent, 0);
    assert.ok(answered > 0 && answered < asked / 2, `the limiter answered ${answered} of ${asked} obeying initiations`);

    // The real peer: one cookie round, then a session, within a few seconds.
    const first = pings.replies[0];
    assert.ok(first, `the real peer's pings were answered during the flood\n${pings.output.slice(-600)}${ctx()}`);
    const waited = first.at - pingStart;
    tc.diagnostic(`the real peer's first ping answered ${waited.toFixed(2)} s after it started (${pings.replies.length} of ${pings.transmitted} answered)`);
    // One cookie round: the first initiation gets a cookie, the retransmission 5 s later (with
    // mac2) a session: ~5.1 s. A starved host may need the next retransmission as well.
    assert.ok(waited < 11, `the real peer's handshake completed within two retransmissions: ${waited.toFixed(2)} s${ctx()}`);
    assert.ok(first.at < floodEnd - 0.5, 'while the flood was still on');
    const afterHandshake = pings.replies.filter((r) => r.at > first.at).length;
    assert.ok(afterHandshake >= (pings.transmitted - (waited / 0.1)) * 0.8, `once connected, its pings kept being answered: ${afterHandshake}`);

    // Bounded: the main thread kept up, memory did not grow with the flood.
    assert.ok((cpu1.main - cpu0.main) / wall < 0.9, `the main thread was not saturated: ${((cpu1.main - cpu0.main) / wall * 100).toFixed(0)} %`);
    assert.ok(rssAfter - rssBefore < 64 * 1048576, `RSS bounded: ${(rssBefore / 1048576).toFixed(0)} → ${(rssAfter / 1048576).toFixed(0)} MiB`);

    // Load mode ends a second after the flood: a fresh peer initiation without a cookie gets a response.
    await new Promise((r) => setTimeout(r, 1500));
    const calmBefore = await daemonStats(t.a);
    const calm = await flooder.flood(1, [{ mode: 'peers', ratePerSource: 4, sources: [0, 8] }]);
    const calmDrops = dropsDelta(calmBefore, await daemonStats(t.a), { inboundOnly: true });
    assert.equal(calmDrops['cookie-required'] ?? 0, 0, `no cookie-required drops after the flood: ${JSON.stringify(calmDrops)}`);
    for (const r of calm) {
      tc.diagnostic(`after the flood: ${show(r)}`);
      assert.equal(r.cookieReplies, 0, `no cookie needed after the flood (${r.address})`);
      assert.ok(r.responses >= 1, `a handshake answered directly after the flood (${r.address})`);
    }
  });
});

/** The high-rate flood (flood-rate.ts): at least this many valid-mac1 initiations per second. */
const HIGH_RATE = Number(process.env.ROAMGUARD_FLOOD_HIGH_RATE ?? 55_000);
const HIGH_RATE_SECONDS = SOAK ? 60 : 12;

describe(`robustness: ${HIGH_RATE}/s valid-mac1 initiations from ${FLOOD_SOURCES} addresses, roamguard and wireguard-go-modern in one run`, () => {
  let flooderBinary = '';
  const scopes: Scope[] = [];
  before(async () => {
    await requireDaemonPrerequisites(['roamguard-node'], ['gcc']);
    await reapStale();
    const scope = new Scope();
    scopes.push(scope);
    flooderBinary = buildFlooder(scope.tempDir('roamguard-flooder-'));
  });
  after(async () => { for (const s of scopes) await s.cleanup(); });

  test('roamguard: the legitimate peer gets through within one cookie round, every flood message is answered or counted, data flows, memory bounded, load mode ends', { timeout: (HIGH_RATE_SECONDS + 120) * 1000 }, async (tc) => {
    const scope = new Scope();
    scopes.push(scope);
    const r = await runFlood(scope, 'roamguard-node', flooderBinary, { rate: HIGH_RATE, seconds: HIGH_RATE_SECONDS });
    tc.diagnostic(describeReport(r));
    const ctx = () => `\n${describeReport(r)}\n${r.victim.describe()}`;
    assert.ok(r.victim.process.running, `the daemon survived the flood${ctx()}`);
    assert.ok(r.flood.rate >= 50_000, `the flood ran at >= 50 000/s: ${r.flood.rate}/s${ctx()}`);
    // One cookie round: the first initiation is answered with a cookie, the retransmission 5 s
    // later (with mac2) with a response.
    assert.ok(r.legitimateSeconds !== undefined && r.legitimateSeconds <= 6, `the legitimate peer's tunnel worked within 6 s: ${r.legitimateSeconds}${ctx()}`);
    // Accounting: every flood message is a counted drop (the cookie replies are cookie-required
    // drops) or a datagram the kernel dropped from the full socket queue. The daemon counts the
    // latter too (receive-queue-overflow, learnt through SO_RXQ_OVFL with the next datagram, so
    // up to the slow flood after this one), but on this kernel (6.18) that count has fallen short
    // of the namespace's RcvbufErrors under overload: the larger of the two is used, both shown.
    const counted = r.counted!;
    const handshakeDrops = ['bad-mac1', 'cookie-required', 'cookie-reply-shed', 'rate-limited', 'handshake-failed', 'handshake-replay', 'handshake-flood', 'unknown-peer']
      .reduce((n, reason) => n + (counted[reason] ?? 0), 0);
    const overflow = (counted['receive-queue-overflow'] ?? 0) + (r.afterCounted!['receive-queue-overflow'] ?? 0);
    const accounted = handshakeDrops + Math.max(overflow, r.kernelDrops);
    // Besides the flood, only the two peers' traffic can be among them (the legitimate peer's
    // first initiation is a cookie-required drop; a full socket queue drops anything).
    const otherTraffic = r.existingPings.transmitted + r.legitimatePings.transmitted + 20;
    assert.ok(accounted >= r.flood.sent && accounted <= r.flood.sent + otherTraffic, `every flood message accounted for: ${handshakeDrops} handshake drops + ${overflow} receive-queue overflows counted by the daemon (the kernel's RcvbufErrors: ${r.kernelDrops}) for ${r.flood.sent} sent${ctx()}`);
    if (r.kernelDrops > 0) assert.ok(overflow > 0, `the daemon noticed the kernel's drops${ctx()}`);
    // The daemon, not the kernel, decided what became of the flood: it answered or shed (an
    // overloaded daemon sheds cookie replies per source, counted) nearly all of it, rather than
    // leaving it to the full socket queue, which drops the legitimate peer's initiations just as
    // often as the flood's.
    const decided = handshakeDrops / r.flood.sent;
    assert.ok(decided >= 0.9, `at least 90 % of the flood answered or shed by the daemon: ${(100 * decided).toFixed(1)} % (cookie replies: ${(100 * r.flood.cookieReplies / r.flood.sent).toFixed(1)} %)${ctx()}`);
    assert.ok((counted['cookie-required'] ?? 0) >= r.flood.cookieReplies, `a cookie-required drop for every cookie reply seen${ctx()}`);
    assert.equal(r.flood.responses, 0, 'no handshake response to a flood message');
    assert.ok(r.flood.cookieReplies * 64 <= r.flood.sent * 148, 'no amplification');
    // The established peer's traffic kept flowing.
    assert.ok(r.existingPings.replies.length >= r.existingPings.transmitted * 0.8, `the established peer's pings were answered during the flood: ${r.existingPings.replies.length}/${r.existingPings.transmitted}${ctx()}`);
    assert.ok(r.rssAfter - r.rssBefore < 64 * 1048576, `RSS bounded${ctx()}`);
    // Load mode ended: the slow flood after it is processed without cookies.
    assert.equal(r.after.cookieReplies, 0, `no cookies after the flood${ctx()}`);
    assert.equal(r.afterCounted!['cookie-required'] ?? 0, 0, `no cookie-required drops after the flood${ctx()}`);
    assert.ok((r.afterCounted!['handshake-failed'] ?? 0) >= r.after.sent * 0.9, `the slow flood was processed (and failed) instead: ${JSON.stringify(r.afterCounted)}${ctx()}`);
  });

  test('wireguard-go-modern under the same flood (the reference: figures only)', { timeout: (HIGH_RATE_SECONDS + 120) * 1000 }, async (tc) => {
    if (!hasWireGuardGoModern()) {
      tc.diagnostic(`${WIREGUARD_GO_MODERN} is absent: no reference figures in this run`);
      return;
    }
    const scope = new Scope();
    scopes.push(scope);
    const r = await runFlood(scope, 'wireguard-go-modern', flooderBinary, { rate: HIGH_RATE, seconds: HIGH_RATE_SECONDS });
    tc.diagnostic(describeReport(r));
    assert.ok(r.flood.sent > 0, 'the flood ran');
  });
});
