/**
 * Applying UAPI `set` requests to a real WireGuardCore (manual clock, in-memory outputs) and
 * taking `get` snapshots: replace_peers, replace_allowed_ips, prefixes moving between peers,
 * removal, update_only, our own key, private key changes, listen port failures, keepalives.
 */
import { before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { ManualClock } from '../../dataplane/clock.ts';
import { WireGuardCore } from '../../dataplane/core.ts';
import type { Crypto } from '../../dataplane/crypto/primitives.ts';
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import type { Endpoint } from '../../dataplane/net/endpoint.ts';
import { formatPrefix, parsePrefix } from '../../dataplane/net/ip.ts';
import { generatePrivateKey, keyToHex } from '../../dataplane/noise/keys.ts';
import {
  applySetRequest, createUapiHandler, errnoOf, takeSnapshot, type UapiHost,
} from '../../dataplane/uapi/uapi-device.ts';
import {
  UAPI_ERRNO, formatGetResponse, parseSetRequest, type SetRequest,
} from '../../dataplane/uapi/uapi-protocol.ts';
import { makeCorePair } from '../helpers/core-pair.ts';

let crypto: Crypto;
before(async () => { crypto = await selectCrypto(); });

/** The UDP side of a device, in memory: ports in `taken` cannot be bound. */
class FakeHost implements UapiHost {
  listenPort = 0;
  fwmark = 0;
  readonly taken = new Set<number>();
  readonly rebinds: number[] = [];
  rebindDelayMs = 0;
  constructor(readonly core: WireGuardCore) {}
  async setListenPort(port: number): Promise<void> {
    this.rebinds.push(port);
    if (this.rebindDelayMs > 0) await new Promise((resolve) => setTimeout(resolve, this.rebindDelayMs));
    if (this.taken.has(port)) throw Object.assign(new Error(`bind: port ${port} in use`), { code: 'EADDRINUSE' });
    this.listenPort = port === 0 ? 40000 + this.rebinds.length : port;
  }
  setFwmark(mark: number): void {
    this.fwmark = mark;
  }
}

interface Rig {
  clock: ManualClock;
  core: WireGuardCore;
  host: FakeHost;
  sent: Array<{ to: Endpoint; bytes: Uint8Array }>;
  /** Parses `text` (a set body) and applies it; returns the errno. */
  set(text: string): Promise<number>;
  /** The get answer. */
  get(): string;
  /** Public keys (hex) of the peers, in order. */
  peerKeys(): string[];
  /** Prefixes of the peer with public key `hexKey`. */
  prefixesOf(hexKey: string): string[];
}

function makeRig(): Rig {
  const clock = new ManualClock();
  const sent: Rig['sent'] = [];
  const core = new WireGuardCore({
    crypto, clock,
    outputs: {
      sendDatagram(to, bytes) { sent.push({ to, bytes: Uint8Array.from(bytes) }); },
      deliverPacket() {},
    },
  });
  const host = new FakeHost(core);
  return {
    clock, core, host, sent,
    async set(text) {
      const parsed = parseSetRequest(text);
      if (!parsed.ok) return parsed.errno;
      return applySetRequest(host, parsed.request);
    },
    get: () => formatGetResponse(takeSnapshot(host)),
    peerKeys: () => [...core.peers].map((p) => keyToHex(p.publicKey)),
    prefixesOf(hexKey) {
      const peer = [...core.peers].find((p) => keyToHex(p.publicKey) === hexKey);
      assert.ok(peer, `no peer ${hexKey.slice(0, 8)}`);
      return core.allowedIps.entriesFor(peer).map(formatPrefix);
    },
  };
}

/** A fresh key pair as hex: [private, public]. */
function keyPair(): [string, string] {
  const priv = generatePrivateKey(crypto);
  return [keyToHex(priv), keyToHex(crypto.publicKey(priv))];
}

function publicKeyHex(): string {
  return keyPair()[1];
}

describe('applySetRequest: device settings', () => {
  test('private key, listen port, fwmark and a peer; the get answer shows them', async () => {
    const rig = makeRig();
    const [priv] = keyPair();
    const peer = publicKeyHex();
    const errno = await rig.set([
      `private_key=${priv}`, 'listen_port=51820', 'fwmark=42',
      `public_key=${peer}`, 'endpoint=[2001:db8::7]:51821', 'allowed_ip=10.0.0.2/32', 'allowed_ip=fd00::2/128',
      '', '',
    ].join('\n'));
    assert.equal(errno, 0);
    assert.equal(rig.host.listenPort, 51820);
    assert.equal(rig.host.fwmark, 42);
    assert.equal(keyToHex(rig.core.ourPrivateKey!), priv);
    assert.equal(rig.get(), [
      `private_key=${priv}`, 'listen_port=51820', 'fwmark=42',
      `public_key=${peer}`, `preshared_key=${'0'.repeat(64)}`, 'protocol_version=1', 'endpoint=[2001:db8::7]:51821',
      'last_handshake_time_sec=0', 'last_handshake_time_nsec=0', 'tx_bytes=0', 'rx_bytes=0',
      'persistent_keepalive_interval=0', 'allowed_ip=10.0.0.2/32', 'allowed_ip=fd00::2/128',
      'errno=0', '', '',
    ].join('\n'));
  });

  test('an all-zero private key clears it; get then leaves private_key out', async () => {
    const rig = makeRig();
    assert.equal(await rig.set(`private_key=${keyPair()[0]}\n\n`), 0);
    assert.ok(rig.core.ourPrivateKey);
    assert.equal(await rig.set(`private_key=${'0'.repeat(64)}\n\n`), 0);
    assert.equal(rig.core.ourPrivateKey, undefined);
    assert.equal(rig.get(), 'errno=0\n\n');
  });

  test('setting the same private key again keeps the sessions; a new key ends them', async () => {
    const pair = makeCorePair(crypto);
    pair.a.peer.initiateHandshake();
    pair.pump();
    assert.ok(pair.a.peer.keypairs.current, 'a session exists');
    const host = new FakeHost(pair.a.core);
    const same = keyToHex(pair.a.core.ourPrivateKey!);
    assert.equal(await applySetRequest(host, { privateKey: Buffer.from(same, 'hex'), replacePeers: false, peers: [] }), 0);
    assert.ok(pair.a.peer.keypairs.current, 'unchanged key: session kept (wg syncconf does not interrupt traffic)');
    assert.equal(await applySetRequest(host, { privateKey: generatePrivateKey(crypto), replacePeers: false, peers: [] }), 0);
    assert.equal(pair.a.peer.keypairs.current, null, 'new key: sessions ended');
  });

  test('a new private key removes the peer that has our new public key', async () => {
    const rig = makeRig();
    const [priv, pub] = keyPair();
    const other = publicKeyHex();
    assert.equal(await rig.set(`public_key=${pub}\nallowed_ip=10.0.0.1/32\npublic_key=${other}\n\n`), 0);
    assert.deepEqual(rig.peerKeys(), [pub, other]);
    assert.equal(await rig.set(`private_key=${priv}\n\n`), 0);
    assert.deepEqual(rig.peerKeys(), [other]);
    assert.equal(rig.core.allowedIps.size, 0, 'its prefixes went with it');
  });

  test('listen port: taken → EADDRINUSE, what came before stays, the rest is skipped', async () => {
    const rig = makeRig();
    rig.host.taken.add(5555);
    const [priv] = keyPair();
    const peer = publicKeyHex();
    const errno = await rig.set(`private_key=${priv}\nlisten_port=5555\nfwmark=9\npublic_key=${peer}\n\n`);
    assert.equal(errno, UAPI_ERRNO.EADDRINUSE);
    assert.equal(keyToHex(rig.core.ourPrivateKey!), priv, 'applied before the failure');
    assert.equal(rig.host.listenPort, 0);
    assert.equal(rig.host.fwmark, 0, 'not applied after the failure');
    assert.deepEqual(rig.peerKeys(), []);
  });

  test('listen port: the same port is not rebound; 0 always rebinds (any free port)', async () => {
    const rig = makeRig();
    assert.equal(await rig.set('listen_port=6000\n\n'), 0);
    assert.equal(await rig.set('listen_port=6000\n\n'), 0);
    assert.deepEqual(rig.host.rebinds, [6000]);
    assert.equal(await rig.set('listen_port=0\n\n'), 0);
    assert.deepEqual(rig.host.rebinds, [6000, 0]);
    assert.notEqual(rig.host.listenPort, 0);
  });

  test('host failures map to errno by code; unknown ones to −55; nothing throws', async () => {
    const rig = makeRig();
    rig.host.setFwmark = () => { throw Object.assign(new Error('no permission'), { code: 'EPERM' }); };
    assert.equal(await rig.set('fwmark=1\n\n'), -1);
    rig.host.setFwmark = () => { throw new Error('odd'); };
    assert.equal(await rig.set('fwmark=2\n\n'), UAPI_ERRNO.UNKNOWN);
    rig.host.setListenPort = () => Promise.reject(Object.assign(new Error('denied'), { code: 'EACCES' }));
    assert.equal(await rig.set('listen_port=80\n\n'), -13);
    rig.host.setListenPort = () => Promise.reject(new Error('no code'));
    assert.equal(await rig.set('listen_port=81\n\n'), UAPI_ERRNO.EADDRINUSE, 'a failed rebind without a code is EADDRINUSE, as in wireguard-go');
    assert.equal(errnoOf({ code: 'ENOTACODE' }, -55), -55);
    assert.equal(errnoOf(null, -5), -5);
  });
});

describe('applySetRequest: peers', () => {
  test('replace_peers removes every existing peer first', async () => {
    const rig = makeRig();
    const [a, b, c] = [publicKeyHex(), publicKeyHex(), publicKeyHex()];
    assert.equal(await rig.set(`public_key=${a}\nallowed_ip=10.0.0.1/32\npublic_key=${b}\n\n`), 0);
    assert.equal(await rig.set(`replace_peers=true\npublic_key=${c}\nallowed_ip=10.0.0.3/32\n\n`), 0);
    assert.deepEqual(rig.peerKeys(), [c]);
    assert.deepEqual(rig.prefixesOf(c), ['10.0.0.3/32']);
    assert.equal(rig.core.allowedIps.size, 1);
    assert.equal(await rig.set('replace_peers=true\n\n'), 0);
    assert.deepEqual(rig.peerKeys(), []);
  });

  test('allowed_ip adds; replace_allowed_ips clears the peer first', async () => {
    const rig = makeRig();
    const a = publicKeyHex();
    assert.equal(await rig.set(`public_key=${a}\nallowed_ip=10.0.0.0/24\nallowed_ip=fd00::/64\n\n`), 0);
    assert.equal(await rig.set(`public_key=${a}\nallowed_ip=10.1.0.0/16\n\n`), 0);
    assert.deepEqual(rig.prefixesOf(a), ['10.0.0.0/24', 'fd00::/64', '10.1.0.0/16'], 'without replace: added');
    assert.equal(await rig.set(`public_key=${a}\nreplace_allowed_ips=true\nallowed_ip=192.168.0.0/16\n\n`), 0);
    assert.deepEqual(rig.prefixesOf(a), ['192.168.0.0/16']);
    assert.equal(await rig.set(`public_key=${a}\nreplace_allowed_ips=true\n\n`), 0);
    assert.deepEqual(rig.prefixesOf(a), []);
  });

  test('a prefix added to another peer moves there', async () => {
    const rig = makeRig();
    const [a, b] = [publicKeyHex(), publicKeyHex()];
    assert.equal(await rig.set(`public_key=${a}\nallowed_ip=10.0.0.0/24\nallowed_ip=10.0.1.0/24\npublic_key=${b}\n\n`), 0);
    assert.equal(await rig.set(`public_key=${b}\nallowed_ip=10.0.1.0/24\n\n`), 0);
    assert.deepEqual(rig.prefixesOf(a), ['10.0.0.0/24']);
    assert.deepEqual(rig.prefixesOf(b), ['10.0.1.0/24']);
    assert.equal(rig.core.allowedIps.lookup(new Uint8Array([10, 0, 1, 9])), rig.core.getPeer(Buffer.from(b, 'hex')));
  });

  test('"-" removes a prefix from this peer only', async () => {
    const rig = makeRig();
    const [a, b] = [publicKeyHex(), publicKeyHex()];
    assert.equal(await rig.set(`public_key=${a}\nallowed_ip=10.0.0.0/24\nallowed_ip=fd00::/64\npublic_key=${b}\nallowed_ip=10.9.0.0/16\n\n`), 0);
    assert.equal(await rig.set(`public_key=${a}\nallowed_ip=-fd00::/64\nallowed_ip=-10.9.0.0/16\nallowed_ip=-172.16.0.0/12\n\n`), 0);
    assert.deepEqual(rig.prefixesOf(a), ['10.0.0.0/24']);
    assert.deepEqual(rig.prefixesOf(b), ['10.9.0.0/16'], 'another peer\'s prefix is untouched');
  });

  test('replace_allowed_ips after allowed_ip lines: the earlier additions still took prefixes away', async () => {
    const rig = makeRig();
    const [a, b] = [publicKeyHex(), publicKeyHex()];
    assert.equal(await rig.set(`public_key=${b}\nallowed_ip=10.0.0.1/32\n\n`), 0);
    assert.equal(await rig.set(`public_key=${a}\nallowed_ip=10.0.0.1/32\nreplace_allowed_ips=true\nallowed_ip=10.0.0.2/32\n\n`), 0);
    assert.deepEqual(rig.prefixesOf(a), ['10.0.0.2/32']);
    assert.deepEqual(rig.prefixesOf(b), [], 'as if the lines ran in order');
  });

  test('remove=true deletes the peer and its prefixes; removing a missing peer is fine', async () => {
    const rig = makeRig();
    const [a, b] = [publicKeyHex(), publicKeyHex()];
    assert.equal(await rig.set(`public_key=${a}\nallowed_ip=10.0.0.0/24\npublic_key=${b}\n\n`), 0);
    assert.equal(await rig.set(`public_key=${a}\nremove=true\n\n`), 0);
    assert.deepEqual(rig.peerKeys(), [b]);
    assert.equal(rig.core.allowedIps.size, 0);
    const missing = publicKeyHex();
    assert.equal(await rig.set(`public_key=${missing}\nremove=true\nallowed_ip=10.0.0.0/8\n\n`), 0);
    assert.deepEqual(rig.peerKeys(), [b], 'not created, and its other keys ignored');
  });

  test('update_only: a missing peer is not created; an existing one is updated', async () => {
    const rig = makeRig();
    const [a, b] = [publicKeyHex(), publicKeyHex()];
    assert.equal(await rig.set(`public_key=${a}\nupdate_only=true\nallowed_ip=10.0.0.0/24\n\n`), 0);
    assert.deepEqual(rig.peerKeys(), []);
    assert.equal(rig.core.allowedIps.size, 0);
    assert.equal(await rig.set(`public_key=${b}\n\n`), 0);
    assert.equal(await rig.set(`public_key=${b}\nupdate_only=true\nendpoint=192.0.2.1:1\nallowed_ip=10.0.0.0/24\n\n`), 0);
    assert.deepEqual(rig.peerKeys(), [b]);
    assert.deepEqual(rig.prefixesOf(b), ['10.0.0.0/24']);
    assert.equal(rig.core.getPeer(Buffer.from(b, 'hex'))?.endpoint?.toString(), '192.0.2.1:1');
  });

  test('a section for our own public key is ignored without error; the others apply', async () => {
    const rig = makeRig();
    const [priv, pub] = keyPair();
    const other = publicKeyHex();
    assert.equal(await rig.set(`private_key=${priv}\npublic_key=${pub}\nallowed_ip=10.0.0.0/8\nendpoint=192.0.2.1:1\npublic_key=${other}\nallowed_ip=10.1.0.0/16\n\n`), 0);
    assert.deepEqual(rig.peerKeys(), [other]);
    assert.deepEqual(rig.prefixesOf(other), ['10.1.0.0/16']);
    assert.equal(rig.core.allowedIps.size, 1);
  });

  test('preshared key, endpoint and keepalive are set and reported', async () => {
    const rig = makeRig();
    const a = publicKeyHex();
    const psk = 'ab'.repeat(32);
    assert.equal(await rig.set(`public_key=${a}\npreshared_key=${psk}\nendpoint=198.51.100.9:4000\npersistent_keepalive_interval=25\n\n`), 0);
    const snap = takeSnapshot(rig.host).peers[0];
    assert.equal(keyToHex(snap.presharedKey), psk);
    assert.equal(snap.endpoint?.toString(), '198.51.100.9:4000');
    assert.equal(snap.persistentKeepalive, 25);
    assert.equal(await rig.set(`public_key=${a}\npreshared_key=${'0'.repeat(64)}\npersistent_keepalive_interval=0\nendpoint=[fd00::9]:4001\n\n`), 0);
    const after = takeSnapshot(rig.host).peers[0];
    assert.equal(keyToHex(after.presharedKey), '0'.repeat(64));
    assert.equal(after.persistentKeepalive, 0);
    assert.equal(after.endpoint?.toString(), '[fd00::9]:4001');
  });

  test('enabling a persistent keepalive sends at once, to the endpoint of the same request', async () => {
    const rig = makeRig();
    assert.equal(await rig.set(`private_key=${keyPair()[0]}\n\n`), 0);
    const a = publicKeyHex();
    assert.equal(await rig.set(`public_key=${a}\npersistent_keepalive_interval=25\nendpoint=192.0.2.44:51820\n\n`), 0);
    // No session yet: the keepalive starts a handshake (a 148-byte initiation).
    assert.equal(rig.sent.length, 1);
    assert.equal(rig.sent[0].to.toString(), '192.0.2.44:51820');
    assert.equal(rig.sent[0].bytes.length, 148);
    assert.equal(rig.sent[0].bytes[0], 1);
    // Setting it again (unchanged, or another non-zero value) sends nothing more.
    assert.equal(await rig.set(`public_key=${a}\npersistent_keepalive_interval=30\n\n`), 0);
    assert.equal(rig.sent.length, 1);
  });

  test('the same key twice in one request: sections apply in turn', async () => {
    const rig = makeRig();
    const a = publicKeyHex();
    assert.equal(await rig.set(`public_key=${a}\nallowed_ip=10.0.0.0/24\npublic_key=${a}\nremove=true\npublic_key=${a}\nallowed_ip=10.0.1.0/24\n\n`), 0);
    assert.deepEqual(rig.prefixesOf(a), ['10.0.1.0/24']);
  });

  test('a rejected request changes nothing (validated before anything is applied)', async () => {
    const rig = makeRig();
    const a = publicKeyHex();
    const errno = await rig.set(`listen_port=7000\npublic_key=${a}\nallowed_ip=10.0.0.0/24\nallowed_ip=bogus\n\n`);
    assert.equal(errno, UAPI_ERRNO.EINVAL);
    assert.equal(rig.host.listenPort, 0);
    assert.deepEqual(rig.peerKeys(), []);
  });
});

describe('createUapiHandler', () => {
  test('operations run one at a time: a get waits for a set that is rebinding', async () => {
    const rig = makeRig();
    rig.host.rebindDelayMs = 30;
    const handler = createUapiHandler(rig.host);
    const a = publicKeyHex();
    const request: SetRequest = {
      listenPort: 7777, replacePeers: false,
      peers: [{ publicKey: Buffer.from(a, 'hex'), remove: false, updateOnly: false, replaceAllowedIps: false, allowedIps: [{ prefix: parsePrefix('10.0.0.0/8'), remove: false }] }],
    };
    const setting = handler.set(request);
    const getting = handler.get();
    const [errno, snapshot] = await Promise.all([setting, getting]);
    assert.equal(errno, 0);
    assert.ok(typeof snapshot !== 'string');
    assert.equal(snapshot.listenPort, 7777);
    assert.equal(snapshot.peers.length, 1, 'the get saw the whole set');
  });

  test('a failing operation does not block the queue', async () => {
    const rig = makeRig();
    rig.host.taken.add(1);
    const handler = createUapiHandler(rig.host);
    assert.equal(await handler.set({ listenPort: 1, replacePeers: false, peers: [] }), UAPI_ERRNO.EADDRINUSE);
    assert.equal(await handler.set({ listenPort: 2, replacePeers: false, peers: [] }), 0);
    const snap = await handler.get();
    assert.ok(typeof snap !== 'string' && snap.listenPort === 2);
  });
});
