/**
 * The TUN offload helpers (dataplane/tun/offload.ts), checked against an independent checksum
 * (test/system/packets.ts) and against the rules of the kernel's GSO/GRO: a TCP super-packet
 * (IPv4 and IPv6) splits into segments with correct lengths, IDs, sequence numbers, flags and
 * checksums whose payloads add up to the original; segments of a flow coalesce back into one write
 * whose vnet header and partial checksum the kernel accepts, while anything that must not be
 * merged (gaps, other flags, other options, other flows, non-TCP) keeps its place in its flow.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import {
  GSO_NONE, GSO_TCPV4, GSO_TCPV6, MAX_COALESCED, VNET_F_NEEDS_CSUM, VNET_HDR_SIZE, coalesceAndWrite, completeChecksum, fold,
  newSegmentPlan, planSegments, readVnetHeader, sum16, wordsOf, writeSegment, writeVnetHeader, type VnetHeader,
} from '../../dataplane/tun/offload.ts';
import { VNET_READ_REFUSED, VNET_READ_STOPPED, VnetReader, type SlotSink } from '../../dataplane/tun/vnet-read.ts';
import { internetChecksum } from '../system/packets.ts';
import { prng } from '../helpers/prng.ts';

const V4 = { src: [10, 0, 0, 1], dst: [10, 0, 0, 2] };
const V6 = { src: [0xfd, 0, ...Array(13).fill(0), 1], dst: [0xfd, 0, ...Array(13).fill(0), 2] };

interface TcpSpec {
  v6?: boolean;
  srcPort?: number;
  dstPort?: number;
  seq: number;
  ack?: number;
  flags?: number;
  payload: Uint8Array;
  /** TCP options (a multiple of 4 bytes). */
  options?: number[];
  id?: number;
  ttl?: number;
}

const ACK = 0x10;
const PSH = 0x08;
const FIN = 0x01;
const CWR = 0x80;

/** A TCP/IP packet with correct checksums. */
function tcpPacket(spec: TcpSpec): Uint8Array {
  const v6 = spec.v6 === true;
  const l4 = v6 ? 40 : 20;
  const options = spec.options ?? [1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2]; // NOP NOP timestamps
  const tcpHeader = 20 + options.length;
  const length = l4 + tcpHeader + spec.payload.length;
  const p = new Uint8Array(length);
  if (v6) {
    p[0] = 0x60;
    p[4] = (length - 40) >> 8;
    p[5] = (length - 40) & 0xff;
    p[6] = 6;
    p[7] = spec.ttl ?? 64;
    p.set(V6.src, 8);
    p.set(V6.dst, 24);
  } else {
    p[0] = 0x45;
    p[2] = length >> 8;
    p[3] = length & 0xff;
    p[4] = (spec.id ?? 0x1234) >> 8;
    p[5] = (spec.id ?? 0x1234) & 0xff;
    p[6] = 0x40; // DF
    p[8] = spec.ttl ?? 64;
    p[9] = 6;
    p.set(V4.src, 12);
    p.set(V4.dst, 16);
    const ipSum = internetChecksum(p, 0, 20);
    p[10] = ipSum >> 8;
    p[11] = ipSum & 0xff;
  }
  const t = l4;
  const srcPort = spec.srcPort ?? 40000;
  const dstPort = spec.dstPort ?? 5201;
  p[t] = srcPort >> 8; p[t + 1] = srcPort & 0xff;
  p[t + 2] = dstPort >> 8; p[t + 3] = dstPort & 0xff;
  new DataView(p.buffer).setUint32(t + 4, spec.seq >>> 0);
  new DataView(p.buffer).setUint32(t + 8, (spec.ack ?? 777) >>> 0);
  p[t + 12] = (tcpHeader / 4) << 4;
  p[t + 13] = spec.flags ?? ACK;
  p[t + 14] = 0x01; p[t + 15] = 0xf5; // window
  p.set(options, t + 20);
  p.set(spec.payload, t + tcpHeader);
  const sum = internetChecksum(p, t, length, pseudo(p, v6, length - l4));
  p[t + 16] = sum >> 8;
  p[t + 17] = sum & 0xff;
  return p;
}

