/**
 * The data plane's counters for the agent (`get=roamguard-stats`, dataplane/uapi/uapi-stats.ts):
 * the text format both ways, what a Device counts (handshakes, failures, roams, drops by reason),
 * and the operation over a real unix socket — including the graceful "not supported" answer of a
 * daemon without it, while `get=1` stays exactly as `wg` expects.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import type { Crypto } from '../../dataplane/crypto/primitives.ts';
import { DROP_REASONS } from '../../dataplane/drop-counters.ts';
import { keyToHex } from '../../dataplane/noise/keys.ts';
import { UapiClient } from '../../dataplane/uapi/uapi-client.ts';
import { createUapiHandler, type UapiHandler } from '../../dataplane/uapi/uapi-device.ts';
import { formatGetResponse, formatErrno, type DeviceSnapshot } from '../../dataplane/uapi/uapi-protocol.ts';
import { startUapiServer, type UapiServer } from '../../dataplane/uapi/uapi-server.ts';
import {
  STATS_OPERATION, formatStatsResponse, parseStatsResponse, type DeviceStats,
} from '../../dataplane/uapi/uapi-stats.ts';
import { buildEchoRequest } from '../system/packets.ts';
import { makeDevicePair } from '../helpers/device-pair.ts';
import { until } from '../helpers/until.ts';

let crypto: Crypto;
before(async () => { crypto = await selectCrypto(); });

const KEY_A = new Uint8Array(32).fill(0xa1);
const KEY_B = new Uint8Array(32).fill(0xb2);

function sampleStats(): DeviceStats {
  return {
    version: 1, workerThreads: 2, workerQueueDepth: 3,
    drops: { 'bad-mac1': 4, replay: 0, 'allowed-ips-mismatch': 9 },
    tunQueueReads: [12, 0, 2 ** 40],
    tunRepliesRead: [3, 0, 2 ** 33],
    peers: [
      { publicKey: KEY_A, rxBytes: 100, txBytes: 2 ** 53 - 1, handshakeAttempts: 5, handshakesCompleted: 2, handshakeFailures: 3, handshakePending: true, endpointChanges: 7, stagedPackets: 1 },
      { publicKey: KEY_B, rxBytes: 0, txBytes: 0, handshakeAttempts: 0, handshakesCompleted: 0, handshakeFailures: 0, handshakePending: false, endpointChanges: 0, stagedPackets: 0 },
    ],
  };
}

describe('stats text format', () => {
  test('format then parse gives the same counters back; the answer ends like a get answer', () => {
    const text = formatStatsResponse(sampleStats());
    assert.ok(text.endsWith('\nerrno=0\n\n'));
    assert.match(text, /^stats_version=1\nworker_threads=2\nworker_queue_depth=3\ndrop\.bad-mac1=4\n/);
    assert.match(text, new RegExp(`public_key=${keyToHex(KEY_A)}\nrx_bytes=100\ntx_bytes=9007199254740991\n`));
    const parsed = parseStatsResponse(text);
    assert.ok(parsed.ok, JSON.stringify(parsed));
    assert.deepEqual(parsed.stats, sampleStats());
  });

  test('unknown keys (of newer daemons) are ignored; unknown drop reasons are kept by name', () => {
    const parsed = parseStatsResponse(`stats_version=2\nnew_device_key=x\ndrop.some-new-reason=5\npublic_key=${keyToHex(KEY_A)}\nnew_peer_key=1\nendpoint_changes=2\nerrno=0\n\n`);
    assert.ok(parsed.ok);
    assert.equal(parsed.stats.version, 2);
    assert.deepEqual(parsed.stats.drops, { 'some-new-reason': 5 });
    assert.equal(parsed.stats.peers[0].endpointChanges, 2);
  });

  test('a non-zero errno, a missing errno line and malformed values are errors', () => {
    const refused = parseStatsResponse('errno=-22\n\n');
    assert.deepEqual(refused.ok ? 'ok' : refused.errno, -22);
    assert.equal(parseStatsResponse('stats_version=1\n').ok, false);
    assert.equal(parseStatsResponse('worker_threads=-1\nerrno=0\n\n').ok, false);
    assert.equal(parseStatsResponse('tun_queue_reads=1,,2\nerrno=0\n\n').ok, false, 'an empty queue counter');
    assert.equal(parseStatsResponse('tun_queue_reads=1,-2\nerrno=0\n\n').ok, false);
    assert.equal(parseStatsResponse(`public_key=${keyToHex(KEY_A)}\nhandshake_pending=yes\nerrno=0\n\n`).ok, false);
    assert.equal(parseStatsResponse('public_key=abcd\nerrno=0\n\n').ok, false);
    assert.equal(parseStatsResponse('rx_bytes=99999999999999999999\nerrno=0\n\n').ok, true, 'device-level unknown key ignored');
    assert.equal(parseStatsResponse(`public_key=${keyToHex(KEY_A)}\nrx_bytes=99999999999999999999\nerrno=0\n\n`).ok, false, 'beyond 2^53');
  });

  test('a drop reason that could break the line format is left out, never emitted', () => {
    const text = formatStatsResponse({ ...sampleStats(), drops: { 'ok-reason': 1, 'bad\nreason': 2, 'x=y': 3 } });
    assert.deepEqual((parseStatsResponse(text) as { stats: DeviceStats }).stats.drops, { 'ok-reason': 1 });
  });
});


/** Two Devices over in-memory TUNs and UDP with short handshake timers. */
function makePair() {
  return makeDevicePair(crypto, { timings: { rekeyTimeout: 60, rekeyTimeoutJitterMax: 1 } });
}

