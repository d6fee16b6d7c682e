/**
 * The sealer a sending thread runs on the packets it read (dataplane/session/transport-sealer.ts),
 * on the shared keypair table, send table and published routes as that thread sees them:
 *
 * - a sealed packet is byte for byte what the main thread's path (sealTransportInPlace) makes of
 *   it under the same nonce, and opens under the peer's key;
 * - what is left to the main thread: no route, an entry that names nothing, a retired keypair, a
 *   chunk this thread lacks, the nonce limit, a packet too big for its slot; a zeroed key is
 *   refused and said so;
 * - runs: consecutive packets to one peer, one nonce range each, in slot order, capped at
 *   MAX_RUN; each carries the entry it was sealed under;
 * - every hold taken is released.
 */
import { before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import { withSlots } from '../../dataplane/crypto/aead-slots.ts';
import type { Crypto, SlotAead } from '../../dataplane/crypto/primitives.ts';
import { REJECT_AFTER_MESSAGES_SAFE } from '../../dataplane/constants.ts';
import { AllowedIps } from '../../dataplane/allowedips/allowedips.ts';
import { parseIp, parsePrefix } from '../../dataplane/net/ip.ts';
import { Endpoint, LocalSource } from '../../dataplane/net/endpoint.ts';
import { readCounter, readU32 } from '../../dataplane/noise/messages.ts';
import {
  CHUNK_SLOTS, HOLDS_MASK, KeypairTable, chunkViews, reserveSendNonces, sendNoncesReserved, slotKey, slotState, type KeySlot,
} from '../../dataplane/session/keypair-table.ts';
import { PeerSendTable, sendChunkViews } from '../../dataplane/session/send-table.ts';
import { TRANSPORT_OVERHEAD, openTransport, sealTransportInPlace } from '../../dataplane/session/transport.ts';
import {
  LEFT, MAX_RUN, RECORD_INTS, R_LENGTH, R_OUTCOME, R_PEER, SEALED, TransportSealer, ZERO_KEY_REFUSED,
} from '../../dataplane/session/transport-sealer.ts';
import { filledKey as key } from '../helpers/transport-message.ts';
import { ipv4PacketTo } from '../helpers/ip-packet.ts';

let crypto: Crypto;
let aead: SlotAead;
before(async () => {
  crypto = await selectCrypto();
  aead = withSlots(crypto);
});

const MTU = 1420;
const STRIDE = 2048;

/** An IPv4 packet of `size` bytes to 10.0.0.`host`. */
const packetTo = (host: number, size: number, seed: number) => ipv4PacketTo(`10.0.0.${host}`, size, seed);

/** A device's tables as a sending thread sees them, peers 0.. routed to 10.0.0.(10 + number). */
function setUp(peers: number) {
  const keypairs = new KeypairTable();
  const sends = new PeerSendTable();
  const routes = new AllowedIps<number>();
  const slots: KeySlot[] = [];
  const endpoints: Endpoint[] = [];
  for (let n = 0; n < peers; n++) {
    sends.add(n);
    routes.insert(parsePrefix(`10.0.0.${10 + n}/32`), n);
    slots.push(keypairs.allocate(key(0x30 + n), key(0x70 + n)));
    endpoints.push(new Endpoint(`192.0.2.${n + 1}`, 51820 + n));
    sends.publish(n, { at: slots[n], remoteIndex: 0xa000 + n }, endpoints[n]);
  }
  let flat: Int32Array | undefined = routes.flatten((n) => n);
  const lacking = new Set<number>();
  const sealer = new TransportSealer(aead, {
    keyChunk: (c) => (lacking.has(c) || c >= keypairs.chunkBuffers.length ? undefined : chunkViews(keypairs.chunkBuffers[c])),
    sendChunk: (c) => { const found = sends.currentChunks.find((x) => x.chunk === c); return found && sendChunkViews(found.buffer!); },
    routes: () => flat,
  }, MTU);
  const noRoutes = () => { flat = undefined; };
  return { keypairs, sends, slots, endpoints, sealer, noRoutes, lacking };
}

/** The ring as the sealer gets it: packets at TRANSPORT_HEADER_SIZE in slots of STRIDE bytes. */
function slotsOf(packets: Uint8Array[]) {
  const data = new Uint8Array(STRIDE * packets.length);
  const lengths = new Int32Array(packets.length);
  packets.forEach((p, i) => { data.set(p, i * STRIDE + 16); lengths[i] = p.length; });
  const records = new Int32Array(packets.length * RECORD_INTS).fill(-9);
  return { data, lengths, records };
}

const recordOf = (records: Int32Array, i: number) => Array.from(records.subarray(i * RECORD_INTS, (i + 1) * RECORD_INTS));
const datagramOf = (data: Uint8Array, records: Int32Array, i: number) => data.subarray(i * STRIDE, i * STRIDE + records[i * RECORD_INTS + R_LENGTH]);
const holdsOf = (at: KeySlot) => slotState(at.chunk, at.index) & HOLDS_MASK;

describe('transport sealer', () => {
  test('a sealed packet is what the main thread makes of it under the same nonce, and opens under the peer\'s key', () => {
    const { sealer, slots } = setUp(2);
    reserveSendNonces(slots[1].chunk, slots[1].index, 41); // the main thread sent 41 already
    const sizes = [20, 21, 100, 1420];
    const packets = sizes.map((size, i) => packetTo(11, size, i));
    const { data, lengths, records } = slotsOf(packets);
    sealer.sealSlots(data, STRIDE, lengths, packets.length, records);
    assert.equal(sealer.runCount, 1);
    packets.forEach((packet, i) => {
      const [outcome, peer, length] = recordOf(records, i);
      assert.deepEqual([outcome, peer], [SEALED, 1]);
      const datagram = datagramOf(data, records, i);
      assert.equal(readU32(datagram, 4), 0xa001, 'the peer\'s index');
      assert.equal(readCounter(datagram, 8), 41 + i, 'the slot\'s next nonces, in order');
      const mine = new Uint8Array(packet.length + TRANSPORT_OVERHEAD);
      mine.set(packet, 16);
      const expected = sealTransportInPlace(crypto, key(0x31), 0xa001, 41 + i, mine, packet.length, MTU);
      assert.equal(length, expected, `packet ${i}: the length with padding to 16`);
      assert.deepEqual(datagram, mine.subarray(0, length), `packet ${i}: byte for byte the main thread's`);
      const opened = openTransport(crypto, key(0x31), 41 + i, Uint8Array.from(datagram));
      assert.ok(opened instanceof Uint8Array && opened.subarray(0, packet.length).every((b, k) => b === packet[k]));
    });
    assert.equal(sendNoncesReserved(slots[1].chunk, slots[1].index), 45);
    assert.equal(holdsOf(slots[1]), 0, 'the hold was released');
    assert.equal(sealer.sealed, 4);
  });

  test('what is left to the main thread untouched, and the zeroed key refused', () => {
    const { sealer, sends, slots, keypairs, endpoints, noRoutes, lacking } = setUp(6);
    sends.publish(1, null, endpoints[1]); // no usable session: the main thread stages
    keypairs.retire(slots[2]); // retired after the entry was read by the main thread: the hold is refused
    slotKey(slots[3].chunk, slots[3].index, 0).fill(0); // a bug: zeros under a live keypair
    reserveSendNonces(slots[4].chunk, slots[4].index, REJECT_AFTER_MESSAGES_SAFE - 1); // one nonce left
    const packets = [
      packetTo(200, 60, 0), // no route
      packetTo(11, 60, 1), // entry names nothing
      packetTo(12, 60, 2), // retired
      packetTo(13, 60, 3), // zeroed key
      packetTo(14, 60, 4), packetTo(14, 60, 5), // two packets, one nonce left: the run is left whole
      packetTo(15, STRIDE - 24, 6), // too big for its slot with header and tag
      packetTo(10, 60, 7), // sealed
    ];
    const { data, lengths, records } = slotsOf(packets);
    const before = Uint8Array.from(data);
    sealer.sealSlots(data, STRIDE, lengths, packets.length, records);
    const outcomes = packets.map((_, i) => recordOf(records, i)[R_OUTCOME]);
    assert.deepEqual(outcomes, [LEFT, LEFT, LEFT, ZERO_KEY_REFUSED, LEFT, LEFT, LEFT, SEALED]);
    assert.equal(recordOf(records, 3)[R_PEER], 3);
    for (const i of [0, 1, 2, 3, 4, 5, 6]) {
      assert.deepEqual(data.subarray(i * STRIDE, (i + 1) * STRIDE), before.subarray(i * STRIDE, (i + 1) * STRIDE), `slot ${i} untouched`);
    }
    assert.deepEqual(sealer.runs.slice(0, sealer.runCount).map((r) => [r.first, r.count, r.peer]), [[7, 1, 0]]);
    assert.deepEqual([sealer.sealed, sealer.left, sealer.refused], [1, 6, 1]);
    for (const at of slots) assert.equal(holdsOf(at), 0, 'no hold kept');

    // A key-table chunk this thread has not been handed, and no routes published: left.
    lacking.add(Math.floor(slots[0].slot / CHUNK_SLOTS));
    const again = slotsOf([packetTo(10, 60, 8)]);
    sealer.sealSlots(again.data, STRIDE, again.lengths, 1, again.records);
    assert.equal(again.records[R_OUTCOME], LEFT);
    lacking.clear();
    noRoutes();
    sealer.sealSlots(again.data, STRIDE, again.lengths, 1, again.records);
    assert.equal(again.records[R_OUTCOME], LEFT);
  });

  test('runs: consecutive packets to one peer, one nonce range each, in slot order, at most MAX_RUN; each with its entry', () => {
    const { sealer, sends, slots } = setUp(3);
    const local = new LocalSource(parseIp('192.0.2.200'), 4);
    sends.publish(2, { at: slots[2], remoteIndex: 0xa002 }, new Endpoint('2001:db8::2', 4000, undefined));
    sends.publish(1, { at: slots[1], remoteIndex: 0xa001 }, new Endpoint('192.0.2.2', 51821, local));
    const hosts = [10, 10, 11, 10, ...new Array(MAX_RUN + 3).fill(12)];
    const packets = hosts.map((h, i) => packetTo(h, 40 + i, i));
    const { data, lengths, records } = slotsOf(packets);
    sealer.sealSlots(data, STRIDE, lengths, packets.length, records);
    const runs = sealer.runs.slice(0, sealer.runCount);
    assert.deepEqual(runs.map((r) => [r.first, r.count, r.peer]), [[0, 2, 0], [2, 1, 1], [3, 1, 0], [4, MAX_RUN, 2], [4 + MAX_RUN, 3, 2]]);
    const counters = packets.map((_, i) => readCounter(datagramOf(data, records, i), 8));
    assert.deepEqual(counters.slice(0, 4), [0, 1, 0, 2], 'peer 0\'s nonces continue across its runs');
    assert.deepEqual(counters.slice(4), Array.from({ length: MAX_RUN + 3 }, (_, i) => i));
    assert.deepEqual([runs[1].target.port, runs[1].target.sourceFamily, runs[1].target.sourceIfindex, [...runs[1].target.sourceAddress.subarray(0, 4)]], [51821, 4, 4, [192, 0, 2, 200]]);
    assert.deepEqual([runs[3].target.family, runs[3].target.port, [...runs[3].target.address]], [6, 4000, [...parseIp('2001:db8::2')]]);
    assert.equal(runs[0].target.remoteIndex, 0xa000);
  });
});