/** Unfolded pseudo-header sum, computed independently of offload.ts. */
function pseudo(p: Uint8Array, v6: boolean, tcpLength: number): number {
  let sum = 0;
  const [from, to] = v6 ? [8, 40] : [12, 20];
  for (let i = from; i < to; i += 2) sum += (p[i] << 8) | p[i + 1];
  return sum + 6 + (tcpLength & 0xffff) + Math.floor(tcpLength / 65536);
}

function assertValidTcp(p: Uint8Array, what: string): void {
  const v6 = p[0] >> 4 === 6;
  const l4 = v6 ? 40 : 20;
  if (!v6) {
    assert.equal(internetChecksum(p, 0, 20), 0, `${what}: IPv4 header checksum`);
    assert.equal((p[2] << 8) | p[3], p.length, `${what}: IPv4 total length`);
  } else {
    assert.equal(((p[4] << 8) | p[5]) + 40, p.length, `${what}: IPv6 payload length`);
  }
  assert.equal(internetChecksum(p, l4, p.length, pseudo(p, v6, p.length - l4)), 0, `${what}: TCP checksum`);
}

const seqOf = (p: Uint8Array) => new DataView(p.buffer, p.byteOffset).getUint32((p[0] >> 4 === 6 ? 40 : 20) + 4);
const flagsOf = (p: Uint8Array) => p[(p[0] >> 4 === 6 ? 40 : 20) + 13];
const payloadOf = (p: Uint8Array) => {
  const l4 = p[0] >> 4 === 6 ? 40 : 20;
  return p.subarray(l4 + (p[l4 + 12] >> 4) * 4);
};

function randomBytes(random: () => number, n: number): Uint8Array {
  const out = new Uint8Array(n);
  for (let i = 0; i < n; i++) out[i] = Math.floor(random() * 256);
  return out;
}

/** A super-packet as the kernel hands it over with TSO: one header, a long payload, partial checksum. */
function superPacket(v6: boolean, payload: Uint8Array, flags: number, mss: number): { packet: Uint8Array; header: VnetHeader } {
  const packet = tcpPacket({ v6, seq: 0xfffff000, flags, payload, id: 0xfffe });
  const l4 = v6 ? 40 : 20;
  // The kernel leaves the pseudo-header sum in the checksum field; planSegments must not care.
  packet[l4 + 16] = 0xab;
  packet[l4 + 17] = 0xcd;
  return { packet, header: { flags: VNET_F_NEEDS_CSUM, gsoType: v6 ? GSO_TCPV6 : GSO_TCPV4, hdrLen: l4 + 32, gsoSize: mss, csumStart: l4, csumOffset: 16 } };
}

function split(packet: Uint8Array, header: VnetHeader): Uint8Array[] {
  const plan = newSegmentPlan();
  assert.ok(planSegments(packet, packet.length, header, plan));
  const ring = new Uint8Array(new SharedArrayBuffer(2048 * plan.segments));
  const words = wordsOf(ring.buffer);
  const out: Uint8Array[] = [];
  for (let i = 0; i < plan.segments; i++) {
    const slot = ring.subarray(i * 2048, (i + 1) * 2048);
    const length = writeSegment(packet, plan, i, slot, words);
    out.push(slot.slice(0, length));
  }
  return out;
}

interface Written {
  header: VnetHeader;
  packet: Uint8Array;
}

function coalesce(packets: Uint8Array[]): Written[] {
  const buffer = new Uint8Array(VNET_HDR_SIZE + MAX_COALESCED);
  const done = new Uint8Array(packets.length);
  const out: Written[] = [];
  const taken = coalesceAndWrite(packets, packets.length, buffer, done, (b, length) => {
    out.push({ header: readVnetHeader(b, 0, { flags: 0, gsoType: 0, hdrLen: 0, gsoSize: 0, csumStart: 0, csumOffset: 0 }), packet: b.slice(VNET_HDR_SIZE, length) });
    return true;
  });
  assert.equal(taken, packets.length, 'every packet is accounted for');
  return out;
}

/** What the kernel does with a NEEDS_CSUM packet: completes the checksum from the partial sum. */
function kernelCompletes(w: Written): Uint8Array {
  const p = w.packet.slice();
  if (w.header.flags & VNET_F_NEEDS_CSUM) {
    const field = w.header.csumStart + w.header.csumOffset;
    const sum = internetChecksum(p, w.header.csumStart, p.length);
    p[field] = sum >> 8;
    p[field + 1] = sum & 0xff;
  }
  return p;
}

