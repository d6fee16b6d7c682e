/**
 * Key rotation's decisions and steps without namespaces: the atomic key file replacement, the
 * agent following the file (publish first, then the data plane, then the kick), the start-up
 * rule for a rotation left pending, the peer replacement keeping the endpoint that worked, and —
 * on two real WireGuard cores — that the handshake after a rotation happens at once whichever
 * side switches first.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { chmodSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { KeyFileError, loadOrCreatePrivateKey, readPrivateKeyFile, replacePrivateKeyFile } from '../../control/identity/private-key.ts';
import {
  followKeyFile, keyFileState, kickRequest, newPrivateKey, rotationDue, rotationPendingAtStart, type KeyFollowDeps,
} from '../../control/agent/key-rotation.ts';
import { newReconcileMemory, planReconcile } from '../../control/mesh/reconcile.ts';
import type { DesiredPeer } from '../../control/mesh/desired-peers.ts';
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import type { Crypto } from '../../dataplane/crypto/primitives.ts';
import { Endpoint } from '../../dataplane/net/endpoint.ts';
import { parsePrefix } from '../../dataplane/net/ip.ts';
import { clampPrivateKey, keyFromBase64, keyToBase64 } from '../../dataplane/noise/keys.ts';
import { applySetRequest, takeSnapshot, type UapiHost } from '../../dataplane/uapi/uapi-device.ts';
import type { DeviceSnapshot, SetRequest } from '../../dataplane/uapi/uapi-protocol.ts';
import type { AgentLogger } from '../../control/log.ts';
import { makeCorePair, type CorePair } from '../helpers/core-pair.ts';
import { ipv4Packet } from '../helpers/ip-packet.ts';
import { renderRotations, rotationPassed, type RotationResult } from '../../lab/key-rotation-scenario.ts';

let crypto: Crypto;
before(async () => { crypto = await selectCrypto(); });
const dir = mkdtempSync(join(tmpdir(), 'rg-rotate-'));
after(() => rmSync(dir, { recursive: true, force: true }));
let fileCounter = 0;
const freshKeyFile = () => {
  const path = join(dir, `k${++fileCounter}`, 'private.key');
  return { path, key: loadOrCreatePrivateKey(path).privateKey };
};

describe('key file replacement', () => {
  test('replaces the whole file: mode 0600 whatever the old mode, no temporary left, readable at once', () => {
    const { path, key } = freshKeyFile();
    chmodSync(path, 0o640); // a loose old file does not make a loose new one
    const next = newPrivateKey();
    replacePrivateKeyFile(path, next);
    assert.equal(statSync(path).mode & 0o777, 0o600);
    assert.equal(readFileSync(path, 'utf8'), `${keyToBase64(next)}\n`);
    assert.deepEqual(readPrivateKeyFile(path), next);
    assert.notDeepEqual(readPrivateKeyFile(path), key);
    assert.deepEqual(readdirSync(join(path, '..')), ['private.key']);
  });

  test('a directory that does not exist is a KeyFileError and creates nothing', () => {
    const path = join(dir, 'missing-dir', 'private.key');
    assert.throws(() => replacePrivateKeyFile(path, newPrivateKey()), (err: Error) => err instanceof KeyFileError && /cannot be replaced/.test(err.message));
    assert.throws(() => statSync(join(dir, 'missing-dir')), /ENOENT/);
  });

  test('reading checks like start-up: loose mode, garbage, missing (never echoing the content)', () => {
    const { path } = freshKeyFile();
    chmodSync(path, 0o644);
    assert.throws(() => readPrivateKeyFile(path), /mode 0644/);
    writeFileSync(path, 'not-a-key-but-secret\n', { mode: 0o600 });
    chmodSync(path, 0o600);
    assert.throws(() => readPrivateKeyFile(path), (err: Error) => /does not hold a base64 WireGuard key/.test(err.message) && !err.message.includes('secret'));
    assert.throws(() => readPrivateKeyFile(join(dir, 'nothing-here.key')), /ENOENT/);
  });

  test('new keys are clamped and differ', () => {
    const a = newPrivateKey(), b = newPrivateKey();
    assert.deepEqual(a, clampPrivateKey(a));
    assert.notDeepEqual(a, b);
  });
});

describe('rotation decisions', () => {
  test('rotationDue: never with interval 0, due once the interval passed since the file was written', () => {
    assert.equal(rotationDue(0, 10 ** 12, 0), false);
    assert.equal(rotationDue(1000, 1000 + 9_999, 10), false);
    assert.equal(rotationDue(1000, 1000 + 10_000, 10), true);
  });

  test('keyFileState: in use, rotated (clamped before comparing), unreadable', () => {
    const inUse = newPrivateKey();
    const unclamped = Uint8Array.from(inUse);
    unclamped[0] |= 7; // the same key as wg would use it
    assert.equal(keyFileState(inUse, () => unclamped).kind, 'in-use');
    const other = newPrivateKey();
    const state = keyFileState(inUse, () => Uint8Array.from(other));
    assert.equal(state.kind, 'rotated');
    assert.deepEqual(state.kind === 'rotated' && state.privateKey, other);
    const bad = keyFileState(inUse, () => { throw new KeyFileError('private key /x has mode 0644'); });
    assert.deepEqual(bad, { kind: 'unreadable', problem: 'private key /x has mode 0644' });
  });

  test('rotationPendingAtStart: only when the running key is the published one and the file holds another', () => {
    assert.equal(rotationPendingAtStart('NEW', 'OLD', 'OLD'), true, 'written while the agent was down');
    assert.equal(rotationPendingAtStart('NEW', 'OLD', 'NEW'), false, 'published already: the peers have it, switch at once');
    assert.equal(rotationPendingAtStart('NEW', 'NEW', 'NEW'), false, 'nothing pending');
    assert.equal(rotationPendingAtStart('NEW', undefined, 'OLD'), false, 'a fresh data plane has no key to keep');
    assert.equal(rotationPendingAtStart('NEW', 'STRANGE', 'OLD'), false, 'a data plane key nobody publishes is not kept');
  });

  test('kickRequest: two sections per peer that end where they started', () => {
    const on = randomBytes(32), off = randomBytes(32);
    const request = kickRequest([{ publicKey: on, persistentKeepalive: 25 }, { publicKey: off, persistentKeepalive: 0 }])!;
    assert.deepEqual(request.peers.map((p) => [keyToBase64(p.publicKey), p.persistentKeepalive, p.updateOnly, p.remove, p.allowedIps.length]), [
      [keyToBase64(on), 0, true, false, 0], [keyToBase64(on), 25, true, false, 0],
      [keyToBase64(off), 1, true, false, 0], [keyToBase64(off), 0, true, false, 0],
    ]);
    assert.equal(kickRequest([]), undefined);
  });
});

function recordingLog(): AgentLogger & { lines: string[] } {
  const lines: string[] = [];
  const at = (level: string) => (message: string, fields?: object) => { lines.push(`${level} ${message} ${JSON.stringify(fields ?? {})}`); };
  return { lines, debug: at('DEBUG'), info: at('INFO'), warn: at('WARN'), error: at('ERROR') };
}

/** A data plane that records requests and reports one peer. */
function fakeDataplane(peerKey = randomBytes(32)) {
  const requests: SetRequest[] = [];
  return {
    requests,
    async get(): Promise<DeviceSnapshot> {
      return { listenPort: 51820, fwmark: 0, peers: [{ publicKey: peerKey, presharedKey: new Uint8Array(32), lastHandshakeWallMs: 0, txBytes: 0, rxBytes: 0, persistentKeepalive: 25, allowedIps: [] }] };
    },
    async set(request: SetRequest): Promise<void> { requests.push(request); },
  };
}

