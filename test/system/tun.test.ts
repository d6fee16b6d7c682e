/**
 * The Linux TUN device (dataplane/tun/) against the real kernel, under Node.js and under Bun.
 *
 * A TUN device is created in the network namespace of the process that opens it, so the device is
 * opened by a child process started inside a fresh namespace (`ip netns exec NS node --import tsx
 * test/system/tun-child.ts NAME MTU`, or the same with bun). The child answers echo requests read
 * from the TUN by writing replies back; this test drives the kernel side with ping, a UDP flood,
 * `ip link` and `ip link del`.
 *
 * Needs root, iproute2, iputils-ping and /dev/net/tun: their absence fails the test.
 */
import { after, before, describe, test, type TestContext } from 'node:test';
import assert from 'node:assert/strict';
import { createSocket } from 'node:dgram';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { setSocketMark } from '../../dataplane/sys/libc.ts';
import { run, reapStale, requireRoot, Scope, uniqueName, waitFor, which, type Namespace, type NsProcess } from './netns.ts';
import { isBun } from '../../dataplane/sys/threads.ts';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..');
const childScript = join(root, 'test', 'system', 'tun-child.ts');
const bunPath = join(root, 'node_modules', '.bin', 'bun');
/** Node itself, also when this file runs under `bun test` (process.execPath is bun then). */
const nodePath = isBun ? which('node') ?? 'node' : process.execPath;

const INNER = { ipv4: '10.77.0.1/24', peer4: '10.77.0.2', ipv6: 'fd77::1/64', peer6: 'fd77::2' };
const BURST = 10_000;

/** Sends `count` UDP datagrams to HOST:9 as fast as dgram allows, then exits (run by node, plain JavaScript). */
const FLOOD = `
const dgram = require('node:dgram');
const [host, total] = [process.argv[1], Number(process.argv[2])];
const socket = dgram.createSocket(host.includes(':') ? 'udp6' : 'udp4');
const payload = Buffer.alloc(32);
let queued = 0, done = 0;
socket.connect(9, host, () => {
  const burst = () => {
    for (let i = 0; i < 500 && queued < total; i++, queued++) socket.send(payload, () => { if (++done === total) socket.close(); });
    if (queued < total) setImmediate(burst);
  };
  burst();
});
`;

type Event = Record<string, unknown> & { event: string };

function events(proc: NsProcess): Event[] {
  const out: Event[] = [];
  for (const line of proc.stdout.split('\n')) {
    if (!line.startsWith('{')) continue;
    try {
      out.push(JSON.parse(line) as Event);
    } catch { /* a partial line */ }
  }
  return out;
}

async function nextEvent(proc: NsProcess, name: string, command?: string, timeoutMs = 10_000): Promise<Event> {
  const before = events(proc).filter((e) => e.event === name).length;
  if (command !== undefined) proc.child.stdin!.write(`${command}\n`);
  return waitFor(() => {
    if (!proc.running) throw new Error(`child exited:\n${proc.describe()}`);
    const matching = events(proc).filter((e) => e.event === name);
    return matching.length > before ? matching[matching.length - 1] : undefined;
  }, timeoutMs, { description: `"${name}" from ${proc.label}` });
}

function parsePing(output: string): { transmitted: number; received: number } {
  const m = /(\d+) packets transmitted, (\d+) (?:packets )?received/.exec(output);
  return m ? { transmitted: Number(m[1]), received: Number(m[2]) } : { transmitted: 0, received: 0 };
}

const runtimes = [
  { runtime: 'node', offload: true, command: nodePath, args: ['--import', 'tsx', childScript] },
  { runtime: 'bun', offload: true, command: bunPath, args: [childScript] },
  // The path of a kernel that refuses IFF_VNET_HDR, forced (ROAMGUARD_TUN_OFFLOAD=0).
  { runtime: 'node', offload: false, command: nodePath, args: ['--import', 'tsx', childScript] },
] as const;

