/**
 * How the agent starts its data plane (control/agent/dataplane-process.ts), run as the agent runs
 * it: a process that calls ensureDataplane in a namespace and then ends, as an agent does when it
 * restarts, while the daemon it started lives on.
 *
 *   - roamguard: the daemon's error lines reach the starter's log (onLog); the starter can exit
 *     while the daemon runs (its stderr does not hold the starter); the daemon outlives the
 *     reader of its stderr;
 *   - wireguard-go: detaches with its output on /dev/null (a Go program is killed by SIGPIPE when
 *     it writes to a stderr pipe nobody reads, which is what our pipe becomes when the agent restarts);
 *   - a daemon that cannot start: the error names its reason.
 *
 * Needs root, iproute2, wireguard-tools, ss, wireguard-go and /dev/net/tun.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { Scope, uniqueName, WG_SOCKET_DIR, type Namespace } from './netns.ts';
import { commandLine, isAlive, killAtCleanup, REPO_ROOT, requireDaemonPrerequisites, socketOwnerPids } from './userspace-wg.ts';

const scope = new Scope();
let ns: Namespace;
let starter: string;

before(async () => {
  await requireDaemonPrerequisites(['roamguard-node', 'wireguard-go']);
  ns = await scope.namespace();
  const dir = scope.tempDir('roamguard-starter-');
  starter = join(dir, 'starter.mts');
  writeFileSync(starter, `
    import { ensureDataplane } from ${JSON.stringify(join(REPO_ROOT, 'control/agent/dataplane-process.ts'))};
    import { UapiClient } from ${JSON.stringify(join(REPO_ROOT, 'dataplane/uapi/uapi-client.ts'))};
    const [choice, ifname, timings] = process.argv.slice(2);
    try {
      const status = await ensureDataplane({
        choice, ifname, client: UapiClient.forInterface(${JSON.stringify(WG_SOCKET_DIR)}, ifname),
        env: timings ? { ROAMGUARD_TEST_TIMINGS: timings } : {},
        onLog: (line) => console.log('LOG ' + line),
      });
      console.log('STATUS ' + status);
    } catch (err) {
      console.log('FAILED ' + err.message);
    }
  `);
});
after(async () => { await scope.cleanup(); });

/** Runs the starter to its end (it must end by itself) and returns what it printed. */
async function start(choice: string, ifname: string, timings?: string): Promise<string> {
  scope.removeFileAtCleanup(join(WG_SOCKET_DIR, `${ifname}.sock`));
  const args = ['--import', 'tsx', starter, choice, ifname, ...(timings ? [timings] : [])];
  const proc = scope.spawn(ns, process.execPath, args, { cwd: REPO_ROOT, label: `starter ${choice} ${ifname}` });
  const ended = await Promise.race([proc.exited, new Promise<undefined>((r) => setTimeout(() => r(undefined), 30_000))]);
  for (const pid of await socketOwnerPids(ns, ifname)) killAtCleanup(scope, pid, new RegExp(`\\b${ifname}\\b`));
  assert.ok(ended, `the starter ended by itself once the daemon was up (nothing of the daemon holds it)\n${proc.describe()}`);
  assert.deepEqual(ended, { code: 0, signal: null }, proc.describe());
  return proc.stdout;
}

async function daemonOf(ifname: string): Promise<number> {
  const pids = await socketOwnerPids(ns, ifname);
  assert.equal(pids.length, 1, `one process serves ${ifname}: ${JSON.stringify(pids)}`);
  return pids[0];
}

describe('the agent starting its data plane', () => {
  test('roamguard: its error lines reach the starter\'s log; it outlives the starter and the reader of its stderr', { timeout: 60_000 }, async () => {
    const ifname = uniqueName('rgs');
    // With test timers the daemon logs an error line at start: the one line it is sure to write.
    const out = await start('roamguard', ifname, '{"rekeyAfterTime":60000}');
    assert.match(out, /^STATUS started$/m, out);
    assert.match(out, new RegExp(`^LOG ERROR: \\(${ifname}\\) .*TEST TIMERS IN USE`, 'm'), `the daemon's error line was handed to onLog:\n${out}`);
    const pid = await daemonOf(ifname);
    assert.match(commandLine(pid) ?? '', /wg --foreground/);
    assert.match(readlinkSync(`/proc/${pid}/fd/2`), /^(pipe|socket):/, 'its stderr is the pipe the starter read');
    // The starter is gone, so the pipe has no reader: requests still answered, the daemon alive.
    for (let i = 0; i < 3; i++) {
      const shown = await ns.exec('wg', ['show', ifname, 'listen-port']);
      assert.match(shown.stdout.trim(), /^\d+$/);
    }
    assert.ok(isAlive(pid), 'the daemon still runs');
  });

  test('wireguard-go: detached with its output on /dev/null, never on a pipe that can lose its reader', { timeout: 60_000 }, async () => {
    const ifname = uniqueName('rgs');
    const out = await start('wireguard-go', ifname);
    assert.match(out, /^STATUS started$/m, out);
    const pid = await daemonOf(ifname);
    assert.equal(readlinkSync(`/proc/${pid}/fd/2`), '/dev/null', 'wireguard-go\'s stderr');
    const shown = await ns.exec('wg', ['show', ifname, 'listen-port']);
    assert.match(shown.stdout.trim(), /^\d+$/);
  });

  test('a daemon that cannot start: the error carries its reason, and nothing is left running', { timeout: 60_000 }, async () => {
    const ifname = 'rg' + 'x'.repeat(18); // longer than an interface name may be
    const out = await start('roamguard', ifname);
    assert.match(out, new RegExp(`^FAILED .*wg ${ifname} failed \\(exit \\d+\\): .*${ifname}.*(long|15)`, 'm'), out);
    assert.deepEqual(await socketOwnerPids(ns, ifname), []);
  });
});
