/**
 * The opener that binds run on received datagrams (dataplane/session/transport-opener.ts), on
 * the shared keypair table and index map as another thread sees them (shared-sessions.ts):
 *
 * - what each kind of datagram comes out as: opened (plaintext in place, header untouched),
 *   forged, unknown index, a retired keypair whose index is still mapped (the hold is refused),
 *   a zeroed key, a counter no number holds exactly, not a transport message at all;
 * - UDP GRO runs: split into runs per receiver index, a shorter last datagram, capped at MAX_RUN;
 * - state that grows after the opener was made (a new table chunk, the index map moved) is
 *   learnt from the posted messages;
 * - every hold taken is released.
 */
import { before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import type { Crypto } from '../../dataplane/crypto/primitives.ts';
import { CHUNK_SLOTS, HOLDS_MASK, KeypairTable, setSlotDeliveryPeer, slotKey, slotState, type KeySlot } from '../../dataplane/session/keypair-table.ts';
import { SharedIndexMap } from '../../dataplane/session/shared-index-map.ts';
import { SharedSessionsView, shareSessions, type SharedSessionsMessage } from '../../dataplane/session/shared-sessions.ts';
import {
  AUTH_FAILED, DELIVERED, MAX_RUN, NOT_OPENED, OPENED, REPLAYED, RECORD_INTS, R_GENERATION, R_LENGTH, R_OUTCOME, R_SLOT, TransportOpener, ZERO_KEY_REFUSED,
} from '../../dataplane/session/transport-opener.ts';
import { writeCounter } from '../../dataplane/noise/messages.ts';
import { AllowedIps } from '../../dataplane/allowedips/allowedips.ts';
import { PublishedRoutes } from '../../dataplane/allowedips/published-routes.ts';
import { parsePrefix } from '../../dataplane/net/ip.ts';
import { filledKey as key, payload, transportMessage } from '../helpers/transport-message.ts';

let crypto: Crypto;
before(async () => {
  crypto = await selectCrypto();
});

/** A device's shared state and an opener on it, as a bind's thread would have. */
function setUp() {
  const keypairs = new KeypairTable();
  const indices = new SharedIndexMap();
  const posted: SharedSessionsMessage[] = [];
  const shared = shareSessions(keypairs, indices, undefined, (m) => posted.push(m));
  const view = new SharedSessionsView(shared.init, () => posted.shift());
  const opener = new TransportOpener(crypto, view.chunkAt, view.indices);
  /** A keypair whose receive key is `fill` repeated, under receiver index `index`. */
  const add = (index: number, fill: number): KeySlot => {
    const at = keypairs.allocate(key(0x55), key(fill));
    indices.set(index, at.slot, at.generation);
    return at;
  };
  return { keypairs, indices, opener, add, posted };
}

const message = (index: number, fill: number, counter: number, payload: Uint8Array) => transportMessage(crypto, index, fill, counter, payload);

const record = (records: Int32Array, i: number) => Array.from(records.subarray(i * RECORD_INTS, (i + 1) * RECORD_INTS));

describe('transport opener', () => {
  test('each kind of datagram: opened in place, forged, unknown, retired, zeroed, inexact counter, not transport', () => {
    const { keypairs, opener, add } = setUp();
    const live = add(0x1001, 1);
    const retired = add(0x1002, 2);
    const zeroed = add(0x1003, 3);
    keypairs.retire(retired); // its index stays mapped: only the hold can refuse it
    slotKey(zeroed.chunk, zeroed.index, 1).fill(0); // a bug: zeros under a live keypair
    const records = new Int32Array(RECORD_INTS);
    const open = (d: Uint8Array) => {
      records.fill(-9);
      assert.equal(opener.openMessage(d, 0, d.length, d.length, records, 0), 1);
      return record(records, 0);
    };

    const text = payload(100, 1);
    const good = message(0x1001, 1, 7, text);
    const header = good.slice(0, 16);
    assert.deepEqual(open(good), [OPENED, 100, live.slot, live.generation], 'opened: the plaintext length, the slot and generation');
    assert.deepEqual(good.subarray(16, 116), text, 'the plaintext in place');
    assert.deepEqual(good.subarray(0, 16), header, 'the header untouched');

    const forged = message(0x1001, 9, 8, text);
    assert.equal(open(forged)[R_OUTCOME], AUTH_FAILED, 'sealed under another key');
    const flipped = message(0x1001, 1, 9, text);
    flipped[40] ^= 1;
    assert.equal(open(flipped)[R_OUTCOME], AUTH_FAILED, 'one bit flipped');
    assert.equal(open(message(0x2222, 1, 1, text))[R_OUTCOME], NOT_OPENED, 'an index no keypair has');
    assert.equal(open(message(0x1002, 2, 1, text))[R_OUTCOME], NOT_OPENED, 'a retired keypair: the hold is refused, its keys unread');
    assert.equal(open(message(0x1003, 0, 1, text))[R_OUTCOME], ZERO_KEY_REFUSED, 'a zeroed key opens nothing, even what zeros sealed');
    const inexact = message(0x1001, 1, 1, text);
    writeCounter(inexact, 8, 2 ** 53);
    assert.equal(open(inexact)[R_OUTCOME], NOT_OPENED, 'a counter past 2^53 is left to the core (counter-limit)');
    const handshake = new Uint8Array(148);
    handshake[0] = 1;
    assert.equal(open(handshake)[R_OUTCOME], NOT_OPENED, 'a handshake message');
    const short = good.slice(0, 31);
    assert.equal(open(short)[R_OUTCOME], NOT_OPENED, 'shorter than a keepalive');

    for (const at of [live, zeroed]) assert.equal(slotState(at.chunk, at.index) & HOLDS_MASK, 0, 'every hold released');
    assert.deepEqual({ opened: opener.opened, failed: opener.failed, left: opener.left }, { opened: 1, failed: 3, left: 5 });
  });

  test('a UDP GRO run: one record per datagram, split per receiver index, the last one shorter', () => {
    const { opener, add } = setUp();
    const a = add(0xa, 0xa);
    const b = add(0xb, 0xb);
    const step = 16 + 64 + 16;
    const parts = [
      message(0xa, 0xa, 1, payload(64, 1)), message(0xa, 0xa, 2, payload(64, 2)), message(0xb, 0xb, 1, payload(64, 3)),
      message(0xb, 0xb, 2, payload(64, 4)), message(0xa, 0xa, 3, payload(64, 5)), message(0xa, 0xa, 4, payload(16, 6)),
    ];
    const length = parts.reduce((n, p) => n + p.length, 0);
    const run = new Uint8Array(4 + length + 8); // at an offset, as in a ring slot
    let at = 4;
    for (const p of parts) {
      run.set(p, at);
      at += p.length;
    }
    const records = new Int32Array(MAX_RUN * RECORD_INTS);
    assert.equal(opener.openMessage(run, 4, length, step, records, 0), 6);
    const owners = [a, a, b, b, a, a];
    for (let i = 0; i < 6; i++) {
      const r = record(records, i);
      assert.deepEqual([r[R_OUTCOME], r[R_LENGTH], r[R_SLOT], r[R_GENERATION]], [OPENED, i === 5 ? 16 : 64, owners[i].slot, owners[i].generation], `datagram ${i}`);
      assert.deepEqual(run.subarray(4 + i * step + 16, 4 + i * step + 16 + r[R_LENGTH]), payload(i === 5 ? 16 : 64, i + 1));
    }
  });

  test('a run longer than MAX_RUN: the rest are left to the main thread', () => {
    const { opener, add } = setUp();
    add(0xc, 0xc);
    const one = message(0xc, 0xc, 0, payload(16, 0));
    const count = MAX_RUN + 3;
    const run = new Uint8Array(count * one.length);
    for (let i = 0; i < count; i++) run.set(message(0xc, 0xc, i, payload(16, i)), i * one.length);
    const rest = run.slice(MAX_RUN * one.length);
    const records = new Int32Array(MAX_RUN * RECORD_INTS);
    assert.equal(opener.openMessage(run, 0, run.length, one.length, records, 0), MAX_RUN, 'records for MAX_RUN of them');
    assert.equal(opener.opened, MAX_RUN);
    assert.deepEqual(run.subarray(MAX_RUN * one.length), rest, 'the rest untouched');
  });

  test('a table chunk added and the index map moved after the opener was made are learnt from the posted messages', () => {
    const { opener, add, posted } = setUp();
    const records = new Int32Array(RECORD_INTS);
    const slots: KeySlot[] = [];
    // More keypairs than a chunk holds, more indices than the map's first buffer takes.
    for (let i = 0; i < CHUNK_SLOTS + 700; i++) slots.push(add(0x10000 + i, (i % 250) + 1));
    assert.ok(posted.some((m) => m.kind === 'chunk') && posted.some((m) => m.kind === 'index-map'), 'both kinds were posted');
    for (const i of [0, CHUNK_SLOTS + 5, CHUNK_SLOTS + 699]) {
      const d = message(0x10000 + i, (i % 250) + 1, 1, payload(32, i));
      opener.openMessage(d, 0, d.length, d.length, records, 0);
      assert.deepEqual([records[R_OUTCOME], records[R_SLOT]], [OPENED, slots[i].slot], `keypair ${i}`);
    }
  });
});

describe('transport opener delivering (step 2b)', () => {
  /** An IPv4 packet from `source` with `payload` bytes after the header. */
  const ipv4 = (source: string, size: number, seed: number) => {
    const packet = payload(20 + size, seed);
    packet[0] = 0x45;
    packet[2] = (20 + size) >> 8;
    packet[3] = (20 + size) & 0xff;
    packet.set(source.split('.').map(Number), 12);
    return packet;
  };

  function deliveringSetUp() {
    const keypairs = new KeypairTable();
    const indices = new SharedIndexMap();
    const routesTable = new AllowedIps<number>();
    routesTable.insert(parsePrefix('10.0.0.0/24'), 7);
    routesTable.insert(parsePrefix('10.0.0.128/25'), 8);
    const routes = new PublishedRoutes(routesTable, (peer) => peer);
    const posted: SharedSessionsMessage[] = [];
    const shared = shareSessions(keypairs, indices, routes, (m) => posted.push(m));
    const view = new SharedSessionsView(shared.init, () => posted.shift());
    const written: Uint8Array[] = [];
    const opener = new TransportOpener(crypto, view.chunkAt, view.indices, {
      routes: () => view.routes(),
      write: (packets, count) => { for (let i = 0; i < count; i++) written.push(packets[i].slice()); },
    });
    const add = (index: number, fill: number, peer: number) => {
      const at = keypairs.allocate(key(0x55), key(fill));
      indices.set(index, at.slot, at.generation);
      setSlotDeliveryPeer(at.chunk, at.index, peer);
      return at;
    };
    const records = new Int32Array(RECORD_INTS);
    const open = (d: Uint8Array) => {
      opener.openMessage(d, 0, d.length, d.length, records, 0);
      opener.flush();
      return records[R_OUTCOME];
    };
    return { keypairs, opener, add, open, written, routesTable };
  }

  test('delivered once, replays refused, and whatever fails a check before the window left to the main thread', async () => {
    const { opener, add, open, written, routesTable } = deliveringSetUp();
    const confirmed = add(0x1, 1, 7);
    add(0x2, 2, -1); // not confirmed: the main thread decides
    const inner = ipv4('10.0.0.5', 60, 1);
    assert.equal(open(message(0x1, 1, 1, inner)), DELIVERED);
    assert.deepEqual(written, [inner], 'the inner packet, unpadded');
    assert.equal(open(message(0x1, 1, 1, inner)), REPLAYED, 'the same counter again');
    assert.equal(open(message(0x1, 1, 0, new Uint8Array(0))), DELIVERED, 'a keepalive passes the window, and writes nothing');
    assert.equal(open(message(0x1, 1, 0, new Uint8Array(0))), REPLAYED);
    assert.equal(open(message(0x2, 2, 1, inner)), OPENED, 'an unconfirmed keypair');
    assert.equal(open(message(0x1, 1, 2, ipv4('10.0.0.200', 60, 2))), OPENED, 'a source the table gives to another peer');
    assert.equal(open(message(0x1, 1, 3, ipv4('192.0.2.1', 60, 3))), OPENED, 'a source no peer has');
    const bad = ipv4('10.0.0.5', 60, 4);
    bad[2] = 0x7f; // a length past the plaintext
    assert.equal(open(message(0x1, 1, 4, bad)), OPENED, 'a bad inner packet');
    assert.equal(open(message(0x1, 1, 2, ipv4('10.0.0.5', 60, 5))), DELIVERED, 'counter 2 was never accepted: the window was not moved by the refusals');
    assert.equal(written.length, 2);
    // A prefix moves to another peer: the next table is published at the end of this turn.
    routesTable.insert(parsePrefix('10.0.0.5/32'), 9);
    await Promise.resolve();
    assert.equal(open(message(0x1, 1, 5, ipv4('10.0.0.5', 60, 6))), OPENED, 'the new table is read');
    assert.equal(opener.delivered, 3, 'two packets and a keepalive');
    assert.equal(slotState(confirmed.chunk, confirmed.index) & HOLDS_MASK, 0, 'no hold left');
  });

  test('deliveredWhole: only a message whose every datagram was delivered here', () => {
    const { opener, add, open } = deliveringSetUp();
    add(0x1, 1, 7);
    add(0x2, 2, -1);
    assert.equal(open(message(0x1, 1, 1, ipv4('10.0.0.5', 60, 1))), DELIVERED);
    assert.equal(opener.deliveredWhole, true);
    assert.equal(open(message(0x1, 1, 1, ipv4('10.0.0.5', 60, 1))), REPLAYED);
    assert.equal(opener.deliveredWhole, false, 'a replay is the main thread\'s to count');
    assert.equal(open(message(0x2, 2, 1, ipv4('10.0.0.5', 60, 1))), OPENED);
    assert.equal(opener.deliveredWhole, false, 'left to the main thread');
    // A GRO run of three: all delivered, then one of them from a source of another peer.
    const run = (sources: string[], first: number) => {
      const parts = sources.map((src, i) => message(0x1, 1, first + i, ipv4(src, 60, first + i)));
      const data = new Uint8Array(parts.length * parts[0].length);
      parts.forEach((p, i) => data.set(p, i * p.length));
      opener.openMessage(data, 0, data.length, parts[0].length, new Int32Array(3 * RECORD_INTS), 0);
      opener.flush();
      return opener.deliveredWhole;
    };
    assert.equal(run(['10.0.0.5', '10.0.0.6', '10.0.0.7'], 10), true, 'a run delivered whole');
    assert.equal(run(['10.0.0.5', '10.0.0.200', '10.0.0.7'], 20), false, 'one member left to the main thread');
  });
});
