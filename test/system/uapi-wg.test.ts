/**
 * The control socket against the real `wg` from wireguard-tools.
 *
 * The server runs in this test process over a real WireGuardCore (no TUN, no UDP: the listen
 * port is an in-memory fake that refuses one port), at /var/run/wireguard/rgu??????.sock, and is
 * driven with `wg set / show / showconf / setconf / addconf / syncconf`. Then the socket's own
 * behaviour: a second server on a live name fails, a stale socket file is replaced, file modes,
 * deletion is noticed, and raw clients (net.connect) that send malformed, oversized, chunked,
 * pipelined or unfinished requests get an errno or a close while others keep being served.
 *
 * Needs root (the socket directory) and `wg` (Debian package wireguard-tools).
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { existsSync, lstatSync, statSync, unlinkSync, writeFileSync } from 'node:fs';
import { connect, type Socket } from 'node:net';
import { join } from 'node:path';
import { ManualClock } from '../../dataplane/clock.ts';
import { WireGuardCore } from '../../dataplane/core.ts';
import type { Crypto } from '../../dataplane/crypto/primitives.ts';
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import type { Endpoint } from '../../dataplane/net/endpoint.ts';
import { formatPrefix } from '../../dataplane/net/ip.ts';
import { keyToBase64 } from '../../dataplane/noise/keys.ts';
import { createUapiHandler, type UapiHost } from '../../dataplane/uapi/uapi-device.ts';
import { UAPI_SOCKET_DIR, startUapiServer, type UapiServer, type UapiServerOptions } from '../../dataplane/uapi/uapi-server.ts';
import { Scope, requireRoot, run, uniqueName, waitFor, type RunOptions } from './netns.ts';
import { generateKeyPair, generatePresharedKey, keyBytes, parseDump, type KeyPair } from './wireguard-go.ts';

/** The fake UDP layer refuses this port, as if another process had it. */
const REFUSED_PORT = 5555;

class FakeHost implements UapiHost {
  listenPort = 0;
  fwmark = 0;
  constructor(readonly core: WireGuardCore) {}
  async setListenPort(port: number): Promise<void> {
    if (port === REFUSED_PORT) throw Object.assign(new Error(`port ${port} is taken`), { code: 'EADDRINUSE' });
    this.listenPort = port === 0 ? 45000 : port;
  }
  setFwmark(mark: number): void {
    this.fwmark = mark;
  }
}

interface Device {
  ifname: string;
  core: WireGuardCore;
  host: FakeHost;
  server: UapiServer;
  sent: Array<{ to: Endpoint; bytes: Uint8Array }>;
  log: string[];
}

let crypto: Crypto;
const scope = new Scope();

async function startDevice(options: UapiServerOptions = {}, ifname = uniqueName('rgu')): Promise<Device> {
  const sent: Device['sent'] = [];
  const core = new WireGuardCore({
    crypto, clock: new ManualClock(),
    outputs: { sendDatagram(to, bytes) { sent.push({ to, bytes: Uint8Array.from(bytes) }); }, deliverPacket() {} },
  });
  const host = new FakeHost(core);
  const log: string[] = [];
  scope.removeFileAtCleanup(join(options.dir ?? UAPI_SOCKET_DIR, `${ifname}.sock`));
  const server = await startUapiServer(ifname, createUapiHandler(host), { log: (m) => log.push(m), ...options });
  scope.defer(`close control socket of ${ifname}`, () => server.close());
  return { ifname, core, host, server, sent, log };
}

function wg(args: readonly string[], options?: RunOptions) {
  return run('wg', args, options);
}

let keyDir: string;
let fileCounter = 0;
/** Writes `content` to a fresh mode-0600 file in the private temp directory. */
function privateFile(content: string): string {
  const path = join(keyDir, `f${++fileCounter}`);
  writeFileSync(path, content, { mode: 0o600 });
  return path;
}

function peerKeysOf(core: WireGuardCore): string[] {
  return [...core.peers].map((p) => keyToBase64(p.publicKey));
}

function prefixesOf(core: WireGuardCore, publicKey: string): string[] {
  const peer = core.getPeer(keyBytes(publicKey));
  assert.ok(peer, `no peer ${publicKey}`);
  return core.allowedIps.entriesFor(peer).map(formatPrefix);
}

