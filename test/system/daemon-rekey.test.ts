/**
 * Rekeying under load: two roamguard daemons (Node.js) with shortened protocol timers
 * (ROAMGUARD_TEST_TIMINGS: rekey after 2 s, keys rejected after 3 s) carry a continuous transfer
 * across several rekeys without a stall:
 *
 *   - an 8 s iperf3 TCP run in which every 1-second interval moved data, then
 *   - 5 s of pings every 50 ms with under 2 % loss,
 *
 * while the handshakes are counted from the daemons' verbose logs ("handshake completed") and
 * `wg show dump`'s latest-handshake time is seen to change several times.
 *
 * With keys rejected 3 s after their handshake, a rekey that came late or a session switch that
 * lost packets would show up as an empty iperf3 interval or lost pings.
 *
 * Needs root, iproute2, wireguard-tools, iputils-ping, iperf3 and /dev/net/tun.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createPair, reapStale, Scope } from './netns.ts';
import {
  describeTunnel, formatRate, INNER, iperf3, requireDaemonPrerequisites, assertPing, startContinuousPing, startTunnel,
  type UserspaceWg,
} from './userspace-wg.ts';

const TIMINGS = { rekeyAfterTime: 2000, rejectAfterTime: 3000, rekeyTimeout: 500, keepaliveTimeout: 1000, rekeyAttemptTime: 10000 };

/** Wall-clock times (ms) of the daemon's "handshake completed" log lines. */
function handshakeTimes(daemon: UserspaceWg): number[] {
  return daemon.logLines(/handshake completed/).map((line) => {
    const m = /(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z)/.exec(line);
    return m ? Date.parse(m[1]) : NaN;
  }).filter((t) => Number.isFinite(t));
}

describe('daemon: rekeying under load with shortened timers', () => {
  before(async () => {
    await requireDaemonPrerequisites(['roamguard-node'], ['iperf3']);
    await reapStale();
  });

  const scopes: Scope[] = [];
  after(async () => {
    for (const scope of scopes) await scope.cleanup();
  });

  test('iperf3 (8 s) and 50 ms pings (5 s) cross several rekeys without a stall', { timeout: 90_000 }, async (tc) => {
    const scope = new Scope();
    scopes.push(scope);
    const topo = await createPair(scope);
    const daemon = { implementation: 'roamguard-node' as const, logLevel: 'verbose' as const, timings: TIMINGS, keepOutputBytes: 4 * 1024 * 1024 };
    const t = await startTunnel(scope, topo, { a: daemon, b: daemon });
    const ctx = () => describeTunnel(t);
    assert.ok(t.a.logLines(/TEST TIMERS IN USE/).length > 0, `the daemon announces its test timers${ctx()}`);
    await assertPing(topo.a, INNER.b.ipv4, { count: 3 }, ctx());

    // Poll our dump's latest handshake during the transfer.
    const seen = new Set<number>();
    let polling = true;
    const poller = (async () => {
      while (polling) {
        const peer = await t.a.peer(t.keysB.publicKey).catch(() => undefined);
        if (peer && peer.latestHandshake > 0) seen.add(peer.latestHandshake);
        await new Promise((r) => setTimeout(r, 300));
      }
    })();

    const started = Date.now();
    let result;
    try {
      result = await iperf3(scope, topo.b, topo.a, INNER.b.ipv4, { seconds: 8 });
    } finally {
      polling = false;
      await poller;
    }
    const iperfEnded = Date.now();
    tc.diagnostic(`iperf3 across rekeys: ${formatRate(result.receivedBitsPerSecond)}; per second (MB): ${result.intervalBytes.map((b) => (b / 1e6).toFixed(1)).join(' ')}`);
    assert.ok(result.intervalBytes.length >= 8, `8 one-second intervals: ${JSON.stringify(result.intervalBytes)}`);
    assert.ok(result.intervalBytes.every((b) => b > 0), `every interval moved data: ${JSON.stringify(result.intervalBytes)}${ctx()}`);

    const duringIperf = [...handshakeTimes(t.a), ...handshakeTimes(t.b)].filter((x) => x >= started && x <= iperfEnded);
    tc.diagnostic(`handshakes completed during iperf3 (both daemons' logs): ${duringIperf.length}; distinct latest-handshake times in A's dump: ${seen.size}`);
    // One rekey every ~2 s over 8 s, each logged by both sides: at least 3 rekeys.
    assert.ok(duringIperf.length >= 6, `at least 3 rekeys (6 log lines over both daemons) during the 8 s transfer, got ${duringIperf.length}${ctx()}`);
    assert.ok(seen.size >= 3, `wg show dump's latest handshake changed several times: ${JSON.stringify([...seen])}`);

    const pingStarted = Date.now();
    const trace = await startContinuousPing(scope, topo.a, INNER.b.ipv4, { durationS: 5, intervalS: 0.05 });
    const rekeysDuringPing = handshakeTimes(t.a).filter((x) => x >= pingStarted).length;
    tc.diagnostic(`pings every 50 ms: ${trace.transmitted} sent, ${trace.replies.length} replies (${trace.lossPercent.toFixed(1)} % loss); handshakes logged by A meanwhile: ${rekeysDuringPing}`);
    assert.ok(trace.transmitted >= 80, `pings were sent: ${trace.transmitted}`);
    assert.ok(trace.lossPercent < 2, `under 2 % ping loss across rekeys: ${trace.lossPercent.toFixed(1)} %\n${trace.output.slice(-800)}${ctx()}`);
    assert.ok(rekeysDuringPing >= 2, `rekeys happened while pinging: ${rekeysDuringPing}${ctx()}`);
    assert.ok(t.a.process.running && t.b.process.running, `both daemons still run${ctx()}`);
  });
});