describe('Device.stats()', () => {
  test('handshakes (initiator and responder), roams, drops by reason with zeros, byte counters', async () => {
    const pair = await makePair();
    try {
      pair.a.tun.inject(buildEchoRequest({ src: '10.0.0.1', dst: '10.0.0.2', id: 1, seq: 0 }));
      await until(() => pair.b.tun.written.length === 1);
      const a = pair.a.device.stats();
      const b = pair.b.device.stats();
      assert.equal(a.version, 1);
      assert.equal(a.workerThreads, 0, 'a MemoryTun has no reader threads');
      assert.equal(a.workerQueueDepth, undefined, 'no crypto pool');
      assert.deepEqual(Object.keys(a.drops).sort(), [...DROP_REASONS].sort(), 'every reason, zeros included');
      assert.ok(Object.values(a.drops).every((n) => n === 0));
      assert.deepEqual(
        [a.peers[0].handshakeAttempts, a.peers[0].handshakesCompleted, a.peers[0].handshakeFailures, a.peers[0].handshakePending],
        [1, 1, 0, false], 'A initiated and completed');
      assert.deepEqual(
        [b.peers[0].handshakeAttempts, b.peers[0].handshakesCompleted, b.peers[0].handshakeFailures],
        [0, 1, 0], 'B answered (and was confirmed by the data packet)');
      assert.ok(a.peers[0].txBytes > 0 && b.peers[0].rxBytes === a.peers[0].txBytes);

      // A moves to another UDP port: B sees the next authenticated packet come from a new address.
      await pair.a.device.setListenPort(0);
      pair.a.tun.inject(buildEchoRequest({ src: '10.0.0.1', dst: '10.0.0.2', id: 1, seq: 1 }));
      await until(() => pair.b.tun.written.length === 2);
      assert.equal(pair.b.device.stats().peers[0].endpointChanges, 1);
      assert.equal(pair.a.device.stats().peers[0].endpointChanges, 0);

      // A packet from a source outside B's allowed IPs for A is counted under its reason.
      pair.a.device.core.allowedIps.insert({ address: new Uint8Array([10, 9, 9, 9]), bits: 32 }, [...pair.a.device.core.peers][0]);
      pair.a.tun.inject(buildEchoRequest({ src: '10.0.0.9', dst: '10.9.9.9', id: 1, seq: 2 }));
      await until(() => pair.b.device.stats().drops['allowed-ips-mismatch'] === 1);
    } finally {
      await pair.close();
    }
  });

  test('initiations nobody answers are failures; the one in flight is pending', async () => {
    const pair = await makePair();
    try {
      pair.network.filter = () => false; // a dead path
      pair.a.tun.inject(buildEchoRequest({ src: '10.0.0.1', dst: '10.0.0.2', id: 1, seq: 0 }));
      await until(() => pair.a.device.stats().peers[0].handshakeAttempts >= 3, 3000);
      const peer = pair.a.device.stats().peers[0];
      assert.equal(peer.handshakesCompleted, 0);
      assert.equal(peer.handshakePending, true);
      assert.equal(peer.handshakeFailures, peer.handshakeAttempts - 1);
      assert.equal(peer.stagedPackets, 1, 'the packet waits for a session');

      pair.network.filter = () => true; // the path heals: the next retry completes
      await until(() => pair.a.device.stats().peers[0].handshakesCompleted === 1, 3000);
      const healed = pair.a.device.stats().peers[0];
      assert.equal(healed.handshakePending, false);
      assert.equal(healed.handshakeFailures, healed.handshakeAttempts - 1);
      assert.equal(healed.stagedPackets, 0);
    } finally {
      await pair.close();
    }
  });
});