describe('TUN offload: checksums', () => {
  test('sum16 gives the same sum with and without the 32-bit word path, at any offset and length', () => {
    const random = prng(11);
    const buffer = new SharedArrayBuffer(4096);
    const bytes = new Uint8Array(buffer);
    bytes.set(randomBytes(random, 4096));
    const words = wordsOf(buffer);
    for (let offset = 0; offset < 12; offset++) {
      for (const length of [0, 1, 2, 3, 15, 16, 17, 63, 64, 65, 1400, 1401, 2000]) {
        const view = new Uint8Array(buffer, offset, 4096 - offset);
        const slow = fold(sum16(view, 3, 3 + length));
        const fast = fold(sum16(view, 3, 3 + length, words));
        const reference = ~internetChecksum(view, 3, 3 + length) & 0xffff; // the folded sum
        assert.equal(fast, slow, `offset ${offset} length ${length}`);
        assert.equal(slow, reference, `reference, offset ${offset} length ${length}`);
      }
    }
    // The largest sums: 64 KiB of 0xff (every word at its maximum) and of 0x80.
    for (const fill of [0xff, 0x80]) {
      const big = new SharedArrayBuffer(65536 + 8);
      new Uint8Array(big).fill(fill);
      const view = new Uint8Array(big);
      assert.equal(fold(sum16(view, 4, 65540, wordsOf(big))), fold(sum16(view, 4, 65540)), `64 KiB of ${fill}`);
    }
  });

  test('completeChecksum finishes a partial TCP and UDP checksum; a UDP zero becomes 0xffff', () => {
    const payload = randomBytes(prng(3), 333);
    const p = tcpPacket({ seq: 5, payload });
    const expected = [p[36], p[37]];
    // Partial: the pseudo-header sum in the field.
    const partial = fold(pseudo(p, false, p.length - 20));
    p[36] = partial >> 8;
    p[37] = partial & 0xff;
    assert.ok(completeChecksum(p, p.length, 20, 16));
    assert.deepEqual([p[36], p[37]], expected);
    assert.equal(completeChecksum(p, p.length, 20, p.length), false, 'offsets beyond the packet');

    // A UDP datagram whose checksum computes to zero is sent as 0xffff.
    const udp = new Uint8Array(28);
    udp[0] = 0x45; udp[9] = 17;
    udp[24] = 0; udp[25] = 8; // length 8 and nothing else: the sum of the rest decides
    // Choose the source port so that ~sum == 0, i.e. sum == 0xffff.
    udp[20] = 0xff; udp[21] = 0xf7; // 0xfff7 + 8 (length) = 0xffff
    assert.ok(completeChecksum(udp, 28, 20, 6));
    assert.deepEqual([udp[26], udp[27]], [0xff, 0xff]);
  });
});

describe('TUN offload: splitting super-packets (TSO)', () => {
  for (const v6 of [false, true]) {
    test(`IPv${v6 ? 6 : 4}: segments carry the payload in order with correct headers and checksums`, () => {
      const random = prng(v6 ? 66 : 44);
      const mss = 1368;
      const payload = randomBytes(random, mss * 20 + 123);
      const { packet, header } = superPacket(v6, payload, ACK | PSH | FIN | CWR, mss);
      const segments = split(packet, header);
      assert.equal(segments.length, 21);
      let offset = 0;
      segments.forEach((s, i) => {
        assertValidTcp(s, `segment ${i}`);
        const body = payloadOf(s);
        assert.equal(body.length, i < 20 ? mss : 123);
        assert.deepEqual(body, payload.subarray(offset, offset + body.length), `segment ${i} payload`);
        assert.equal(seqOf(s), (0xfffff000 + offset) >>> 0, `segment ${i} sequence number (wrapping)`);
        offset += body.length;
        const flags = flagsOf(s);
        assert.equal((flags & (PSH | FIN)) !== 0, i === 20, `segment ${i}: PSH and FIN on the last only`);
        assert.equal((flags & CWR) !== 0, i === 0, `segment ${i}: CWR on the first only`);
        assert.ok(flags & ACK);
        if (!v6) assert.equal((s[4] << 8) | s[5], (0xfffe + i) & 0xffff, `segment ${i}: IPv4 ID`);
      });
      assert.equal(offset, payload.length);
    });
  }

  test('a payload that is an exact multiple of the segment size, and one segment only', () => {
    const payload = randomBytes(prng(5), 1000 * 3);
    const { packet, header } = superPacket(false, payload, ACK, 1000);
    assert.equal(split(packet, header).length, 3);
    const small = superPacket(false, payload.subarray(0, 10), ACK, 1000);
    const one = split(small.packet, small.header);
    assert.equal(one.length, 1);
    assertValidTcp(one[0], 'single segment');
  });

  test('what cannot be split is refused', () => {
    const { packet, header } = superPacket(false, new Uint8Array(3000), ACK, 1000);
    const plan = newSegmentPlan();
    assert.equal(planSegments(packet, packet.length, { ...header, gsoType: 3 }, plan), false, 'UDP GSO');
    assert.equal(planSegments(packet, packet.length, { ...header, gsoType: GSO_TCPV6 }, plan), false, 'family mismatch');
    assert.equal(planSegments(packet, packet.length, { ...header, gsoSize: 0 }, plan), false, 'segment size 0');
    assert.equal(planSegments(packet, 30, header, plan), false, 'truncated');
    assert.equal(planSegments(packet, packet.length, { ...header, csumStart: 24 }, plan), false, 'TCP offset is not the IP header length');
  });
});

