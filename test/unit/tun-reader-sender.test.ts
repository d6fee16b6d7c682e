/**
 * The TUN reader thread sealing and sending itself (tun/reader-sender.ts, docs/data-workers.md
 * step 3), driven without root: LinuxTun's real reader thread over a datagram socket instead of
 * /dev/net/tun (LinuxTun.overDescriptorForTests: one read, one packet), the sockets of a real
 * FfiUdpBind on loopback, and a plain UDP socket as the peer.
 *
 * - a packet whose peer's send-table entry names a keypair leaves from the reader thread, sealed
 *   under that keypair's next nonce; the main thread gets only the books; a packet without a
 *   route, or for a peer whose entry names nothing, is handed to the main thread as before;
 * - after the bind reopens on another port the reader sends from the new sockets and lets go of
 *   the old ones at once (the old port can be bound again);
 * - a sticky source the kernel refuses: the datagram still leaves, and the books say so.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createSocket, type Socket } from 'node:dgram';
import { FfiUdpBind } from '../../dataplane/bind/ffi-udp-bind.ts';
import { LinuxTun } from '../../dataplane/tun/linux-tun.ts';
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import type { Crypto } from '../../dataplane/crypto/primitives.ts';
import { AllowedIps } from '../../dataplane/allowedips/allowedips.ts';
import { PublishedRoutes } from '../../dataplane/allowedips/published-routes.ts';
import { parseIp, parsePrefix } from '../../dataplane/net/ip.ts';
import { Endpoint, LocalSource } from '../../dataplane/net/endpoint.ts';
import { readCounter, readU32 } from '../../dataplane/noise/messages.ts';
import { KeypairTable, sendNoncesReserved } from '../../dataplane/session/keypair-table.ts';
import { SharedIndexMap } from '../../dataplane/session/shared-index-map.ts';
import { PeerSendTable } from '../../dataplane/session/send-table.ts';
import { openTransport } from '../../dataplane/session/transport.ts';
import { SEALED, SOURCE_REFUSED } from '../../dataplane/session/transport-sealer.ts';
import { filledKey as key } from '../helpers/transport-message.ts';
import { loopbackSocket } from '../helpers/loopback-socket.ts';
import { ipv4PacketTo } from '../helpers/ip-packet.ts';
import { until } from '../helpers/until.ts';

let crypto: Crypto;
before(async () => {
  crypto = await selectCrypto();
});

const packetTo = ipv4PacketTo;

const PEER = 7;

describe('TUN reader: sealing and sending on its own thread', () => {
  let tun: LinuxTun;
  let bind: FfiUdpBind;
  let peer: Socket;
  let tunInput: Socket;
  let tunPort: number;
  const got: { data: Uint8Array; port: number }[] = [];
  const books: [number, number, number, number][] = [];
  const handed: Uint8Array[] = [];
  const keypairs = new KeypairTable();
  const sendTable = new PeerSendTable();
  const at = keypairs.allocate(key(0x31), key(0x71));
  let peerEndpoint: Endpoint;

  before(async () => {
    const descriptor = await loopbackSocket();
    tunPort = descriptor.port;
    tun = await LinuxTun.overDescriptorForTests(descriptor.fd, { watchdog: false });
    bind = new FfiUdpBind({ offload: false });
    await bind.open(0);
    peer = createSocket('udp4');
    await new Promise<void>((resolve) => peer.bind(0, '127.0.0.1', resolve));
    peer.on('message', (data, rinfo) => got.push({ data: new Uint8Array(data), port: rinfo.port }));
    peerEndpoint = new Endpoint('127.0.0.1', peer.address().port);
    tunInput = createSocket('udp4');
    const allowed = new AllowedIps<number>();
    allowed.insert(parsePrefix('10.0.0.2/32'), PEER);
    sendTable.add(PEER);
    sendTable.publish(PEER, { at, remoteIndex: 0xabc }, peerEndpoint);
    tun.sendOnThread({
      keypairs, indices: new SharedIndexMap(), sendTable, routes: new PublishedRoutes(allowed, (n) => n), mtu: 1420,
      aead: crypto, selection: {}, sockets: bind.threadSockets,
    }, (p, outcome, datagrams, bytes) => books.push([p, outcome, datagrams, bytes]));
    tun.start((packets, count) => { for (let i = 0; i < count; i++) handed.push(packets[i].slice()); });
    await tun.ready();
  });

  after(async () => {
    tun?.close();
    await bind?.close();
    peer?.close();
    tunInput?.close();
  });

  /** Plays the kernel routing `packet` into the tunnel. */
  const inject = (packet: Uint8Array) => tunInput.send(packet, tunPort, '127.0.0.1');

  test('allowed: sealed under the next nonce and sent by the reader, books to the main thread; the rest handed over', async () => {
    const sealed = packetTo('10.0.0.2', 100, 1);
    const unrouted = packetTo('10.0.0.99', 60, 2);
    inject(sealed);
    inject(unrouted);
    await until(() => got.length === 1 && handed.length === 1 && books.length === 1, 5000, 'the sealed datagram, the handed packet and the books');
    const datagram = got[0].data;
    assert.equal(got[0].port, bind.port, 'it left from the bind\'s socket');
    assert.equal(readU32(datagram, 4), 0xabc);
    assert.equal(readCounter(datagram, 8), 0);
    const opened = openTransport(crypto, key(0x31), 0, datagram);
    assert.ok(opened instanceof Uint8Array);
    assert.deepEqual(opened.subarray(0, 100), sealed);
    assert.deepEqual(books[0], [PEER, SEALED, 1, datagram.length]);
    assert.deepEqual(handed[0], unrouted);
    assert.equal(sendNoncesReserved(at.chunk, at.index), 1);

    // The entry names nothing (say, a handshake is due): the next packet is the main thread's.
    sendTable.publish(PEER, null, peerEndpoint);
    inject(packetTo('10.0.0.2', 80, 3));
    await until(() => handed.length === 2, 5000, 'handed over');
    assert.equal(got.length, 1);
    sendTable.publish(PEER, { at, remoteIndex: 0xabc }, peerEndpoint);
  });

  test('after the bind reopens elsewhere: sent from the new sockets, and the old port is free at once', async () => {
    const oldPort = bind.port;
    const newPort = await bind.open(0);
    assert.notEqual(newPort, oldPort);
    // The reader was woken to take its new sockets and close its copies of the old ones.
    const deadline = Date.now() + 5000;
    for (;;) {
      const probe = createSocket('udp4');
      const bound = await new Promise<boolean>((resolve) => {
        probe.once('error', () => resolve(false));
        probe.bind(oldPort, '127.0.0.1', () => resolve(true));
      });
      probe.close();
      if (bound) break;
      assert.ok(Date.now() < deadline, `port ${oldPort} is still held after the bind moved to ${newPort}`);
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    const before = got.length;
    const booked = books.length;
    inject(packetTo('10.0.0.2', 90, 4));
    // Its books come without a wake-up of their own: at the main thread's next look (at most the wait's backstop).
    await until(() => got.length === before + 1 && books.length === booked + 1, 5000, 'the next datagram and its books');
    assert.equal(got.at(-1)!.port, newPort);
    assert.equal(readCounter(got.at(-1)!.data, 8), 1, 'the nonces go on');
  });

  test('a sticky source the kernel refuses: the datagram leaves from an address it picks, and the books say so', async () => {
    const gone = new LocalSource(parseIp('192.0.2.77'), 0); // not an address of this host
    sendTable.publish(PEER, { at, remoteIndex: 0xabc }, new Endpoint('127.0.0.1', peerEndpoint.port, gone));
    const before = got.length;
    books.length = 0;
    inject(packetTo('10.0.0.2', 70, 5));
    await until(() => got.length === before + 1 && books.length === 1, 5000, 'the datagram and its books');
    assert.deepEqual(books[0].slice(0, 3), [PEER, SOURCE_REFUSED, 1]);
  });

  test('a new MTU reaches the reader: what it seals from then on is padded no further than it', async () => {
    const before = got.length;
    inject(packetTo('10.0.0.2', 1270, 6));
    await until(() => got.length === before + 1, 5000, 'the first datagram');
    assert.equal(got.at(-1)!.data.length, 16 + 1280 + 16, 'padded to a multiple of 16 under MTU 1420');
    tun.sendingMtu(1276);
    inject(packetTo('10.0.0.2', 1270, 7));
    await until(() => got.length === before + 2, 5000, 'the second datagram');
    assert.equal(got.at(-1)!.data.length, 16 + 1276 + 16, 'padded up to the new MTU only');
    tun.sendingMtu(1420);
  });
});
