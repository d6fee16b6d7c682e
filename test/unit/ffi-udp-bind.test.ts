/**
 * FfiUdpBind on loopback (no namespaces; SO_MARK and the forced buffer sizes need root): round
 * trips on both families between two FFI binds and with node:dgram, batched sends through
 * sendmmsg (complete, in order, from shared memory in place), sources, port picking, EADDRINUSE,
 * the fwmark, the send queue behind a full send buffer (faults injected), and close (the reader
 * thread stops, the port is free again). Runs under Node and Bun.
 */
import { after, afterEach, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import dgram from 'node:dgram';
import { readdirSync } from 'node:fs';
import { FfiUdpBind } from '../../dataplane/bind/ffi-udp-bind.ts';
import { Endpoint, LocalSource } from '../../dataplane/net/endpoint.ts';
import { PeerSendTable } from '../../dataplane/session/send-table.ts';
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import { Device } from '../../dataplane/device/device.ts';
import { generatePrivateKey } from '../../dataplane/noise/keys.ts';
import { MemoryTun } from '../../dataplane/tun/memory-tun.ts';
import { buildEchoRequest, parseEcho } from '../system/packets.ts';
import { until } from '../helpers/until.ts';
import { filledKey, payload, transportMessage } from '../helpers/transport-message.ts';
import { CHUNK_SLOTS, HOLDS_MASK, KeypairTable, setSlotDeliveryPeer, slotState } from '../../dataplane/session/keypair-table.ts';
import { SharedIndexMap } from '../../dataplane/session/shared-index-map.ts';
import { AUTH_FAILED, DELIVERED, NOT_OPENED, OPENED, REPLAYED, type OpenedTransport } from '../../dataplane/session/transport-opener.ts';
import { AllowedIps } from '../../dataplane/allowedips/allowedips.ts';
import { PublishedRoutes } from '../../dataplane/allowedips/published-routes.ts';
import { parsePrefix } from '../../dataplane/net/ip.ts';
import {
  AF_INET, EAGAIN, EINVAL, SOCKADDR_IN_SIZE, SOCK_DGRAM, SOL_SOCKET, SO_MARK, SO_RCVBUF, SO_RCVBUFFORCE, SO_SNDBUF, loadLibc, type Libc,
} from '../../dataplane/sys/libc.ts';
import { isBun } from '../../dataplane/sys/threads.ts';

const isRoot = typeof process.getuid === 'function' && process.getuid() === 0;

interface Received {
  data: Uint8Array;
  source: Endpoint;
}

/** Binds opened by a test, closed after it. */
const opened: Array<{ close(): Promise<void> | void }> = [];
afterEach(async () => {
  for (const b of opened.splice(0)) await b.close();
});

async function ffiBind(options?: ConstructorParameters<typeof FfiUdpBind>[0]): Promise<{ bind: FfiUdpBind; got: Received[] }> {
  const bind = new FfiUdpBind(options);
  const got: Received[] = [];
  bind.onReceive((data, source) => got.push({ data: data.slice(), source }));
  opened.push(bind);
  await bind.open(0);
  // The reader thread may take a while to start on a loaded machine (Node: tsx compiles it first);
  // the waits below are about datagrams, not about that.
  await bind.ready();
  return { bind, got };
}

async function dgramSocket(type: 'udp4' | 'udp6'): Promise<{ socket: dgram.Socket; got: Array<{ data: Buffer; port: number; address: string }> }> {
  // A receive buffer for whole batches (the default, 208 KiB, drops part of a burst of 128 datagrams of 1.5 KB).
  const socket = dgram.createSocket({ type, ipv6Only: type === 'udp6', recvBufferSize: 4 << 20 });
  const got: Array<{ data: Buffer; port: number; address: string }> = [];
  socket.on('message', (data, rinfo) => got.push({ data, port: rinfo.port, address: rinfo.address }));
  await new Promise<void>((resolve) => socket.bind(0, type === 'udp4' ? '127.0.0.1' : '::1', resolve));
  // recvBufferSize is capped by net.core.rmem_max; as root, lift the cap for this socket.
  const fd = (socket as unknown as { _handle?: { fd?: number } })._handle?.fd;
  if (isRoot && typeof fd === 'number' && fd >= 0) {
    const libc = await loadLibc();
    const size = new Uint8Array(new Int32Array([4 << 20]).buffer);
    libc.setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, size, 4);
  }
  opened.push({ close: () => new Promise<void>((resolve) => socket.close(() => resolve())) });
  return { socket, got };
}


const bytes = (...values: number[]) => Uint8Array.from(values);

/** A batch laid out as PacketBatch does: `count` slots of `stride` bytes in shared memory. */
function sharedBatch(count: number, stride: number, lengthOf: (i: number) => number): { data: Uint8Array; lengths: Int32Array } {
  const data = new Uint8Array(new SharedArrayBuffer(count * stride));
  const lengths = new Int32Array(new SharedArrayBuffer(4 * count));
  for (let i = 0; i < count; i++) {
    const length = lengthOf(i);
    lengths[i] = length;
    const slot = data.subarray(i * stride, i * stride + length);
    for (let j = 0; j < length; j++) slot[j] = (i * 7 + j) & 0xff;
    if (length >= 2) {
      slot[0] = i & 0xff;
      slot[1] = i >> 8;
    }
  }
  return { data, lengths };
}

function assertBatch(got: Received[], data: Uint8Array, stride: number, lengths: Int32Array, indices: number[]): void {
  assert.equal(got.length, indices.length);
  indices.forEach((i, k) => {
    assert.deepEqual(got[k].data, data.slice(i * stride, i * stride + lengths[i]), `datagram ${k} is batch entry ${i}`);
  });
}

function threadCount(): number {
  return readdirSync('/proc/self/task').length;
}

async function socketOption(fd: number, name: number): Promise<number> {
  const libc = await loadLibc();
  const value = new Uint8Array(4);
  const length = new Uint8Array(4);
  new Uint32Array(length.buffer)[0] = 4;
  assert.equal(libc.getsockopt(fd, SOL_SOCKET, name, value, length), 0);
  return new Uint32Array(value.buffer)[0];
}

