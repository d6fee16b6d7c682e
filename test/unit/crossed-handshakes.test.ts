/**
 * Handshake initiations that cross, on two real WireGuard cores: each side initiates before the
 * other's initiation arrives. Each side answers the other's and keeps its own
 * (Handshake.setAsideOwnInitiation), so a session exists as soon as the datagrams have arrived,
 * with no time passing; wireguard-go and the kernel drop both responses here and wait
 * REKEY_TIMEOUT (5 s). The system test crossed-handshakes.test.ts does it against wireguard-go.
 *
 * The model-based test drives random interleavings of sends, initiations, deliveries in any order
 * and small clock steps, and checks the invariant: once every datagram has arrived, traffic flows
 * both ways without waiting for a timer, and no handshake index or ephemeral key is left over.
 */
import { before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import type { Crypto } from '../../dataplane/crypto/primitives.ts';
import { HandshakeState } from '../../dataplane/noise/noise-protocol.ts';
import { A_INNER, B_INNER, makeCorePair, type CorePair } from '../helpers/core-pair.ts';
import { ipv4Packet } from '../helpers/ip-packet.ts';
import { prng } from '../helpers/prng.ts';

let crypto: Crypto;
before(async () => { crypto = await selectCrypto(); });

const MESSAGE_INITIATION = 1;
const MESSAGE_RESPONSE = 2;

/** Whether a packet `from` sends now reaches the other side, the clock standing still. */
function flows(pair: CorePair, from: 'a' | 'b'): boolean {
  const to = from === 'a' ? pair.b : pair.a;
  const before = to.delivered.length;
  pair[from].core.sendPacket(from === 'a' ? ipv4Packet(A_INNER, B_INNER) : ipv4Packet(B_INNER, A_INNER));
  pair.pump();
  return to.delivered.length > before;
}

/** Delivers the datagram at `index` of the wire (out of order when it is not the first). */
function deliverAt(pair: CorePair, index: number): void {
  const [d] = pair.wire.splice(index, 1);
  (d.from === 'a' ? pair.b : pair.a).core.receiveDatagram(d.bytes, d.source);
}

/** Handshake indices still registered without a keypair (a pending handshake's, or a leak). */
function pendingIndices(pair: CorePair, side: 'a' | 'b'): number {
  const core = pair[side].core;
  let live = 0;
  for (const peer of core.peers) for (const keypair of [peer.keypairs.previous, peer.keypairs.current, peer.keypairs.next]) if (keypair) live++;
  return core.indexTable.size - live;
}

describe('handshake initiations that cross', () => {
  for (const first of ['a', 'b'] as const) {
    test(`both sides initiate at once (${first}'s initiation arrives first): a session both ways with no time passing`, () => {
      const pair = makeCorePair(crypto);
      const started = pair.clock.now();
      pair.a.peer.initiateHandshake();
      pair.b.peer.initiateHandshake();
      assert.deepEqual(pair.wire.map((d) => [d.from, d.bytes[0]]), [['a', MESSAGE_INITIATION], ['b', MESSAGE_INITIATION]]);
      if (first === 'b') pair.wire.reverse();
      deliverAt(pair, 0);
      deliverAt(pair, 0);
      // Each side answered the other's initiation: two responses, each to an initiation still pending.
      assert.deepEqual(pair.wire.map((d) => d.bytes[0]).sort(), [MESSAGE_RESPONSE, MESSAGE_RESPONSE]);
      for (const side of ['a', 'b'] as const) assert.equal(pair[side].peer.handshake.state, HandshakeState.InitiationCreated, `${side} kept its own initiation`);
      pair.pump();
      assert.ok(flows(pair, 'a'), 'a → b');
      assert.ok(flows(pair, 'b'), 'b → a');
      assert.equal(pair.clock.now(), started, 'no time passed');
      for (const side of ['a', 'b'] as const) {
        assert.equal(pair[side].peer.handshake.state, HandshakeState.Zeroed, `${side}: nothing pending`);
        assert.ok(pair[side].peer.handshake.localEphemeralPrivate.every((byte) => byte === 0), `${side}: ephemeral key wiped`);
        assert.equal(pendingIndices(pair, side), 0, `${side}: no handshake index left over`);
      }
    });
  }

  test('each side sends a packet with no session yet: the crossing initiations deliver both staged packets at once', () => {
    const pair = makeCorePair(crypto);
    const started = pair.clock.now();
    pair.a.core.sendPacket(ipv4Packet(A_INNER, B_INNER));
    pair.b.core.sendPacket(ipv4Packet(B_INNER, A_INNER));
    pair.pump();
    assert.equal(pair.b.delivered.length, 1, 'a\'s staged packet');
    assert.equal(pair.a.delivered.length, 1, 'b\'s staged packet');
    assert.equal(pair.clock.now(), started);
  });

  test('an initiation answered while ours is pending, whose response never comes: the retry timer still sends a new one', () => {
    const pair = makeCorePair(crypto);
    pair.a.peer.initiateHandshake();
    pair.b.peer.initiateHandshake();
    pair.pump((d) => d.bytes[0] === MESSAGE_INITIATION); // both initiations arrive, both responses are lost
    pair.wire.length = 0;
    assert.equal(pair.a.peer.handshake.state, HandshakeState.InitiationCreated);
    const sent = pair.log.length;
    pair.advance(6000);
    assert.ok(pair.log.length > sent, 'a retry went out');
    assert.ok(flows(pair, 'a') && flows(pair, 'b'));
    assert.equal(pendingIndices(pair, 'a'), 0);
    assert.equal(pendingIndices(pair, 'b'), 0);
  });

  test('model: any interleaving of sends, initiations, out-of-order deliveries and small clock steps ends with traffic both ways at once', () => {
    const SEEDS = 400;
    let crossings = 0;
    for (let seed = 1; seed <= SEEDS; seed++) {
      const random = prng(seed);
      const pick = (n: number) => Math.floor(random() * n);
      const pair = makeCorePair(crypto);
      const trace: string[] = [];
      let pendingBoth = false;
      for (let step = 0; step < 16; step++) {
        const side = random() < 0.5 ? 'a' : 'b';
        const event = pick(5);
        if (event === 0) {
          trace.push(`${side} sends`);
          pair[side].core.sendPacket(side === 'a' ? ipv4Packet(A_INNER, B_INNER) : ipv4Packet(B_INNER, A_INNER));
        } else if (event === 1) {
          trace.push(`${side} initiates`);
          pair[side].peer.initiateHandshake();
        } else if (event === 2 || event === 3) {
          if (pair.wire.length === 0) continue;
          const at = pick(pair.wire.length);
          trace.push(`deliver #${at} (${pair.wire[at].from}:${pair.wire[at].bytes[0]})`);
          deliverAt(pair, at);
        } else {
          // Well under REKEY_TIMEOUT in all: the invariant must not lean on a retry.
          const ms = pick(60);
          trace.push(`+${ms} ms`);
          pair.clock.advance(ms);
          pair.a.core.tick();
          pair.b.core.tick();
        }
        pendingBoth ||= pair.a.peer.handshake.state === HandshakeState.InitiationCreated && pair.b.peer.handshake.state === HandshakeState.InitiationCreated
          && pair.wire.filter((d) => d.bytes[0] === MESSAGE_INITIATION).length === 2;
      }
      if (pendingBoth) crossings++;
      while (pair.wire.length > 0) {
        const at = pick(pair.wire.length);
        trace.push(`drain #${at} (${pair.wire[at].from}:${pair.wire[at].bytes[0]})`);
        deliverAt(pair, at);
      }
      const context = `seed ${seed}: ${trace.join(', ')}`;
      assert.ok(flows(pair, 'a'), `a → b without a timer; ${context}`);
      assert.ok(flows(pair, 'b'), `b → a without a timer; ${context}`);
      for (const side of ['a', 'b'] as const) assert.equal(pendingIndices(pair, side), 0, `${side}: no handshake index left over; ${context}`);
    }
    assert.ok(crossings >= 20, `the interleavings include crossed initiations (${crossings} of ${SEEDS})`);
  });
});
