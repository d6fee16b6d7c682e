/**
 * The `roamguard wg` daemon's life cycle, with wireguard-go's rules:
 *
 *   - SIGTERM: exits 0 and removes its control socket (and so its TUN);
 *   - its control socket file deleted: exits;
 *   - its interface deleted (`ip link del`): exits and removes its socket;
 *   - without -f, `roamguard wg IF` returns only once `ip link show IF` and the socket exist; the
 *     detached daemon is then found by its socket (`ss -xlpn`) and stopped by that pid;
 *   - a second daemon for a live name fails with a clear error and leaves the first running
 *     (same namespace: the TUN is taken; another namespace: the socket answers);
 *   - the reader of its stderr gone (the launcher exited), logging does not end it and SIGTERM
 *     still does, also when it runs from its sources through tsx;
 *   - an invalid interface name, and LOG_LEVEL=bogus, fail at once with one line of error;
 *   - ready means ready: the first ping right after two daemons report ready is answered at once
 *     (it used to wait 1-3 s for the crypto workers to load), and a daemon stopped within its
 *     first second exits 0 (terminating a worker that was still loading koffi aborted Node).
 *
 * Needs root, iproute2, wireguard-tools, ss and /dev/net/tun.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, statSync, unlinkSync } from 'node:fs';
import { join } from 'node:path';
import { createPair, reapStale, Scope, uniqueName, waitFor, WG_SOCKET_DIR, type Namespace, type PairTopology } from './netns.ts';
import {
  commandLine, describeTunnel, INNER, isAlive, killAtCleanup, ping, requireDaemonPrerequisites, ROAMGUARD_BIN, socketOwnerPids,
  startTunnel, UserspaceWg, waitForExit,
} from './userspace-wg.ts';

const scope = new Scope();
let topo: PairTopology;

const socketOf = (ifname: string) => join(WG_SOCKET_DIR, `${ifname}.sock`);

async function linkExists(ns: Namespace, ifname: string): Promise<boolean> {
  return (await ns.ip(['link', 'show', 'dev', ifname], { allowFailure: true })).code === 0;
}

/** Exit status after `what`; the socket and the TUN must be gone too. */
async function assertExitsCleanly(daemon: UserspaceWg, what: string): Promise<void> {
  const status = await waitForExit(daemon.process, 10_000, what);
  assert.deepEqual(status, { code: 0, signal: null }, `exit status after ${what}\n${daemon.describe()}`);
  assert.equal(existsSync(daemon.socketPath), false, `${daemon.socketPath} removed after ${what}`);
  assert.equal(await linkExists(daemon.ns, daemon.ifname), false, `${daemon.ifname} gone after ${what}`);
}

/** `roamguard wg ARGS` in `ns` to completion (it must not hang). */
function roamguardWg(ns: Namespace, args: readonly string[], env: Record<string, string> = {}) {
  return ns.exec(ROAMGUARD_BIN, ['wg', ...args], { env: { LOG_LEVEL: 'silent', ...env }, allowFailure: true, timeoutMs: 30_000 });
}

function assertOneLineError(stderr: string, pattern: RegExp, what: string): void {
  const lines = stderr.trim().split('\n').filter(Boolean);
  assert.equal(lines.length, 1, `${what}: one line of error, got:\n${stderr}`);
  assert.match(lines[0], pattern, `${what}: ${lines[0]}`);
}

