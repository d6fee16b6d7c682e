/**
 * Abusing the control socket of a running `roamguard wg` daemon (issue 8, item 4): malformed and
 * oversized requests, requests cut into one-byte pieces, hundreds of concurrent clients, binary
 * junk, clients that stall half-way or never say anything. Every client gets an errno answer or
 * a closed connection; meanwhile `wg show` keeps working for everyone else, the configuration is
 * untouched by the rejected requests, and afterwards the daemon's descriptors are back where they
 * were. The stalled clients are disconnected by the daemon's request deadline (30 s), so this
 * test runs for about that long; everything else happens meanwhile. Run by
 * robustness-uapi-soak.test.ts, side by side with the soak.
 */
import type { TestContext } from 'node:test';
import assert from 'node:assert/strict';
import { connect, type Socket } from 'node:net';
import { memoryStatus } from '../../bench/suite/procfs.ts';
import { waitFor, type Scope } from './netns.ts';
import { fdCount, fdKinds } from './robustness-helpers.ts';
import { UserspaceWg } from './userspace-wg.ts';
import { generateKeyPair } from './wireguard-go.ts';

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));
/** The daemon's deadline for a request (DEFAULT_UAPI_LIMITS.requestTimeoutMs), stated independently. */
export const REQUEST_DEADLINE_MS = 30_000;

/** A raw control-socket client: what it sent, what came back, whether the daemon closed it. */
export class Client {
  data = '';
  closed = false;
  readonly opened: Promise<void>;
  private readonly socket: Socket;

  constructor(path: string) {
    this.socket = connect(path);
    this.socket.setEncoding('utf8');
    this.socket.on('data', (chunk: string) => { this.data += chunk; });
    this.socket.on('error', () => {});
    this.socket.on('close', () => { this.closed = true; });
    this.opened = new Promise((resolve, reject) => {
      this.socket.once('connect', resolve);
      this.socket.once('error', reject);
    });
  }

  write(bytes: string | Buffer): Promise<void> {
    return new Promise((resolve) => {
      if (this.socket.destroyed || !this.socket.writable) return resolve();
      this.socket.write(bytes, () => resolve());
    });
  }

  /** The errno values answered so far. */
  errnos(): number[] {
    return [...this.data.matchAll(/errno=(-?\d+)\n\n/g)].map((m) => Number(m[1]));
  }

  /** Waits for `count` answers or the close, whichever comes first. */
  async settled(count = 1, timeoutMs = 10_000): Promise<{ errnos: number[]; closed: boolean }> {
    await waitFor(() => this.errnos().length >= count || this.closed, timeoutMs, { description: `an answer or a close (got ${JSON.stringify(this.data.slice(0, 200))})` });
    return { errnos: this.errnos(), closed: this.closed };
  }

  destroy(): void {
    this.socket.destroy();
  }
}

export const CONTROL_SOCKET_TITLE = 'malformed, oversized, fragmented, concurrent and stalled clients: each answered or closed, `wg show` served throughout';

