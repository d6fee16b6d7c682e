/**
 * A keypair's keys are used only while it is valid (issue 12, item 1): the hold/retire rules of
 * Keypair, what the peer retires and frees, the all-zero key refused by the lowest-level seal and
 * open (inline and in a worker thread), and the pipelines dropping work queued for a keypair that
 * was retired before the work ran. The model test (keypair-lifetime-model.test.ts) attacks the
 * same rules at random; these tests pin each rule down on its own.
 */
import { before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import { writeCounterNonce, type Crypto } from '../../dataplane/crypto/primitives.ts';
import { Endpoint } from '../../dataplane/net/endpoint.ts';
import { isZeroKey } from '../../dataplane/noise/keys.ts';
import { SLOT_ZERO_KEY, sealBatch, type BatchView } from '../../dataplane/session/batch-seal.ts';
import { Keypair } from '../../dataplane/session/keypair.ts';
import { ManualClock } from '../../dataplane/clock.ts';
import { PRODUCTION_TIMINGS } from '../../dataplane/constants.ts';
import { NO_KEYPAIR } from '../../dataplane/session/send-table.ts';
import { KeypairTable } from '../../dataplane/session/keypair-table.ts';
import type { Peer } from '../../dataplane/session/peer.ts';
import type { MemoryBind } from '../../dataplane/bind/memory-bind.ts';
import { ZERO_KEY, openTransport, sealTransportInPlace } from '../../dataplane/session/transport.ts';
import { makeCorePair } from '../helpers/core-pair.ts';
import { makeDevicePair } from '../helpers/device-pair.ts';
import { writeU32le } from '../helpers/fuzz.ts';
import { buildEchoRequest } from '../system/packets.ts';

const MTU = 1420;
let crypto: Crypto;
before(async () => {
  crypto = await selectCrypto();
});

const keypairTable = new KeypairTable();

function keypair(): Keypair {
  return new Keypair({
    sendKey: crypto.randomBytes(32), receiveKey: crypto.randomBytes(32), isInitiator: true, localIndex: 7, remoteIndex: 9,
  }, 0, keypairTable);
}

const zeros = (key: Uint8Array) => isZeroKey(key);

/** A datagram to `index` sealed under `key` by hand (what an attacker can make). */
function forged(key: Uint8Array, index: number, counter: number, inner: Uint8Array): Uint8Array {
  const padded = Math.ceil(inner.length / 16) * 16;
  const bytes = new Uint8Array(16 + padded + 16);
  bytes[0] = 4;
  writeU32le(bytes, 4, index);
  writeU32le(bytes, 8, counter);
  bytes.set(inner, 16);
  crypto.seal(key, writeCounterNonce(counter), bytes.subarray(16, 16 + padded), undefined, bytes.subarray(16));
  return bytes;
}

describe('Keypair: holds and retirement', () => {
  test('retired with no hold: invalid and zeroed at once', () => {
    const k = keypair();
    assert.equal(k.retired, false);
    k.retire();
    assert.equal(k.retired, true);
    assert.equal(k.keysZeroed, true);
    assert.ok(zeros(k.sendKey) && zeros(k.receiveKey));
  });

  test('retired while held: invalid at once, keys intact until the last hold is released', () => {
    const k = keypair();
    const send = k.sendKey.slice();
    k.hold();
    k.hold();
    k.retire();
    assert.equal(k.retired, true, 'no longer valid the moment it is retired');
    assert.deepEqual(k.sendKey, send, 'but a queued batch may still be reading its keys');
    k.release();
    assert.equal(k.keysZeroed, false, 'one hold is left');
    k.release();
    assert.equal(k.keysZeroed, true);
    assert.ok(zeros(k.sendKey) && zeros(k.receiveKey));
  });

  test('holds on a valid keypair zero nothing; releasing more than was held is a bug and throws', () => {
    const k = keypair();
    const receive = k.receiveKey.slice();
    k.hold();
    k.release();
    assert.equal(k.retired, false);
    assert.deepEqual(k.receiveKey, receive);
    assert.throws(() => k.release(), /without a hold/);
    k.retire();
    k.retire(); // twice is harmless
    assert.equal(k.keysZeroed, true);
  });
});

describe('Peer: what is retired, freed and zeroed', () => {
  test('a replaced keypair is retired, its index unregistered and its keys zeroed', () => {
    const pair = makeCorePair(crypto);
    pair.a.core.sendPacket(buildEchoRequest({ src: '10.0.0.1', dst: '10.0.0.2', id: 1, seq: 1 }));
    pair.pump();
    const first = pair.a.peer.keypairs.current!;
    assert.ok(first && !first.retired);
    for (let i = 0; i < 2; i++) { // two rekeys: current -> previous -> gone
      pair.clock.advance(6000);
      pair.a.peer.initiateHandshake();
      pair.pump();
    }
    assert.ok(![pair.a.peer.keypairs.previous, pair.a.peer.keypairs.current, pair.a.peer.keypairs.next].includes(first));
    assert.equal(first.retired, true);
    assert.equal(first.keysZeroed, true);
    assert.equal(pair.a.core.indexTable.lookup(first.localIndex), undefined, 'its index leads nowhere');
  });

  test('expiring the sessions (a private-key change) also frees the index of a pending handshake', () => {
    const pair = makeCorePair(crypto);
    pair.a.peer.initiateHandshake(); // the initiation stays on the wire: the handshake is pending
    assert.equal(pair.a.core.indexTable.size, 1);
    pair.a.core.setPrivateKey(pair.a.core.ourPrivateKey!);
    assert.equal(pair.a.core.indexTable.size, 0, 'no index left behind for a handshake that can no longer finish');
    pair.pump(); // the stale initiation is answered; the answer finds no index
    pair.clock.advance(1000);
    pair.a.core.sendPacket(buildEchoRequest({ src: '10.0.0.1', dst: '10.0.0.2', id: 1, seq: 2 }));
    pair.pump();
    assert.equal(pair.b.delivered.length, 1, 'a new handshake works');
  });

  test('a removed peer\'s preshared key is zeroed, and so is a replaced one', () => {
    const psk = crypto.randomBytes(32);
    const pair = makeCorePair(crypto, { presharedKey: psk });
    const first = pair.a.peer.presharedKey;
    pair.a.peer.setPresharedKey(crypto.randomBytes(32));
    assert.ok(zeros(first), 'the replaced preshared key');
    const second = pair.a.peer.presharedKey;
    assert.ok(!zeros(second));
    pair.a.core.removePeer(pair.a.peer.publicKey);
    assert.ok(zeros(second), 'the removed peer\'s preshared key');
    pair.b.peer.setPresharedKey(pair.b.peer.presharedKey); // set to itself: copied before the old one is zeroed
    assert.deepEqual(pair.b.peer.presharedKey, psk);
  });
});

describe('the all-zero key is refused by the lowest-level seal and open', () => {
  const zeroKey = new Uint8Array(32);
  const inner = buildEchoRequest({ src: '10.0.0.1', dst: '10.0.0.2', id: 1, seq: 1, payload: new Uint8Array(100) });

  test('sealTransportInPlace and openTransport: ZERO_KEY, nothing written', () => {
    const buf = new Uint8Array(inner.length + 64);
    buf.set(inner, 16);
    const before = buf.slice();
    assert.equal(sealTransportInPlace(crypto, zeroKey, 5, 0, buf, inner.length, MTU), ZERO_KEY);
    assert.deepEqual(buf, before, 'the plaintext was not sealed');
    const datagram = forged(zeroKey, 5, 3, inner); // authentic under the zero key
    const out = new Uint8Array(datagram.length);
    assert.equal(openTransport(crypto, zeroKey, 3, datagram, out), ZERO_KEY);
    assert.ok(zeros(out), 'nothing was decrypted');
    assert.notEqual(openTransport(crypto, crypto.randomBytes(32), 3, datagram), ZERO_KEY, 'any other key is tried (and fails)');
  });

  test('the batch seal the TUN readers\' sealer runs refuses it too: every slot SLOT_ZERO_KEY, nothing sealed', () => {
    const slotSize = 2048;
    const batch: BatchView = { data: new Uint8Array(10 * slotSize), lengths: new Int32Array(10), counters: new Float64Array(10), slotSize, count: 10 };
    for (let i = 0; i < 10; i++) {
      batch.data.set(inner, i * slotSize + 16);
      batch.lengths[i] = inner.length;
      batch.counters[i] = i;
    }
    const plain = batch.data.slice();
    sealBatch(crypto, zeroKey, 5, MTU, batch);
    assert.deepEqual([...batch.lengths], Array(10).fill(SLOT_ZERO_KEY));
    assert.deepEqual(batch.data, plain, 'nothing sealed');
  });

  test('the core counts it (a valid keypair whose receive key is zeros: a bug the floor still catches)', () => {
    const pair = makeCorePair(crypto);
    pair.a.core.sendPacket(buildEchoRequest({ src: '10.0.0.1', dst: '10.0.0.2', id: 1, seq: 1 }));
    pair.pump();
    const k = pair.b.peer.keypairs.current ?? pair.b.peer.keypairs.next!;
    k.receiveKey.fill(0);
    pair.b.core.receiveDatagram(forged(zeroKey, k.localIndex, 100, inner), new Endpoint('203.0.113.9', 9));
    assert.equal(pair.b.core.drops.get('zero-key'), 1);
    assert.equal(pair.b.delivered.length, 1, 'only the genuine ping');
    assert.equal(pair.b.peer.endpoint?.host, '192.0.2.1');
  });
});

describe('work meets a keypair retired before it ran', () => {
  const turn = () => new Promise<void>((resolve) => setImmediate(resolve));
  async function until(condition: () => boolean, what: string): Promise<void> {
    const deadline = Date.now() + 10_000;
    while (!condition()) {
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
      await new Promise((r) => setTimeout(r, 2));
    }
  }

  /** A device pair with a session both ways; A's datagrams are then captured instead of delivered. */
  async function setUp(clock?: ManualClock) {
    const pair = await makeDevicePair(crypto, { clock });
    const ping = (from: 'a' | 'b', seq: number, size = 0) => buildEchoRequest({
      src: from === 'a' ? '10.0.0.1' : '10.0.0.2', dst: from === 'a' ? '10.0.0.2' : '10.0.0.1', id: 7, seq, payload: new Uint8Array(size),
    });
    pair.a.tun.inject(ping('a', 0));
    await until(() => pair.b.tun.written.length === 1, 'the first ping');
    pair.b.tun.inject(ping('b', 0));
    await until(() => pair.a.tun.written.length === 1, 'the answer');
    const captured: Uint8Array[] = [];
    pair.network.filter = (from, _to, d) => {
      if (from.host !== '192.0.2.1') return true;
      captured.push(d);
      return false;
    };
    const peerOf = (side: 'a' | 'b'): Peer => [...pair[side].device.core.peers][0];
    const deliverToB = (d: Uint8Array) => (pair.b.bind as MemoryBind).receiveFrom(d, new Endpoint('192.0.2.1', pair.a.bind.port));
    /** n large packets from A, sealed and captured. */
    const capture = async (n: number, firstSeq: number) => {
      captured.length = 0;
      for (let i = 0; i < n; i++) pair.a.tun.inject(ping('a', firstSeq + i, 1000));
      await until(() => captured.filter((d) => d[0] === 4).length === n, `${n} sealed datagrams`);
      return captured.splice(0);
    };
    return { pair, ping, captured, peerOf, deliverToB, capture };
  }

  test('inbound, delivered on arrival under a confirmed keypair: written at once, and a key change before the device reads the records changes nothing', async () => {
    const t = await setUp();
    try {
      const datagrams = await t.capture(20, 1);
      const k = t.peerOf('b').keypairs.current!;
      assert.equal(k.readerDelivers, true, 'confirmed: the receiving side may deliver its packets');
      const written = t.pair.b.tun.written.length;
      const before = { ...(t.pair.b.bind as MemoryBind).openerCounts! };
      for (const d of datagrams) t.deliverToB(d);
      assert.equal(t.pair.b.tun.written.length, written + 20, 'written as they arrived');
      assert.equal((t.pair.b.bind as MemoryBind).openerCounts!.delivered - before.delivered, 20);
      const rx = t.peerOf('b').rxBytes;
      t.pair.b.device.core.setPrivateKey(t.pair.b.device.core.ourPrivateKey!); // same turn: every session ends
      assert.equal(k.keysZeroed, true, 'nothing holds it');
      await turn();
      await turn();
      assert.deepEqual(t.pair.b.device.core.drops.snapshot(), {}, 'nothing dropped: they were out before the keypair went');
      assert.equal(t.pair.b.tun.written.length, written + 20, 'and nothing written twice');
      assert.equal(rx, t.peerOf('b').rxBytes, 'no books kept for a peer whose sessions ended');
      for (const d of datagrams) t.deliverToB(d); // the same datagrams again
      await turn();
      assert.equal(t.pair.b.tun.written.length, written + 20, 'replays under a gone keypair deliver nothing');
    } finally {
      await t.pair.close();
    }
  });

  test('inbound, opened on arrival, then retired before the device handles it (a key change in the same turn): not delivered, keys zeroed at once', async () => {
    const t = await setUp();
    try {
      const datagrams = await t.capture(20, 1);
      const k = t.peerOf('b').keypairs.current!;
      k.stopReaderDelivery(); // as near its expiry: the main thread decides
      const written = t.pair.b.tun.written.length;
      const before = { ...(t.pair.b.bind as MemoryBind).openerCounts! };
      for (const d of datagrams) t.deliverToB(d); // B's bind opens each under k as it arrives
      const opener = (t.pair.b.bind as MemoryBind).openerCounts!;
      assert.equal(opener.opened - before.opened, 20, 'opened on arrival');
      t.pair.b.device.core.setPrivateKey(t.pair.b.device.core.ourPrivateKey!); // same turn: every session ends
      assert.equal(k.retired, true);
      assert.equal(k.keysZeroed, true, 'nothing holds it: the opener let go after each datagram');
      await turn();
      await turn();
      assert.equal(t.pair.b.device.core.drops.get('keypair-retired'), 20, 'opened under a keypair that is gone when handled');
      assert.equal(t.pair.b.tun.written.length, written, 'nothing delivered');
    } finally {
      await t.pair.close();
    }
  });

  test('inbound, retired before its datagrams arrive: the bind opens nothing under it, the device drops them', async () => {
    const t = await setUp();
    try {
      const datagrams = await t.capture(20, 1);
      const k = t.peerOf('b').keypairs.current!;
      const written = t.pair.b.tun.written.length;
      t.pair.b.device.core.removePeer(t.peerOf('b').publicKey); // the peer goes away first
      assert.equal(k.retired, true);
      assert.equal(k.keysZeroed, true);
      const before = { ...(t.pair.b.bind as MemoryBind).openerCounts! };
      for (const d of datagrams) t.deliverToB(d);
      const opener = (t.pair.b.bind as MemoryBind).openerCounts!;
      assert.deepEqual([opener.opened - before.opened, opener.failed - before.failed, opener.left - before.left], [0, 0, 20], 'left as they came');
      await turn();
      await turn();
      assert.equal(t.pair.b.device.core.drops.get('unknown-index'), 20);
      assert.equal(t.pair.b.tun.written.length, written, 'nothing delivered for a removed peer');
    } finally {
      await t.pair.close();
    }
  });

  test('outbound in a keypair\'s last second: the TUN leaves the packets, the core seals them under that keypair; once it is retired nothing is sealed under it', async () => {
    const clock = new ManualClock();
    const t = await setUp(clock);
    try {
      const k = t.peerOf('a').keypairs.current!;
      // Within the last second of the keypair's life the TUN may no longer seal under it (the
      // send table names nothing: send-table.ts); the main thread still sends with it.
      clock.advance(PRODUCTION_TIMINGS.rejectAfterTime - 500 - (clock.now() - k.created));
      t.pair.a.device.core.tick();
      assert.equal(t.pair.a.device.core.sendTable.read(t.peerOf('a').number)!.keySlot, NO_KEYPAIR);
      const left = t.pair.a.tun.sealerCounts!.left;
      t.captured.length = 0;
      for (let i = 0; i < 20; i++) t.pair.a.tun.inject(t.ping('a', 100 + i, 1000));
      await until(() => t.captured.filter((d) => d[0] === 4).length === 20, 'the 20 sealed by the core');
      assert.equal(t.pair.a.tun.sealerCounts!.left - left, 20, 'all left by the TUN');
      t.pair.a.device.core.setPrivateKey(t.pair.a.device.core.ourPrivateKey!); // every session ends
      assert.equal(k.retired, true);
      assert.equal(k.keysZeroed, true, 'nothing holds it');
      t.captured.length = 0;
      for (let i = 0; i < 20; i++) t.pair.a.tun.inject(t.ping('a', 200 + i, 1000));
      await turn();
      await turn();
      assert.equal(t.captured.filter((d) => d[0] === 4).length, 0, 'nothing sealed under the retired keypair');
      assert.equal(t.pair.a.device.core.drops.get('zero-key'), 0, 'and never under zeros: staged for a new handshake');
    } finally {
      await t.pair.close();
    }
  });

  test('the zero-key floor in the pipelines: a valid keypair with zeroed keys (a bug) seals and opens nothing, both paths', async () => {
    const t = await setUp();
    try {
      const zeroKey = new Uint8Array(32);
      // Outbound: a burst and a lone small packet, both sealed by the TUN's sealer.
      const ka = t.peerOf('a').keypairs.current!;
      ka.sendKey.fill(0);
      t.captured.length = 0;
      for (let i = 0; i < 20; i++) t.pair.a.tun.inject(t.ping('a', 200 + i, 1000));
      await until(() => t.pair.a.device.core.drops.get('zero-key') === 20, 'the burst refused');
      t.pair.a.tun.inject(t.ping('a', 300));
      await until(() => t.pair.a.device.core.drops.get('zero-key') === 21, 'the lone packet refused');
      assert.equal(t.captured.filter((d) => d[0] === 4).length, 0, 'nothing sent');
      // Inbound: datagrams authentic under zeros, opened by the bind on arrival, and one handed to
      // the core as it came (what a bind that could not hold the keypair leaves to the main thread).
      const kb = t.peerOf('b').keypairs.current!;
      kb.receiveKey.fill(0);
      const written = t.pair.b.tun.written.length;
      const attacker = new Endpoint('203.0.113.9', 9);
      const bindB = t.pair.b.bind as MemoryBind;
      const asItCame = (d: Uint8Array) => (bindB as unknown as { deliver(d: Uint8Array, f: Endpoint, opened: undefined): void }).deliver(d, attacker, undefined);
      asItCame(forged(zeroKey, kb.localIndex, 1000, t.ping('a', 400)));
      const failedBefore = bindB.openerCounts!.failed;
      for (let i = 0; i < 20; i++) bindB.receiveFrom(forged(zeroKey, kb.localIndex, 1001 + i, t.ping('a', 401 + i, 1000)), attacker);
      assert.equal(bindB.openerCounts!.failed - failedBefore, 20, 'the bind\'s opener refused all 20');
      await until(() => t.pair.b.device.core.drops.get('zero-key') === 21, 'all 21 refused');
      await turn();
      assert.equal(t.pair.b.tun.written.length, written, 'nothing delivered');
      assert.equal(t.peerOf('b').endpoint?.host, '192.0.2.1', 'the endpoint did not move');
    } finally {
      await t.pair.close();
    }
  });
});
