/**
 * Soak (issue 8, item 5): one long iperf3 transfer B → A between two roamguard daemons with test
 * timers (a rekey every 2 s, keys rejected after 3 s) while B's endpoint keeps changing: every
 * few seconds B either moves to another listen port or to another outer IPv4 address (the old one
 * removed), so A has to follow it by roaming.
 *
 * What must hold: every second of the transfer moves data (no stall across rekeys and endpoint
 * changes); many handshakes happen; A ends up with B's current endpoint; both daemons' RSS and
 * descriptor counts level off (no growth from the second half of the run to its end beyond a
 * bound); the daemons' transfer counters agree with each other and with iperf3's byte count
 * (tunnel bytes = payload + TCP/IP headers + WireGuard overhead).
 *
 * Default: 20 s of transfer. ROAMGUARD_SOAK=1: ten minutes. Run by robustness-uapi-soak.test.ts,
 * side by side with the control-socket test.
 */
import type { TestContext } from 'node:test';
import assert from 'node:assert/strict';
import { memoryStatus } from '../../bench/suite/procfs.ts';
import { createPair, type Scope } from './netns.ts';
import { daemonStats, dropsDelta, fdCount } from './robustness-helpers.ts';
import {
  assertPing, describeTunnel, formatRate, INNER, iperf3, startTunnel, type UserspaceWg,
} from './userspace-wg.ts';

const SOAK = process.env.ROAMGUARD_SOAK === '1';
export const SECONDS = SOAK ? 600 : 20;
const TIMINGS = { rekeyAfterTime: 2000, rejectAfterTime: 3000, rekeyTimeout: 500, keepaliveTimeout: 1000, rekeyAttemptTime: 10000 };
const MOVE_EVERY_MS = 4000;

const mib = (bytes: number) => bytes / 1048576;

interface Sample { at: number; rss: number; fds: number }

function handshakesLogged(daemon: UserspaceWg): number {
  return daemon.logLines(/handshake completed/).length;
}

export const SOAK_TITLE = `${SECONDS} s of iperf3 with a rekey every 2 s and B moving every ${MOVE_EVERY_MS / 1000} s: no stall, no leak, counters agree`;

