import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  answerEchoRequest,
  buildEchoReply,
  buildEchoRequest,
  fromHex,
  internetChecksum,
  isEchoReplyTo,
  parseEcho,
  toHex,
} from '../system/packets.ts';

// Hand-assembled packets; checksums worked out on paper, word by word.
//
// IPv4: header words 4500 001c 1235 4000 4001 [csum] 0a00 0001 0a00 0002
//   sum = 0xeb55 -> checksum 0x14aa
// ICMP: words 0800 [csum] 1234 0001 -> sum 0x1a35 -> checksum 0xe5ca
const IPV4_ECHO_REQUEST =
  '4500001c' + '12354000' + '400114aa' + '0a000001' + '0a000002' + // IPv4 header
  '0800e5ca' + '12340001'; // ICMP echo request, id 0x1234, seq 1, no data

// IPv6: fd00::1 -> fd00::2, ICMPv6 echo request id 0x1234 seq 1, no data.
// pseudo-header: fd00+0001 + fd00+0002 + length 8 + next header 0x3a = 0x1fa45
// ICMPv6 words 8000 [csum] 1234 0001 = 0x9235; total 0x28c7a -> folded 0x8c7c -> checksum 0x7383
const IPV6_ECHO_REQUEST =
  '60000000' + '00083a40' + // version 6, payload length 8, next header 58, hop limit 64
  'fd000000000000000000000000000001' +
  'fd000000000000000000000000000002' +
  '80007383' + '12340001';

test('builds an IPv4 ICMP echo request identical to a hand-assembled one', () => {
  const built = buildEchoRequest({ src: '10.0.0.1', dst: '10.0.0.2', id: 0x1234, seq: 1 });
  assert.equal(toHex(built), IPV4_ECHO_REQUEST);
});

test('builds an IPv6 ICMPv6 echo request identical to a hand-assembled one (pseudo-header checksum)', () => {
  const built = buildEchoRequest({ src: 'fd00::1', dst: 'fd00::2', id: 0x1234, seq: 1 });
  assert.equal(toHex(built), IPV6_ECHO_REQUEST);
});

test('parses the hand-assembled packets', () => {
  const v4 = parseEcho(fromHex(IPV4_ECHO_REQUEST));
  assert.deepEqual(v4 && { ...v4, payload: toHex(v4.payload) }, {
    family: 4, kind: 'request', src: '10.0.0.1', dst: '10.0.0.2', id: 0x1234, seq: 1, ttl: 64,
    payload: '', ipChecksumOk: true, icmpChecksumOk: true,
  });
  const v6 = parseEcho(fromHex(IPV6_ECHO_REQUEST));
  assert.deepEqual(v6 && { ...v6, payload: toHex(v6.payload) }, {
    family: 6, kind: 'request', src: 'fd00::1', dst: 'fd00::2', id: 0x1234, seq: 1, ttl: 64,
    payload: '', ipChecksumOk: true, icmpChecksumOk: true,
  });
});

test('internet checksum: known RFC 1071 example and a zero sum over correct data', () => {
  // RFC 1071 section 3 example: words 0001 f203 f4f5 f6f7 sum to 0x2ddf0 -> folded 0xddf2.
  const data = fromHex('0001f203f4f5f6f7');
  assert.equal(internetChecksum(data), ~0xddf2 & 0xffff);
  // Odd length: the last byte is padded with a zero byte.
  assert.equal(internetChecksum(fromHex('01')), ~0x0100 & 0xffff);
  const p = fromHex(IPV4_ECHO_REQUEST);
  assert.equal(internetChecksum(p, 0, 20), 0);
  assert.equal(internetChecksum(p, 20, 28), 0);
});