before(async () => {
  await requireRoot({ binaries: ['wg'] });
  crypto = await selectCrypto();
  keyDir = scope.tempDir('rgu-keys-');
});

after(async () => {
  await scope.cleanup();
});

describe('driven by wg', () => {
  let dev: Device;
  let own: KeyPair;
  let peerA: KeyPair;
  let psk: string;
  const PORT = 51830;

  before(async () => {
    dev = await startDevice();
    own = await generateKeyPair();
    peerA = await generateKeyPair();
    psk = await generatePresharedKey();
  });

  test('`wg show interfaces` lists the interface', async () => {
    const { stdout } = await wg(['show', 'interfaces']);
    assert.ok(stdout.trim().split(/\s+/).includes(dev.ifname), `got ${JSON.stringify(stdout)}`);
  });

  test('`wg show` of a fresh device', async () => {
    const dump = parseDump((await wg(['show', dev.ifname, 'dump'])).stdout);
    assert.equal(dump.privateKey, undefined);
    assert.equal(dump.listenPort, 0);
    assert.equal(dump.fwmark, 0);
    assert.deepEqual(dump.peers, []);
  });

  test('`wg set` with every option configures the core', async () => {
    await wg([
      'set', dev.ifname, 'private-key', privateFile(`${own.privateKey}\n`), 'listen-port', String(PORT), 'fwmark', '0x33',
      'peer', peerA.publicKey, 'preshared-key', privateFile(`${psk}\n`), 'endpoint', '192.0.2.1:51820',
      'persistent-keepalive', '25', 'allowed-ips', '10.0.0.2/32,fd00::2/128',
    ]);
    assert.equal(keyToBase64(dev.core.ourPrivateKey!), own.privateKey);
    assert.equal(keyToBase64(dev.core.ourPublicKey!), own.publicKey, 'the same public key as `wg pubkey`');
    assert.equal(dev.host.listenPort, PORT);
    assert.equal(dev.host.fwmark, 0x33);
    assert.deepEqual(peerKeysOf(dev.core), [peerA.publicKey]);
    const peer = dev.core.getPeer(keyBytes(peerA.publicKey))!;
    assert.equal(keyToBase64(peer.presharedKey), psk);
    assert.equal(peer.endpoint?.toString(), '192.0.2.1:51820');
    assert.equal(peer.persistentKeepalive, 25);
    assert.deepEqual(prefixesOf(dev.core, peerA.publicKey), ['10.0.0.2/32', 'fd00::2/128']);
    // Turning the keepalive on sent one at once: with no session, a handshake initiation.
    assert.ok(dev.sent.some((d) => d.bytes[0] === 1 && d.to.toString() === '192.0.2.1:51820'));
  });

  test('`wg show dump` reports everything, with absolute handshake time', async () => {
    const peer = dev.core.getPeer(keyBytes(peerA.publicKey))!;
    const handshakeMs = Date.now() - 42_000;
    peer.lastHandshakeWallMs = handshakeMs;
    peer.txBytes = 123_456;
    peer.rxBytes = 654_321;
    const dump = parseDump((await wg(['show', dev.ifname, 'dump'])).stdout);
    assert.equal(dump.privateKey, own.privateKey);
    assert.equal(dump.publicKey, own.publicKey);
    assert.equal(dump.listenPort, PORT);
    assert.equal(dump.fwmark, 0x33);
    assert.equal(dump.peers.length, 1);
    assert.deepEqual(dump.peers[0], {
      publicKey: peerA.publicKey,
      presharedKey: psk,
      endpoint: '192.0.2.1:51820',
      allowedIps: ['10.0.0.2/32', 'fd00::2/128'],
      latestHandshake: Math.floor(handshakeMs / 1000),
      rxBytes: 654_321,
      txBytes: 123_456,
      persistentKeepalive: 25,
    });
    const handshakes = (await wg(['show', dev.ifname, 'latest-handshakes'])).stdout.trim();
    assert.equal(handshakes, `${peerA.publicKey}\t${Math.floor(handshakeMs / 1000)}`);
  });

  test('`wg show` (human form)', async () => {
    const { stdout } = await wg(['show', dev.ifname]);
    assert.match(stdout, new RegExp(`^interface: ${dev.ifname}$`, 'm'));
    assert.match(stdout, new RegExp(`public key: ${own.publicKey.replace(/[+/]/g, '\\$&')}`));
    assert.match(stdout, /private key: \(hidden\)/);
    assert.match(stdout, new RegExp(`listening port: ${PORT}`));
    assert.match(stdout, /fwmark: 0x33/);
    assert.match(stdout, /endpoint: 192\.0\.2\.1:51820/);
    assert.match(stdout, /allowed ips: 10\.0\.0\.2\/32, fd00::2\/128/);
    assert.match(stdout, /latest handshake: 4[234] seconds ago/, 'an age computed from the absolute time');
    assert.match(stdout, /transfer: 638\.99 KiB received, 120\.56 KiB sent/);
    assert.match(stdout, /persistent keepalive: every 25 seconds/);
  });

  test('`wg showconf`', async () => {
    const { stdout } = await wg(['showconf', dev.ifname]);
    assert.match(stdout, /^\[Interface\]$/m);
    assert.match(stdout, new RegExp(`^ListenPort = ${PORT}$`, 'm'));
    assert.match(stdout, /^FwMark = 0x33$/m);
    assert.ok(stdout.includes(`PrivateKey = ${own.privateKey}`));
    assert.match(stdout, /^\[Peer\]$/m);
    assert.ok(stdout.includes(`PublicKey = ${peerA.publicKey}`));
    assert.ok(stdout.includes(`PresharedKey = ${psk}`));
    assert.match(stdout, /^AllowedIPs = 10\.0\.0\.2\/32, fd00::2\/128$/m);
    assert.match(stdout, /^Endpoint = 192\.0\.2\.1:51820$/m);
    assert.match(stdout, /^PersistentKeepalive = 25$/m);
  });

  test('`wg set` resolves names itself and sends numeric endpoints; IPv6 endpoints', async () => {
    await wg(['set', dev.ifname, 'peer', peerA.publicKey, 'endpoint', 'localhost:4000']);
    const endpoint = dev.core.getPeer(keyBytes(peerA.publicKey))!.endpoint!.toString();
    assert.ok(endpoint === '127.0.0.1:4000' || endpoint === '[::1]:4000', endpoint);
    await wg(['set', dev.ifname, 'peer', peerA.publicKey, 'endpoint', '[2001:db8::1]:4001']);
    const dump = parseDump((await wg(['show', dev.ifname, 'dump'])).stdout);
    assert.equal(dump.peers[0].endpoint, '[2001:db8::1]:4001');
  });

  test('`wg set` a listen port the UDP layer refuses: non-zero exit, "Address already in use"', async () => {
    const r = await wg(['set', dev.ifname, 'listen-port', String(REFUSED_PORT)], { allowFailure: true });
    assert.notEqual(r.code, 0);
    assert.match(r.stderr, /Address already in use/);
    assert.equal(dev.host.listenPort, PORT, 'the old port stays');
  });

  test('`wg setconf` replaces the configuration', async () => {
    const b = await generateKeyPair();
    const c = await generateKeyPair();
    const conf = privateFile([
      '[Interface]', `PrivateKey = ${own.privateKey}`, `ListenPort = ${PORT + 1}`, '',
      '[Peer]', `PublicKey = ${b.publicKey}`, 'AllowedIPs = 10.0.1.0/24, 10.0.0.2/32', 'Endpoint = 198.51.100.2:1234', '',
      '[Peer]', `PublicKey = ${c.publicKey}`, 'AllowedIPs = fd00:c::/64', '',
    ].join('\n'));
    await wg(['setconf', dev.ifname, conf]);
    assert.deepEqual(peerKeysOf(dev.core), [b.publicKey, c.publicKey], 'peer A is gone');
    assert.equal(dev.host.listenPort, PORT + 1);
    assert.equal(dev.host.fwmark, 0, 'setconf without FwMark turns it off');
    assert.deepEqual(prefixesOf(dev.core, b.publicKey), ['10.0.1.0/24', '10.0.0.2/32']);
    assert.deepEqual(prefixesOf(dev.core, c.publicKey), ['fd00:c::/64']);
    const dump = parseDump((await wg(['show', dev.ifname, 'dump'])).stdout);
    assert.deepEqual(dump.peers.map((p) => [p.publicKey, p.endpoint, p.allowedIps.join(',')]).sort(), [
      [b.publicKey, '198.51.100.2:1234', '10.0.1.0/24,10.0.0.2/32'],
      [c.publicKey, undefined, 'fd00:c::/64'],
    ].sort());
  });

  test('`wg addconf` adds, `wg syncconf` removes / adds / changes and keeps unchanged peers', async () => {
    const [b, c] = peerKeysOf(dev.core);
    const d = await generateKeyPair();
    await wg(['addconf', dev.ifname, privateFile(['[Peer]', `PublicKey = ${d.publicKey}`, 'AllowedIPs = 10.0.4.0/24', ''].join('\n'))]);
    assert.deepEqual(peerKeysOf(dev.core), [b, c, d.publicKey]);
    assert.deepEqual(prefixesOf(dev.core, b), ['10.0.1.0/24', '10.0.0.2/32'], 'addconf leaves the others alone');

    const peerB = dev.core.getPeer(keyBytes(b))!;
    const e = await generateKeyPair();
    // Keep b (unchanged), drop c, move 10.0.4.0/24 from d to e while giving d a new one, add e.
    await wg(['syncconf', dev.ifname, privateFile([
      '[Interface]', `PrivateKey = ${own.privateKey}`, `ListenPort = ${PORT + 1}`, '',
      '[Peer]', `PublicKey = ${b}`, 'AllowedIPs = 10.0.1.0/24, 10.0.0.2/32', 'Endpoint = 198.51.100.2:1234', '',
      '[Peer]', `PublicKey = ${d.publicKey}`, 'AllowedIPs = 10.0.5.0/24', 'PersistentKeepalive = 10', '',
      '[Peer]', `PublicKey = ${e.publicKey}`, 'AllowedIPs = 10.0.4.0/24', '',
    ].join('\n'))]);
    assert.deepEqual(new Set(peerKeysOf(dev.core)), new Set([b, d.publicKey, e.publicKey]));
    assert.equal(dev.core.getPeer(keyBytes(b)), peerB, 'an unchanged peer is the same object (its sessions survive)');
    assert.deepEqual(prefixesOf(dev.core, b), ['10.0.1.0/24', '10.0.0.2/32']);
    assert.deepEqual(prefixesOf(dev.core, d.publicKey), ['10.0.5.0/24']);
    assert.deepEqual(prefixesOf(dev.core, e.publicKey), ['10.0.4.0/24']);
    assert.equal(dev.core.getPeer(keyBytes(d.publicKey))!.persistentKeepalive, 10);
  });

  test('`wg set … peer KEY remove`', async () => {
    const [first, ...rest] = peerKeysOf(dev.core);
    await wg(['set', dev.ifname, 'peer', first, 'remove']);
    assert.deepEqual(peerKeysOf(dev.core), rest);
    const dump = parseDump((await wg(['show', dev.ifname, 'dump'])).stdout);
    assert.ok(!dump.peers.some((p) => p.publicKey === first));
  });

  test('`wg set` with our own public key as a peer is accepted and ignored', async () => {
    const before = peerKeysOf(dev.core);
    await wg(['set', dev.ifname, 'peer', own.publicKey, 'allowed-ips', '10.99.0.0/16']);
    assert.deepEqual(peerKeysOf(dev.core), before);
    assert.ok(!dev.core.allowedIps.lookup(new Uint8Array([10, 99, 0, 1])));
  });

  test('several `wg` at once', async () => {
    const results = await Promise.all(Array.from({ length: 20 }, (_, i) =>
      i % 2 === 0 ? wg(['show', dev.ifname, 'dump']) : wg(['set', dev.ifname, 'listen-port', String(PORT + 1 + (i % 4))])));
    for (const r of results) assert.equal(r.code, 0);
    await waitFor(() => dev.server.connectionCount === 0, 3000, { description: 'every connection to be closed' });
  });
});