describe('Linux TUN device (system)', () => {
  const scopes: Scope[] = [];
  before(async () => {
    await requireRoot({ binaries: ['ping', 'ss'], tun: true });
    await reapStale();
    if (!existsSync(bunPath)) throw new Error(`bun not found at ${bunPath} (npm install installs it)`);
  });
  after(async () => {
    for (const scope of scopes) await scope.cleanup();
  });

  test('setSocketMark sets SO_MARK on a dgram socket (what `ss -e` shows as fwmark)', async () => {
    const socket = createSocket('udp4');
    try {
      await new Promise<void>((resolve) => socket.bind(0, '127.0.0.1', resolve));
      const fd = (socket as unknown as { _handle?: { fd?: number } })._handle?.fd;
      assert.ok(typeof fd === 'number' && fd >= 0, 'no fd on the dgram handle');
      await setSocketMark(fd, 0x5eed);
      const ss = await run('ss', ['-uaen', `sport = :${socket.address().port}`]);
      assert.match(ss.stdout, /fwmark:0x5eed/);
      await assert.rejects(setSocketMark(fd, -1), RangeError);
    } finally {
      socket.close();
    }
  });

  for (const { runtime, offload, command, args } of runtimes) {
    const variant = offload ? 'offloads' : 'no offloads';
    describe(`under ${runtime}, ${variant}`, () => {
      const env = { ROAMGUARD_TUN_OFFLOAD: offload ? '1' : '0' };
      let scope: Scope;
      let ns: Namespace;
      let child: NsProcess;
      const name = uniqueName('rgtun', 4);

      before(async () => {
        scope = new Scope();
        scopes.push(scope);
        ns = await scope.namespace();
        child = scope.spawn(ns, command, [...args, name, '1400'], { cwd: root, env, label: `tun-child (${runtime}, ${variant})` });
        const ready = await nextEvent(child, 'ready', undefined, 20_000);
        assert.equal(ready.name, name);
        assert.equal(ready.runtime, runtime);
        if (!offload) assert.equal(ready.vnetHeader, false, 'opened without IFF_VNET_HDR');
        await ns.ip(['addr', 'add', INNER.ipv4, 'dev', name]);
        await ns.ip(['-6', 'addr', 'add', INNER.ipv6, 'dev', name, 'nodad']);
        await ns.ip(['link', 'set', name, 'up']);
      });
      after(async () => { await scope?.cleanup(); });

      test('IPv4: the kernel pings through the TUN, the child reads the requests and writes replies', { timeout: 30_000 }, async () => {
        const r = await ns.exec('ping', ['-c', '3', '-i', '0.2', '-W', '5', INNER.peer4], { allowFailure: true, timeoutMs: 15_000 });
        assert.deepEqual(parsePing(r.stdout), { transmitted: 3, received: 3 }, `${r.stdout}\n${child.describe()}`);
        const stats = await nextEvent(child, 'stats', 'stats');
        assert.ok((stats.echoes as number) >= 3);
        assert.ok((stats.writePackets as number) >= 3);
        assert.equal(stats.writeErrors, 0);
      });

      test('IPv6: ping6 through the TUN is answered', { timeout: 30_000 }, async () => {
        const r = await ns.exec('ping', ['-6', '-c', '3', '-i', '0.2', '-W', '5', INNER.peer6], { allowFailure: true, timeoutMs: 15_000 });
        assert.deepEqual(parsePing(r.stdout), { transmitted: 3, received: 3 }, `${r.stdout}\n${child.describe()}`);
      });

      test('MTU: set at open, changed with setMtu, followed after `ip link set mtu`', { timeout: 30_000 }, async () => {
        const linkMtu = async () => Number(/ mtu (\d+) /.exec((await ns.ip(['link', 'show', name])).stdout)?.[1]);
        assert.equal(await linkMtu(), 1400);
        assert.equal((await nextEvent(child, 'mtu', 'mtu')).mtu, 1400);
        assert.equal((await nextEvent(child, 'mtu', 'mtu 1380')).mtu, 1380);
        assert.equal(await linkMtu(), 1380);
        await ns.ip(['link', 'set', name, 'mtu', '1280']);
        assert.equal((await nextEvent(child, 'mtu', 'mtu')).mtu, 1280);
        const refused = await nextEvent(child, 'error', 'mtu 20');
        assert.match(String(refused.message), /MTU/);
        assert.equal(await linkMtu(), 1280);
      });

      test(`burst: ${BURST} UDP datagrams from the kernel arrive in batches; the device keeps working`, { timeout: 60_000 }, async (t: TestContext) => {
        const txDropped = async () => {
          const [link] = JSON.parse((await ns.ip(['-s', '-j', 'link', 'show', 'dev', name])).stdout) as Array<{ stats64: { tx: { dropped: number } } }>;
          return link.stats64.tx.dropped;
        };
        await nextEvent(child, 'reset', 'reset');
        const dropped0 = await txDropped();
        await ns.exec(nodePath, ['-e', FLOOD, INNER.peer4, String(BURST)], { timeoutMs: 30_000 });
        // Every datagram is either read by the child or dropped by the kernel because the TUN
        // queue (txqueuelen 500) was full while the reader was behind; nothing may vanish between.
        let dropped = 0;
        const stats = await waitFor(async () => {
          const s = await nextEvent(child, 'stats', 'stats');
          dropped = (await txDropped()) - dropped0;
          return (s.other as number) + dropped >= BURST ? s : undefined;
        }, 10_000, { description: `${BURST} datagrams read or dropped by the kernel`, intervalMs: 200 })
          .catch(async (err: Error) => {
            const s = await nextEvent(child, 'stats', 'stats');
            assert.fail(`${err.message}: read ${s.other}, kernel dropped ${dropped}\n${child.describe()}`);
          });
        t.diagnostic(`${runtime} (${variant}): read ${stats.other} of ${BURST} datagrams (kernel queue dropped ${dropped}) in ${stats.batches} batches ` +
          `(largest ${stats.maxBatch}, ${stats.multiBatches} with more than one packet), ${stats.readsPerSecond} reads/s ` +
          'between first and last read (paced by the sender)');
        // How many the reader gets before the kernel queue overflows depends on scheduling (a loaded
        // machine may not run the reader during the flood at all): what matters is that none vanish.
        assert.ok((stats.other as number) > 0, 'no datagram read');
        assert.ok((stats.multiBatches as number) > 0, 'no batch had more than one packet');
        assert.ok((stats.maxBatch as number) > 1);
        assert.equal(stats.readErrors, 0);
        assert.ok(child.running, child.describe());
        const r = await ns.exec('ping', ['-c', '2', '-i', '0.2', '-W', '5', INNER.peer4], { allowFailure: true, timeoutMs: 15_000 });
        assert.equal(parsePing(r.stdout).received, 2, r.stdout);
      });

      test('`ip link del` fires onClose once and the child exits 0 by itself', { timeout: 30_000 }, async () => {
        const started = performance.now();
        await ns.ip(['link', 'del', name]);
        const exit = await Promise.race([child.exited, new Promise<'timeout'>((r) => setTimeout(() => r('timeout'), 10_000).unref())]);
        assert.notEqual(exit, 'timeout', `child did not exit after ip link del\n${child.describe()}`);
        assert.deepEqual(exit, { code: 0, signal: null }, child.describe());
        const closed = events(child).filter((e) => e.event === 'closed');
        assert.equal(closed.length, 1);
        assert.match(String(closed[0].reason), /deleted/);
        assert.ok(performance.now() - started < 5000);
      });

      test('a name with %d lets the kernel pick; close() removes the interface', { timeout: 30_000 }, async () => {
        const picker = scope.spawn(ns, command, [...args, 'rgk%d'], { cwd: root, env, label: `tun-child %d (${runtime})` });
        const ready = await nextEvent(picker, 'ready', undefined, 20_000);
        assert.equal(ready.name, 'rgk0');
        assert.equal(ready.mtu, 1500);
        assert.match((await ns.ip(['link', 'show'])).stdout, /rgk0:/);
        picker.child.stdin!.write('quit\n');
        assert.deepEqual(await picker.exited, { code: 0, signal: null }, picker.describe());
        assert.doesNotMatch((await ns.ip(['link', 'show'])).stdout, /rgk0:/);
      });

      test('without start(), deletion is still noticed by the once-a-second check', { timeout: 30_000 }, async () => {
        const idleName = uniqueName('rgidle', 4);
        const idle = scope.spawn(ns, command, [...args, idleName], {
          cwd: root, label: `tun-child idle (${runtime})`, env: { ...env, TUN_CHILD_NO_START: '1' },
        });
        await nextEvent(idle, 'ready', undefined, 20_000);
        await ns.ip(['link', 'del', idleName]);
        const exit = await Promise.race([idle.exited, new Promise<'timeout'>((r) => setTimeout(() => r('timeout'), 5_000).unref())]);
        assert.deepEqual(exit, { code: 0, signal: null }, idle.describe());
        assert.match(String(events(idle).find((e) => e.event === 'closed')?.reason), /deleted/);
      });
    });
  }
});
