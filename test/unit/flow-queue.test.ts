/**
 * flowQueue (dataplane/tun/flow-queue.ts): the queue of a multi-queue TUN a packet is written
 * through. One flow always gets one queue, whatever else differs between its packets; flows spread
 * over the queues; a packet too short or of no known version is still given a queue in range.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { flowQueue } from '../../dataplane/tun/flow-queue.ts';

function ipv4(src: string, dst: string, protocol: number, sport: number, dport: number, options: { fragmentOffset?: number; moreFragments?: boolean; ttl?: number; payload?: number } = {}): Uint8Array {
  const p = new Uint8Array(20 + 8 + (options.payload ?? 8));
  p[0] = 0x45;
  p[6] = ((options.moreFragments ? 0x20 : 0) | ((options.fragmentOffset ?? 0) >> 8)) & 0xff;
  p[7] = (options.fragmentOffset ?? 0) & 0xff;
  p[8] = options.ttl ?? 64;
  p[9] = protocol;
  p.set(src.split('.').map(Number), 12);
  p.set(dst.split('.').map(Number), 16);
  new DataView(p.buffer).setUint16(20, sport);
  new DataView(p.buffer).setUint16(22, dport);
  return p;
}

function ipv6(last: number, protocol: number, sport: number, dport: number): Uint8Array {
  const p = new Uint8Array(40 + 8 + 8);
  p[0] = 0x60;
  p[6] = protocol;
  p[7] = 64;
  p[8] = 0xfd; p[23] = last;
  p[24] = 0xfd; p[39] = 1;
  new DataView(p.buffer).setUint16(40, sport);
  new DataView(p.buffer).setUint16(42, dport);
  return p;
}

const at = (p: Uint8Array, queues: number) => flowQueue(p, 0, p.length, queues);

describe('flowQueue', () => {
  test('one queue: always 0', () => {
    assert.equal(at(ipv4('10.0.0.1', '10.0.0.2', 6, 1000, 80), 1), 0);
  });

  test('one flow, one queue: TTL, length and payload do not change it; the same bytes behind a header offset do not either', () => {
    for (const queues of [2, 3, 8]) {
      for (let port = 40000; port < 40050; port++) {
        const a = at(ipv4('10.0.0.1', '10.0.0.2', 6, port, 80), queues);
        assert.equal(at(ipv4('10.0.0.1', '10.0.0.2', 6, port, 80, { ttl: 3, payload: 1400 }), queues), a);
        const framed = new Uint8Array(10 + 36);
        framed.set(ipv4('10.0.0.1', '10.0.0.2', 6, port, 80), 10);
        assert.equal(flowQueue(framed, 10, 36, queues), a, 'read at its offset (behind a vnet header)');
      }
    }
  });

  test('flows spread over the queues (IPv4 TCP and UDP, IPv6)', () => {
    for (const queues of [2, 4]) {
      const counts = new Array<number>(queues).fill(0);
      for (let port = 40000; port < 40256; port++) {
        counts[at(ipv4('10.0.0.1', '10.0.0.2', port % 2 === 0 ? 6 : 17, port, 5201), queues)]++;
        counts[at(ipv6(port & 0xff, 17, port, 53), queues)]++;
      }
      for (const n of counts) assert.ok(n > 512 / queues / 2, `every queue gets its share: ${counts.join(' ')}`);
    }
  });

  test('ports count only where the packet carries them: a later fragment goes by addresses and protocol', () => {
    const tcp = (sport: number, offset: number) => at(ipv4('10.0.0.1', '10.0.0.2', 17, sport, 53, { fragmentOffset: offset }), 64);
    assert.equal(tcp(1111, 185), tcp(2222, 185), 'bytes where ports would be are not read');
    const first = new Set<number>();
    for (let port = 1000; port < 1064; port++) first.add(tcp(port, 0));
    assert.ok(first.size > 1, 'the first fragment does carry its ports');
    const other = at(ipv4('10.0.0.1', '10.0.0.2', 47, 1, 2), 64);
    assert.equal(other, at(ipv4('10.0.0.1', '10.0.0.2', 47, 3, 4), 64), 'another protocol: no ports');
  });

  test('short, truncated or unknown packets get a queue in range and never throw', () => {
    for (const p of [new Uint8Array(0), new Uint8Array(19), new Uint8Array(20), Uint8Array.of(0x60, ...new Uint8Array(30)), new Uint8Array(64).fill(0xff)]) {
      const q = flowQueue(p, 0, p.length, 3);
      assert.ok(q >= 0 && q < 3 && Number.isInteger(q));
    }
    const truncated = ipv4('10.0.0.1', '10.0.0.2', 6, 1, 2).subarray(0, 22);
    assert.ok(at(truncated, 2) >= 0);
  });
});