describe('followKeyFile (the agent following its key file)', () => {
  const deps = (over: Partial<KeyFollowDeps> & Pick<KeyFollowDeps, 'path' | 'inUse'>): KeyFollowDeps & { published: string[]; log: ReturnType<typeof recordingLog> } => {
    const published: string[] = [];
    return {
      intervalS: 0, publicKeyOf: (k) => crypto.publicKey(k), dataplane: fakeDataplane(), reported: new Set(),
      publish: async (publicKey) => { published.push(publicKey); }, published, log: recordingLog(), ...over,
    } as KeyFollowDeps & { published: string[]; log: ReturnType<typeof recordingLog> };
  };

  test('nothing to do while the file holds the key in use', async () => {
    const { path, key } = freshKeyFile();
    const d = deps({ path, inUse: key });
    assert.equal(await followKeyFile(d), undefined);
    assert.deepEqual(d.published, []);
    assert.deepEqual((d.dataplane as ReturnType<typeof fakeDataplane>).requests, []);
  });

  test('a rotated file: published first, then the data plane gets the key, then every peer is kicked; no private key in the log', async () => {
    const { path, key } = freshKeyFile();
    const next = newPrivateKey();
    replacePrivateKeyFile(path, next);
    const order: string[] = [];
    const dataplane = fakeDataplane();
    const d = deps({
      path, inUse: key, dataplane: { get: dataplane.get, set: async (r) => { order.push(r.privateKey ? 'set-key' : 'kick'); await dataplane.set(r); } },
      publish: async (pk) => { order.push(`publish ${pk}`); },
    });
    const switched = await followKeyFile(d);
    const nextPublic = keyToBase64(crypto.publicKey(next));
    assert.ok(switched);
    assert.equal(switched.publicKey, nextPublic);
    assert.equal(switched.previousPublicKey, keyToBase64(crypto.publicKey(key)));
    assert.deepEqual(switched.privateKey, next);
    assert.deepEqual(order, [`publish ${nextPublic}`, 'set-key', 'kick']);
    assert.deepEqual(dataplane.requests[0].privateKey, next);
    assert.equal(dataplane.requests[0].peers.length, 0);
    assert.deepEqual(dataplane.requests[1].peers.map((p) => p.persistentKeepalive), [0, 25]);
    const text = d.log.lines.join('\n');
    assert.match(text, /rotated this node's key/);
    for (const secret of [keyToBase64(next), keyToBase64(key)]) assert.ok(!text.includes(secret));
  });

  test('the API server refuses: no switch, the key in use stays, one warning; the next look completes it', async () => {
    const { path, key } = freshKeyFile();
    const next = newPrivateKey();
    replacePrivateKeyFile(path, next);
    let up = false;
    const dataplane = fakeDataplane();
    const d = deps({ path, inUse: key, dataplane, publish: async () => { if (!up) throw Object.assign(new Error('connect ECONNREFUSED'), { code: 'ECONNREFUSED' }); } });
    assert.equal(await followKeyFile(d), undefined);
    assert.equal(await followKeyFile(d), undefined);
    assert.equal(dataplane.requests.length, 0, "the data plane keeps the old key");
    assert.equal(d.log.lines.filter((l) => /cannot be published yet/.test(l)).length, 1, 'said once');
    assert.deepEqual(readPrivateKeyFile(path), next, 'the rotation is not lost');
    up = true;
    const switched = await followKeyFile(d);
    assert.ok(switched);
    assert.deepEqual(dataplane.requests[0].privateKey, next);
  });

  test('an unusable key file: the key in use stays, one error while it lasts', async () => {
    const { path, key } = freshKeyFile();
    chmodSync(path, 0o644);
    const d = deps({ path, inUse: key });
    assert.equal(await followKeyFile(d), undefined);
    assert.equal(await followKeyFile(d), undefined);
    assert.equal(d.log.lines.filter((l) => /cannot be used/.test(l)).length, 1);
    assert.deepEqual(d.published, []);
  });

  test('KEY_ROTATION_INTERVAL: a key file older than the interval is replaced and switched to; a younger one is left alone', async () => {
    const { path, key } = freshKeyFile();
    const young = deps({ path, inUse: key, intervalS: 3600 });
    assert.equal(await followKeyFile(young), undefined);
    assert.deepEqual(readPrivateKeyFile(path), key);
    // A second past the interval: the file's mtime comes from the kernel's coarse clock, which may
    // read a few milliseconds ahead of this process's Date.now() (a Bun run once saw exactly that).
    const due = deps({ path, inUse: key, intervalS: 3600, nowMs: Date.now() + 3601_000 });
    const switched = await followKeyFile(due);
    assert.ok(switched);
    assert.deepEqual(readPrivateKeyFile(path), switched.privateKey, 'persisted before it was used');
    assert.equal(statSync(path).mode & 0o777, 0o600);
    assert.deepEqual(due.published, [switched.publicKey]);
  });
});

describe('the peer of a rotated node', () => {
  const oldKey = randomBytes(32), newKey = randomBytes(32);
  const want = (source: DesiredPeer['endpointSource'] = 'published'): DesiredPeer => ({
    nodeName: 'o1', publicKey: keyToBase64(newKey), publicKeyBytes: newKey, endpoint: '192.168.1.11:51821', endpointSource: source,
    allowedIps: ['10.244.3.0/24', 'fd00:244:3::/64'], persistentKeepalive: 25,
  });
  const device = (handshakeAgeMs: number): DeviceSnapshot => ({
    listenPort: 51820, fwmark: 0, peers: [{
      publicKey: oldKey, presharedKey: new Uint8Array(32), endpoint: new Endpoint('203.0.113.10', 40001), lastHandshakeWallMs: 1_000_000 - handshakeAgeMs,
      txBytes: 1, rxBytes: 1, persistentKeepalive: 25, allowedIps: [parsePrefix('10.244.3.0/24'), parsePrefix('fd00:244:3::/64')],
    }],
  });
  const plan = (w: DesiredPeer, d: DeviceSnapshot) => planReconcile(new Map([[w.publicKey, w]]), d, newReconcileMemory(), { collectGarbage: true, canRemoveAllowedIp: true, nowWallMs: 1_000_000 });

  test('is replaced in one request: the old key removed first, the new one added with its allowed IPs at the endpoint that worked', () => {
    const p = plan(want(), device(5000));
    const peers = p.request!.peers;
    assert.deepEqual(peers.map((x) => [keyToBase64(x.publicKey), x.remove]), [[keyToBase64(oldKey), true], [keyToBase64(newKey), false]]);
    assert.equal(peers[1].endpoint?.toString(), '203.0.113.10:40001', 'the NAT mapping, not the LAN address the Node publishes');
    assert.deepEqual(peers[1].allowedIps.map((a) => a.remove), [false, false]);
    assert.equal(peers[1].persistentKeepalive, 25, 'a new peer with keepalive handshakes at once');
    assert.deepEqual(p.actions.find((a) => a.kind === 'add'), { kind: 'add', peer: want(), carriedEndpoint: '203.0.113.10:40001' });
  });

  test('keeps the published endpoint when the old session is stale, or when the endpoint is forced', () => {
    assert.equal(plan(want(), device(200_000)).request!.peers[1].endpoint?.toString(), '192.168.1.11:51821');
    assert.equal(plan(want('forced'), device(5000)).request!.peers[1].endpoint?.toString(), '192.168.1.11:51821');
  });
});

describe('a rotation on two WireGuard cores', () => {
  function host(pair: CorePair, side: 'a' | 'b'): UapiHost {
    return { core: pair[side].core, listenPort: 51820, fwmark: 0, setListenPort: async () => {}, setFwmark: () => {} };
  }
  const ping = (pair: CorePair) => {
    const before = pair.b.delivered.length;
    pair.a.core.sendPacket(ipv4Packet('10.0.0.1', '10.0.0.2'));
    pair.pump();
    return pair.b.delivered.length > before;
  };
  /** b's agent: the old peer out, the new one in with the same allowed IPs and endpoint, keepalive on. */
  const replaceAtB = async (pair: CorePair, oldPublic: Uint8Array, newPublic: Uint8Array, keepalive: number) => {
    const old = takeSnapshot(host(pair, 'b')).peers.find((p) => keyToBase64(p.publicKey) === keyToBase64(oldPublic))!;
    assert.equal(await applySetRequest(host(pair, 'b'), {
      replacePeers: false, peers: [
        { publicKey: oldPublic, remove: true, updateOnly: false, replaceAllowedIps: false, allowedIps: [] },
        { publicKey: newPublic, remove: false, updateOnly: false, endpoint: old.endpoint, persistentKeepalive: keepalive, replaceAllowedIps: false, allowedIps: old.allowedIps.map((prefix) => ({ prefix, remove: false })) },
      ],
    }), 0);
  };
  const switchAtA = async (pair: CorePair, key: Uint8Array, kick: boolean) => {
    assert.equal(await applySetRequest(host(pair, 'a'), { privateKey: key, replacePeers: false, peers: [] }), 0);
    const request = kickRequest(takeSnapshot(host(pair, 'a')).peers);
    if (kick && request) assert.equal(await applySetRequest(host(pair, 'a'), request), 0);
  };

  for (const order of ['the rotating node first', 'the peer first'] as const) {
    test(`${order}: the handshake under the new key completes at once, without waiting for a retry timer`, async () => {
      const pair = makeCorePair(crypto, { persistentKeepalive: 25 });
      assert.ok(ping(pair), 'a session before the rotation');
      const oldPublic = pair.a.core.ourPublicKey!;
      const next = newPrivateKey();
      const newPublic = crypto.publicKey(next);
      if (order === 'the rotating node first') {
        await switchAtA(pair, next, true);
        pair.pump(); // a's kick reaches b, which does not know the new key yet
        await replaceAtB(pair, oldPublic, newPublic, 25);
      } else {
        await replaceAtB(pair, oldPublic, newPublic, 25);
        pair.pump(); // b's handshake reaches a, which has not switched yet
        await switchAtA(pair, next, true);
      }
      pair.pump();
      assert.ok(ping(pair), 'traffic under the new key with no time passing');
      assert.equal(keyToBase64([...pair.b.core.peers][0].publicKey), keyToBase64(newPublic));
    });
  }

  test('without the kick, the peer-first order waits for a timer (what the kick is for)', async () => {
    const pair = makeCorePair(crypto, { persistentKeepalive: 25 });
    assert.ok(ping(pair));
    const next = newPrivateKey();
    await replaceAtB(pair, pair.a.core.ourPublicKey!, crypto.publicKey(next), 25);
    pair.pump();
    await switchAtA(pair, next, false);
    pair.pump();
    assert.equal(pair.wire.length, 0);
    const sentBefore = pair.log.length;
    pair.pump();
    assert.equal(pair.log.length, sentBefore, 'nothing goes out on its own: no handshake until a packet or a retry timer');
  });

  test('the private key handed over is the one the file holds (base64 round trip)', () => {
    const next = newPrivateKey();
    assert.deepEqual(keyFromBase64(keyToBase64(next)), next);
  });
});

describe('the demo\'s key-rotation report', () => {
  const rotation = (lost: number, switched = true): RotationResult => ({
    node: 'o1', from: 'AAAAAAAAxxxx', to: 'BBBBBBBByyyy', switchedInS: 0.4,
    peers: [{ peer: 'c1', transmitted: 400, lost, longestSilenceMs: lost * 20 + 20, switched }, { peer: 'h1', transmitted: 400, lost: 0, longestSilenceMs: 30, switched: true }],
  });
  test('one row per peer with the pings lost and the longest silence; passes only within one second and with every peer switched', () => {
    const text = renderRotations([rotation(3)]);
    assert.match(text, /^o1 +AAAAAAAA → BBBBBBBB +c1 +3 of 400 +60 ms +80 ms +yes$/m);
    assert.match(text, /^ +h1 +0 of 400 +0 ms +30 ms +yes$/m);
    assert.match(text, /at most 3 pings \(60 ms\) lost per peer and rotation/);
    assert.equal(rotationPassed(rotation(51)), false, 'more than one second of pings lost fails');
    assert.equal(rotationPassed(rotation(50)), true, 'one second is the limit');
    assert.equal(rotationPassed(rotation(0, false)), false, 'a peer that did not switch fails');
    assert.equal(rotationPassed({ ...rotation(0), error: 'no data plane' }), false);
    assert.match(renderRotations([rotation(0, false)]), /did not switch/);
  });
});