async function localPortOf(fd: number): Promise<{ family: number; port: number }> {
  const libc = await loadLibc();
  const name = new Uint8Array(28);
  const length = new Uint8Array(4);
  new Uint32Array(length.buffer)[0] = 28;
  assert.equal(libc.getsockname(fd, name, length), 0);
  return { family: new Uint16Array(name.buffer, 0, 1)[0], port: (name[2] << 8) | name[3] };
}

describe('FfiUdpBind', () => {
  test('port 0 picks one port for both families', async () => {
    const { bind } = await ffiBind();
    assert.ok(bind.port > 0);
    const { v4, v6 } = bind.fileDescriptors;
    assert.deepEqual(await localPortOf(v4), { family: 2, port: bind.port });
    assert.deepEqual(await localPortOf(v6), { family: 10, port: bind.port });
  });

  test('IPv4 and IPv6 round trips between two binds, with their sources', async () => {
    const a = await ffiBind();
    const b = await ffiBind();
    for (const host of ['127.0.0.1', '::1']) {
      a.got.length = b.got.length = 0;
      a.bind.send(new Endpoint(host, b.bind.port), bytes(1, 2, 3));
      await until(() => b.got.length === 1, 10_000, `datagram at b over ${host}`);
      assert.deepEqual(b.got[0].data, bytes(1, 2, 3));
      assert.equal(b.got[0].source.toString(), new Endpoint(host, a.bind.port).toString());
      b.bind.send(b.got[0].source, bytes(4, 5));
      await until(() => a.got.length === 1, 10_000, `reply at a over ${host}`);
      assert.deepEqual(a.got[0].data, bytes(4, 5));
      assert.equal(a.got[0].source.toString(), new Endpoint(host, b.bind.port).toString());
    }
    assert.equal(a.bind.stats.sent, 2);
    assert.equal(a.bind.stats.received, 2);
    assert.equal(b.bind.stats.sent, 2);
    assert.equal(b.bind.stats.received, 2);
    assert.equal(a.bind.stats.sendErrors + b.bind.stats.sendErrors, 0);
  });

  test('the same source gives the same Endpoint object (cached, not parsed per datagram)', async () => {
    const a = await ffiBind();
    const b = await ffiBind();
    for (const host of ['127.0.0.1', '::1']) {
      b.got.length = 0;
      const to = new Endpoint(host, b.bind.port);
      for (let i = 0; i < 3; i++) a.bind.send(to, bytes(i));
      await until(() => b.got.length === 3, 10_000);
      assert.ok(b.got[1].source === b.got[0].source && b.got[2].source === b.got[0].source);
    }
  });

  for (const type of ['udp4', 'udp6'] as const) {
    const host = type === 'udp4' ? '127.0.0.1' : '::1';
    test(`round trip with a node:dgram ${type} socket`, async () => {
      const { bind, got } = await ffiBind();
      const peer = await dgramSocket(type);
      const peerPort = peer.socket.address().port;
      await new Promise<void>((resolve, reject) => peer.socket.send(bytes(9, 8, 7), bind.port, host, (err) => (err ? reject(err) : resolve())));
      await until(() => got.length === 1, 10_000, 'datagram from dgram');
      assert.deepEqual(got[0].data, bytes(9, 8, 7));
      assert.equal(got[0].source.toString(), new Endpoint(host, peerPort).toString());
      bind.send(got[0].source, bytes(6, 5));
      await until(() => peer.got.length === 1, 10_000, 'reply at dgram');
      assert.deepEqual(new Uint8Array(peer.got[0].data), bytes(6, 5));
      assert.equal(peer.got[0].port, bind.port);
      assert.equal(peer.got[0].address, host);
    });

    test(`a batch of 128 (PacketBatch layout) arrives complete and in order over ${type}`, async () => {
      const a = await ffiBind();
      const b = await ffiBind();
      const peer = await dgramSocket(type);
      const stride = 1536;
      const { data, lengths } = sharedBatch(128, stride, (i) => 32 + ((i * 37) % 1452));
      const indices = Array.from({ length: 128 }, (_, i) => i);
      a.bind.sendBatch(new Endpoint(host, b.bind.port), data, stride, lengths, 128);
      a.bind.sendBatch(new Endpoint(host, peer.socket.address().port), data, stride, lengths, 128);
      await until(() => b.got.length === 128 && peer.got.length === 128, 10_000, 'both batches');
      assertBatch(b.got, data, stride, lengths, indices);
      assert.ok(b.got.every((r) => r.source.toString() === new Endpoint(host, a.bind.port).toString()));
      peer.got.forEach((r, i) => assert.deepEqual(new Uint8Array(r.data), data.slice(i * stride, i * stride + lengths[i])));
      assert.equal(a.bind.stats.sent, 256);
      assert.equal(a.bind.stats.sendErrors, 0);
    });
  }

  test('batches: more than one sendmmsg, empty entries skipped, non-shared memory, bounds checked', async () => {
    const a = await ffiBind();
    const b = await ffiBind();
    const to = new Endpoint('127.0.0.1', b.bind.port);
    // 600 entries (3 sendmmsg calls of at most 256) with some empty or failed (length <= 0) ones.
    const stride = 256;
    const big = sharedBatch(600, stride, (i) => (i % 50 === 7 ? 0 : i % 50 === 8 ? -1 : 16 + (i % 200)));
    const expected = Array.from({ length: 600 }, (_, i) => i).filter((i) => big.lengths[i] > 0);
    a.bind.sendBatch(to, big.data, stride, big.lengths, 600);
    await until(() => b.got.length === expected.length, 10_000, 'the big batch');
    assertBatch(b.got, big.data, stride, big.lengths, expected);
    assert.equal(a.bind.stats.sendErrors, 0);

    // Ordinary (non-shared) memory takes the one-by-one path; a view with a byteOffset is honoured.
    b.got.length = 0;
    const plain = new Uint8Array(64 + 4 * 100);
    for (let i = 0; i < plain.length; i++) plain[i] = i & 0xff;
    const view = plain.subarray(64);
    a.bind.sendBatch(to, view, 100, [10, 20, 30, 40], 4);
    await until(() => b.got.length === 4, 10_000, 'the plain batch');
    b.got.forEach((r, i) => assert.deepEqual(r.data, view.slice(i * 100, i * 100 + 10 * (i + 1))));

    // Shared memory with a byteOffset, and an entry past the end of the view: counted, not sent.
    b.got.length = 0;
    const shared = sharedBatch(5, 64, () => 64);
    const part = shared.data.subarray(64, 64 * 4); // entries 1..3 of the batch, as a view
    a.bind.sendBatch(to, part, 64, [64, 64, 64, 64], 4);
    await until(() => b.got.length === 3, 10_000, 'the offset batch');
    b.got.forEach((r, i) => assert.deepEqual(r.data, part.slice(i * 64, (i + 1) * 64)));
    assert.equal(a.bind.stats.sendErrors, 1);
    assert.throws(() => a.bind.sendBatch(to, shared.data, -64, [64, 64], 2), RangeError);
  });

  for (const host of ['127.0.0.1', '::1']) {
    test(`UDP GSO over ${host}: a run of equal-sized datagrams leaves in a few messages and arrives whole and in order (with and without GRO)`, async () => {
      const real = await loadLibc();
      const messages: number[] = []; // datagrams (iovecs) per message handed to sendmmsg
      const counting: Libc = {
        ...real,
        sendmmsg: (fd, vec, vlen, flags) => {
          const words = new Uint32Array(vec.buffer, vec.byteOffset, (vlen * 64) / 4);
          const sent = real.sendmmsg(fd, vec, vlen, flags);
          for (let m = 0; m < Math.max(sent, 0); m++) messages.push(words[m * 16 + 6]);
          return sent;
        },
      };
      const a = await ffiBind({ libc: counting });
      const b = await ffiBind();
      const peer = await dgramSocket(host === '::1' ? 'udp6' : 'udp4');
      const stride = 1536;
      // 100 full datagrams, a shorter one (ends a run), then 27 more full ones.
      const { data, lengths } = sharedBatch(128, stride, (i) => (i === 100 ? 700 : 1452));
      const indices = Array.from({ length: 128 }, (_, i) => i);
      a.bind.sendBatch(new Endpoint(host, b.bind.port), data, stride, lengths, 128);
      await until(() => b.got.length === 128, 10_000, 'the batch at the FFI bind (GRO)');
      assertBatch(b.got, data, stride, lengths, indices);
      assert.ok(a.bind.segmentationOffload);
      assert.equal(messages.reduce((x, y) => x + y, 0), 128);
      assert.ok(messages.length <= 6, `128 datagrams in ${messages.length} messages (${messages.join(' ')})`);
      assert.ok(b.bind.stats.batches >= 1);

      messages.length = 0;
      a.bind.sendBatch(new Endpoint(host, peer.socket.address().port), data, stride, lengths, 128);
      await until(() => peer.got.length === 128, 10_000, 'the batch at a node:dgram socket (no GRO: the kernel splits)');
      peer.got.forEach((r, i) => assert.deepEqual(new Uint8Array(r.data), data.slice(i * stride, i * stride + lengths[i])));
      assert.ok(messages.length <= 6);
      assert.equal(a.bind.stats.sent, 256);
      assert.equal(a.bind.stats.sendErrors, 0);
    });
  }

  test('UDP GSO refused by the kernel (EINVAL): the bind sends one datagram per message from then on, nothing lost', async () => {
    const real = await loadLibc();
    let fakeErrno = 0;
    let refused = 0;
    const noGso: Libc = {
      ...real,
      sendmmsg: (fd, vec, vlen, flags) => {
        // Like a kernel that refuses UDP_SEGMENT: the messages before the first GSO run leave, then EINVAL.
        const words = new Uint32Array(vec.buffer, vec.byteOffset, (vlen * 64) / 4);
        let k = 0;
        while (k < vlen && words[k * 16 + 6] === 1) k++;
        if (k === 0) { refused++; fakeErrno = EINVAL; return -1; }
        fakeErrno = 0;
        return real.sendmmsg(fd, vec, k, flags);
      },
      errno: () => fakeErrno || real.errno(),
    };
    const a = await ffiBind({ libc: noGso });
    const b = await ffiBind();
    const stride = 1536;
    const { data, lengths } = sharedBatch(64, stride, (i) => (i < 3 ? 100 + i : 1000));
    a.bind.sendBatch(new Endpoint('127.0.0.1', b.bind.port), data, stride, lengths, 64);
    await until(() => b.got.length === 64, 10_000, 'every datagram');
    assertBatch(b.got, data, stride, lengths, Array.from({ length: 64 }, (_, i) => i));
    assert.equal(refused, 1);
    assert.equal(a.bind.segmentationOffload, false);
    assert.equal(a.bind.stats.sendErrors, 0);
    const off = await ffiBind({ offload: false });
    assert.equal(off.bind.segmentationOffload, false, 'offload: false');
  });

  test('a full send buffer (EAGAIN, partial sendmmsg) queues the rest and keeps the order', async () => {
    const real = await loadLibc();
    let calls = 0;
    // Every third call fails with EAGAIN; sendmmsg otherwise sends at most 10 datagrams.
    let fakeErrno = 0;
    const faulty: Libc = {
      ...real,
      sendto: (...args) => {
        if (++calls % 3 === 0) { fakeErrno = EAGAIN; return -1; }
        fakeErrno = 0;
        return real.sendto(...args);
      },
      sendmmsg: (fd, vec, vlen, flags) => {
        if (++calls % 3 === 0) { fakeErrno = EAGAIN; return -1; }
        fakeErrno = 0;
        return real.sendmmsg(fd, vec, Math.min(vlen, 10), flags);
      },
      errno: () => fakeErrno || real.errno(),
    };
    const a = await ffiBind({ libc: faulty });
    const b = await ffiBind();
    const to = new Endpoint('127.0.0.1', b.bind.port);
    const stride = 256;
    const batch = sharedBatch(128, stride, (i) => 20 + i);
    a.bind.send(to, bytes(0xee, 0));
    a.bind.sendBatch(to, batch.data, stride, batch.lengths, 128);
    // The caller reuses its memory at once: what was queued must have been copied.
    const original = batch.data.slice();
    batch.data.fill(0);
    a.bind.send(to, bytes(0xee, 1));
    a.bind.sendBatch(to, batch.data.subarray(0, 0), stride, [], 0);
    await until(() => b.got.length === 130, 10_000, 'every datagram');
    assert.deepEqual(b.got[0].data, bytes(0xee, 0));
    assertBatch(b.got.slice(1, 129), original, stride, batch.lengths, Array.from({ length: 128 }, (_, i) => i));
    assert.deepEqual(b.got[129].data, bytes(0xee, 1));
    assert.equal(a.bind.stats.sent, 130);
    assert.equal(a.bind.stats.sendErrors, 0);
    assert.equal(a.bind.stats.queued, 0);
  });

  test('answers sent while received datagrams are delivered leave together (sendmmsg, one destination each), in order, also past EAGAIN', async () => {
    const real = await loadLibc();
    let sendtos = 0, sendmmsgs = 0, calls = 0, fakeErrno = 0;
    // Every fifth sendmmsg of several messages fails with EAGAIN, and each sends at most 50 messages.
    // (A datagram retried from the send queue leaves from its sticky source: a sendmmsg of one.)
    const counting: Libc = {
      ...real,
      sendto: (...args) => { sendtos++; fakeErrno = 0; return real.sendto(...args); },
      sendmmsg: (fd, vec, vlen, flags) => {
        sendmmsgs++;
        if (vlen > 1 && ++calls % 5 === 0) { fakeErrno = EAGAIN; return -1; }
        fakeErrno = 0;
        return real.sendmmsg(fd, vec, Math.min(vlen, 50), flags);
      },
      errno: () => fakeErrno || real.errno(),
    };
    // The responder answers every datagram with a copy prefixed by 0xaa; one with 0xbb gets a
    // large answer (not collected: it flushes what was collected first).
    const responder = new FfiUdpBind({ libc: counting });
    opened.push(responder);
    responder.onReceive((data, source) => {
      const answer = new Uint8Array(data[0] === 0xbb ? 1200 : data.length + 1);
      answer[0] = 0xaa;
      answer.set(data, 1);
      responder.send(source, answer);
    });
    await responder.open(0);
    await responder.ready();
    const clients = await Promise.all([dgramSocket('udp4'), dgramSocket('udp4'), dgramSocket('udp6')]);
    const count = 600;
    for (let i = 0; i < count; i++) {
      const client = clients[i % 3];
      const message = Buffer.from([i === 300 ? 0xbb : 1, i >> 8, i & 0xff]);
      client.socket.send(message, responder.port, client.socket.address().family === 'IPv6' ? '::1' : '127.0.0.1');
    }
    await until(() => clients.reduce((n, c) => n + c.got.length, 0) === count, 10_000, `every answer (${clients.map((c) => c.got.length)})`);
    for (const [k, client] of clients.entries()) {
      const seqs = client.got.map((d) => { assert.equal(d.data[0], 0xaa); return (d.data[2] << 8) | d.data[3]; });
      assert.deepEqual(seqs, Array.from({ length: count / 3 }, (_, j) => j * 3 + k), `client ${k}: every answer, in order`);
    }
    assert.equal(responder.stats.sent, count);
    assert.equal(responder.stats.sendErrors, 0);
    assert.ok(sendmmsgs > 0 && sendtos + sendmmsgs < count / 2, `answers were collected: ${sendmmsgs} sendmmsg and ${sendtos} sendto calls for ${count}`);
  });

  test('a taken port fails with EADDRINUSE', async () => {
    const holder = await dgramSocket('udp4');
    const port = holder.socket.address().port; // bound to 127.0.0.1: conflicts with the wildcard bind
    const bind = new FfiUdpBind();
    opened.push(bind);
    await assert.rejects(bind.open(port), (err: NodeJS.ErrnoException) => err.code === 'EADDRINUSE');
    assert.equal(bind.port, 0);
    // IPv6 only taken: the same.
    const holder6 = await dgramSocket('udp6');
    await assert.rejects(bind.open(holder6.socket.address().port), (err: NodeJS.ErrnoException) => err.code === 'EADDRINUSE');
    // An FfiUdpBind's port is taken for another FfiUdpBind, and for node:dgram.
    const { bind: first } = await ffiBind();
    await assert.rejects(bind.open(first.port), (err: NodeJS.ErrnoException) => err.code === 'EADDRINUSE');
    const udp = dgram.createSocket('udp4');
    opened.push({ close: () => { try { udp.close(); } catch { /* the failed bind closed it */ } } });
    await assert.rejects(new Promise<void>((resolve, reject) => {
      udp.once('error', reject);
      udp.bind(first.port, resolve);
    }), (err: NodeJS.ErrnoException) => err.code === 'EADDRINUSE');
    // The failed bind still works afterwards.
    assert.ok((await bind.open(0)) > 0);
  });

  test('datagrams the kernel dropped from a full receive queue are counted (SO_RXQ_OVFL) and reported to onKernelDrops', async () => {
    // A ring of two slots and the smallest socket buffer: while this thread sends without
    // yielding, nothing is consumed, so the reader stops, the kernel's queue fills, and it drops.
    const { bind, got } = await ffiBind({ slots: 2, socketBufferBytes: 4096 });
    const reported: number[] = [];
    bind.onKernelDrops((n) => reported.push(n));
    const libc = await loadLibc();
    const fd = libc.socket(AF_INET, SOCK_DGRAM, 0);
    assert.ok(fd >= 0);
    try {
      const to = new Uint8Array(SOCKADDR_IN_SIZE);
      new Uint16Array(to.buffer, 0, 1)[0] = AF_INET;
      to[2] = bind.port >>> 8; to[3] = bind.port & 0xff;
      to.set([127, 0, 0, 1], 4);
      const datagram = new Uint8Array(100);
      const burst = 2000;
      for (let i = 0; i < burst; i++) assert.equal(libc.sendto(fd, datagram, datagram.length, 0, to, to.length), datagram.length);
      // The drop count arrives with the next datagram queued after the drops.
      await until(() => got.length > 0 && bind.stats.received === got.length, 10_000, 'the burst\'s survivors');
      await new Promise((r) => setTimeout(r, 50));
      assert.equal(libc.sendto(fd, datagram, datagram.length, 0, to, to.length), datagram.length);
      await until(() => got.length + bind.stats.kernelDrops === burst + 1, 10_000, `every datagram received or counted as a kernel drop (${got.length} received, ${bind.stats.kernelDrops} dropped)`);
      assert.ok(bind.stats.kernelDrops > burst / 2, `most of the burst was dropped: ${bind.stats.kernelDrops}`);
      assert.equal(reported.reduce((a, b) => a + b, 0), bind.stats.kernelDrops, 'onKernelDrops got each drop once');
    } finally {
      libc.close(fd);
    }
  });

  test('socket buffers are 7 MiB', async () => {
    assert.ok(isRoot, 'the test suite runs as root; this check needs root (SO_RCVBUFFORCE)');
    const { bind } = await ffiBind();
    for (const fd of [bind.fileDescriptors.v4, bind.fileDescriptors.v6]) {
      // The kernel reports twice the requested size (it counts its bookkeeping overhead).
      assert.equal(await socketOption(fd, SO_RCVBUF), 2 * 7 * 1024 * 1024);
      assert.equal(await socketOption(fd, SO_SNDBUF), 2 * 7 * 1024 * 1024);
    }
  });

  test('setMark sets SO_MARK on both sockets, and again after a reopen', async () => {
    assert.ok(isRoot, 'the test suite runs as root; this check needs root (CAP_NET_ADMIN)');
    const { bind } = await ffiBind();
    await bind.setMark(0x1234);
    assert.equal(await socketOption(bind.fileDescriptors.v4, SO_MARK), 0x1234);
    assert.equal(await socketOption(bind.fileDescriptors.v6, SO_MARK), 0x1234);
    await bind.open(0);
    assert.equal(await socketOption(bind.fileDescriptors.v4, SO_MARK), 0x1234);
    assert.equal(await socketOption(bind.fileDescriptors.v6, SO_MARK), 0x1234);
    await bind.setMark(0);
    assert.equal(await socketOption(bind.fileDescriptors.v4, SO_MARK), 0);
    await assert.rejects(bind.setMark(-1), RangeError);
  });

  test('close stops the reader thread and frees the port; reopening the same port works', async () => {
    // Readers of earlier tests' binds that were closed while starting end by themselves.
    await until(() => FfiUdpBind.readerThreads === 0, 30_000, 'earlier reader threads to end');
    const { bind, got } = await ffiBind();
    const port = bind.port;
    await bind.ready();
    assert.equal(FfiUdpBind.readerThreads, 1, 'the reader thread runs');
    await bind.close();
    assert.equal(bind.port, 0);
    assert.equal(FfiUdpBind.readerThreads, 0, 'close() returns once the reader thread has ended');
    bind.send(new Endpoint('127.0.0.1', port), bytes(1));
    assert.equal(bind.stats.sendErrors, 1, 'sending while closed counts an error');

    // The port is free: node:dgram can take it, and then this bind cannot.
    const udp = dgram.createSocket('udp4');
    await new Promise<void>((resolve) => udp.bind(port, resolve));
    await assert.rejects(bind.open(port), (err: NodeJS.ErrnoException) => err.code === 'EADDRINUSE');
    await new Promise<void>((resolve) => udp.close(() => resolve()));

    assert.equal(await bind.open(port), port);
    await bind.ready();
    const other = await ffiBind();
    other.bind.send(new Endpoint('::1', port), bytes(42));
    await until(() => got.length === 1, 10_000, 'a datagram after the reopen');
    assert.deepEqual(got[0].data, bytes(42));
  });

  test('close (or a new port) delivers what the reader had already received instead of dropping it', async () => {
    const a = await ffiBind();
    const b = await ffiBind();
    const to = new Endpoint('127.0.0.1', b.bind.port);
    for (let i = 0; i < 50; i++) a.bind.send(to, bytes(i, 1, 2));
    // Keep this thread busy so that only b's reader thread runs: the datagrams wait in its ring.
    const until = Date.now() + 300;
    while (Date.now() < until) { /* busy */ }
    const delivered = b.got.length; // nothing yet: the pump runs on this (busy) thread
    await b.bind.open(0); // a new port: the old sockets close
    assert.equal(delivered, 0);
    assert.equal(b.got.length, 50, 'every datagram the reader had taken was delivered on close');
    assert.deepEqual(b.got.map((r) => r.data[0]), [...Array(50).keys()]);
  });

  test('opening and closing at once, repeatedly: reader threads still starting end by themselves', async () => {
    await until(() => FfiUdpBind.readerThreads === 0, 30_000, 'earlier reader threads to end');
    const threads0 = threadCount();
    const bind = new FfiUdpBind();
    opened.push(bind);
    for (let i = 0; i < 5; i++) {
      await bind.open(0);
      await bind.close();
    }
    const port = await bind.open(0);
    await bind.ready();
    const other = await ffiBind();
    const got: Received[] = [];
    bind.onReceive((data, source) => got.push({ data: data.slice(), source }));
    other.bind.send(new Endpoint('127.0.0.1', port), bytes(7));
    await until(() => got.length === 1, 10_000, 'a datagram after the cycles');
    await bind.close();
    await other.bind.close();
    await until(() => FfiUdpBind.readerThreads === 0, 30_000, 'every reader thread to end');
    await until(() => threadCount() <= threads0, 10_000, 'their OS threads to go');
  });

  test('ready() asked while a new port is applied waits for the new reader, and it receives', async () => {
    // The daemon answers its control socket before its threads have booted, so `wg set
    // listen-port` can arrive while ready() is still pending (dataplane/device/daemon.ts).
    const bind = new FfiUdpBind();
    opened.push(bind);
    await bind.open(0);
    await bind.ready();
    const moved = bind.open(0); // a new listen port: close (waiting for the old reader to end), then open
    for (let i = 0; i < 5; i++) await new Promise<void>((resolve) => queueMicrotask(resolve));
    const early = bind.ready(); // asked in the middle of the reopen, with no reader open
    const port = await moved;
    await early;
    const got: Received[] = [];
    bind.onReceive((data, source) => got.push({ data: data.slice(), source }));
    const other = await ffiBind();
    other.bind.send(new Endpoint('127.0.0.1', port), bytes(9));
    await until(() => got.length === 1, 10_000, 'a datagram on the new port');
  });

  test('shared memory addresses stay put across garbage collections', async () => {
    const libc = await loadLibc();
    const view = new Uint8Array(new SharedArrayBuffer(1 << 16), 4096, 100);
    const before = libc.address(view);
    assert.equal(libc.address(new Uint8Array(view.buffer, 0, 1)) + 4096, before, 'byteOffset included');
    const collect = isBun
      ? () => (globalThis as unknown as { Bun: { gc(force: boolean): void } }).Bun.gc(true)
      : await (async () => {
        const v8 = await import('node:v8');
        const vm = await import('node:vm');
        v8.setFlagsFromString('--expose-gc');
        return vm.runInNewContext('gc') as () => void;
      })();
    for (let round = 0; round < 3; round++) {
      let garbage: unknown[] = [];
      for (let i = 0; i < 20_000; i++) garbage.push(new Uint8Array(32), { i });
      garbage = [];
      collect();
      assert.equal(libc.address(view), before);
    }
  });

});