describe('socket lifecycle', () => {
  test('socket owner-only, directory 0755 when created', async () => {
    const parent = scope.tempDir('rgu-dir-');
    const dir = join(parent, 'new', 'wireguard');
    const dev = await startDevice({ dir });
    assert.equal(statSync(dir).mode & 0o777, 0o755);
    const st = lstatSync(dev.server.path);
    assert.ok(st.isSocket());
    assert.equal(st.mode & 0o077, 0, `socket mode ${(st.mode & 0o777).toString(8)} gives group/others nothing`);
    assert.equal(dev.server.path, join(dir, `${dev.ifname}.sock`));
    const real = await startDevice();
    assert.equal(real.server.path, `/var/run/wireguard/${real.ifname}.sock`);
    assert.equal(lstatSync(real.server.path).mode & 0o777, 0o700);
    await real.server.close();
    assert.ok(!existsSync(real.server.path), 'close removes the socket file');
  });

  test('a second server for a live interface fails; the first keeps working', async () => {
    const first = await startDevice();
    await assert.rejects(
      startUapiServer(first.ifname, createUapiHandler(first.host)),
      /already served by another process/);
    assert.ok(lstatSync(first.server.path).isSocket(), 'the live socket was not removed');
    const dump = parseDump((await wg(['show', first.ifname, 'dump'])).stdout);
    assert.deepEqual(dump.peers, []);
  });

  test('a stale socket file (nobody listening) is replaced', async () => {
    const ifname = uniqueName('rgu');
    const path = join(UAPI_SOCKET_DIR, `${ifname}.sock`);
    scope.removeFileAtCleanup(path);
    // A process that listened and died without cleaning up.
    const child = spawnSync(process.execPath, ['-e', `require('net').createServer().listen(${JSON.stringify(path)}, () => process.exit(0))`]);
    assert.equal(child.status, 0, child.stderr?.toString());
    const stale = lstatSync(path);
    assert.ok(stale.isSocket());
    assert.notEqual(stale.mode & 0o777, 0o700, 'made without our umask');
    const dev = await startDevice({}, ifname);
    assert.equal(lstatSync(path).mode & 0o777, 0o700, 'ours now');
    const { stdout } = await wg(['show', 'interfaces']);
    assert.ok(stdout.trim().split(/\s+/).includes(ifname));
    assert.equal(dev.server.path, path);
  });

  test('a file that is not a socket is never removed', async () => {
    const dir = scope.tempDir('rgu-file-');
    writeFileSync(join(dir, 'rguplain.sock'), 'keep me');
    await assert.rejects(startUapiServer('rguplain', createUapiHandler(new FakeHost(new WireGuardCore({
      crypto, outputs: { sendDatagram() {}, deliverPacket() {} },
    }))), { dir }), /not a socket/);
    assert.ok(existsSync(join(dir, 'rguplain.sock')));
  });

  test('a socket replaced by another file: noticed, and close() leaves the newcomer alone', async () => {
    const dir = scope.tempDir('rgu-replaced-');
    let deleted = 0;
    const dev = await startDevice({ dir, onSocketDeleted: () => { deleted++; } });
    unlinkSync(dev.server.path);
    const newcomer = spawnSync(process.execPath, ['-e', `require('net').createServer().listen(${JSON.stringify(dev.server.path)}, () => process.exit(0))`]);
    assert.equal(newcomer.status, 0);
    await waitFor(() => deleted === 1, 3000, { description: 'onSocketDeleted' });
    await dev.server.close();
    assert.ok(lstatSync(dev.server.path).isSocket(), 'the other socket is still there');
  });

  test('bad interface names are refused', async () => {
    const handler = { get: () => 'errno=0\n\n', set: () => 0 };
    for (const name of ['', '../x', 'a/b', 'x'.repeat(16), 'sp ace', '..']) {
      await assert.rejects(startUapiServer(name, handler, { dir: keyDir }), /bad interface name/, name);
    }
  });

  test('deleting the socket file is noticed (the daemon exits on that)', async () => {
    let deleted = 0;
    const dev = await startDevice({ onSocketDeleted: () => { deleted++; } });
    await new Promise((resolve) => setTimeout(resolve, 50));
    assert.equal(deleted, 0);
    unlinkSync(dev.server.path);
    await waitFor(() => deleted === 1, 3000, { description: 'onSocketDeleted' });
    await dev.server.close();
    assert.equal(deleted, 1, 'once, and not for close()');
    const quiet = await startDevice({ onSocketDeleted: () => { deleted++; } });
    await quiet.server.close();
    await new Promise((resolve) => setTimeout(resolve, 100));
    assert.equal(deleted, 1, 'close() does not count as deletion');
  });
});