/** The soak test (run by robustness-uapi-soak.test.ts). */
export async function soak(tc: TestContext, scope: Scope): Promise<void> {
  const topo = await createPair(scope);
  const daemon = { implementation: 'roamguard-node' as const, startTimeoutMs: 60_000, logLevel: 'verbose' as const, timings: TIMINGS, keepOutputBytes: 16 * 1024 * 1024 };
  const t = await startTunnel(scope, topo, { a: daemon, b: daemon });
  const ctx = () => describeTunnel(t);
  const pids = { a: t.a.process.pid, b: t.b.process.pid };
  const before0 = { a: await t.a.peer(t.keysB.publicKey), b: await t.b.peer(t.keysA.publicKey) };
  const handshakes0 = handshakesLogged(t.a) + handshakesLogged(t.b);
  const stats0 = { a: await daemonStats(t.a), b: await daemonStats(t.b) };

  const samples: Record<'a' | 'b', Sample[]> = { a: [], b: [] };
  const moves: string[] = [];
  let running = true;
  const started = performance.now();
  const sampler = (async () => {
    while (running) {
      for (const side of ['a', 'b'] as const) samples[side].push({ at: (performance.now() - started) / 1000, rss: memoryStatus(pids[side]).rssBytes, fds: fdCount(pids[side]) });
      await new Promise((r) => setTimeout(r, 1000));
    }
  })();
  // B moves: another listen port, or another outer address, in turn. (The old address goes, so
  // B's packets leave from the new one and A's to the old one are lost: A must follow B.)
  let port = 51821;
  let address = topo.linkB.ipv4;
  const mover = (async () => {
    let n = 0;
    while (running) {
      await new Promise((r) => setTimeout(r, MOVE_EVERY_MS));
      if (!running) break;
      if (n++ % 2 === 0) {
        port = port >= 51899 ? 51822 : port + 1;
        await t.b.wg(['set', t.b.ifname, 'listen-port', String(port)]);
        moves.push(`port ${port}`);
      } else {
        const next = address === '192.0.2.2' ? '192.0.2.3' : '192.0.2.2';
        await topo.b.ip(['addr', 'del', `${address}/24`, 'dev', topo.linkB.ifname]);
        await topo.b.ip(['addr', 'add', `${next}/24`, 'dev', topo.linkB.ifname]);
        address = next;
        moves.push(`address ${next}`);
      }
    }
  })();
  let result;
  try {
    result = await iperf3(scope, topo.a, topo.b, INNER.a.ipv4, { seconds: SECONDS });
  } finally {
    running = false;
    await Promise.all([sampler, mover]);
  }
  // B's next packet after its last move tells A where B is now.
  await assertPing(topo.b, INNER.a.ipv4, { count: 2 }, ctx());
  const after = { a: await t.a.peer(t.keysB.publicKey), b: await t.b.peer(t.keysA.publicKey) };
  const handshakes = handshakesLogged(t.a) + handshakesLogged(t.b) - handshakes0;
  const sentBytes = result.intervalBytes.reduce((a, b) => a + b, 0);
  const rxA = after.a!.rxBytes - before0.a!.rxBytes;
  const txB = after.b!.txBytes - before0.b!.txBytes;
  const txA = after.a!.txBytes - before0.a!.txBytes;
  const rxB = after.b!.rxBytes - before0.b!.rxBytes;
  tc.diagnostic(`iperf3 B→A: ${formatRate(result.receivedBitsPerSecond)}, ${(sentBytes / 1e6).toFixed(1)} MB; per second (MB): ${result.intervalBytes.map((b) => (b / 1e6).toFixed(1)).join(' ')}`);
  tc.diagnostic(`${handshakes} handshakes logged, ${moves.length} moves of B (${moves.join(', ')}); A sees B at ${after.a?.endpoint}`);
  tc.diagnostic(`counters: B sent ${txB} / A received ${rxA} bytes (iperf3 payload ${sentBytes}, ratio ${(rxA / sentBytes).toFixed(3)}); A sent ${txA} / B received ${rxB}`);
  for (const side of ['a', 'b'] as const) {
    const s = samples[side];
    tc.diagnostic(`${side.toUpperCase()}: RSS (MiB) ${s.filter((_, i) => i % 5 === 0).map((x) => mib(x.rss).toFixed(0)).join(' ')}; fds ${[...new Set(s.map((x) => x.fds))].join(',')}`);
  }

  const drops = { a: dropsDelta(stats0.a, await daemonStats(t.a)), b: dropsDelta(stats0.b, await daemonStats(t.b)) };
  tc.diagnostic(`drops during the soak: A ${JSON.stringify(drops.a)}, B ${JSON.stringify(drops.b)}`);
  // Packets in flight across a rekey or a move may arrive for a key already gone (stale), but a
  // genuine packet never fails to authenticate or hits a limit: that would be a key mix-up.
  for (const side of ['a', 'b'] as const) {
    for (const reason of ['decryption-failed', 'counter-limit', 'bad-mac1', 'handshake-failed', 'allowed-ips-mismatch', 'bad-inner-packet']) {
      assert.equal(drops[side][reason] ?? 0, 0, `${side.toUpperCase()}: no '${reason}' drops in genuine traffic${ctx()}`);
    }
  }

  // No stall.
  assert.ok(result.intervalBytes.length >= SECONDS - 1, `iperf3 ran its course: ${result.intervalBytes.length} intervals`);
  const empty = result.intervalBytes.map((b, i) => [i, b]).filter(([, b]) => b === 0);
  assert.deepEqual(empty, [], `every second moved data${ctx()}`);
  assert.ok(handshakes >= SECONDS / 2, `a rekey every ~2 s: ${handshakes} handshake lines over both daemons${ctx()}`);
  assert.ok(moves.length >= Math.floor(SECONDS * 1000 / MOVE_EVERY_MS) * 0.9 - 1, `B moved: ${moves.length}`);
  assert.equal(after.a?.endpoint, `${address}:${port}`, `A followed B to its last endpoint${ctx()}`);

  // Counters: what B sent A received (minus a little lost at the moves), and it is iperf3's
  // payload plus per-packet overhead (TCP/IP headers 52, WireGuard 32 + padding: under 12 %).
  assert.ok(rxA <= txB, `A received no more than B sent: ${rxA} > ${txB}`);
  assert.ok(rxA >= txB * 0.97, `A received nearly all B sent: ${rxA} of ${txB}`);
  assert.ok(rxA >= sentBytes, `A's rx covers iperf3's payload: ${rxA} < ${sentBytes}`);
  assert.ok(rxA <= sentBytes * 1.12 + 1e6, `A's rx is payload plus overhead: ${rxA} vs ${sentBytes} (${(rxA / sentBytes).toFixed(3)})`);
  assert.ok(rxB <= txA && rxB >= txA * 0.97, `the ACK direction agrees too: A sent ${txA}, B received ${rxB}`);

  // No leak: after the first half, RSS and descriptors level off.
  for (const side of ['a', 'b'] as const) {
    const s = samples[side];
    const half = s.filter((x) => x.at >= SECONDS / 2);
    const firstHalf = s.filter((x) => x.at >= SECONDS / 4 && x.at < SECONDS / 2);
    const peak = (xs: Sample[]) => Math.max(...xs.map((x) => x.rss));
    assert.ok(peak(half) - peak(firstHalf) < 48 * 1048576, `${side.toUpperCase()}: RSS levels off: ${mib(peak(firstHalf)).toFixed(0)} → ${mib(peak(half)).toFixed(0)} MiB`);
    // A listen-port change briefly holds the old and the new sockets, eventfd and reader thread
    // (up to ~8 descriptors for a moment); a leak raises the floor, so the floor of the last
    // samples is what must not grow, and a transient stays bounded.
    const earlier = s.filter((x) => x.at < SECONDS / 2).map((x) => x.fds);
    const floor = Math.min(...s.slice(-3).map((x) => x.fds));
    assert.ok(floor <= Math.max(...earlier) + 2, `${side.toUpperCase()}: descriptors do not grow: ${s.map((x) => x.fds).join(' ')}`);
    assert.ok(Math.max(...half.map((x) => x.fds)) <= Math.max(...earlier) + 12, `${side.toUpperCase()}: descriptor peaks stay bounded: ${s.map((x) => x.fds).join(' ')}`);
  }
  assert.ok(t.a.process.running && t.b.process.running, `both daemons still run${ctx()}`);
}
