/**
 * Replays and spoofed inner sources at a running `roamguard wg` daemon (issue 8, item 3).
 *
 *   A: roamguard daemon (Node.js) with two peers: the insider (10.77.0.50, fd77::50) and a peer
 *      "B" that owns 10.77.0.2 and fd77::2; a canary UDP listener on A's tunnel addresses shows
 *      which inner packets were delivered.
 *   B's namespace: the hostile peer (hostile-peer.ts); its first socket is the insider, a genuine
 *      peer of A that records everything it sends.
 *
 * The insider answers a handshake A starts (a recorded response), starts one itself (a recorded
 * initiation), and sends data to the canary (recorded transport messages). Then every recorded
 * datagram is sent again, from the insider's own address and from another one, seconds later (and
 * with ROAMGUARD_SOAK=1 also 130 s and 200 s later, past the keys' 180 s lifetime, while the
 * session goes on). Nothing may be accepted: the canary gets no second copy, the daemon's rx and
 * tx counters for the insider do not move (with keepalives after 1 s, an accepted data packet
 * would make A answer within the window), its latest handshake stays, its endpoint stays.
 *
 * Then the insider sends packets with inner source addresses it may not use (B's, A's own,
 * nobody's): none reaches the canary, while its genuine packets do.
 *
 * The daemon's drop counters (`get=roamguard-stats`) must say why: handshake-replay for each
 * initiation, replay (or, once the keys are gone, unknown-index / expired-keypair) for each
 * response and data message, allowed-ips-mismatch for each spoofed packet.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createPair, reapStale, Scope, waitFor } from './netns.ts';
import { Canary, HostilePeer } from './hostile-peer.ts';
import { daemonStats, dropsDelta } from './robustness-helpers.ts';
import { INNER, PORT_A, requireDaemonPrerequisites, UserspaceWg } from './userspace-wg.ts';
import { generateKeyPair } from './wireguard-go.ts';

const SOAK = process.env.ROAMGUARD_SOAK === '1';
const DELAYS_S = SOAK ? [3, 130, 200] : [3];
const CANARY_PORT = 7777;
const INSIDER = { ipv4: '10.77.0.50', ipv6: 'fd77::50' };
const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

describe('robustness: replays and spoofed inner sources at a running daemon', () => {
  before(async () => {
    await requireDaemonPrerequisites(['roamguard-node']);
    await reapStale();
  });
  const scopes: Scope[] = [];
  after(async () => { for (const s of scopes) await s.cleanup(); });

  test(`recorded handshakes and data resent ${DELAYS_S.join(' s, ')} s later are refused; spoofed inner sources are dropped`, { timeout: (DELAYS_S[DELAYS_S.length - 1] + 90) * 1000 }, async (tc) => {
    const scope = new Scope();
    scopes.push(scope);
    const topo = await createPair(scope);
    await topo.b.ip(['addr', 'add', '192.0.2.10/24', 'dev', topo.linkB.ifname]);
    // Passive keepalives after 1 s: a data packet the daemon accepted would be answered quickly.
    const a = await UserspaceWg.start(scope, topo.a, { implementation: 'roamguard-node', startTimeoutMs: 60_000, timings: { keepaliveTimeout: 1000 }, logLevel: 'verbose' });
    const [keysA, insiderKeys, keysB] = await Promise.all([generateKeyPair(), generateKeyPair(), generateKeyPair()]);
    const hostile = await HostilePeer.start(scope, topo.b, {
      daemon: { publicKey: keysA.publicKey, endpoint4: `${topo.linkA.ipv4}:${PORT_A}`, endpoint6: `[${topo.linkA.ipv6}]:${PORT_A}` },
      sources: ['192.0.2.10', topo.linkB.ipv4, topo.linkB.ipv6],
      insider: { privateKey: insiderKeys.privateKey },
    });
    const insiderEndpoint = `192.0.2.10:${hostile.ports['192.0.2.10']}`;
    await a.configure({
      privateKey: keysA.privateKey, listenPort: PORT_A,
      peers: [
        { publicKey: insiderKeys.publicKey, endpoint: insiderEndpoint, allowedIps: [`${INSIDER.ipv4}/32`, `${INSIDER.ipv6}/128`] },
        { publicKey: keysB.publicKey, allowedIps: [`${INNER.b.ipv4}/32`, `${INNER.b.ipv6}/128`] },
      ],
    });
    await a.addAddress(`${INNER.a.ipv4}/24`);
    await a.addAddress(`${INNER.a.ipv6}/64`);
    await a.up();
    const canary = await Canary.start(scope, topo.a, CANARY_PORT, [INNER.a.ipv4, INNER.a.ipv6]);
    const ctx = () => `\n${a.describe()}\n${hostile.process.describe()}`;

    // Record a session: A initiates (the insider's response is recorded), then the insider
    // initiates (its initiation is recorded), then it sends data (transport messages).
    await topo.a.exec('ping', ['-c', '1', '-W', '1', INSIDER.ipv4], { allowFailure: true }); // the insider does not answer pings
    await waitFor(async () => (await hostile.stats()).insider?.delivered === 1, 15_000, { description: 'A\'s ping at the insider' });
    // An answer, so that A (which heard nothing back for its ping) does not start another
    // handshake of its own, which would cross the insider's.
    await hostile.udp(INSIDER.ipv4, INNER.a.ipv4, CANARY_PORT, 'pong');
    await sleep(5200); // a peer sends at most one initiation per 5 s
    await hostile.handshake(20_000).catch((err) => { throw new Error(`${(err as Error).message}${ctx()}`); });
    for (let i = 0; i < 10; i++) {
      await hostile.udp(INSIDER.ipv4, INNER.a.ipv4, CANARY_PORT, `data ${i}`);
      await hostile.udp(INSIDER.ipv6, INNER.a.ipv6, CANARY_PORT, `data6 ${i}`);
    }
    await waitFor(() => canary.received().length === 21, 15_000, { description: 'the genuine data at the canary' });
    const recorded = await hostile.recorded();
    assert.ok(recorded >= 23, `recorded the session: ${recorded} datagrams`);

    let elapsed = 0;
    for (const delay of DELAYS_S) {
      // The session goes on meanwhile (past rekeys and the keys' lifetime in the long run).
      let seq = 0;
      while (elapsed < delay - 2) {
        await hostile.udp(INSIDER.ipv4, INNER.a.ipv4, CANARY_PORT, `alive ${delay} ${seq++}`);
        const step = Math.min(5, delay - 2 - elapsed);
        await sleep(step * 1000);
        elapsed += step;
      }
      await sleep(2000); // quiet: the last keepalive is out
      elapsed = delay;
      const before = await a.peer(insiderKeys.publicKey);
      const statsBefore = await daemonStats(a);
      const canaryBefore = canary.received().length;
      let replayed = 0;
      const byType: Record<string, number> = {};
      for (const source of [0, 1, 2]) {
        const r = await hostile.replay([1, 2, 4], { to: recorded, source });
        replayed += r.replayed;
        for (const [type, n] of Object.entries(r.byType)) byType[type] = (byType[type] ?? 0) + n;
      }
      await sleep(2500);
      const afterwards = await a.peer(insiderKeys.publicKey);
      const counted = dropsDelta(statsBefore, await daemonStats(a), { inboundOnly: true });
      tc.diagnostic(`${delay} s later: resent by type ${JSON.stringify(byType)}; drops counted ${JSON.stringify(counted)}`);
      // Initiations: refused by their timestamp. Responses: their handshake is over (the index
      // now names a session or nothing). Data: the replay window, or, once the keys are gone, stale.
      assert.equal(counted['handshake-replay'] ?? 0, byType[1] ?? 0, `${delay} s: every replayed initiation counted as handshake-replay`);
      const stale = (counted['unknown-index'] ?? 0) + (counted['expired-keypair'] ?? 0);
      assert.equal((counted.replay ?? 0) + stale, (byType[2] ?? 0) + (byType[4] ?? 0), `${delay} s: every replayed response and data message counted as replay or stale`);
      if (delay < 60) assert.equal(counted.replay ?? 0, byType[4] ?? 0, `${delay} s: the data messages hit the replay window`);
      const others = Object.keys(counted).filter((r) => !['handshake-replay', 'replay', 'unknown-index', 'expired-keypair'].includes(r));
      assert.deepEqual(others, [], `${delay} s: no other drops`);
      tc.diagnostic(`${delay} s later: ${replayed} datagrams resent (${recorded} recorded, from 3 sources); insider at A before ${JSON.stringify({ rx: before?.rxBytes, tx: before?.txBytes, hs: before?.latestHandshake })} after ${JSON.stringify({ rx: afterwards?.rxBytes, tx: afterwards?.txBytes, hs: afterwards?.latestHandshake })}`);
      assert.equal(canary.received().length, canaryBefore, `${delay} s: no replayed packet was delivered${ctx()}`);
      assert.equal(afterwards?.rxBytes, before?.rxBytes, `${delay} s: the daemon accepted none of the replays${ctx()}`);
      assert.equal(afterwards?.txBytes, before?.txBytes, `${delay} s: and answered none (no response, no keepalive)${ctx()}`);
      assert.equal(afterwards?.latestHandshake, before?.latestHandshake, `${delay} s: no handshake from a replay`);
      assert.equal(afterwards?.endpoint, insiderEndpoint, `${delay} s: the endpoint stayed`);
      const payloads = canary.received().map((d) => d.payload);
      assert.equal(new Set(payloads).size, payloads.length, 'no packet delivered twice');
    }

    // Spoofed inner sources: B's addresses, A's own, nobody's. Only the genuine ones arrive.
    const spoofed = [INNER.b.ipv4, INNER.a.ipv4, '10.77.0.99', '192.0.2.1', INNER.b.ipv6, 'fd77::99', '::ffff:10.77.0.50'];
    const countBefore = canary.received().length;
    const spoofStats = await daemonStats(a);
    for (const src of spoofed) {
      const v6 = src.includes(':');
      await hostile.udp(src, v6 ? INNER.a.ipv6 : INNER.a.ipv4, CANARY_PORT, `spoofed from ${src}`);
      await hostile.udp(v6 ? INSIDER.ipv6 : INSIDER.ipv4, v6 ? INNER.a.ipv6 : INNER.a.ipv4, CANARY_PORT, `genuine after ${src}`);
    }
    await waitFor(() => canary.count('genuine after') === spoofed.length, 15_000, { description: 'the genuine packets between the spoofed ones' })
      .catch((err) => { throw new Error(`${(err as Error).message}: ${JSON.stringify(canary.received().slice(countBefore))}${ctx()}`); });
    await sleep(500);
    const spoofedSeen = canary.received().slice(countBefore).filter((d) => d.payload.startsWith('spoofed'));
    assert.deepEqual(spoofedSeen, [], `packets with spoofed inner sources are dropped${ctx()}`);
    const spoofDrops = dropsDelta(spoofStats, await daemonStats(a), { inboundOnly: true });
    tc.diagnostic(`spoofed inner sources: drops counted ${JSON.stringify(spoofDrops)}`);
    assert.deepEqual(spoofDrops, { 'allowed-ips-mismatch': spoofed.length }, 'each counted by the allowed-IPs check');
    assert.ok(a.process.running, `the daemon still runs${ctx()}`);
  });
});
