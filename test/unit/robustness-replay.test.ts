/**
 * Replays and spoofed inner sources in process (issue 8, item 3), on a manual clock so "minutes
 * later" and "an hour later" cost nothing:
 *
 * - every datagram of a recorded session (initiations and responses in both directions, cookie
 *   replies, data, keepalives) is sent again to its receiver and reflected back to its sender,
 *   from its original address and from an attacker's, right away and 5 s, 2 min, 10 min and 1 h
 *   later while the genuine session goes on (and rekeys): none is accepted, each is counted once
 *   under a replay or stale reason, nothing answers it, the endpoint stays;
 * - packets inside a genuine session whose inner source address is not one the sending peer may
 *   use (random addresses, another peer's, the receiver's own) are dropped by the allowed-IPs
 *   check, and malformed inner packets as such.
 */
import { before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import type { Crypto } from '../../dataplane/crypto/primitives.ts';
import type { DropReason } from '../../dataplane/drop-counters.ts';
import { Endpoint } from '../../dataplane/net/endpoint.ts';
import { generatePrivateKey } from '../../dataplane/noise/keys.ts';
import { A_INNER, B_INNER, makeCorePair, type InFlight } from '../helpers/core-pair.ts';
import { randInt } from '../helpers/fuzz.ts';
import { prng } from '../helpers/prng.ts';
import { buildEchoRequest, parseEcho } from '../system/packets.ts';

let crypto: Crypto;
before(async () => { crypto = await selectCrypto(); });

const STALE: DropReason[] = ['unknown-index', 'expired-keypair'];

describe('replays', () => {
  test('a recorded session replayed and reflected now, 5 s, 2 min, 10 min and 1 h later: nothing accepted, each counted as a replay or stale', (tc) => {
    const pair = makeCorePair(crypto);
    let seq = 0;
    const pingAB = () => pair.a.core.sendPacket(buildEchoRequest({ src: A_INNER, dst: B_INNER, id: 1, seq: ++seq & 0xffff }));
    const pingBA = () => pair.b.core.sendPacket(buildEchoRequest({ src: B_INNER, dst: A_INNER, id: 2, seq: ++seq & 0xffff }));

    // Record a session with every kind of message: A initiates, data both ways, B initiates
    // under load (a cookie reply, then the retry with mac2), keepalives.
    pingAB(); pair.pump();
    for (let i = 0; i < 20; i++) { pingAB(); pingBA(); pair.advance(100); }
    pair.a.core.setUnderLoadFor(10_000);
    pair.clock.advance(5_000);
    pair.b.peer.initiateHandshake(); pair.pump();
    pair.advance(6_000);
    for (let i = 0; i < 20; i++) { pingAB(); pingBA(); pair.advance(100); }
    pair.advance(12_000); // passive keepalives
    const recorded: InFlight[] = pair.log.splice(0);
    const types = new Set(recorded.map((d) => `${d.from}${d.bytes[0]}`));
    for (const kind of ['a1', 'b1', 'a2', 'b2', 'a3', 'a4', 'b4']) assert.ok(types.has(kind), `the recording has a ${kind} message: ${[...types]}`);
    assert.equal(pair.b.delivered.length + pair.a.delivered.length, 81);
    assert.equal(pair.a.core.underLoad || pair.b.core.underLoad, false);

    const attacker = new Endpoint('203.0.113.66', 6666);
    const byDelay: Record<string, Partial<Record<DropReason, number>>> = {};
    let elapsed = 0;
    for (const [label, delayMs] of [['now', 0], ['5 s', 5_000], ['2 min', 120_000], ['10 min', 600_000], ['1 h', 3_600_000]] as const) {
      // The genuine session goes on meanwhile: a ping each way every 2 s (rekeys included).
      for (; elapsed < delayMs; elapsed += 2_000) { pingAB(); pingBA(); pair.advance(2_000, 500); }
      pair.a.delivered.length = 0; pair.b.delivered.length = 0;
      pair.log.length = 0;
      const counts: Partial<Record<DropReason, number>> = {};
      for (const original of recorded) {
        for (const reflected of [false, true]) {
          for (const source of [original.source, attacker]) {
            const receiver = (original.from === 'a') !== reflected ? pair.b : pair.a;
            const endpointBefore = receiver.peer.endpoint?.toString();
            const totalBefore = receiver.core.drops.total();
            const snapshot = receiver.core.drops.snapshot();
            receiver.core.receiveDatagram(original.bytes.slice(), source);
            const after = receiver.core.drops.snapshot();
            const moved = (Object.keys(after) as DropReason[]).filter((r) => (after[r] ?? 0) !== (snapshot[r] ?? 0));
            const what = `${label}: ${reflected ? 'reflected' : 'replayed'} type-${original.bytes[0]} message from ${original.from} (sent as from ${source})`;
            assert.equal(receiver.core.drops.total(), totalBefore + 1, `${what}: exactly one drop, got ${JSON.stringify(moved)}`);
            const reason = moved[0];
            const allowed: DropReason[] = reflected
              ? (original.bytes[0] === 4 ? ['unknown-index'] : original.bytes[0] === 3 ? ['bad-cookie-reply'] : ['bad-mac1'])
              : ({ 1: ['handshake-replay'], 2: ['unknown-index'], 3: ['bad-cookie-reply'], 4: ['replay', ...STALE] } as Record<number, DropReason[]>)[original.bytes[0]];
            assert.ok(allowed.includes(reason), `${what}: counted as ${reason}, expected one of ${allowed}`);
            assert.equal(pair.wire.length, 0, `${what}: nothing answers a replay`);
            assert.equal(pair.a.delivered.length + pair.b.delivered.length, 0, `${what}: nothing delivered`);
            assert.equal(receiver.peer.endpoint?.toString(), endpointBefore, `${what}: the endpoint stays`);
            counts[reason] = (counts[reason] ?? 0) + 1;
          }
        }
      }
      byDelay[label] = counts;
      // The genuine session is unharmed.
      pingAB(); pingBA(); pair.pump();
      assert.equal(pair.b.delivered.length, 1, `${label}: the session still carries A's packets`);
      assert.equal(pair.a.delivered.length, 1, `${label}: and B's`);
    }
    // Early on the data replays hit the replay window; an hour later the keys are long gone.
    assert.ok((byDelay['5 s'].replay ?? 0) > 0, `replays seconds later meet the replay window: ${JSON.stringify(byDelay['5 s'])}`);
    assert.equal(byDelay['1 h'].replay ?? 0, 0, `an hour later every data message is stale: ${JSON.stringify(byDelay['1 h'])}`);
    assert.ok((byDelay['1 h']['handshake-replay'] ?? 0) > 0, 'initiations are still refused by their timestamp an hour later');
    const handshakes = pair.a.peer.handshakeAttemptsTotal + pair.b.peer.handshakeAttemptsTotal;
    assert.ok(handshakes >= 25, `the session rekeyed meanwhile: ${handshakes} handshakes`);
    tc.diagnostic(`${recorded.length} recorded datagrams, each replayed and reflected from 2 sources at each delay; drops by delay: ${JSON.stringify(byDelay)}`);
  });
});

describe('spoofed inner source addresses', () => {
  test('packets in a genuine session from addresses the peer may not use are dropped by the allowed-IPs check', (tc) => {
    const rng = prng(0x5900f);
    const pair = makeCorePair(crypto);
    // A third peer at B owns 10.0.0.3 and fd00::3: A must not be able to speak for it.
    pair.b.core.addPeer(crypto.publicKey(generatePrivateKey(crypto)), { allowedIps: ['10.0.0.3/32', 'fd00::3/128', '10.9.0.0/16'] });
    pair.a.peer.initiateHandshake(); pair.pump();
    const victim = pair.b.core;
    const randomV4 = () => `${1 + randInt(rng, 223)}.${randInt(rng, 256)}.${randInt(rng, 256)}.${randInt(rng, 256)}`;
    const randomV6 = () => `fd00:${randInt(rng, 0x10000).toString(16)}::${randInt(rng, 0x10000).toString(16)}`;
    const spoofed: Array<[string, string]> = [
      ['10.0.0.3', B_INNER], ['fd00::3', 'fd00::2'], ['10.9.4.4', B_INNER], // another peer's addresses
      [B_INNER, B_INNER], ['fd00::2', 'fd00::2'], // the receiver's own
      ['0.0.0.0', B_INNER], ['255.255.255.255', B_INNER], ['::', 'fd00::2'], ['::ffff:10.0.0.1', 'fd00::2'], ['fd00::1:0', 'fd00::2'],
    ];
    for (let i = 0; i < 500; i++) spoofed.push([randomV4(), B_INNER], [randomV6(), 'fd00::2']);
    let genuine = 0;
    for (const [src, dst] of spoofed) {
      if (src === A_INNER || src === 'fd00::1') continue;
      const before = victim.drops.get('allowed-ips-mismatch');
      pair.a.peer.sendPacket(buildEchoRequest({ src, dst, id: 9, seq: 1 }));
      pair.pump();
      assert.equal(victim.drops.get('allowed-ips-mismatch'), before + 1, `inner source ${src} is dropped by the allowed-IPs check`);
      if (rng() < 0.1) {
        const v6 = rng() < 0.5;
        pair.a.peer.sendPacket(buildEchoRequest({ src: v6 ? 'fd00::1' : A_INNER, dst: v6 ? 'fd00::2' : B_INNER, id: 10, seq: ++genuine }));
        pair.pump();
      }
    }
    assert.equal(pair.b.delivered.length, genuine, 'only the genuine packets were delivered');
    assert.ok(pair.b.delivered.every((p) => parseEcho(p)?.id === 10), 'and they are the genuine ones');

    // Malformed inner packets: not IPv4/IPv6, shorter than their header, or claiming more bytes than sent.
    const v4 = buildEchoRequest({ src: A_INNER, dst: B_INNER, id: 11, seq: 1 });
    const badLength = v4.slice(); badLength[2] = 0x05; badLength[3] = 0xdc; // total length 1500
    const tooShort = v4.slice(); tooShort[2] = 0; tooShort[3] = 19;
    // (A packet cut short but still covered by its padding is not malformed: the padding is authenticated.)
    const malformed = [Uint8Array.of(0x10, 1, 2, 3), v4.slice(0, 12), badLength, tooShort, new Uint8Array(39).fill(0x60)];
    for (const packet of malformed) {
      const before = victim.drops.get('bad-inner-packet');
      pair.a.peer.sendPacket(packet);
      pair.pump();
      assert.equal(victim.drops.get('bad-inner-packet'), before + 1, `malformed inner packet ${Buffer.from(packet.subarray(0, 8)).toString('hex')} counted`);
    }
    assert.equal(pair.b.delivered.length, genuine);
    assert.deepEqual(Object.keys(victim.drops.snapshot()).sort(), ['allowed-ips-mismatch', 'bad-inner-packet']);
    tc.diagnostic(`drops ${JSON.stringify(victim.drops.snapshot())}; ${genuine} genuine packets delivered in between`);
  });
});