describe('TUN offload: coalescing segments (GRO)', () => {
  const mss = 1000;
  const flow = (seq: number, size: number, extra: Partial<TcpSpec> = {}) =>
    tcpPacket({ seq, payload: new Uint8Array(size).fill(seq & 0xff), ...extra });

  for (const v6 of [false, true]) {
    test(`IPv${v6 ? 6 : 4}: consecutive segments become one GSO write that the kernel can complete`, () => {
      const random = prng(v6 ? 9 : 8);
      const payload = randomBytes(random, mss * 7 + 321);
      const { packet, header } = superPacket(v6, payload, ACK | PSH, mss);
      const segments = split(packet, header);
      const out = coalesce(segments);
      assert.equal(out.length, 1);
      const [w] = out;
      const l4 = v6 ? 40 : 20;
      assert.deepEqual(w.header, {
        flags: VNET_F_NEEDS_CSUM, gsoType: v6 ? GSO_TCPV6 : GSO_TCPV4, hdrLen: l4 + 32, gsoSize: mss, csumStart: l4, csumOffset: 16,
      });
      const whole = kernelCompletes(w);
      assertValidTcp(whole, 'coalesced');
      assert.deepEqual(payloadOf(whole), payload);
      assert.equal(seqOf(whole), 0xfffff000);
      assert.ok(flagsOf(whole) & PSH, 'PSH of the last segment is kept');
    });
  }

  test('a lone packet and non-TCP packets are written unchanged, without offload', () => {
    const single = flow(1, 500);
    const icmp = new Uint8Array([0x45, 0, 0, 28, 0, 0, 0, 0, 64, 1, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2, 8, 0, 0, 0, 0, 0, 0, 0]);
    const out = coalesce([single, icmp]);
    assert.equal(out.length, 2);
    for (const [i, w] of out.entries()) {
      assert.deepEqual(w.header, { flags: 0, gsoType: GSO_NONE, hdrLen: 0, gsoSize: 0, csumStart: 0, csumOffset: 0 });
      assert.deepEqual(w.packet, [single, icmp][i]);
    }
  });

  test('order within a flow is kept: a gap, a FIN, a pure ACK or other options end the run', () => {
    const a = [flow(0, mss), flow(1000, mss), flow(3000, mss), flow(4000, mss)]; // gap at 2000
    assert.deepEqual(coalesce(a).map((w) => [seqOf(kernelCompletes(w)), payloadOf(w.packet).length]), [[0, 2000], [3000, 2000]]);

    const fin = [flow(0, mss), flow(1000, mss, { flags: ACK | FIN }), flow(2000, mss)];
    assert.deepEqual(coalesce(fin).map((w) => seqOf(w.packet)), [0, 1000, 2000]);

    const pureAck = [flow(0, mss), tcpPacket({ seq: 1000, payload: new Uint8Array(0) }), flow(1000, mss)];
    assert.deepEqual(coalesce(pureAck).map((w) => [seqOf(w.packet), payloadOf(w.packet).length]), [[0, mss], [1000, 0], [1000, mss]]);

    const options = [flow(0, mss), flow(1000, mss, { options: [1, 1, 8, 10, 0, 0, 0, 9, 0, 0, 0, 2] }), flow(2000, mss, { options: [1, 1, 8, 10, 0, 0, 0, 9, 0, 0, 0, 2] })];
    assert.deepEqual(coalesce(options).map((w) => [seqOf(w.packet), payloadOf(w.packet).length]), [[0, mss], [1000, 2000]]);

    const ack = [flow(0, mss), flow(1000, mss, { ack: 778 })];
    assert.equal(coalesce(ack).length, 2, 'another ACK number');

    const ttl = [flow(0, mss), flow(1000, mss, { ttl: 3 })];
    assert.equal(coalesce(ttl).length, 2, 'another TTL');

    const larger = [flow(0, mss), flow(1000, mss + 1)];
    assert.equal(coalesce(larger).length, 2, 'a segment larger than the first');

    const afterShort = [flow(0, mss), flow(1000, 10), flow(1010, mss)];
    assert.deepEqual(coalesce(afterShort).map((w) => payloadOf(w.packet).length), [mss + 10, mss], 'nothing after a short segment');

    const afterPush = [flow(0, mss, { flags: ACK | PSH }), flow(1000, mss)];
    assert.equal(coalesce(afterPush).length, 2, 'nothing after PSH');
  });

  test('interleaved flows coalesce separately; other flows may be overtaken, a flow never reorders', () => {
    const f1 = (seq: number) => tcpPacket({ seq, srcPort: 1111, payload: new Uint8Array(mss).fill(1) });
    const f2 = (seq: number) => tcpPacket({ seq, srcPort: 2222, payload: new Uint8Array(mss).fill(2) });
    const v6 = (seq: number) => tcpPacket({ v6: true, seq, srcPort: 1111, payload: new Uint8Array(mss).fill(6) });
    const out = coalesce([f1(0), f2(0), f1(1000), v6(0), f2(1000), f1(2000), v6(1000)]);
    const summary = out.map((w) => [w.packet[0] >> 4, (w.packet[w.header.csumStart] << 8) | w.packet[w.header.csumStart + 1], payloadOf(w.packet).length]);
    assert.deepEqual(summary, [[4, 1111, 3000], [4, 2222, 2000], [6, 1111, 2000]]);
    for (const w of out) assertValidTcp(kernelCompletes(w), 'flow');
  });

  /** What the receiving stack sees of one write: a merged packet completed, a lone one as it is. */
  const received = (w: Written) => ({ merged: w.header.gsoType !== GSO_NONE, seq: seqOf(w.packet), bytes: payloadOf(w.packet).length });
  const NO_OFFLOAD = { flags: 0, gsoType: GSO_NONE, hdrLen: 0, gsoSize: 0, csumStart: 0, csumOffset: 0 };

  for (const v6 of [false, true]) {
    test(`IPv${v6 ? 6 : 4}: a segment with a bad TCP checksum is never merged: written alone, unchanged, for the kernel to drop`, () => {
      const segment = (i: number) => flow(i * mss, mss, { v6 });
      for (const bad of [0, 3, 6]) { // first, middle, last of seven
        const segments = Array.from({ length: 7 }, (_, i) => segment(i));
        const corrupt = segments[bad];
        corrupt[corrupt.length - 1] ^= 0x40; // a payload bit flipped after the checksum was made
        const copy = corrupt.slice();
        const out = coalesce(segments);
        const expected = [
          ...(bad > 0 ? [{ merged: bad > 1, seq: 0, bytes: bad * mss }] : []),
          { merged: false, seq: bad * mss, bytes: mss },
          ...(bad < 6 ? [{ merged: bad < 5, seq: (bad + 1) * mss, bytes: (6 - bad) * mss }] : []),
        ];
        assert.deepEqual(out.map(received), expected, `bad segment ${bad}`);
        const lone = out.find((w) => seqOf(w.packet) === bad * mss)!;
        assert.deepEqual(lone.header, NO_OFFLOAD, 'no NEEDS_CSUM: the kernel verifies it');
        assert.deepEqual(lone.packet, copy, 'written as it came, bad checksum included');
        assert.throws(() => assertValidTcp(lone.packet, 'corrupt'), /TCP checksum/);
        for (const w of out) if (w !== lone) assertValidTcp(kernelCompletes(w), 'good segments');
      }
    });
  }

  test('a segment with a bad IPv4 header checksum is never merged (the merge would recompute it)', () => {
    const segments = Array.from({ length: 5 }, (_, i) => flow(i * mss, mss));
    segments[2][5] ^= 0x01; // the IP ID (not compared between segments), checksum left as it was
    const copy = segments[2].slice();
    const out = coalesce(segments);
    assert.deepEqual(out.map(received), [
      { merged: true, seq: 0, bytes: 2 * mss }, { merged: false, seq: 2 * mss, bytes: mss }, { merged: true, seq: 3 * mss, bytes: 2 * mss },
    ]);
    assert.deepEqual(out[1].packet, copy);
    assert.notEqual(internetChecksum(out[1].packet, 0, 20), 0, 'the kernel drops it');
  });

  test('a bad checksum in either segment of a pair keeps both apart; good pairs still merge', () => {
    const pair = () => [flow(0, mss), flow(mss, mss)];
    assert.deepEqual(coalesce(pair()).map(received), [{ merged: true, seq: 0, bytes: 2 * mss }]);
    for (const bad of [0, 1]) {
      const segments = pair();
      segments[bad][60] ^= 0xff;
      assert.deepEqual(coalesce(segments).map(received), [{ merged: false, seq: 0, bytes: mss }, { merged: false, seq: mss, bytes: mss }]);
    }
  });

  test('a coalesced packet stays within 64 KiB', () => {
    const segments = Array.from({ length: 70 }, (_, i) => flow(i * mss, mss));
    const out = coalesce(segments);
    assert.ok(out.length >= 2);
    for (const w of out) assert.ok(w.packet.length <= MAX_COALESCED);
    assert.equal(out.reduce((n, w) => n + payloadOf(w.packet).length, 0), 70 * mss);
  });

  test('vnet header fields are little-endian', () => {
    const b = new Uint8Array(VNET_HDR_SIZE);
    writeVnetHeader(b, 0, 1, 4, 0x1234, 0x0567, 0x0028, 0x0010);
    assert.deepEqual([...b], [1, 4, 0x34, 0x12, 0x67, 0x05, 0x28, 0, 0x10, 0]);
  });
});