describe('FfiUdpBind opening transport messages in its reader thread', () => {
  test('opened in place (single datagrams and UDP GRO runs), forged ones refused, keypairs and map growth after the start learnt', async () => {
    const crypto = await selectCrypto();
    const keypairs = new KeypairTable();
    const indices = new SharedIndexMap();
    const add = (index: number, fill: number) => {
      const at = keypairs.allocate(filledKey(0x55), filledKey(fill));
      indices.set(index, at.slot, at.generation);
      return at;
    };
    const first = add(0x100, 1);
    const bind = new FfiUdpBind();
    bind.openTransport({ keypairs, indices, aead: crypto, selection: {} });
    const got: Array<{ data: Uint8Array; opened: OpenedTransport }> = [];
    bind.onReceive((data, _source, opened) => got.push({ data: data.slice(), opened: { ...opened } }));
    opened.push(bind);
    await bind.open(0);
    await bind.ready();
    assert.equal(bind.openerFailed, false, 'the reader loaded an AEAD and opens');
    const a = await ffiBind();
    const to = new Endpoint('127.0.0.1', bind.port);

    a.bind.send(to, transportMessage(crypto, 0x100, 1, 5, payload(200, 1)));
    a.bind.send(to, transportMessage(crypto, 0x100, 9, 6, payload(200, 2))); // forged: another key
    a.bind.send(to, transportMessage(crypto, 0x999, 1, 7, payload(200, 3))); // no such index
    await until(() => got.length === 3, 10_000, 'three datagrams');
    assert.deepEqual(got[0].opened, { outcome: OPENED, length: 200, slot: first.slot, generation: first.generation });
    assert.deepEqual(got[0].data.subarray(16, 216), payload(200, 1), 'the plaintext, in place');
    assert.equal(got[1].opened.outcome, AUTH_FAILED);
    assert.equal(got[2].opened.outcome, NOT_OPENED);
    assert.deepEqual(got[2].data, transportMessage(crypto, 0x999, 1, 7, payload(200, 3)), 'left as it came');

    // While the reader runs: a new table chunk and a moved index map, which it learns over its port.
    const late = [];
    for (let i = 0; i < CHUNK_SLOTS + 700; i++) late.push(add(0x10000 + i, (i % 250) + 1));
    got.length = 0;
    const last = CHUNK_SLOTS + 699;
    a.bind.send(to, transportMessage(crypto, 0x10000 + last, (last % 250) + 1, 1, payload(64, 4)));
    await until(() => got.length === 1, 10_000, 'a datagram for a late keypair');
    assert.deepEqual([got[0].opened.outcome, got[0].opened.slot], [OPENED, late[last].slot]);

    // A batch of 32 equal datagrams leaves as one UDP GSO message and arrives as one GRO run.
    got.length = 0;
    const stride = 16 + 1200 + 16;
    const { data, lengths } = sharedBatch(32, stride, () => stride);
    for (let i = 0; i < 32; i++) data.set(transportMessage(crypto, 0x100, 1, 100 + i, payload(1200, i)), i * stride);
    a.bind.sendBatch(to, data, stride, lengths, 32);
    await until(() => got.length === 32, 10_000, 'the batch');
    got.forEach((r, i) => {
      assert.equal(r.opened.outcome, OPENED, `datagram ${i}`);
      assert.deepEqual(r.data.subarray(16, 1216), payload(1200, i));
    });
    for (const at of [first, late[last]]) assert.equal(slotState(at.chunk, at.index) & HOLDS_MASK, 0, 'no hold left');
  });

  /** A bind whose reader delivers index 0x100's packets (peer 7, 10.0.0.0/24) into a socket standing in for the TUN; 0x200 is unconfirmed. */
  async function deliveringBind(sendTable?: PeerSendTable) {
    const crypto = await selectCrypto();
    const libc = await loadLibc();
    const keypairs = new KeypairTable();
    const indices = new SharedIndexMap();
    const table = new AllowedIps<number>();
    table.insert(parsePrefix('10.0.0.0/24'), 7);
    const confirmed = keypairs.allocate(filledKey(0x55), filledKey(1));
    indices.set(0x100, confirmed.slot, confirmed.generation);
    setSlotDeliveryPeer(confirmed.chunk, confirmed.index, 7);
    const unconfirmed = keypairs.allocate(filledKey(0x55), filledKey(2));
    indices.set(0x200, unconfirmed.slot, unconfirmed.generation);
    // The "TUN": a UDP socket connected to a node:dgram one, so each write(2) the reader makes arrives as a datagram.
    const sink = await dgramSocket('udp4');
    const tunSide = dgram.createSocket('udp4');
    await new Promise<void>((resolve) => tunSide.bind(0, '127.0.0.1', resolve));
    await new Promise<void>((resolve, reject) => tunSide.connect(sink.socket.address().port, '127.0.0.1', (err?: Error) => (err ? reject(err) : resolve())));
    opened.push({ close: () => new Promise<void>((resolve) => tunSide.close(() => resolve())) });
    const tunFd = (tunSide as unknown as { _handle: { fd: number } })._handle.fd;
    const bind = new FfiUdpBind();
    bind.openTransport({
      keypairs, indices, aead: crypto, selection: {}, routes: new PublishedRoutes(table, (peer) => peer), sendTable,
      tunWriter: () => ({ fds: [libc.dup(tunFd)], vnetHeader: false, offloads: 0 }),
    });
    const got: Array<{ outcome: number }> = [];
    bind.onReceive((_data, _source, outcome) => got.push({ outcome: outcome.outcome }));
    opened.push(bind);
    await bind.open(0);
    await bind.ready();
    const a = await ffiBind();
    const to = new Endpoint('127.0.0.1', bind.port);
    const inner = payload(60, 3);
    inner[0] = 0x45;
    inner[2] = 0;
    inner[3] = 60;
    inner.set([10, 0, 0, 5], 12);
    const send = (index: number, counter: number) => {
      const message = transportMessage(crypto, index, index === 0x100 ? 1 : 2, counter, inner);
      a.bind.send(to, message);
      return message;
    };
    return { bind, got, sink, inner, send, senderPort: a.bind.port, confirmed };
  }

  test('delivering: a confirmed keypair\'s packets are written by the reader thread itself (once), the rest handed over', async () => {
    const { bind, got, sink, inner, send } = await deliveringBind();
    const message = send(0x100, 9);
    send(0x100, 9); // a replay
    send(0x200, 9); // unconfirmed: the main thread's
    assert.ok(message.length > 0);
    await until(() => got.length === 3, 10_000, 'three records');
    assert.deepEqual(got.map((r) => r.outcome), [DELIVERED, REPLAYED, OPENED]);
    await until(() => sink.got.length === 1, 10_000, 'the packet at the "TUN"');
    assert.deepEqual(new Uint8Array(sink.got[0].data), inner, 'the inner packet, written once by the reader');
    assert.deepEqual(bind.tunWrites, { written: 1, errors: 0 });
  });

  test('the books of delivered packets do not wake the main thread: taken at its next send (takeReceived) or by its wait\'s backstop', async () => {
    const { bind, got, sink, send } = await deliveringBind();
    // 20 delivered packets 5 ms apart: woken for each, the main thread would take about 20 batches.
    const batches = bind.stats.batches;
    for (let i = 0; i < 20; i++) {
      send(0x100, 100 + i);
      await new Promise((r) => setTimeout(r, 5));
    }
    await until(() => sink.got.length === 20, 10_000, '20 packets at the "TUN"');
    await until(() => got.length === 20, 10_000, 'their 20 records, by the backstop');
    assert.ok(got.every((r) => r.outcome === DELIVERED));
    assert.ok(bind.stats.batches - batches <= 6, `taken in ${bind.stats.batches - batches} wake-ups, not one each`);

    // takeReceived hands them over at once. (A look that finds them handed over already, by the
    // backstop, proves nothing: try again.)
    let proven = false;
    for (let i = 0; i < 10 && !proven; i++) {
      const before = got.length;
      send(0x100, 200 + i);
      await until(() => sink.got.length === 21 + i, 10_000, 'the packet at the "TUN"');
      await new Promise((r) => setTimeout(r, 5)); // published just after it was written
      if (got.length !== before) continue;
      bind.takeReceived();
      assert.equal(got.length, before + 1, 'handed over by takeReceived, synchronously');
      proven = true;
    }
    assert.ok(proven, 'takeReceived was seen handing a record over');

    // Anything else rings for itself and what was published quietly before it.
    send(0x100, 300);
    send(0x200, 300);
    await until(() => got.at(-1)?.outcome === OPENED, 10_000, 'the unconfirmed packet\'s record');
    assert.equal(got.at(-2)?.outcome, DELIVERED, 'the quiet one before it, handed over with it, in order');
  });

  test('a delivered datagram from elsewhere than its peer\'s published endpoint (a roam) wakes the main thread at once', async () => {
    const sendTable = new PeerSendTable();
    sendTable.add(7);
    const { bind, got, send, senderPort, confirmed } = await deliveringBind(sendTable);
    const sendKeypair = { at: confirmed, remoteIndex: 1 };
    const tenSent = async (first: number) => {
      const batches = bind.stats.batches;
      const before = got.length;
      for (let i = 0; i < 10; i++) {
        send(0x100, first + i);
        await new Promise((r) => setTimeout(r, 5));
      }
      await until(() => got.length === before + 10, 10_000, 'ten records');
      return bind.stats.batches - batches;
    };
    // Sent to another port than the one the datagrams come from: each delivery is a roam.
    sendTable.publish(7, sendKeypair, new Endpoint('127.0.0.1', senderPort === 65535 ? 1 : senderPort + 1));
    const roaming = await tenSent(400);
    assert.ok(roaming >= 8, `woken for each roamed delivery: ${roaming} wake-ups for 10`);
    // From the published endpoint, arriving on the published local address: books only, quiet.
    sendTable.publish(7, sendKeypair, new Endpoint('127.0.0.1', senderPort, new LocalSource(Uint8Array.of(127, 0, 0, 1), 1)));
    const staying = await tenSent(500);
    assert.ok(staying <= 4, `not woken for deliveries from where the peer is: ${staying} wake-ups for 10`);
    // The same address and port reaching another of our addresses is a move too (the sticky source changes).
    sendTable.publish(7, sendKeypair, new Endpoint('127.0.0.1', senderPort, new LocalSource(Uint8Array.of(127, 0, 0, 2), 1)));
    const otherLocal = await tenSent(600);
    assert.ok(otherLocal >= 8, `woken when the datagrams reach another local address: ${otherLocal} wake-ups for 10`);
  });

  test('a reader that cannot load an AEAD provider says so and hands every datagram over as it came', async () => {
    const crypto = await selectCrypto();
    const keypairs = new KeypairTable();
    const indices = new SharedIndexMap();
    const at = keypairs.allocate(filledKey(0x55), filledKey(1));
    indices.set(0x100, at.slot, at.generation);
    const bind = new FfiUdpBind();
    bind.openTransport({ keypairs, indices, aead: crypto, selection: { only: 'no-such-provider' } });
    const got: Array<{ data: Uint8Array; opened: OpenedTransport }> = [];
    bind.onReceive((data, _source, opened) => got.push({ data: data.slice(), opened: { ...opened } }));
    opened.push(bind);
    await bind.open(0);
    await bind.ready();
    assert.equal(bind.openerFailed, true);
    const a = await ffiBind();
    const message = transportMessage(crypto, 0x100, 1, 5, payload(100, 1));
    a.bind.send(new Endpoint('127.0.0.1', bind.port), message);
    await until(() => got.length === 1, 10_000, 'the datagram');
    assert.equal(got[0].opened.outcome, NOT_OPENED);
    assert.deepEqual(got[0].data, message, 'untouched: the core opens it');
  });

  test('a new listen port while the device\'s other threads still boot is not taken for a reader that cannot open', async () => {
    // What the agent does to every data plane it starts: sets the port at once. The device looks
    // at its reader once every thread runs; the new reader may still be booting then. Taking that
    // for a failure logged an error (and a detached daemon whose stderr had no reader died of it).
    const crypto = await selectCrypto();
    // Another thread of the device (here the TUN's reader) still boots until the test says so.
    let tunReady!: () => void;
    const booted = new Promise<void>((r) => { tunReady = r; });
    const tun = Object.assign(new MemoryTun('rgffi9', 1420), { ready: () => booted });
    const errors: string[] = [];
    const bind = new FfiUdpBind();
    const device = new Device({ tun, bind, crypto, logger: { error: (m) => errors.push(m), verbose: () => {} } });
    opened.push(device);
    await device.open(0);
    await bind.ready();
    const probe = new FfiUdpBind();
    await probe.open(0);
    const port = probe.port; // free in both families (the probe just had it)
    await probe.close();
    await device.setListenPort(port);
    tunReady();
    await device.running();
    assert.deepEqual(errors, [], 'nothing logged as an error');
    await bind.ready();
    assert.equal(bind.openerFailed, false);
  });
});

