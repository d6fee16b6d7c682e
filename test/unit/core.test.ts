/**
 * Two protocol cores back to back in memory: handshakes, data, rekeying, expiry, retries,
 * keepalives, cookies, replays and tampering, all on a manual clock.
 */
import { before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import type { Crypto } from '../../dataplane/crypto/primitives.ts';
import {
  KEEPALIVE_TIMEOUT, REJECT_AFTER_TIME, REKEY_AFTER_TIME, REKEY_ATTEMPT_TIME, REKEY_TIMEOUT,
} from '../../dataplane/constants.ts';
import { Endpoint } from '../../dataplane/net/endpoint.ts';
import { HandshakeState } from '../../dataplane/noise/noise-protocol.ts';
import { generatePrivateKey } from '../../dataplane/noise/keys.ts';
import { WireGuardCore } from '../../dataplane/core.ts';
import { ManualClock } from '../../dataplane/clock.ts';
import { A_INNER, B_INNER, makeCorePair, type CorePair, type InFlight } from '../helpers/core-pair.ts';
import { buildEchoRequest, parseEcho } from '../system/packets.ts';

let crypto: Crypto;
before(async () => { crypto = await selectCrypto(); });

const typeOf = (d: InFlight) => d.bytes[0];
const INITIATION = 1, RESPONSE = 2, COOKIE = 3, DATA = 4;

function ping(seq: number, from = A_INNER, to = B_INNER): Uint8Array {
  return buildEchoRequest({ src: from, dst: to, id: 7, seq, payload: new TextEncoder().encode(`payload ${seq}`) });
}

/** Sends pings from A to B and returns the sequence numbers B received. */
function seqsDelivered(packets: Uint8Array[]): number[] {
  return packets.map((p) => parseEcho(p)?.seq ?? -1);
}

function handshake(pair: CorePair): void {
  pair.a.peer.initiateHandshake();
  pair.pump();
}

describe('handshake', () => {
  test('A initiates: both sides derive matching sessions and B confirms on first data', () => {
    const pair = makeCorePair(crypto);
    pair.a.core.sendPacket(ping(1));
    assert.equal(pair.a.peer.stagedCount, 1, 'packet waits for the handshake');
    assert.deepEqual(pair.wire.map(typeOf), [INITIATION]);
    assert.equal(pair.wire[0].bytes.length, 148);
    pair.pump();
    // The response came back, A sent the staged ping; B promoted its `next` keypair on receipt.
    assert.deepEqual(pair.log.map(typeOf), [INITIATION, RESPONSE, DATA]);
    assert.equal(pair.log[1].bytes.length, 92);
    assert.deepEqual(seqsDelivered(pair.b.delivered), [1]);
    assert.ok(pair.a.peer.keypairs.current?.isInitiator);
    assert.equal(pair.b.peer.keypairs.next, null);
    assert.equal(pair.b.peer.keypairs.current?.isInitiator, false);
    assert.ok(pair.a.peer.lastHandshakeWallMs > 0 && pair.b.peer.lastHandshakeWallMs > 0);
    assert.equal(pair.a.core.drops.total(), 0);
    assert.equal(pair.b.core.drops.total(), 0);
  });

  test('B initiates: handshake in the other direction, data both ways', () => {
    const pair = makeCorePair(crypto);
    pair.b.core.sendPacket(ping(5, B_INNER, A_INNER));
    pair.pump();
    assert.deepEqual(seqsDelivered(pair.a.delivered), [5]);
    pair.a.core.sendPacket(ping(6));
    pair.pump();
    assert.deepEqual(seqsDelivered(pair.b.delivered), [6]);
    assert.ok(pair.b.peer.keypairs.current?.isInitiator);
  });

  test('responder does not send on an unconfirmed keypair: its packets wait for confirmation', () => {
    const pair = makeCorePair(crypto);
    handshake(pair); // A initiates; A answers the response with a keepalive, which confirms
    assert.ok(pair.b.peer.keypairs.current, 'keepalive from A confirmed the keys');
    const fresh = makeCorePair(crypto);
    fresh.a.peer.initiateHandshake();
    fresh.pump((d) => typeOf(d) !== DATA); // deliver the handshake but lose A's confirming keepalive
    assert.ok(fresh.b.peer.keypairs.next, 'B holds the new keypair in next');
    assert.equal(fresh.b.peer.keypairs.current, null);
    fresh.b.core.sendPacket(ping(9, B_INNER, A_INNER));
    assert.equal(fresh.wire.filter((d) => d.from === 'b' && typeOf(d) === DATA).length, 0,
      'B may not encrypt with an unconfirmed key');
    fresh.a.core.sendPacket(ping(10));
    fresh.pump();
    assert.deepEqual(seqsDelivered(fresh.b.delivered), [10]);
    assert.deepEqual(seqsDelivered(fresh.a.delivered), [9], 'B sent its staged packet once confirmed');
  });

  test('works with a preshared key, and fails closed when the keys differ', () => {
    const psk = crypto.randomBytes(32);
    const pair = makeCorePair(crypto, { presharedKey: psk });
    pair.a.core.sendPacket(ping(1));
    pair.pump();
    assert.deepEqual(seqsDelivered(pair.b.delivered), [1]);

    const mismatch = makeCorePair(crypto, { presharedKey: psk });
    mismatch.b.peer.setPresharedKey(crypto.randomBytes(32));
    mismatch.a.core.sendPacket(ping(1));
    mismatch.pump();
    assert.equal(mismatch.b.delivered.length, 0);
    assert.equal(mismatch.a.core.drops.get('handshake-failed'), 1, 'A cannot open the response');
  });

  test('rejects a peer that is not configured, and a wrong-key initiation', () => {
    const pair = makeCorePair(crypto);
    pair.b.core.removePeer(pair.a.core.ourPublicKey!);
    handshake(pair);
    assert.equal(pair.b.core.drops.get('unknown-peer'), 1);
    assert.equal(pair.a.peer.hasSession, false);
  });

  test('a replaced private key is wiped, and the crypto provider told to forget it', () => {
    const calls: string[] = [];
    const hexOf = (k: Uint8Array | undefined) => (k ? Buffer.from(k).toString('hex').slice(0, 8) : '-');
    const told: Crypto = { ...crypto, replaceStaticKey: (next, previous) => { calls.push(`${hexOf(next)}/${hexOf(previous)}`); } };
    const core = new WireGuardCore({ crypto: told, clock: new ManualClock(), outputs: { sendDatagram() {}, deliverPacket() {} } });
    const first = generatePrivateKey(crypto);
    core.setPrivateKey(first);
    const held = core.ourPrivateKey!;
    const heldHex = hexOf(held);
    assert.deepEqual(calls, [`${heldHex}/-`], 'the new key is announced as static');
    core.setPrivateKey(Uint8Array.from(held)); // the same key again: nothing to forget
    const same = core.ourPrivateKey!;
    assert.ok(held.every((b) => b === 0), 'the replaced buffer is zero even for the same key');
    assert.deepEqual(calls.slice(1), [`${heldHex}/-`]);
    core.setPrivateKey(generatePrivateKey(crypto));
    assert.ok(same.every((b) => b === 0), 'the old key is zero');
    assert.equal(calls.at(-1), `-/${heldHex}`, 'and forgotten by the provider');
    const last = core.ourPrivateKey!;
    core.setPrivateKey(new Uint8Array(32)); // clearing the key wipes it too
    assert.equal(core.ourPrivateKey, undefined);
    assert.ok(last.every((b) => b === 0));
    void first;
  });
});

// Simultaneous start (initiations that cross): test/unit/crossed-handshakes.test.ts.

describe('transport data', () => {
  test('data both ways over IPv4 and IPv6, with padding stripped and counters kept', () => {
    const pair = makeCorePair(crypto);
    for (let i = 0; i < 20; i++) pair.a.core.sendPacket(ping(i));
    pair.pump();
    for (let i = 0; i < 20; i++) pair.b.core.sendPacket(ping(100 + i, B_INNER, A_INNER));
    pair.b.core.sendPacket(buildEchoRequest({ src: 'fd00::2', dst: 'fd00::1', id: 1, seq: 77 }));
    pair.pump();
    assert.deepEqual(seqsDelivered(pair.b.delivered), [...Array(20).keys()]);
    assert.deepEqual(seqsDelivered(pair.a.delivered), [...[...Array(20).keys()].map((i) => 100 + i), 77]);
    const parsed = parseEcho(pair.b.delivered[3])!;
    assert.equal(new TextDecoder().decode(parsed.payload), 'payload 3');
    for (const d of pair.log.filter((x) => typeOf(x) === DATA)) assert.equal((d.bytes.length - 32) % 16, 0, 'padded to 16');
    assert.ok(pair.a.peer.txBytes > 0 && pair.a.peer.rxBytes > 0);
    assert.equal(pair.a.peer.txBytes, pair.b.peer.rxBytes);
    assert.equal(pair.b.peer.txBytes, pair.a.peer.rxBytes);
  });

  test('packets to addresses no peer owns are dropped as no-route', () => {
    const pair = makeCorePair(crypto);
    pair.a.core.sendPacket(ping(1, A_INNER, '10.9.9.9'));
    assert.equal(pair.wire.length, 0);
    assert.equal(pair.a.core.drops.get('no-route'), 1);
  });

  test('an inner source address outside the peer\'s allowed IPs is dropped', () => {
    const pair = makeCorePair(crypto);
    handshake(pair);
    pair.a.core.sendPacket(ping(1, '10.66.0.1', B_INNER)); // spoofed inner source
    pair.pump();
    assert.equal(pair.b.delivered.length, 0);
    assert.equal(pair.b.core.drops.get('allowed-ips-mismatch'), 1);
  });

  test('tampered bytes anywhere in a data message are rejected', () => {
    const pair = makeCorePair(crypto);
    handshake(pair);
    pair.a.core.sendPacket(ping(1));
    const original = pair.wire.shift()!;
    for (const offset of [8, 16, 20, original.bytes.length - 1]) {
      const bad = Uint8Array.from(original.bytes);
      bad[offset] ^= 0x01;
      pair.b.core.receiveDatagram(bad, original.source);
    }
    assert.equal(pair.b.delivered.length, 0);
    assert.equal(pair.b.core.drops.get('decryption-failed'), 4);
    pair.b.core.receiveDatagram(original.bytes, original.source);
    assert.deepEqual(seqsDelivered(pair.b.delivered), [1], 'the genuine message still gets through');
  });

  test('a captured data message replayed later is rejected', () => {
    const pair = makeCorePair(crypto);
    handshake(pair);
    pair.a.core.sendPacket(ping(1));
    const captured = Uint8Array.from(pair.wire[0].bytes);
    pair.pump();
    pair.advance(5_000);
    pair.b.core.receiveDatagram(captured, pair.a.endpoint);
    assert.equal(pair.b.delivered.length, 1);
    assert.equal(pair.b.core.drops.get('replay'), 1);
  });

  test('malformed datagrams are dropped with a reason and never throw', () => {
    const pair = makeCorePair(crypto);
    const src = new Endpoint('203.0.113.9', 4000);
    const cases: [Uint8Array, string][] = [
      [new Uint8Array(0), 'too-short'],
      [new Uint8Array(31).fill(4), 'too-short'],
      [Uint8Array.from({ length: 148 }, (_, i) => (i === 0 ? 9 : 0)), 'unknown-type'],
      [Uint8Array.from({ length: 148 }, (_, i) => (i === 0 ? 1 : i === 2 ? 1 : 0)), 'unknown-type'],
      [Uint8Array.from({ length: 149 }, (_, i) => (i === 0 ? 1 : 0)), 'bad-length'],
      [Uint8Array.from({ length: 91 }, (_, i) => (i === 0 ? 2 : 0)), 'bad-length'],
      [Uint8Array.from({ length: 65 }, (_, i) => (i === 0 ? 3 : 0)), 'bad-length'],
      [Uint8Array.from({ length: 148 }, (_, i) => (i === 0 ? 1 : 0)), 'bad-mac1'],
      [Uint8Array.from({ length: 92 }, (_, i) => (i === 0 ? 2 : 0)), 'bad-mac1'],
      [Uint8Array.from({ length: 64 }, (_, i) => (i === 0 ? 3 : 0)), 'bad-cookie-reply'],
      [Uint8Array.from({ length: 48 }, (_, i) => (i === 0 ? 4 : 0)), 'unknown-index'],
    ];
    for (const [bytes, reason] of cases) {
      const before = pair.b.core.drops.get(reason as never);
      pair.b.core.receiveDatagram(bytes, src);
      assert.equal(pair.b.core.drops.get(reason as never), before + 1, `expected drop reason ${reason}`);
    }
    for (let i = 0; i < 2000; i++) {
      const junk = crypto.randomBytes(1 + (i % 200));
      if (i % 4 === 0) junk[0] = 1 + (i % 4);
      pair.b.core.receiveDatagram(junk, src);
    }
    assert.equal(pair.b.delivered.length, 0);
    assert.equal(pair.wire.length, 0, 'nothing answers junk');
  });
});

describe('handshake replay and flood protection', () => {
  test('a captured initiation replayed is rejected by its timestamp', () => {
    const pair = makeCorePair(crypto);
    pair.a.peer.initiateHandshake();
    const captured = Uint8Array.from(pair.wire[0].bytes);
    pair.pump();
    const sessionBefore = pair.b.peer.keypairs.current;
    pair.advance(30_000);
    pair.b.core.receiveDatagram(captured, new Endpoint('203.0.113.50', 1234));
    assert.equal(pair.b.core.drops.get('handshake-replay'), 1);
    assert.equal(pair.b.peer.keypairs.current, sessionBefore, 'state untouched');
    assert.equal(pair.b.peer.endpoint?.host, '192.0.2.1', 'a replay does not move the endpoint');
    assert.equal(pair.wire.length, 0, 'no response to a replay');
  });

  test('initiations faster than one per 20 ms from a peer are dropped', () => {
    const pair = makeCorePair(crypto);
    pair.a.peer.initiateHandshake();
    const first = pair.wire.shift()!;
    pair.clock.advance(REKEY_TIMEOUT); // allow A to create another initiation
    pair.a.peer.initiateHandshake();
    const second = pair.wire.shift()!;
    pair.b.core.receiveDatagram(first.bytes, first.source);
    pair.b.core.receiveDatagram(second.bytes, second.source); // same instant for B: a flood
    assert.equal(pair.b.core.drops.get('handshake-flood'), 1);
  });
});

describe('timers', () => {
  test('rekey after 120 s without losing a packet, and the old keypair still receives', () => {
    const pair = makeCorePair(crypto);
    handshake(pair);
    const sent: number[] = [];
    let seq = 0;
    // Traffic every second for 6 minutes: several rekeys.
    for (let t = 0; t < 360; t++) {
      pair.a.core.sendPacket(ping(seq)); sent.push(seq++);
      pair.b.core.sendPacket(ping(seq, B_INNER, A_INNER)); seq++;
      pair.advance(1_000, 250);
    }
    assert.deepEqual(seqsDelivered(pair.b.delivered), sent);
    assert.equal(pair.a.delivered.length, 360);
    const initiations = pair.log.filter((d) => typeOf(d) === INITIATION).length;
    assert.ok(initiations >= 3, `expected at least 3 handshakes in 6 minutes, saw ${initiations}`);
    assert.deepEqual([pair.a.core.drops.snapshot(), pair.b.core.drops.snapshot()], [{}, {}]);
    const current = pair.a.peer.keypairs.current!;
    assert.ok(pair.clock.now() - current.created <= REKEY_AFTER_TIME + 2_000, 'keys are fresh');
  });

  test('in-flight packets under the previous keypair are still accepted after a rekey', () => {
    const pair = makeCorePair(crypto);
    handshake(pair);
    pair.a.core.sendPacket(ping(1));
    const inFlight = pair.wire.shift()!; // sent under the first keypair, delivered late
    pair.clock.advance(REKEY_AFTER_TIME + 1);
    pair.a.core.sendPacket(ping(2)); // old key still valid: sent, then a rekey starts
    pair.pump();
    assert.notEqual(pair.a.peer.keypairs.previous, null);
    pair.b.core.receiveDatagram(inFlight.bytes, inFlight.source);
    assert.deepEqual(seqsDelivered(pair.b.delivered).sort(), [1, 2]);
  });

  test('the receiving thread stops delivering a keypair\'s packets itself a second before its reject-after time, on both sides', () => {
    const pair = makeCorePair(crypto);
    handshake(pair);
    pair.a.core.sendPacket(ping(1));
    pair.pump(); // B confirms on A's first data
    const kA = pair.a.peer.keypairs.current!, kB = pair.b.peer.keypairs.current!;
    assert.equal(kA.readerDelivers && kB.readerDelivers, true, 'both confirmed: the receiving thread may deliver');
    pair.advance(REJECT_AFTER_TIME - 1300, 100);
    assert.equal(kA.readerDelivers && kB.readerDelivers, true, 'still delivering 1.3 s before');
    pair.advance(400, 100);
    assert.equal(kA.readerDelivers, false, 'A: the main thread decides from 1 s before');
    assert.equal(kB.readerDelivers, false, 'B: the main thread decides from 1 s before');
  });

  test('a session expires after 180 s: old data is rejected and sending starts a new handshake', () => {
    const pair = makeCorePair(crypto);
    handshake(pair);
    pair.a.core.sendPacket(ping(1));
    const late = pair.wire.shift()!;
    pair.clock.advance(REJECT_AFTER_TIME);
    assert.equal(pair.a.peer.hasSession, false);
    pair.b.core.receiveDatagram(late.bytes, late.source);
    assert.equal(pair.b.core.drops.get('expired-keypair'), 1);
    pair.a.core.sendPacket(ping(2));
    assert.deepEqual(pair.wire.map(typeOf), [INITIATION], 'no data under an expired key');
    pair.pump();
    assert.deepEqual(seqsDelivered(pair.b.delivered), [2]);
  });

  test('handshake retries every 5 s (+ jitter) and gives up after about 90 s', () => {
    const pair = makeCorePair(crypto);
    pair.a.core.sendPacket(ping(1));
    const times: number[] = [];
    const start = pair.clock.now();
    for (let t = 0; t < 150_000; t += 50) {
      for (const d of pair.wire.splice(0)) if (typeOf(d) === INITIATION) times.push(pair.clock.now() - start); // B unreachable
      pair.clock.advance(50);
      pair.a.core.tick();
    }
    for (let i = 1; i < times.length; i++) {
      const gap = times[i] - times[i - 1];
      assert.ok(gap >= REKEY_TIMEOUT && gap <= REKEY_TIMEOUT + 334 + 50, `retry gap ${gap} ms`);
    }
    assert.ok(times.length >= 18 && times.length <= 21, `saw ${times.length} initiations`);
    assert.ok(times[times.length - 1] >= REKEY_ATTEMPT_TIME && times[times.length - 1] < REKEY_ATTEMPT_TIME + 15_000);
    assert.equal(pair.a.peer.stagedCount, 0, 'staged packets flushed on give-up');
    assert.equal(pair.a.core.drops.get('handshake-gave-up'), 1);
  });

  test('passive keepalive: a receiver that has nothing to say answers after 10 s', () => {
    const pair = makeCorePair(crypto);
    handshake(pair);
    pair.advance(1_000);
    const before = pair.log.length;
    pair.a.core.sendPacket(ping(1));
    pair.pump();
    pair.advance(KEEPALIVE_TIMEOUT - 500);
    assert.equal(pair.log.slice(before).filter((d) => d.from === 'b').length, 0, 'not before 10 s');
    pair.advance(1_000);
    const fromB = pair.log.slice(before).filter((d) => d.from === 'b');
    assert.equal(fromB.length, 1);
    assert.equal(fromB[0].bytes.length, 32, 'a keepalive is an empty data message');
  });

  test('sending data without hearing back for 15 s starts a new handshake', () => {
    const pair = makeCorePair(crypto);
    handshake(pair);
    pair.a.core.sendPacket(ping(1));
    pair.wire.length = 0; // B never hears it, never answers
    const before = pair.log.length;
    pair.clock.advance(KEEPALIVE_TIMEOUT + REKEY_TIMEOUT - 10);
    pair.a.core.tick();
    assert.equal(pair.wire.length, 0);
    pair.clock.advance(400);
    pair.a.core.tick();
    assert.deepEqual(pair.log.slice(before).map(typeOf), [INITIATION]);
  });

  test('persistent keepalive sends every interval while idle', () => {
    const pair = makeCorePair(crypto, { persistentKeepalive: 3 });
    handshake(pair);
    const before = pair.log.length;
    pair.advance(10_000);
    const keepalives = pair.log.slice(before).filter((d) => d.from === 'a' && d.bytes.length === 32);
    assert.equal(keepalives.length, 3);
  });

  test('keys are wiped after 540 s of silence', () => {
    const pair = makeCorePair(crypto);
    handshake(pair);
    pair.clock.advance(3 * REJECT_AFTER_TIME + 1);
    pair.a.core.tick();
    assert.equal(pair.a.peer.keypairs.current, null);
    assert.equal(pair.a.peer.handshake.state, HandshakeState.Zeroed);
  });

  test('shortened test timings drive the same state machine', () => {
    const pair = makeCorePair(crypto, {
      timings: { rekeyAfterTime: 2_000, rejectAfterTime: 3_000, rekeyTimeout: 500, keepaliveTimeout: 1_000, rekeyAttemptTime: 5_000 },
    });
    let seq = 0;
    for (let t = 0; t < 100; t++) {
      pair.a.core.sendPacket(ping(seq++));
      pair.advance(100, 50);
    }
    assert.equal(pair.b.delivered.length, 100);
    assert.ok(pair.log.filter((d) => typeOf(d) === INITIATION).length >= 4);
  });
});

describe('cookies under load', () => {
  test('under load a handshake without mac2 gets a cookie reply, and the retry with mac2 succeeds', () => {
    const pair = makeCorePair(crypto);
    pair.b.core.setUnderLoadFor(60_000);
    pair.a.core.sendPacket(ping(1));
    pair.pump();
    assert.equal(pair.b.core.drops.get('cookie-required'), 1);
    assert.deepEqual(pair.log.map(typeOf), [INITIATION, COOKIE]);
    assert.equal(pair.log[1].bytes.length, 64);
    assert.ok(pair.a.peer.cookieGenerator.hasFreshCookie);
    pair.advance(REKEY_TIMEOUT + 400); // the retransmission carries mac2
    assert.deepEqual(seqsDelivered(pair.b.delivered), [1]);
    assert.equal(pair.b.core.drops.get('cookie-required'), 1);
  });

  test('a cookie reply that was not for our last message, or is tampered, is rejected', () => {
    const pair = makeCorePair(crypto);
    pair.b.core.setUnderLoadFor(60_000);
    pair.a.peer.initiateHandshake();
    const initiation = pair.wire.shift()!;
    pair.b.core.receiveDatagram(initiation.bytes, initiation.source);
    const reply = pair.wire.shift()!;
    assert.equal(typeOf(reply), COOKIE);
    const bad = Uint8Array.from(reply.bytes);
    bad[40] ^= 1;
    pair.a.core.receiveDatagram(bad, reply.source);
    assert.equal(pair.a.core.drops.get('bad-cookie-reply'), 1);
    assert.equal(pair.a.peer.cookieGenerator.hasFreshCookie, false);
    pair.a.core.receiveDatagram(reply.bytes, reply.source);
    assert.ok(pair.a.peer.cookieGenerator.hasFreshCookie);
    pair.a.core.receiveDatagram(reply.bytes, reply.source);
    assert.equal(pair.a.core.drops.get('bad-cookie-reply'), 2, 'one cookie reply per message sent');
  });

  test('under load, the per-source rate limiter caps handshake work', () => {
    const pair = makeCorePair(crypto);
    pair.b.core.setUnderLoadFor(60_000);
    pair.a.peer.initiateHandshake();
    pair.pump(); // gets the cookie
    let sent = 0;
    for (let i = 0; i < 20; i++) {
      pair.a.peer.handshake.lastSentHandshake = -Infinity; // bypass A's own 5 s spacing
      pair.a.peer.initiateHandshake();
      sent++;
    }
    pair.pump();
    assert.equal(sent, 20);
    assert.ok(pair.b.core.drops.get('rate-limited') >= 14, `rate-limited ${pair.b.core.drops.get('rate-limited')}`);
  });

  test('a burst of handshake messages switches cookies on by itself, for a second after it ends', () => {
    const pair = makeCorePair(crypto);
    pair.a.peer.initiateHandshake();
    const initiation = pair.wire.shift()!;
    assert.equal(pair.b.core.underLoad, false);
    for (let i = 0; i < 300; i++) pair.b.core.receiveDatagram(initiation.bytes, initiation.source);
    assert.equal(pair.b.core.underLoad, true);
    assert.ok(pair.b.core.drops.get('cookie-required') > 0, 'cookie replies instead of handshake work');
    pair.clock.advance(1_001);
    assert.equal(pair.b.core.underLoad, false, 'load mode ends once the flood stops');
  });

  test('an initiation with a bad mac1 never reaches the handshake code', () => {
    const pair = makeCorePair(crypto);
    pair.a.peer.initiateHandshake();
    const msg = pair.wire.shift()!;
    msg.bytes[120] ^= 0xff;
    pair.b.core.receiveDatagram(msg.bytes, msg.source);
    assert.equal(pair.b.core.drops.get('bad-mac1'), 1);
    assert.equal(pair.wire.length, 0);
  });
});

describe('roaming', () => {
  test('the endpoint follows authenticated packets only', () => {
    const pair = makeCorePair(crypto);
    handshake(pair);
    const moved = new Endpoint('203.0.113.77', 40000);
    pair.a.core.sendPacket(ping(1));
    const d = pair.wire.shift()!;
    const forged = Uint8Array.from(d.bytes);
    forged[30] ^= 1;
    pair.b.core.receiveDatagram(forged, new Endpoint('203.0.113.66', 1));
    assert.equal(pair.b.peer.endpoint?.host, '192.0.2.1', 'a forged packet does not move the endpoint');
    pair.b.core.receiveDatagram(d.bytes, moved);
    assert.equal(pair.b.peer.endpoint?.toString(), '203.0.113.77:40000');
    assert.equal(pair.b.peer.roamCount, 1);
    pair.b.core.sendPacket(ping(2, B_INNER, A_INNER));
    assert.equal(pair.wire[0].to.toString(), '203.0.113.77:40000', 'replies go to the new endpoint');
  });
});