describe('TUN reader thread with a vnet header (a scripted kernel)', () => {
  test('super-packets are split into ring slots, partial checksums completed, bad ones counted', async () => {
    const { runReader } = await import('../../dataplane/tun/reader-worker.ts');
    const { ringBytes, ringViews, READ_ERRORS, PACKET_OFFSET } = await import('../../dataplane/tun/ring.ts');
    const { STATE, STATE_STOPPED, STATE_STOP_REQUESTED, WRITE_SEQ } = await import('../../dataplane/ring/shared-ring.ts');
    const { EAGAIN, POLLIN } = await import('../../dataplane/sys/libc.ts');
    type Libc = import('../../dataplane/sys/libc.ts').Libc;

    const layout = { slots: 64, slotSize: 65536 };
    const buffer = new SharedArrayBuffer(ringBytes(layout));
    const ring = ringViews(buffer, layout);
    const random = prng(21);
    const payload = randomBytes(random, 1368 * 30 + 5);
    const big = superPacket(false, payload, ACK | PSH, 1368);
    const plain = tcpPacket({ seq: 9, payload: randomBytes(random, 100) });
    const partial = plain.slice();
    const sum = fold(pseudo(partial, false, partial.length - 20));
    partial[36] = sum >> 8;
    partial[37] = sum & 0xff;
    const withHeader = (header: VnetHeader, packet: Uint8Array) => {
      const out = new Uint8Array(VNET_HDR_SIZE + packet.length);
      writeVnetHeader(out, 0, header.flags, header.gsoType, header.hdrLen, header.gsoSize, header.csumStart, header.csumOffset);
      out.set(packet, VNET_HDR_SIZE);
      return out;
    };
    const none = { flags: 0, gsoType: GSO_NONE, hdrLen: 0, gsoSize: 0, csumStart: 0, csumOffset: 0 };
    const kernel = [
      withHeader(big.header, big.packet),
      withHeader({ ...none, flags: VNET_F_NEEDS_CSUM, csumStart: 20, csumOffset: 16 }, partial),
      withHeader({ ...big.header, gsoType: 3 }, big.packet), // UDP GSO was not offered: dropped
      withHeader(none, plain),
    ];
    let errno = 0;
    let polls = 0;
    const libc = {
      poll(fds: Uint8Array) {
        const v = new Int16Array(fds.buffer, fds.byteOffset, 8);
        if (polls++ === 0) v[3] = POLLIN; // the TUN fd is readable
        else { Atomics.store(ring.header, STATE, STATE_STOP_REQUESTED); v[7] = POLLIN; } // then the main thread asks to stop
        return 1;
      },
      read(_fd: number, buf: Uint8Array, size: number) {
        const next = kernel.shift();
        if (!next) { errno = EAGAIN; return -1; }
        assert.ok(size >= next.length);
        buf.set(next);
        return next.length;
      },
      errno: () => errno,
    } as unknown as Libc;
    runReader(libc, { fd: 3, wakeFd: 4, buffer, ...layout, vnetHeader: true });

    assert.equal(Atomics.load(ring.header, STATE), STATE_STOPPED);
    assert.equal(Atomics.load(ring.header, READ_ERRORS), 1, 'the UDP super-packet');
    const count = Atomics.load(ring.header, WRITE_SEQ);
    assert.equal(count, 31 + 2);
    // Each packet lies PACKET_OFFSET into its slot (room for the transport header).
    const slot = (i: number) => ring.data.slice(i * layout.slotSize + PACKET_OFFSET, i * layout.slotSize + PACKET_OFFSET + ring.lengths[i]);
    let offset = 0;
    for (let i = 0; i < 31; i++) {
      const s = slot(i);
      assertValidTcp(s, `segment ${i}`);
      assert.deepEqual(payloadOf(s), payload.subarray(offset, offset + payloadOf(s).length));
      offset += payloadOf(s).length;
    }
    assert.equal(offset, payload.length);
    assert.deepEqual(slot(31), plain, 'the partial checksum completed');
    assert.deepEqual(slot(32), plain);
  });
});