for (const [family, src, dst] of [[4, '192.0.2.10', '198.51.100.7'], [6, '2001:db8::a', '2001:db8:1::7']] as const) {
  test(`IPv${family}: checksums verify by recomputation for many payload sizes`, () => {
    for (const size of [0, 1, 2, 3, 15, 16, 17, 56, 255, 1000, 1391]) {
      const payload = new Uint8Array(size);
      for (let i = 0; i < size; i++) payload[i] = (i * 37 + size) & 0xff;
      for (const build of [buildEchoRequest, buildEchoReply]) {
        const packet = build({ src, dst, id: 0xbeef, seq: size, payload });
        const parsed = parseEcho(packet);
        assert.ok(parsed, `size ${size}`);
        assert.equal(parsed.ipChecksumOk, true);
        assert.equal(parsed.icmpChecksumOk, true);
        assert.equal(parsed.id, 0xbeef);
        assert.equal(parsed.seq, size);
        assert.deepEqual(parsed.payload, payload);
        const headerLength = family === 4 ? 20 : 40;
        assert.equal(packet.length, headerLength + 8 + size);
        if (family === 4) {
          assert.equal(internetChecksum(packet, 0, 20), 0);
          // Recompute the ICMP checksum from scratch with the field zeroed.
          const copy = packet.slice();
          copy[22] = 0; copy[23] = 0;
          assert.equal(internetChecksum(copy, 20), (packet[22] << 8) | packet[23]);
        } else {
          // Recompute over an explicit pseudo-header + message buffer.
          const len = 8 + size;
          const buf = new Uint8Array(40 + len);
          buf.set(packet.subarray(8, 40), 0); // src, dst
          new DataView(buf.buffer).setUint32(32, len);
          buf[39] = 58;
          buf.set(packet.subarray(40), 40);
          buf[42] = 0; buf[43] = 0;
          assert.equal(internetChecksum(buf), (packet[42] << 8) | packet[43]);
        }
      }
    }
  });

  test(`IPv${family}: a wrong checksum is detected`, () => {
    const packet = buildEchoReply({ src: dst, dst: src, id: 7, seq: 9, payload: fromHex('00112233445566') });
    assert.equal(isEchoReplyTo(packet, { src, dst, id: 7, seq: 9, payload: fromHex('00112233445566') }), true);
    const icmpStart = family === 4 ? 20 : 40;
    const corrupted = packet.slice();
    corrupted[corrupted.length - 1] ^= 0x01; // payload bit flip
    assert.equal(parseEcho(corrupted)?.icmpChecksumOk, false);
    const badChecksum = packet.slice();
    badChecksum[icmpStart + 2] ^= 0x80;
    assert.equal(parseEcho(badChecksum)?.icmpChecksumOk, false);
    assert.equal(isEchoReplyTo(badChecksum, { src, dst, id: 7, seq: 9, payload: fromHex('00112233445566') }), false);
    if (family === 4) {
      const badHeader = packet.slice();
      badHeader[8] ^= 0x01; // TTL changed without fixing the header checksum
      assert.equal(parseEcho(badHeader)?.ipChecksumOk, false);
      assert.equal(parseEcho(badHeader)?.icmpChecksumOk, true);
    } else {
      // The ICMPv6 checksum covers the addresses through the pseudo-header.
      const otherSource = packet.slice();
      otherSource[23] ^= 0x01;
      assert.equal(parseEcho(otherSource)?.icmpChecksumOk, false);
    }
  });

  test(`IPv${family}: reply matching`, () => {
    const payload = fromHex('deadbeef01');
    const spec = { src, dst, id: 0x4242, seq: 3, payload };
    const request = buildEchoRequest(spec);
    const reply = answerEchoRequest(request);
    assert.ok(reply);
    const parsed = parseEcho(reply);
    assert.equal(parsed?.kind, 'reply');
    assert.equal(parsed?.src, dst);
    assert.equal(parsed?.dst, src);
    assert.equal(isEchoReplyTo(reply, spec), true);
    assert.equal(isEchoReplyTo(reply, request), true);
    assert.equal(isEchoReplyTo(request, spec), false, 'a request is not a reply');
    assert.equal(isEchoReplyTo(reply, { ...spec, seq: 4 }), false, 'other sequence');
    assert.equal(isEchoReplyTo(reply, { ...spec, id: 1 }), false, 'other identifier');
    assert.equal(isEchoReplyTo(reply, { ...spec, payload: fromHex('deadbeef02') }), false, 'other payload');
    assert.equal(isEchoReplyTo(buildEchoReply({ ...spec }), spec), false, 'addresses not swapped');
    assert.equal(answerEchoRequest(reply), undefined, 'only requests are answered');
  });
}

test('non-echo packets are not parsed', () => {
  assert.equal(parseEcho(new Uint8Array(0)), undefined);
  assert.equal(parseEcho(fromHex(IPV4_ECHO_REQUEST).subarray(0, 24)), undefined, 'truncated');
  const udp = fromHex(IPV4_ECHO_REQUEST);
  udp[9] = 17;
  assert.equal(parseEcho(udp), undefined, 'UDP');
  const unreachable = fromHex(IPV6_ECHO_REQUEST);
  unreachable[40] = 1;
  assert.equal(parseEcho(unreachable), undefined, 'ICMPv6 destination unreachable');
  assert.throws(() => buildEchoRequest({ src: '10.0.0.1', dst: 'fd00::1', id: 1, seq: 1 }), /mixed/);
  assert.throws(() => buildEchoRequest({ src: '10.0.0.1', dst: '10.0.0.2', id: 70000, seq: 1 }), RangeError);
});