describe('get=roamguard-stats over the control socket', () => {
  let dir: string;
  const servers: UapiServer[] = [];
  before(() => { dir = mkdtempSync(join(tmpdir(), 'rg-stats-')); });
  after(async () => {
    for (const s of servers) await s.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const snapshot: DeviceSnapshot = { listenPort: 51820, fwmark: 0, peers: [] };
  async function serve(ifname: string, handler: UapiHandler): Promise<UapiClient> {
    const server = await startUapiServer(ifname, handler, { dir });
    servers.push(server);
    return new UapiClient(server.path, 2000);
  }

  test('a device with counters answers them; get=1 is unchanged (no roamguard keys in it)', async () => {
    const pair = await makePair();
    try {
      const client = await serve('rgstats0', createUapiHandler(pair.a.device));
      const stats = await client.stats();
      assert.ok(stats);
      assert.equal(stats.peers.length, 1);
      assert.equal(keyToHex(stats.peers[0].publicKey), keyToHex(pair.b.device.core.ourPublicKey!));
      assert.equal(stats.drops['bad-mac1'], 0);
      const get = await client.exchange('get=1\n\n');
      assert.doesNotMatch(get, /stats_version|drop\.|handshake_attempts|endpoint_changes/);
      assert.equal((await client.get()).peers.length, 1);
    } finally {
      await pair.close();
    }
  });

  test('stats and get can share one connection (operations in sequence)', async () => {
    const client = await serve('rgstats1', { get: () => snapshot, set: () => 0, stats: () => sampleStats() });
    const answer = await new Promise<string>((resolve, reject) => {
      const socket = connect(client.socketPath);
      let text = '';
      socket.setEncoding('utf8');
      socket.on('data', (chunk: string) => {
        text += chunk;
        if ((text.match(/errno=0\n\n/g) ?? []).length === 2) { socket.destroy(); resolve(text); }
      });
      socket.on('error', reject);
      socket.write(`${STATS_OPERATION}\n\nget=1\n\n`);
    });
    const [statsPart, getPart] = answer.split(/(?<=errno=0\n\n)/);
    assert.deepEqual((parseStatsResponse(statsPart) as { stats: DeviceStats }).stats, sampleStats());
    assert.equal(getPart, formatGetResponse(snapshot));
  });

  test('a daemon without counters closes on the unknown operation: stats() is undefined, get still works', async () => {
    const client = await serve('rgstats2', { get: () => snapshot, set: () => 0 });
    assert.equal(await client.stats(), undefined);
    assert.equal((await client.get()).listenPort, 51820);
  });

  test('a daemon that refuses with an errno: undefined too; a malformed answer is an error', async () => {
    const refusing = await serve('rgstats3', { get: () => snapshot, set: () => 0, stats: () => formatErrno(-22) });
    assert.equal(await refusing.stats(), undefined);
    const broken = await serve('rgstats4', { get: () => snapshot, set: () => 0, stats: () => 'worker_threads=x\nerrno=0\n\n' });
    await assert.rejects(broken.stats(), /worker_threads/);
    const none = new UapiClient(join(dir, 'absent.sock'), 1000);
    await assert.rejects(none.stats(), /absent\.sock/);
  });
});