describe('Device over FfiUdpBind (loopback)', () => {
  for (const mode of ['TUN seals', 'TUN leaves all'] as const) {
    test(`${mode}: 1000 packets each way arrive complete and in order${mode === 'TUN leaves all' ? ' (every packet sealed by the core and sent through bind.send)' : ''}`, async () => {
      const crypto = await selectCrypto();
      const make = async () => {
        const tun = new MemoryTun('rgffi0', 1420, { sealsItself: mode === 'TUN seals' });
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
        a.device.core.addPeer(b.device.core.ourPublicKey!, { endpoint: new Endpoint('::1', b.bind.port), allowedIps: ['10.0.0.2/32'] });
        b.device.core.addPeer(a.device.core.ourPublicKey!, { endpoint: new Endpoint('127.0.0.1', a.bind.port), allowedIps: ['10.0.0.1/32'] });
        a.tun.inject(buildEchoRequest({ src: '10.0.0.1', dst: '10.0.0.2', id: 1, seq: 0 }));
        await until(() => b.tun.written.length === 1, 15_000, 'the first packet (after the handshake)');
        for (let seq = 1; seq <= 1000; seq++) {
          a.tun.inject(buildEchoRequest({ src: '10.0.0.1', dst: '10.0.0.2', id: 1, seq, payload: new Uint8Array(seq % 1300) }));
          b.tun.inject(buildEchoRequest({ src: '10.0.0.2', dst: '10.0.0.1', id: 2, seq }));
        }
        await until(() => b.tun.written.length === 1001 && a.tun.written.length === 1000, 15_000, 'every packet');
        assert.deepEqual(b.tun.written.map((p) => parseEcho(p)?.seq), [...Array(1001).keys()]);
        assert.deepEqual(a.tun.written.map((p) => parseEcho(p)?.seq), [...Array(1000).keys()].map((i) => i + 1));
        assert.equal(parseEcho(b.tun.written[700])!.payload.length, 700);
        assert.deepEqual(a.device.core.drops.snapshot(), {});
        assert.deepEqual(b.device.core.drops.snapshot(), {});
        // B roamed A's endpoint to what it saw: IPv6 loopback, A's port.
        assert.equal([...b.device.core.peers][0].endpoint?.toString(), `[::1]:${a.bind.port}`);
        if (mode === 'TUN seals') assert.ok(a.tun.sealerCounts!.sealed >= 999, `A's TUN sealed what followed the handshake: ${JSON.stringify(a.tun.sealerCounts)}`);
        else assert.equal(a.tun.sealerCounts, undefined, 'the core sealed everything');
        assert.equal(a.bind.stats.sendErrors + b.bind.stats.sendErrors, 0);
      } finally {
        await a.device.close();
        await b.device.close();
      }
    });
  }
});
