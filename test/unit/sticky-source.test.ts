/**
 * Sticky sources of FfiUdpBind on loopback (no namespaces: all of 127.0.0.0/8 is local on lo, so
 * 127.0.0.2 and 127.0.0.3 are "other addresses" of this host; the namespace test with real
 * secondary addresses and their removal is test/system/sticky-source.test.ts):
 * - a received datagram's source Endpoint carries the local address it arrived on (IP_PKTINFO /
 *   IPV6_PKTINFO), and what is sent to that Endpoint leaves from that address, on every send path
 *   (one datagram, answers collected during a delivery, sendBatch with and without UDP GSO);
 * - a source the kernel refuses (an address this host does not have: as after its removal) is
 *   cleared and the datagram still leaves, from the address the kernel picks;
 * - over two Devices: a peer that talks to our second address keeps seeing it (no roam).
 * Runs under Node and Bun.
 */
import { afterEach, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import dgram from 'node:dgram';
import { readFileSync } from 'node:fs';
import { FfiUdpBind } from '../../dataplane/bind/ffi-udp-bind.ts';
import { Endpoint, LocalSource } from '../../dataplane/net/endpoint.ts';
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import { Device } from '../../dataplane/device/device.ts';
import { generatePrivateKey } from '../../dataplane/noise/keys.ts';
import { MemoryTun } from '../../dataplane/tun/memory-tun.ts';
import { buildEchoRequest, parseEcho } from '../system/packets.ts';
import { until } from '../helpers/until.ts';

interface Received {
  data: Uint8Array;
  source: Endpoint;
}

interface Arrival {
  data: Buffer;
  address: string;
  port: number;
}

const opened: Array<{ close(): Promise<void> | void }> = [];
afterEach(async () => {
  for (const b of opened.splice(0)) await b.close();
});

const loopbackIndex = Number(readFileSync('/sys/class/net/lo/ifindex', 'utf8'));

/** A bind whose handler records what arrives and then calls `answer` (if given) during the delivery. */
async function ffiBind(answer?: (data: Uint8Array, source: Endpoint, bind: FfiUdpBind) => void): Promise<{ bind: FfiUdpBind; got: Received[] }> {
  const bind = new FfiUdpBind();
  const got: Received[] = [];
  bind.onReceive((data, source) => {
    got.push({ data: data.slice(), source });
    answer?.(data, source, bind);
  });
  opened.push(bind);
  await bind.open(0);
  await bind.ready();
  return { bind, got };
}

async function client(type: 'udp4' | 'udp6'): Promise<{ socket: dgram.Socket; got: Arrival[] }> {
  const socket = dgram.createSocket({ type, ipv6Only: type === 'udp6' });
  const got: Arrival[] = [];
  socket.on('message', (data, rinfo) => got.push({ data, address: rinfo.address, port: rinfo.port }));
  await new Promise<void>((resolve) => socket.bind(0, type === 'udp4' ? '127.0.0.1' : '::1', resolve));
  opened.push({ close: () => new Promise<void>((resolve) => socket.close(() => resolve())) });
  return { socket, got };
}


/** `count` datagrams of `size` bytes (datagram i starts with i) in shared memory, PacketBatch layout. */
function sharedBatch(count: number, size: number): { data: Uint8Array; lengths: Int32Array } {
  const data = new Uint8Array(new SharedArrayBuffer(count * size));
  const lengths = new Int32Array(new SharedArrayBuffer(4 * count)).fill(size);
  for (let i = 0; i < count; i++) data[i * size] = i;
  return { data, lengths };
}

const textOf = (local: LocalSource | undefined) => local?.toString();

describe('sticky sources (FfiUdpBind, loopback)', () => {
  test('IPv4: replies leave from the address the datagram arrived on, on every send path', async () => {
    const { bind, got } = await ffiBind((data, source, self) => {
      if (data[0] === 1) self.send(source, Uint8Array.of(0xa1)); // collected during the delivery
    });
    const peer = await client('udp4');
    peer.socket.send(Uint8Array.of(1), bind.port, '127.0.0.2');
    await until(() => got.length === 1 && peer.got.length === 1, 10_000, 'the datagram and its collected answer');
    const source = got[0].source;
    assert.equal(source.toString(), `127.0.0.1:${peer.socket.address().port}`, 'the remote address and port, as before');
    assert.equal(textOf(source.local), `127.0.0.2%${loopbackIndex}`, 'the local address it arrived on, and lo');

    bind.send(source, new Uint8Array(1000).fill(0xa2)); // one datagram, outside a delivery
    const gso = sharedBatch(8, 600); // a run of equal sizes: one UDP GSO message
    bind.sendBatch(source, gso.data, 600, gso.lengths, 8);
    const single = sharedBatch(3, 800);
    single.lengths[0] = 500; // a shorter datagram ends its run: messages of one datagram each
    single.lengths[1] = 300;
    single.lengths[2] = 700;
    bind.sendBatch(source, single.data, 800, single.lengths, 3);
    await until(() => peer.got.length === 1 + 1 + 8 + 3, 10_000, 'every reply');
    assert.deepEqual(peer.got.map((a) => a.address), Array(13).fill('127.0.0.2'), 'every reply left from 127.0.0.2');
    assert.deepEqual(peer.got.map((a) => a.port), Array(13).fill(bind.port));
    assert.deepEqual(peer.got.slice(2, 10).map((a) => a.data[0]), [0, 1, 2, 3, 4, 5, 6, 7], 'the GSO run, in order');
    assert.equal(bind.stats.sendErrors, 0);
    assert.equal(bind.stats.sourcesCleared, 0);

    // The control: to the same peer without a sticky source, the kernel picks 127.0.0.1.
    bind.send(new Endpoint('127.0.0.1', peer.socket.address().port), Uint8Array.of(0xa3));
    await until(() => peer.got.length === 14, 10_000, 'the reply without a sticky source');
    assert.equal(peer.got[13].address, '127.0.0.1');
  });

  test('IPv4: another local address gives another Endpoint (equal, not the same); the same one gives the cached one', async () => {
    const { bind, got } = await ffiBind();
    const peer = await client('udp4');
    for (const to of ['127.0.0.2', '127.0.0.2', '127.0.0.3']) peer.socket.send(Uint8Array.of(1), bind.port, to);
    await until(() => got.length === 3, 10_000, 'three datagrams');
    const [first, again, third] = got.map((g) => g.source);
    assert.ok(first === again, 'same source and local address: the cached Endpoint');
    assert.ok(third !== first && third.equals(first), 'another local address: another Endpoint of the same peer address');
    assert.equal(textOf(third.local), `127.0.0.3%${loopbackIndex}`);
    bind.send(third, Uint8Array.of(2));
    await until(() => peer.got.length === 1, 10_000, 'the reply');
    assert.equal(peer.got[0].address, '127.0.0.3');
  });

  test('IPv6: the local address is recorded and replies leave from it', async () => {
    const { bind, got } = await ffiBind((data, source, self) => self.send(source, Uint8Array.of(0xb1)));
    const peer = await client('udp6');
    peer.socket.send(Uint8Array.of(1), bind.port, '::1');
    await until(() => got.length === 1 && peer.got.length === 1, 10_000, 'the datagram and its collected answer');
    const source = got[0].source;
    assert.equal(source.toString(), `[::1]:${peer.socket.address().port}`);
    assert.equal(textOf(source.local), `::1%${loopbackIndex}`);
    bind.send(source, new Uint8Array(900));
    const gso = sharedBatch(4, 800);
    bind.sendBatch(source, gso.data, 800, gso.lengths, 4);
    await until(() => peer.got.length === 6, 10_000, 'every reply');
    assert.deepEqual(peer.got.map((a) => a.address), Array(6).fill('::1'));
    assert.equal(bind.stats.sendErrors, 0);
    assert.equal(bind.stats.sourcesCleared, 0);
  });

  for (const [family, host, gone] of [[4, '127.0.0.1', '192.0.2.99'], [6, '::1', '2001:db8::99']] as const) {
    test(`IPv${family}: a source this host does not have (as after its removal) is cleared and every datagram still leaves`, async () => {
      const peer = await client(family === 4 ? 'udp4' : 'udp6');
      const port = peer.socket.address().port;
      const bogus = () => new Endpoint(host, port, new LocalSource(new Endpoint(gone, 1).addressBytes, loopbackIndex));
      // Collected during a delivery: the answer goes to an endpoint with a source that is gone.
      const collected = bogus();
      const { bind } = await ffiBind((_data, _source, self) => self.send(collected, Uint8Array.of(0xc1)));
      peer.socket.send(Uint8Array.of(1), bind.port, host);
      await until(() => peer.got.length === 1, 10_000, 'the collected answer');
      assert.equal(collected.local, undefined, 'its source was cleared');

      const direct = bogus();
      bind.send(direct, new Uint8Array(1000).fill(0xc2));
      await until(() => peer.got.length === 2, 10_000, 'the direct datagram');
      assert.equal(direct.local, undefined);

      const batched = bogus();
      const gso = sharedBatch(6, 700);
      bind.sendBatch(batched, gso.data, 700, gso.lengths, 6);
      await until(() => peer.got.length === 8, 10_000, 'the batch');
      assert.equal(batched.local, undefined);
      assert.deepEqual(peer.got.slice(2).map((a) => a.data[0]), [0, 1, 2, 3, 4, 5], 'the batch, whole and in order');
      assert.deepEqual(peer.got.map((a) => a.address), Array(8).fill(host), 'from the address the kernel picks');
      assert.equal(bind.stats.sourcesCleared, 3);
      assert.equal(bind.stats.sendErrors, 0);
      assert.equal(bind.segmentationOffload, true, 'a refused source is not taken for a refused GSO');
    });
  }

  test('a cleared source is not stuck: the next datagram on that address gives an Endpoint with it again', async () => {
    const { bind, got } = await ffiBind();
    const peer = await client('udp4');
    peer.socket.send(Uint8Array.of(1), bind.port, '127.0.0.2');
    await until(() => got.length === 1, 10_000, 'the first datagram');
    const first = got[0].source;
    first.local = undefined; // what the bind does when the kernel refuses the source
    peer.socket.send(Uint8Array.of(2), bind.port, '127.0.0.2');
    await until(() => got.length === 2, 10_000, 'the second datagram');
    const second = got[1].source;
    assert.ok(second !== first);
    assert.equal(textOf(second.local), `127.0.0.2%${loopbackIndex}`);
  });
});

describe('sticky sources over two Devices (FfiUdpBind, loopback)', () => {
  test('a peer that talks to our second address keeps it as our endpoint: handshake answer and data leave from it', async () => {
    const crypto = await selectCrypto();
    const make = async () => {
      const tun = new MemoryTun('rgsticky0', 1420);
      const bind = new FfiUdpBind();
      const device = new Device({ tun, bind, crypto });
      device.core.setPrivateKey(generatePrivateKey(crypto));
      await device.start(0);
      await bind.ready();
      return { tun, bind, device };
    };
    const a = await make();
    const b = await make();
    try {
      // A knows B at 127.0.0.1 (so without sticky sources A would answer from 127.0.0.1); B knows A at 127.0.0.2.
      a.device.core.addPeer(b.device.core.ourPublicKey!, { allowedIps: ['10.0.0.2/32'] });
      b.device.core.addPeer(a.device.core.ourPublicKey!, { endpoint: new Endpoint('127.0.0.2', a.bind.port), allowedIps: ['10.0.0.1/32'] });
      b.tun.inject(buildEchoRequest({ src: '10.0.0.2', dst: '10.0.0.1', id: 1, seq: 0 }));
      await until(() => a.tun.written.length === 1, 15_000, 'the first packet (after the handshake)');
      for (let seq = 1; seq <= 50; seq++) {
        a.tun.inject(buildEchoRequest({ src: '10.0.0.1', dst: '10.0.0.2', id: 2, seq, payload: new Uint8Array(seq * 20) }));
      }
      await until(() => b.tun.written.length === 50, 15_000, 'A\'s packets at B');
      assert.deepEqual(b.tun.written.map((p) => parseEcho(p)?.seq), [...Array(50).keys()].map((i) => i + 1));
      const peerAtB = [...b.device.core.peers][0];
      const peerAtA = [...a.device.core.peers][0];
      assert.equal(peerAtB.endpoint?.toString(), `127.0.0.2:${a.bind.port}`, 'B still sees A at the address it talks to');
      assert.equal(peerAtB.roamCount, 0, 'B never saw A roam');
      assert.equal(textOf(peerAtA.endpoint?.local), `127.0.0.2%${loopbackIndex}`, 'A answers B from 127.0.0.2');
      assert.equal(a.bind.stats.sendErrors + b.bind.stats.sendErrors, 0);
    } finally {
      await a.device.close();
      await b.device.close();
    }
  });
});
