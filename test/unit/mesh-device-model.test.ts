/**
 * The agent's model of its data plane (control/mesh/device-model.ts) against the data plane
 * itself: the same random `set` requests applied to a real WireGuardCore (through the daemon's
 * own applySetRequest) and to the model must leave the same peers, endpoints, keepalives and
 * allowed IPs.
 */
import { before, test } from 'node:test';
import assert from 'node:assert/strict';
import { ManualClock } from '../../dataplane/clock.ts';
import { WireGuardCore } from '../../dataplane/core.ts';
import type { Crypto } from '../../dataplane/crypto/primitives.ts';
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import { Endpoint } from '../../dataplane/net/endpoint.ts';
import { formatPrefix, parsePrefix } from '../../dataplane/net/ip.ts';
import { generatePrivateKey, keyToBase64 } from '../../dataplane/noise/keys.ts';
import { applySetRequest, takeSnapshot, type UapiHost } from '../../dataplane/uapi/uapi-device.ts';
import type { DeviceSnapshot, PeerChange, SetRequest } from '../../dataplane/uapi/uapi-protocol.ts';
import { applySetToSnapshot } from '../../control/mesh/device-model.ts';
import type { DesiredPeer } from '../../control/mesh/desired-peers.ts';
import { newReconcileMemory, planReconcile } from '../../control/mesh/reconcile.ts';
import { prng } from '../helpers/prng.ts';

let crypto: Crypto;
before(async () => { crypto = await selectCrypto(); });

function device(): UapiHost {
  const core = new WireGuardCore({ crypto, clock: new ManualClock(), outputs: { sendDatagram() {}, deliverPacket() {} } });
  core.setPrivateKey(generatePrivateKey(crypto));
  return { core, listenPort: 0, fwmark: 0, async setListenPort() {}, setFwmark() {} };
}

/** Order-free view: key → endpoint, keepalive, sorted allowed IPs. */
function view(s: DeviceSnapshot): Record<string, string> {
  const out: Record<string, string> = {};
  for (const p of s.peers) {
    out[keyToBase64(p.publicKey)] = `${p.endpoint?.toString() ?? '-'} ka=${p.persistentKeepalive} ${p.allowedIps.map(formatPrefix).sort().join(',')}`;
  }
  return out;
}

test('the model ends where the data plane ends, over random requests (add, update, update_only, remove, replace, moving prefixes)', async () => {
  let seed = 11;
  const random = () => { seed = (seed * 1103515245 + 12345) & 0x7fffffff; return seed / 0x7fffffff; };
  const pick = <T>(list: readonly T[]) => list[Math.floor(random() * list.length)];
  const keys = Array.from({ length: 12 }, () => crypto.publicKey(generatePrivateKey(crypto)));
  const prefixes = ['10.128.0.0/24', '10.128.1.0/24', '10.128.1.0/25', 'fd00:245::/64', '172.16.0.1/32', 'fd78::1/128', '10.0.0.0/8'].map(parsePrefix);
  const host = device();
  let model: DeviceSnapshot = takeSnapshot(host);
  for (let round = 0; round < 300; round++) {
    const peers: PeerChange[] = [];
    for (let k = 0, n = 1 + Math.floor(random() * 4); k < n; k++) {
      const r = random();
      peers.push({
        publicKey: pick(keys), remove: r < 0.12, updateOnly: r >= 0.12 && r < 0.3, replaceAllowedIps: random() < 0.15,
        endpoint: random() < 0.3 ? new Endpoint(`172.16.0.${1 + Math.floor(random() * 5)}`, 51820 + Math.floor(random() * 3)) : undefined,
        persistentKeepalive: random() < 0.2 ? pick([0, 25]) : undefined,
        allowedIps: Array.from({ length: Math.floor(random() * 3) }, () => ({ prefix: pick(prefixes), remove: random() < 0.3 })),
      });
    }
    const request: SetRequest = { replacePeers: random() < 0.03, peers };
    assert.equal(await applySetRequest(host, request), 0);
    model = applySetToSnapshot(model, request);
    assert.deepEqual(view(model), view(takeSnapshot(host)), `after round ${round}`);
  }
  assert.ok(model.peers.length > 0, 'the rounds should leave some peers');
});