/** The control-socket test (run by robustness-uapi-soak.test.ts); `clients` are destroyed by the caller's cleanup. */
export async function controlSocketAbuse(tc: TestContext, scope: Scope, clients: Client[]): Promise<void> {
  const ns = await scope.namespace();
  const daemon = await UserspaceWg.start(scope, ns, { implementation: 'roamguard-node', startTimeoutMs: 60_000, logLevel: 'verbose' });
  const [keys, peer] = await Promise.all([generateKeyPair(), generateKeyPair()]);
  await daemon.configure({ privateKey: keys.privateKey, listenPort: 51820, peers: [{ publicKey: peer.publicKey, allowedIps: ['10.77.0.2/32', 'fd77::2/128'], endpoint: '192.0.2.2:51821' }] });
  const ctx = () => `\n${daemon.describe()}`;
  const path = daemon.socketPath;
  const pid = daemon.process.pid;
  const reference = await daemon.dump();
  const fdsBefore = fdCount(pid);
  const fdKindsBefore = fdKinds(pid);
  const rssBefore = memoryStatus(pid).rssBytes;
  /** Connects; a full listen backlog (EAGAIN) is waited out, as a blocking connect (`wg`) would. */
  const open = async (): Promise<Client> => {
    for (let attempt = 0; ; attempt++) {
      const c = new Client(path);
      try {
        await c.opened;
        clients.push(c);
        return c;
      } catch (err) {
        c.destroy();
        if ((err as NodeJS.ErrnoException).code !== 'EAGAIN' || attempt >= 200) throw err;
        await sleep(10);
      }
    }
  };
  /** `wg show dump` works and the configuration is what it was. */
  const stillServing = async (when: string) => {
    const dump = await daemon.dump();
    assert.equal(dump.privateKey, reference.privateKey, `${when}: private key unchanged`);
    assert.equal(dump.listenPort, reference.listenPort, `${when}: listen port unchanged`);
    assert.deepEqual(dump.peers.map((p) => [p.publicKey, p.allowedIps.join(',')]), reference.peers.map((p) => [p.publicKey, p.allowedIps.join(',')]), `${when}: peers unchanged`);
  };

  // Clients that stall: half a request, half a line, or nothing at all. Left hanging meanwhile.
  const stalledAt = performance.now();
  const stalled = await Promise.all([
    open().then(async (c) => { await c.write('set=1\nlisten_port=1\n'); return c; }),
    open().then(async (c) => { await c.write('get=1'); return c; }),
    open().then(async (c) => { await c.write('set=1\nprivate_key=00'); return c; }),
    open(),
  ]);

  // Malformed requests, each on its own connection, with what must come back.
  const key = 'a'.repeat(64);
  const cases: Array<[string, string | Buffer, (r: { errnos: number[]; closed: boolean }) => boolean]> = [
    ['garbage first line', 'hello\n', (r) => r.closed && r.errnos.length === 0],
    ['binary junk', Buffer.from([0, 1, 2, 0xff, 0xfe, 10, 10, 0x80, 10]), (r) => r.closed && r.errnos.length === 0],
    ['get=1 with trailing junk', 'get=1\nfoo\n', (r) => r.errnos[0] === -22],
    ['a line without "="', 'set=1\nlisten_port\n\n', (r) => r.errnos[0] === -71],
    ['an unknown key', 'set=1\nbogus=1\n\n', (r) => r.errnos[0] === -22],
    ['a bad key', 'set=1\nprivate_key=zz\n\n', (r) => r.errnos[0] === -22],
    ['a port out of range', 'set=1\nlisten_port=70000\n\n', (r) => r.errnos[0] === -22],
    ['a peer key that is not hex', 'set=1\npublic_key=xyz\n\n', (r) => r.errnos[0] === -22],
    ['a bad allowed IP', `set=1\npublic_key=${key}\nallowed_ip=10.0.0.300/32\n\n`, (r) => r.errnos[0] === -22],
    ['a bad endpoint', `set=1\npublic_key=${key}\nendpoint=[::1:51820\n\n`, (r) => r.errnos[0] === -22],
    ['a peer setting before any peer', 'set=1\nendpoint=1.2.3.4:5\n\n', (r) => r.errnos[0] === -22],
    ['invalid UTF-8 in a value', Buffer.concat([Buffer.from('set=1\nprivate_key='), Buffer.from([0xc3, 0x28, 0xff]), Buffer.from('\n\n')]), (r) => r.errnos[0] === -22],
    ['NUL bytes in a line', 'set=1\nlisten_port=5\u0000\n\n', (r) => r.errnos[0] === -22],
    ['a 1 MiB line', `set=1\nprivate_key=${'a'.repeat(1 << 20)}\n\n`, (r) => r.closed && (r.errnos.length === 0 || r.errnos[0] === -90)],
    ['a 20 MiB set of short lines', `set=1\n${`public_key=${key}\nallowed_ip=10.1.0.0/16\n`.repeat(180_000)}\n`, (r) => r.closed && r.errnos[0] === -90],
    ['100 000 peer sections', `set=1\n${Array.from({ length: 100_000 }, (_, i) => `public_key=${i.toString(16).padStart(64, '0')}\n`).join('')}\n`, (r) => r.errnos[0] === -90],
  ];
  const malformed = await Promise.all(cases.map(async ([what, bytes, ok]) => {
    const c = await open();
    await c.write(bytes);
    let r = await c.settled(1, 20_000);
    // An oversized request is answered and then closed: give the close a moment.
    if (r.errnos[0] === -90) r = await waitFor(() => c.closed, 5000, { description: `${what}: the close after errno=-90` }).then(() => ({ errnos: c.errnos(), closed: true }), () => r);
    return { what, r, ok: ok(r) };
  }));
  for (const m of malformed) assert.ok(m.ok, `${m.what}: got ${JSON.stringify(m.r)}${ctx()}`);
  await stillServing('after the malformed requests');

  // A request cut into one-byte pieces still works; so do pipelined ones.
  const slow = await open();
  for (const byte of 'get=1\n\n') { await slow.write(byte); await sleep(5); }
  assert.deepEqual((await slow.settled()).errnos, [0]);
  const pipelined = await open();
  await pipelined.write('get=1\n\nset=1\nbogus=1\n\nget=1\n\n');
  assert.deepEqual((await pipelined.settled(3)).errnos, [0, -22, 0]);

  // Hundreds of concurrent clients: gets, no-op sets, rejected sets, and clients that drop the
  // connection right after asking.
  const started = performance.now();
  const crowd = await Promise.all(Array.from({ length: 400 }, async (_, i) => {
    const c = await open();
    const kind = i % 4;
    await c.write(kind === 0 ? 'get=1\n\n' : kind === 1 ? `set=1\nlisten_port=${reference.listenPort}\n\n` : kind === 2 ? 'set=1\nfwmark=abc\n\n' : 'get=1\n\n');
    if (kind === 3) { c.destroy(); return { kind, r: { errnos: [], closed: true } }; }
    return { kind, r: await c.settled(1, 20_000) };
  }));
  const crowdSeconds = (performance.now() - started) / 1000;
  for (const { kind, r } of crowd) {
    if (kind === 0) assert.deepEqual(r.errnos, [0]);
    if (kind === 1) assert.deepEqual(r.errnos, [0]);
    if (kind === 2) assert.deepEqual(r.errnos, [-22]);
  }
  await stillServing('during 400 concurrent clients');
  tc.diagnostic(`400 concurrent clients answered in ${crowdSeconds.toFixed(2)} s`);

  // 3000 connections opened and closed one after another: nothing leaks.
  for (let i = 0; i < 3000; i++) {
    const c = await open();
    if (i % 2 === 0) await c.write('get=1\n\n');
    c.destroy();
  }
  clients.length = 0;
  await stillServing('after 3000 short connections');

  // The stalled clients: still hanging (nothing answered yet), `wg show` unaffected; then cut off
  // by the deadline.
  for (const c of stalled) assert.equal(c.closed, false, 'a stalled client waits for its deadline');
  await Promise.all(stalled.map((c) => waitFor(() => c.closed, REQUEST_DEADLINE_MS + 15_000, { description: 'the daemon to disconnect a stalled client' })));
  const stalledFor = (performance.now() - stalledAt) / 1000;
  for (const c of stalled) assert.ok(c.errnos().every((e) => e !== 0), `a stalled client got no success: ${JSON.stringify(c.data)}`);
  tc.diagnostic(`stalled clients disconnected after ${stalledFor.toFixed(1)} s`);
  await stillServing('after the stalled clients');

  // Afterwards (our own answered connections closed): descriptors back to where they were,
  // memory bounded, `wg show` as before.
  for (const c of clients) c.destroy();
  const kindsBefore = fdKindsBefore;
  // Every client connection closed: the daemon's sockets are back to where they were (a worker
  // thread started meanwhile may hold a few pipes and event fds of its own).
  await waitFor(() => (fdKinds(pid).socket ?? 0) <= (kindsBefore.socket ?? 0) && fdCount(pid) <= fdsBefore + 8, 10_000, { description: 'the daemon\'s descriptors to return' })
    .catch((err) => { throw new Error(`${(err as Error).message}: ${fdsBefore} before ${JSON.stringify(kindsBefore)}, ${fdCount(pid)} now ${JSON.stringify(fdKinds(pid))}${ctx()}`); });
  const rssAfter = memoryStatus(pid).rssBytes;
  tc.diagnostic(`fds ${fdsBefore} → ${fdCount(pid)}, RSS ${(rssBefore / 1048576).toFixed(0)} → ${(rssAfter / 1048576).toFixed(0)} MiB`);
  assert.ok(rssAfter - rssBefore < 128 * 1048576, 'RSS bounded');
  assert.match((await daemon.wg(['show', daemon.ifname])).stdout, /allowed ips: 10\.77\.0\.2\/32, fd77::2\/128/, '`wg show` (human form) still right');
  assert.ok(daemon.process.running, `the daemon still runs${ctx()}`);
}