/** A raw client: collects what the server sends and whether it closed. */
class RawClient {
  readonly socket: Socket;
  data = '';
  ended = false;
  closed = false;
  private listeners: Array<() => void> = [];

  constructor(path: string) {
    this.socket = connect(path);
    this.socket.setEncoding('utf8');
    this.socket.on('data', (chunk: string) => { this.data += chunk; this.poke(); });
    this.socket.on('end', () => { this.ended = true; this.poke(); });
    this.socket.on('error', () => {});
    this.socket.on('close', () => { this.closed = true; this.poke(); });
  }

  static async open(path: string): Promise<RawClient> {
    const client = new RawClient(path);
    await new Promise<void>((resolve, reject) => {
      client.socket.once('connect', resolve);
      client.socket.once('error', reject);
    });
    return client;
  }

  private poke(): void {
    for (const listener of this.listeners) listener();
  }

  /** Waits until `condition` holds (checked on every event) or fails after `timeoutMs`. */
  until(condition: (c: RawClient) => boolean, timeoutMs = 3000, what = 'condition'): Promise<void> {
    if (condition(this)) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const check = () => {
        if (!condition(this)) return;
        clearTimeout(timer);
        this.listeners = this.listeners.filter((l) => l !== check);
        resolve();
      };
      const timer = setTimeout(() => {
        this.listeners = this.listeners.filter((l) => l !== check);
        reject(new Error(`timed out waiting for ${what}; got ${JSON.stringify(this.data.slice(0, 300))}, ended=${this.ended}, closed=${this.closed}`));
      }, timeoutMs);
      this.listeners.push(check);
    });
  }

  /** Number of complete answers (each ends with errno=N and an empty line). */
  answers(): string[] {
    return [...this.data.matchAll(/errno=(-?\d+)\n\n/g)].map((m) => m[1]);
  }

  async answer(count = 1): Promise<string[]> {
    await this.until((c) => c.answers().length >= count, 3000, `${count} answer(s)`);
    return this.answers();
  }

  write(text: string | Buffer): void {
    this.socket.write(text);
  }

  destroy(): void {
    this.socket.destroy();
  }
}