describe('daemon: life cycle and exit rules', () => {
  before(async () => {
    await requireDaemonPrerequisites(['roamguard-node', 'roamguard-bun']);
    await reapStale();
    topo = await createPair(scope);
  });

  after(async () => {
    await scope.cleanup();
  });

  test('SIGTERM: exits 0 and removes its socket and interface', { timeout: 40_000 }, async () => {
    const daemon = await UserspaceWg.start(scope, topo.a);
    process.kill(daemon.process.pid, 'SIGTERM');
    await assertExitsCleanly(daemon, 'SIGTERM');
  });

  test('deleting the control socket file: exits', { timeout: 40_000 }, async () => {
    const daemon = await UserspaceWg.start(scope, topo.a);
    unlinkSync(daemon.socketPath);
    await assertExitsCleanly(daemon, 'deleting its socket');
  });

  test('ip link del IF: exits and removes its socket', { timeout: 40_000 }, async () => {
    const daemon = await UserspaceWg.start(scope, topo.a);
    await topo.a.ip(['link', 'del', 'dev', daemon.ifname]);
    await assertExitsCleanly(daemon, '`ip link del`');
  });

  test('without -f: returns once the interface and socket exist; the detached daemon is stopped by its pid', { timeout: 60_000 }, async () => {
    const ifname = uniqueName('rgl');
    const socketPath = socketOf(ifname);
    scope.removeFileAtCleanup(socketPath);
    const started = performance.now();
    const result = await roamguardWg(topo.a, [ifname]);
    // Checked the moment it returns: no waiting here.
    const socketThere = existsSync(socketPath);
    const linkThere = await linkExists(topo.a, ifname);
    const pids = await socketOwnerPids(topo.a, ifname);
    for (const pid of pids) killAtCleanup(scope, pid, new RegExp(`\\bwg\\b.*\\b${ifname}\\b`));
    assert.equal(result.code, 0, `roamguard wg ${ifname} failed: ${result.stderr}`);
    assert.ok(socketThere, `${socketPath} exists when roamguard wg returns (after ${(performance.now() - started).toFixed(0)} ms)`);
    assert.ok(statSync(socketPath).isSocket());
    assert.ok(linkThere, `ip link show ${ifname} succeeds when roamguard wg returns`);

    assert.equal(pids.length, 1, `one process serves ${socketPath}: ${JSON.stringify(pids)}`);
    const pid = pids[0];
    assert.match(commandLine(pid) ?? '', new RegExp(`(roamguard\\.ts|launch\\.mjs) wg --foreground ${ifname}$`), 'the detached daemon');
    const shown = await topo.a.exec('wg', ['show', ifname, 'listen-port']);
    assert.match(shown.stdout.trim(), /^\d+$/, 'the detached daemon answers wg');

    process.kill(pid, 'SIGTERM');
    await waitFor(() => !isAlive(pid) && !existsSync(socketPath), 10_000, { description: `detached daemon ${pid} to exit on SIGTERM` });
    assert.equal(await linkExists(topo.a, ifname), false, `${ifname} gone`);
  });

  test('a second daemon for a live name fails clearly and leaves the first running', { timeout: 60_000 }, async () => {
    const first = await UserspaceWg.start(scope, topo.a);
    const inode = statSync(first.socketPath).ino;

    // Same namespace: the TUN is taken. Foreground, so the error comes straight from the daemon.
    const same = await roamguardWg(topo.a, ['-f', first.ifname], { LOG_LEVEL: 'error' });
    assert.notEqual(same.code, 0, `a second daemon for ${first.ifname} in the same namespace must fail`);
    assertOneLineError(same.stderr, new RegExp(`${first.ifname}.*(EBUSY|busy|in use|already)|(EBUSY|busy|in use|already).*${first.ifname}`, 'i'), 'same namespace');

    // Another namespace: the TUN can be made there, but the socket answers. Without -f, so the
    // error travels back from the detached daemon through the readiness report.
    const other = await roamguardWg(topo.b, [first.ifname], { LOG_LEVEL: 'silent' });
    assert.notEqual(other.code, 0, `a second daemon for ${first.ifname} in another namespace must fail`);
    assertOneLineError(other.stderr, new RegExp(`${first.ifname}.*already served by another process`), 'other namespace');
    assert.equal(await linkExists(topo.b, first.ifname), false, 'the failed daemon removed the TUN it made');
    assert.deepEqual(await socketOwnerPids(topo.b, first.ifname), [], 'no daemon left behind in the other namespace');

    assert.equal(first.process.running, true, `the first daemon still runs\n${first.describe()}`);
    assert.equal(statSync(first.socketPath).ino, inode, 'the first daemon\'s socket was not replaced');
    const shown = await first.wg(['show', first.ifname, 'listen-port']);
    assert.match(shown.stdout.trim(), /^\d+$/, 'the first daemon still answers wg');
    await first.stop();
  });

  test('ready means ready: right after start, the first ping is answered at once (crypto workers loaded)', { timeout: 60_000 }, async () => {
    const t = await startTunnel(scope, topo, { a: { implementation: 'roamguard-node' }, b: { implementation: 'roamguard-node' } });
    const first = await ping(topo.a, INNER.b.ipv4, { count: 1, deadlineS: 10 });
    const rtt = /time=([\d.]+) ms/.exec(first.output);
    assert.ok(rtt, `the first ping got a reply:\n${first.output}${describeTunnel(t)}`);
    // A handshake and one round trip take milliseconds here; seconds mean packets were held
    // back while the daemon's crypto workers were still loading after it reported ready.
    assert.ok(Number(rtt[1]) < 1000, `first ping round trip ${rtt[1]} ms after both daemons reported ready (want < 1000 ms)`);
    await t.a.stop();
    await t.b.stop();
  });

  test('stopped within its first second: still exits 0 (no abort from crypto workers being torn down while loading)', { timeout: 90_000 }, async () => {
    for (const delayMs of [0, 500, 1000]) {
      const daemon = await UserspaceWg.start(scope, topo.a);
      await new Promise((r) => setTimeout(r, delayMs));
      await topo.a.ip(['link', 'del', 'dev', daemon.ifname]);
      await assertExitsCleanly(daemon, `\`ip link del\` ${delayMs} ms after start`);
    }
  });

  const stderrCases = [
    { label: 'roamguard-node', implementation: 'roamguard-node', fromSources: false },
    { label: 'roamguard-bun', implementation: 'roamguard-bun', fromSources: false },
    // Under tsx a worker (tsx's loader thread) pipes into stderr before the daemon's own code runs.
    { label: 'roamguard-node from its sources (tsx)', implementation: 'roamguard-node', fromSources: true },
  ] as const;
  for (const { label, implementation, fromSources } of stderrCases) {
    test(`${label}: whoever read its stderr gone, it keeps running, logging costs nothing, SIGTERM ends it`, { timeout: 60_000 }, async () => {
      // What happens to every detached daemon: `roamguard wg` (or the agent that ran it) exits
      // and the read end of the daemon's stderr closes. A log line written after that used to
      // end the process (an unhandled EPIPE): the data plane died at its first error. Under tsx
      // it then also hung in exit, its reader threads blocked in poll.
      const daemon = await UserspaceWg.start(scope, topo.a, { implementation, fromSources, logLevel: 'verbose' });
      daemon.process.child.stderr!.destroy();
      for (let i = 0; i < 3; i++) {
        // Each control-socket request logs a verbose line into the closed pipe.
        const shown = await daemon.wg(['show', daemon.ifname, 'listen-port']);
        assert.match(shown.stdout.trim(), /^\d+$/, `request ${i + 1} answered\n${daemon.describe()}`);
        await new Promise((r) => setTimeout(r, 200));
      }
      assert.equal(daemon.process.running, true, `the daemon still runs\n${daemon.describe()}`);
      assert.equal(await linkExists(topo.a, daemon.ifname), true, 'its interface is still there');
      // Its shutdown logs too, into the closed pipe.
      process.kill(daemon.process.pid, 'SIGTERM');
      await assertExitsCleanly(daemon, 'SIGTERM with its stderr gone');
    });
  }

  test('an invalid interface name: non-zero exit with a one-line error', { timeout: 30_000 }, async () => {
    const name = 'rg' + 'x'.repeat(18); // 20 characters
    const result = await roamguardWg(topo.a, ['-f', name], { LOG_LEVEL: 'error' });
    assert.notEqual(result.code, 0, 'must fail');
    assertOneLineError(result.stderr, new RegExp(`${name}.*(long|15)`), 'invalid name');
    assert.equal(existsSync(socketOf(name)), false);
  });

  test('LOG_LEVEL=bogus: non-zero exit with a one-line error naming LOG_LEVEL', { timeout: 30_000 }, async () => {
    const ifname = uniqueName('rgl');
    const result = await roamguardWg(topo.a, ['-f', ifname], { LOG_LEVEL: 'bogus' });
    assert.notEqual(result.code, 0, 'must fail');
    assertOneLineError(result.stderr, /LOG_LEVEL/, 'bad LOG_LEVEL');
    assert.equal(existsSync(socketOf(ifname)), false, 'no socket made');
    assert.equal(await linkExists(topo.a, ifname), false, 'no interface made');
  });
});