describe('vnet reads: what the TUN reader does with what the kernel hands over (vnet-read.ts)', () => {
  /** A sink of `slots` slots of exactly `slotSize` bytes in one buffer, recording what was placed. */
  function sinkOf(slotSize: number, slots = 64, stopAfter = Infinity) {
    const ring = new Uint8Array(new SharedArrayBuffer(slotSize * slots));
    const placed: Uint8Array[] = [];
    let next = 0;
    const sink: SlotSink = {
      slot: () => (placed.length >= stopAfter ? undefined : ring.subarray((next % slots) * slotSize, (next % slots + 1) * slotSize)),
      filled: (length) => {
        assert.ok(length <= slotSize, 'never longer than a slot');
        const at = (next++ % slots) * slotSize;
        placed.push(ring.slice(at, at + length));
      },
    };
    return { sink, placed, words: wordsOf(ring.buffer) };
  }
  const read = (reader: VnetReader, header: VnetHeader, packet: Uint8Array, sink: SlotSink) => {
    writeVnetHeader(reader.target, 0, header.flags, header.gsoType, header.hdrLen, header.gsoSize, header.csumStart, header.csumOffset);
    reader.target.set(packet, VNET_HDR_SIZE);
    return reader.ingest(VNET_HDR_SIZE + packet.length, sink);
  };
  const none = { flags: 0, gsoType: GSO_NONE, hdrLen: 0, gsoSize: 0, csumStart: 0, csumOffset: 0 };

  test('good reads: a super-packet becomes its segments, a whole packet one slot; a stop is reported', () => {
    const { sink, placed, words } = sinkOf(2048);
    const reader = new VnetReader(2048, words);
    const payload = randomBytes(prng(5), 1400 * 5 + 3);
    const big = superPacket(true, payload, ACK, 1400);
    assert.equal(read(reader, big.header, big.packet, sink), 6);
    for (const s of placed) assertValidTcp(s, 'segment');
    assert.deepEqual(Buffer.concat(placed.map(payloadOf)), Buffer.from(payload));
    const plain = tcpPacket({ seq: 1, payload: new Uint8Array(100) });
    assert.equal(read(reader, none, plain, sink), 1);
    assert.deepEqual(placed.at(-1), plain);
    const stopping = sinkOf(2048, 64, 2);
    assert.equal(read(new VnetReader(2048, stopping.words), big.header, big.packet, stopping.sink), VNET_READ_STOPPED);
    assert.equal(stopping.placed.length, 2);
  });

  test('hostile vnet headers and sizes are refused, nothing is written past a slot, nothing throws', () => {
    const payload = randomBytes(prng(6), 70_000);
    const v4 = superPacket(false, payload, ACK, 1400);
    const v6 = superPacket(true, payload.subarray(0, 9000), ACK, 1400);
    const hostile: [string, VnetHeader, Uint8Array, number?][] = [
      // The largest gso_size with a payload that fills it: a segment of 65535 bytes plus headers
      // does not fit a 64 KiB ring slot (ring.ts SLOT_SIZE).
      ['gso_size 65535 (segment larger than a slot)', { ...v4.header, gsoSize: 65535 }, v4.packet, 65536],
      ['gso_size past a small slot', { ...v6.header, gsoSize: 4000 }, v6.packet, 2048],
      ['whole packet larger than a slot', none, payload.subarray(0, 2049), 2048],
      ['gso_size 0', { ...v4.header, gsoSize: 0 }, v4.packet],
      ['UDP GSO', { ...v4.header, gsoType: 3 }, v4.packet],
      ['UDP L4 GSO', { ...v4.header, gsoType: 5 }, v4.packet],
      ['unknown GSO type', { ...v4.header, gsoType: 0x42 }, v4.packet],
      ['IPv4 GSO type on IPv6', { ...v6.header, gsoType: GSO_TCPV4 }, v6.packet],
      ['csum_start not the IPv4 header length', { ...v4.header, csumStart: 24 }, v4.packet],
      ['csum_start past the packet', { ...v4.header, csumStart: 65000 }, v4.packet.subarray(0, 100)],
      ['TCP header cut off', v4.header, v4.packet.subarray(0, 30)],
      ['TCP data offset below 5', v4.header, Uint8Array.from(v4.packet.subarray(0, 200), (b, i) => (i === 32 ? 0x30 : b))],
      ['NEEDS_CSUM field past the end', { ...none, flags: VNET_F_NEEDS_CSUM, csumStart: 20, csumOffset: 16 }, v4.packet.subarray(0, 30)],
      ['NEEDS_CSUM start past the end', { ...none, flags: VNET_F_NEEDS_CSUM, csumStart: 4000, csumOffset: 0 }, v4.packet.subarray(0, 100)],
      ['no packet after the header', none, new Uint8Array(0)],
    ];
    for (const [what, header, packet, slotSize = 65536] of hostile) {
      const { sink, placed, words } = sinkOf(slotSize, 4);
      const reader = new VnetReader(slotSize, words);
      assert.equal(read(reader, header, packet, sink), VNET_READ_REFUSED, what);
      assert.equal(placed.length, 0, what);
    }
    const reader = new VnetReader(65536);
    for (const n of [0, 5, VNET_HDR_SIZE]) assert.equal(reader.ingest(n, sinkOf(65536, 1).sink), VNET_READ_REFUSED, `a read of ${n} bytes`);
  });

  test('random vnet headers over random and real packets never throw nor overflow a slot', () => {
    const random = prng(77);
    const int = (n: number) => Math.floor(random() * n);
    const real = [superPacket(false, randomBytes(random, 20_000), ACK, 1400).packet, superPacket(true, randomBytes(random, 20_000), ACK, 1400).packet];
    const slotSize = 2048;
    for (let i = 0; i < 3000; i++) {
      const { sink, words } = sinkOf(slotSize, 8);
      const reader = new VnetReader(slotSize, words);
      const packet = i % 2 === 0 ? randomBytes(random, int(3000)) : real[int(2)].subarray(0, int(20_100));
      const header = {
        flags: int(4), gsoType: [0, 1, 3, 4, 5, 0x81, int(256)][int(7)], hdrLen: int(65536),
        gsoSize: [0, 1, int(65536), 1400, 2000, 65535][int(6)], csumStart: [20, 40, int(65536), int(100)][int(4)], csumOffset: [6, 16, int(65536)][int(3)],
      };
      assert.ok(read(reader, header, packet, sink) >= VNET_READ_REFUSED);
    }
  });
});