describe('raw clients', () => {
  let dev: Device;
  const clients: RawClient[] = [];
  const open = async () => {
    const c = await RawClient.open(dev.server.path);
    clients.push(c);
    return c;
  };

  before(async () => {
    dev = await startDevice({ limits: { requestTimeoutMs: 1000 } });
  });
  after(() => {
    for (const c of clients) c.destroy();
  });

  /** The server still answers a fresh client (and `wg`). */
  async function stillServing(): Promise<void> {
    const c = await open();
    c.write('get=1\n\n');
    assert.deepEqual(await c.answer(), ['0']);
    await wg(['show', dev.ifname, 'dump']);
  }

  test('a line without "=" → errno=-71; the connection stays usable', async () => {
    const c = await open();
    c.write('set=1\nlisten_port\n\n');
    assert.deepEqual(await c.answer(), ['-71']);
    c.write('set=1\nlisten_port=6100\n\nget=1\n\n');
    await c.answer(3);
    assert.deepEqual(c.answers(), ['-71', '0', '0']);
    assert.match(c.data, /^listen_port=6100$/m);
    assert.equal(dev.host.listenPort, 6100);
  });

  test('an unknown key → errno=-22, nothing applied', async () => {
    const c = await open();
    c.write('set=1\nlisten_port=6200\nfrobnicate=1\n\n');
    assert.deepEqual(await c.answer(), ['-22']);
    assert.equal(dev.host.listenPort, 6100);
  });

  test('a garbage first line closes the connection without an answer', async () => {
    const c = await open();
    c.write('hello there\nget=1\n\n');
    await c.until((x) => x.ended || x.closed, 3000, 'close');
    assert.equal(c.data, '');
    await stillServing();
  });

  test('get=1 followed by anything but an empty line → errno=-22 and close', async () => {
    const c = await open();
    c.write('get=1\nx\n');
    await c.until((x) => x.ended || x.closed, 3000, 'close');
    assert.equal(c.data, 'errno=-22\n\n');
  });

  test('a line over 64 KiB → errno=-90 or a close; others unaffected', async () => {
    const c = await open();
    c.write(`set=1\nlisten_port=${'1'.repeat(70 * 1024)}`);
    await c.until((x) => x.ended || x.closed, 3000, 'close');
    assert.ok(c.data === '' || c.data === 'errno=-90\n\n', c.data.slice(0, 100));
    await stillServing();
  });

  test('a client that sends half a request and stalls is disconnected; others are served meanwhile', async () => {
    const stalled = await open();
    stalled.write('set=1\nlisten_port=6300\n');
    await stillServing();
    await stalled.until((x) => x.ended || x.closed, 3000, 'the deadline to close the stalled client');
    assert.equal(stalled.data, '');
    assert.equal(dev.host.listenPort, 6100, 'the unfinished request was not applied');
    const idle = await open();
    await idle.until((x) => x.ended || x.closed, 3000, 'an idle client to be closed too');
  });

  test('a client that never reads its answers is disconnected', async () => {
    const slowMessages = () => dev.log.filter((m) => m.includes('client too slow')).length;
    const before = slowMessages();
    // About 300 bytes per peer in a get answer: 4000 peers fill any socket buffer.
    const added = Array.from({ length: 4000 }, () => dev.core.addPeer(crypto.randomBytes(32)).publicKey);
    try {
      const baseline = dev.server.connectionCount;
      const c = await open();
      c.socket.pause();
      c.write('get=1\n\n'.repeat(8));
      await waitFor(() => slowMessages() > before, 5000, { description: 'the server to give up on the client' });
      await waitFor(() => dev.server.connectionCount <= baseline, 5000, { description: 'the connection to be dropped' });
      await stillServing();
    } finally {
      for (const key of added) dev.core.removePeer(key);
    }
  });

  test('a request split into one-byte chunks', async () => {
    const c = await open();
    for (const byte of 'set=1\nlisten_port=6400\n\nget=1\n\n') {
      c.write(byte);
      await new Promise((resolve) => setTimeout(resolve, 1));
    }
    await c.answer(2);
    assert.deepEqual(c.answers(), ['0', '0']);
    assert.equal(dev.host.listenPort, 6400);
  });

  test('pipelined operations in one write get their answers in order', async () => {
    const c = await open();
    c.write('get=1\n\nset=1\nlisten_port=5555\n\nset=1\nfwmark=7\n\nget=1\n\n');
    await c.answer(4);
    assert.deepEqual(c.answers(), ['0', '-98', '0', '0']);
    assert.match(c.data, /fwmark=7\nerrno=0\n\n$/);
  });

  test('a client that half-closes after its request still gets the answer', async () => {
    const c = await open();
    c.socket.end('get=1\n\n');
    await c.until((x) => x.ended, 3000, 'end');
    assert.deepEqual(c.answers(), ['0']);
  });

  test('a set cut off by end of input → errno=-5, nothing applied', async () => {
    const c = await open();
    c.socket.end('set=1\nlisten_port=6500\n');
    await c.until((x) => x.ended, 3000, 'end');
    assert.equal(c.data, 'errno=-5\n\n');
    assert.equal(dev.host.listenPort, 6400);
  });

  test('an empty line right after set=1 ends the set; the next line is then no operation', async () => {
    const c = await open();
    c.write('set=1\n\nlisten_port=6600\n\n');
    await c.until((x) => x.ended || x.closed, 3000, 'close');
    assert.equal(c.data, 'errno=0\n\n');
    assert.equal(dev.host.listenPort, 6400);
  });

  test('many concurrent clients', async () => {
    const many = await Promise.all(Array.from({ length: 100 }, async (_, i) => {
      const c = await open();
      c.write(i % 2 ? 'get=1\n\n' : `set=1\nfwmark=${i + 1}\n\n`);
      return c;
    }));
    for (const c of many) assert.deepEqual(await c.answer(), ['0']);
    for (const c of many) c.destroy();
    await waitFor(() => dev.server.connectionCount === 0, 3000, { description: 'connections to close' });
  });

  test('a request over the size limit → errno=-90 and close', async () => {
    const small = await startDevice({ limits: { maxRequestBytes: 1000 } });
    const c = await RawClient.open(small.server.path);
    clients.push(c);
    c.write(`set=1\n${'fwmark=1\n'.repeat(200)}\n`);
    await c.until((x) => x.ended || x.closed, 3000, 'close');
    assert.ok(c.data === '' || c.data === 'errno=-90\n\n', c.data);
    assert.equal(small.host.fwmark, 0);
  });

  test('the server logged the misbehaviour', () => {
    const text = dev.log.join('\n');
    assert.match(text, /invalid operation/);
    assert.match(text, /longer than 65536 bytes/);
    assert.match(text, /client too slow .* within 1000 ms/);
    assert.match(text, /errno -71/);
  });
});
