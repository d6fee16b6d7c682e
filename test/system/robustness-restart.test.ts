/**
 * Restarts (issue 8, item 6): the roamguard daemon A is killed with SIGKILL while pings flow both
 * ways (every 20 ms) to and from its wireguard-go peer B, then started again under the same
 * interface name and reconfigured with the same `wg` and `ip` commands. The killed daemon leaves
 * a stale control socket behind; the new one must replace it.
 *
 * What must hold, for each restart: once the new daemon is configured, A's pings are answered
 * within one handshake (0.3–1.7 s here, the new process still warming up; a retransmission would
 * come only after 5 s), and
 * B's pings too (B still holds the old session; A's new initiation replaces it); A's log shows one
 * completed handshake; B reports a new latest handshake.
 *
 * ROAMGUARD_SOAK=1: ten restarts instead of one.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { createPair, reapStale, Scope } from './netns.ts';
import { daemonStats } from './robustness-helpers.ts';
import {
  assertPing, describeTunnel, INNER, requireDaemonPrerequisites, startContinuousPing, startTunnel, waitForExit,
} from './userspace-wg.ts';

const SOAK = process.env.ROAMGUARD_SOAK === '1';
const RESTARTS = SOAK ? 10 : 1;
/** Traffic must be back before a handshake retransmission could have happened (RekeyTimeout, 5 s). */
const WITHIN_S = 4;
const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
const nowS = () => Date.now() / 1000;

describe('robustness: the daemon killed with SIGKILL under traffic and restarted', () => {
  before(async () => {
    await requireDaemonPrerequisites(['roamguard-node', 'wireguard-go']);
    await reapStale();
  });
  const scopes: Scope[] = [];
  after(async () => { for (const s of scopes) await s.cleanup(); });

  test(`${RESTARTS} × SIGKILL under 50 pings/s each way, restart, reconfigure: traffic back within one handshake`, { timeout: (RESTARTS * 40 + 60) * 1000 }, async (tc) => {
    const scope = new Scope();
    scopes.push(scope);
    const topo = await createPair(scope);
    const t = await startTunnel(scope, topo, { a: { implementation: 'roamguard-node', startTimeoutMs: 60_000, logLevel: 'verbose' }, b: { implementation: 'wireguard-go' } });
    const ctx = () => describeTunnel(t);

    for (let round = 1; round <= RESTARTS; round++) {
      await assertPing(topo.a, INNER.b.ipv4, { count: 3 }, ctx()); // a session exists before the kill
      const duration = 12;
      const fromA = startContinuousPing(scope, topo.a, INNER.b.ipv4, { durationS: duration, intervalS: 0.02 });
      const fromB = startContinuousPing(scope, topo.b, INNER.a.ipv4, { durationS: duration, intervalS: 0.02 });
      await sleep(1500);
      const victim = t.a.process;
      const killedAt = nowS();
      process.kill(victim.pid, 'SIGKILL');
      await waitForExit(victim, 5000, 'SIGKILL');
      assert.ok(existsSync(t.a.socketPath), 'a SIGKILLed daemon leaves its control socket behind');
      const handshakeB = (await t.b.peer(t.keysA.publicKey))?.latestHandshake ?? 0;
      await t.a.restart(); // start under the same name, replay `wg set` and `ip` configuration
      const configuredAt = nowS();
      const [a, b] = await Promise.all([fromA, fromB]);

      const firstAfter = (trace: typeof a) => trace.replies.find((r) => r.at > configuredAt)?.at;
      const backA = firstAfter(a);
      const backB = firstAfter(b);
      const repliesBefore = a.replies.filter((r) => r.at < killedAt).length;
      tc.diagnostic(`restart ${round}: down ${(configuredAt - killedAt).toFixed(2)} s (kill → reconfigured); A's pings answered again after ${backA ? (backA - configuredAt).toFixed(3) : '—'} s, B's after ${backB ? (backB - configuredAt).toFixed(3) : '—'} s`);
      assert.ok(repliesBefore > 20, `traffic flowed before the kill: ${repliesBefore} replies${ctx()}`);
      // Within one handshake: a lost or refused first initiation would be retried only after 5 s.
      assert.ok(backA !== undefined && backA - configuredAt < WITHIN_S, `A's traffic back within one handshake (${backA === undefined ? 'never' : `${(backA - configuredAt).toFixed(2)} s`})${ctx()}`);
      assert.ok(backB !== undefined && backB - configuredAt < WITHIN_S, `B's traffic back within one handshake (${backB === undefined ? 'never' : `${(backB - configuredAt).toFixed(2)} s`})${ctx()}`);
      // And it stays back: of the requests sent from then on (by sequence number), most answered.
      const steady = a.replies.filter((r) => r.at > backA! + 0.5);
      const sent = steady.length === 0 ? 1 : steady[steady.length - 1].seq - steady[0].seq + 1;
      assert.ok(steady.length >= sent * 0.9, `and it stays back: ${steady.length} of ${sent} requests answered`);
      const fresh = await daemonStats(t.a);
      tc.diagnostic(`restart ${round}: the new daemon's drops ${JSON.stringify(Object.fromEntries(Object.entries(fresh.drops).filter(([, n]) => n > 0)))} (B's packets under the old session: unknown-index)`);
      assert.equal(fresh.peers[0]?.handshakesCompleted, 1, 'the new daemon needed one handshake (its counters)');
      const completed = t.a.logLines(/handshake completed/);
      assert.equal(completed.length, 1, `the new daemon needed one handshake: ${completed.join('\n')}${ctx()}`);
      const peerB = await t.b.peer(t.keysA.publicKey);
      assert.ok((peerB?.latestHandshake ?? 0) > handshakeB, 'B saw the new handshake');
    }
  });
});