test('the snapshot it started from is left as it was', () => {
  const key = crypto.publicKey(generatePrivateKey(crypto));
  const before: DeviceSnapshot = { listenPort: 1, fwmark: 0, peers: [] };
  const one = applySetToSnapshot(before, { replacePeers: false, peers: [{ publicKey: key, remove: false, updateOnly: false, replaceAllowedIps: false, allowedIps: [{ prefix: parsePrefix('10.0.0.0/24'), remove: false }] }] });
  const two = applySetToSnapshot(one, { replacePeers: false, peers: [{ publicKey: key, remove: false, updateOnly: true, replaceAllowedIps: true, allowedIps: [] }] });
  assert.equal(before.peers.length, 0);
  assert.deepEqual(one.peers[0].allowedIps.map(formatPrefix), ['10.0.0.0/24']);
  assert.deepEqual(two.peers[0].allowedIps, []);
});

test('a read answered while sets went on, with every set since it started replayed, ends where the data plane ends', async () => {
  // The agent reads beside its passes (agent.ts, readingBeside): a set sent after the read
  // started may reach the data plane before or after the read is answered, so the replay applies
  // some sets twice. Requests here are the ones the agent makes: plans of random desired meshes.
  const random = prng(41);
  const pick = <T>(list: readonly T[]) => list[Math.floor(random() * list.length)];
  const keys = Array.from({ length: 10 }, () => crypto.publicKey(generatePrivateKey(crypto)));
  const prefixes = ['10.128.0.0/24', '10.128.1.0/24', '10.128.2.0/24', 'fd00:245::/64', 'fd00:246::/64', '172.16.0.1/32', '172.16.0.2/32'];
  const host = device();
  const memory = newReconcileMemory();
  const log: SetRequest[] = [];
  const reads: Array<{ startedAt: number; snapshot: DeviceSnapshot }> = [];
  for (let round = 0; round < 200; round++) {
    const desired = new Map<string, DesiredPeer>();
    const free = [...prefixes];
    for (const key of keys) {
      if (random() < 0.3) continue;
      const allowedIps = free.splice(0, Math.floor(random() * 2)).concat(random() < 0.2 && free.length > 0 ? free.splice(Math.floor(random() * free.length), 1) : []);
      const peer: DesiredPeer = {
        nodeName: keyToBase64(key).slice(0, 6), publicKey: keyToBase64(key), publicKeyBytes: key,
        endpoint: `172.16.1.${1 + Math.floor(random() * 3)}:51820`, endpointSource: 'published',
        allowedIps: allowedIps.sort(), persistentKeepalive: pick([0, 25]),
      };
      desired.set(peer.publicKey, peer);
    }
    // A read started some sets ago is answered now (before this round's set reaches the device).
    if (random() < 0.3) reads.push({ startedAt: Math.max(0, log.length - Math.floor(random() * 4)), snapshot: takeSnapshot(host) });
    const plan = planReconcile(desired, takeSnapshot(host), memory, { collectGarbage: true, canRemoveAllowedIp: true, nowWallMs: Date.UTC(2026, 0, 1) + round * 1000 });
    if (!plan.request) continue;
    log.push(plan.request);
    assert.equal(await applySetRequest(host, plan.request), 0);
  }
  assert.ok(reads.length > 20, 'the rounds should make reads');
  const now = view(takeSnapshot(host));
  for (const read of reads) {
    let model = read.snapshot;
    for (const request of log.slice(read.startedAt)) model = applySetToSnapshot(model, request);
    assert.deepEqual(view(model), now, `a read started before set ${read.startedAt}`);
  }
});
