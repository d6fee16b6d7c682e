/**
 * Two Devices over in-memory TUNs and an in-memory UDP network, with TUNs that seal what they read
 * (as the reader threads do) and with TUNs that leave every packet to the core's single-packet
 * path (a reader without an AEAD provider): packets flow both ways, in order, and what is
 * dropped is counted.
 */
import { before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import type { Crypto } from '../../dataplane/crypto/primitives.ts';
import { buildEchoRequest, parseEcho } from '../system/packets.ts';
import { makeDevicePair } from '../helpers/device-pair.ts';
import { Endpoint } from '../../dataplane/net/endpoint.ts';
import { Device } from '../../dataplane/device/device.ts';
import { MemoryNetwork, type MemoryBind } from '../../dataplane/bind/memory-bind.ts';
import { MemoryTun } from '../../dataplane/tun/memory-tun.ts';
import { generatePrivateKey } from '../../dataplane/noise/keys.ts';
import { until } from '../helpers/until.ts';

let crypto: Crypto;
before(async () => {
  crypto = await selectCrypto();
});

type Mode = 'TUN seals' | 'TUN leaves all';
function makePair(mode: Mode) {
  return makeDevicePair(crypto, { tunSeals: mode === 'TUN seals' });
}

describe('device pipelines', () => {
  test('with a session every packet, lone or in a burst, is sealed where it is read (the TUN\'s sealer), none left to the core; every transport message is opened by the bind; in order', async () => {
    const pair = await makePair('TUN seals');
    try {
      const small = (seq: number, size = 0) => buildEchoRequest({ src: '10.0.0.1', dst: '10.0.0.2', id: 3, seq, payload: new Uint8Array(size) });
      pair.a.tun.inject(small(0)); // staged on the main thread: the handshake comes first
      await until(() => pair.b.tun.written.length === 1);
      const peer = [...pair.a.device.core.peers][0];
      const sentBefore = peer.txBytes;
      for (let seq = 1; seq <= 5; seq++) {
        pair.a.tun.inject(small(seq, 100));
        await until(() => pair.b.tun.written.length === seq + 1);
      }
      const before = { ...(pair.b.bind as MemoryBind).openerCounts! };
      // A burst of full-size packets, then a small one in the same read and one right behind it.
      for (let seq = 6; seq < 70; seq++) pair.a.tun.inject(small(seq, 1300));
      pair.a.tun.inject(small(70));
      await new Promise((r) => setImmediate(r));
      pair.a.tun.inject(small(71));
      await until(() => pair.b.tun.written.length === 72);
      assert.deepEqual(pair.a.tun.sealerCounts, { sealed: 71, left: 1, refused: 0 }, 'all but the first (staged for the handshake) sealed by the TUN');
      assert.ok(peer.txBytes > sentBefore + 66 * 1300, `the books of what the TUN sent were kept: ${peer.txBytes - sentBefore} bytes`);
      const opener = (pair.b.bind as MemoryBind).openerCounts!;
      assert.equal(opener.opened - before.opened, 66, `the bind opened each of the 66 datagrams: ${JSON.stringify(opener)}`);
      assert.equal(opener.left - before.left, 0, 'and left none to the main thread');
      assert.deepEqual(pair.b.tun.written.map((p) => parseEcho(p)?.seq), [...Array(72).keys()], 'in order');
      assert.deepEqual(pair.b.device.core.drops.snapshot(), {});
    } finally {
      await pair.close();
    }
  });

  for (const mode of ['TUN seals', 'TUN leaves all'] as const) {
    test(`${mode}: 1000 packets each way arrive complete and in order`, async () => {
      const pair = await makePair(mode);
      try {
        pair.a.tun.inject(buildEchoRequest({ src: '10.0.0.1', dst: '10.0.0.2', id: 1, seq: 0 }));
        await until(() => pair.b.tun.written.length === 1);
        for (let seq = 1; seq <= 1000; seq++) {
          pair.a.tun.inject(buildEchoRequest({ src: '10.0.0.1', dst: '10.0.0.2', id: 1, seq, payload: new Uint8Array(seq % 1300) }));
          pair.b.tun.inject(buildEchoRequest({ src: '10.0.0.2', dst: '10.0.0.1', id: 2, seq }));
        }
        await until(() => pair.b.tun.written.length === 1001 && pair.a.tun.written.length === 1000);
        assert.deepEqual(pair.b.tun.written.map((p) => parseEcho(p)?.seq), [...Array(1001).keys()]);
        assert.deepEqual(pair.a.tun.written.map((p) => parseEcho(p)?.seq), [...Array(1000).keys()].map((i) => i + 1));
        assert.equal(parseEcho(pair.b.tun.written[700])!.payload.length, 700);
        assert.deepEqual(pair.a.device.core.drops.snapshot(), {});
        assert.deepEqual(pair.b.device.core.drops.snapshot(), {});
      } finally {
        await pair.close();
      }
    });

    test(`${mode}: tampered and replayed datagrams are dropped and counted, others still delivered`, async () => {
      const pair = await makePair(mode);
      try {
        const captured: Uint8Array[] = [];
        pair.network.filter = (_from, _to, d) => {
          if (d[0] === 4 && d.length > 32) captured.push(Uint8Array.from(d));
          return true;
        };
        for (let seq = 0; seq < 10; seq++) pair.a.tun.inject(buildEchoRequest({ src: '10.0.0.1', dst: '10.0.0.2', id: 1, seq }));
        await until(() => pair.b.tun.written.length === 10);
        const aEndpoint = new Endpoint('192.0.2.1', pair.a.bind.port);
        const bBind = pair.network.binds.get(new Endpoint('192.0.2.2', pair.b.bind.port).toString())!;
        const tampered = Uint8Array.from(captured[3]);
        tampered[40] ^= 1;
        // Deliver straight into B's receive path as if from A.
        (bBind as unknown as { deliver(d: Uint8Array, f: Endpoint): void }).deliver(tampered, aEndpoint);
        (bBind as unknown as { deliver(d: Uint8Array, f: Endpoint): void }).deliver(captured[5], aEndpoint);
        await until(() => pair.b.device.core.drops.total() === 2);
        assert.equal(pair.b.device.core.drops.get('decryption-failed'), 1);
        assert.equal(pair.b.device.core.drops.get('replay'), 1);
        assert.equal(pair.b.tun.written.length, 10);
      } finally {
        await pair.close();
      }
    });
  }
});

describe('the MTU padding is computed for', () => {
  for (const mode of ['TUN seals', 'TUN leaves all'] as const) {
    test(`${mode}: follows the device's MTU once it changes (ip link set mtu after start)`, async () => {
      const pair = await makeDevicePair(crypto, { tunSeals: mode === 'TUN seals' });
      try {
        const sizes: number[] = [];
        pair.network.filter = (from, _to, d) => {
          if (from.host === '192.0.2.1' && d[0] === 4) sizes.push(d.length);
          return true;
        };
        // 1270 bytes of IP packet: padded to 1280 under MTU 1420; under 1276 only up to the MTU.
        const packet = (seq: number) => buildEchoRequest({ src: '10.0.0.1', dst: '10.0.0.2', id: 5, seq, payload: new Uint8Array(1270 - 28) });
        pair.a.tun.inject(packet(0));
        await until(() => pair.b.tun.written.length === 1);
        pair.a.tun.inject(packet(1));
        await until(() => pair.b.tun.written.length === 2);
        assert.equal(sizes.at(-1), 16 + 1280 + 16, 'padded to a multiple of 16 under MTU 1420');
        pair.a.tun.setMtu(1276);
        pair.a.device.tick();
        pair.a.tun.inject(packet(2));
        await until(() => pair.b.tun.written.length === 3);
        assert.equal(sizes.at(-1), 16 + 1276 + 16, 'padded no further than the new MTU');
        assert.equal(pair.a.device.core.mtu, 1276);
        assert.equal(pair.a.tun.sealerCounts?.sealed ?? 0, mode === 'TUN seals' ? 2 : 0, mode === 'TUN seals' ? 'the TUN\'s sealer padded them' : 'the core padded them');
      } finally {
        await pair.close();
      }
    });
  }
});

describe('start-up: open, then running', () => {
  /** A MemoryTun whose ready() is a promise the test settles itself (a reader thread still booting). */
  function gatedTun() {
    let settle!: { resolve: () => void; reject: (err: Error) => void };
    const ready = new Promise<void>((resolve, reject) => { settle = { resolve, reject }; });
    ready.catch(() => {});
    const tun = new MemoryTun('rgmem0', 1420);
    Object.assign(tun, { ready: () => ready }); // Tun.ready, as LinuxTun has it
    return { tun, settle };
  }

  test('an opened device carries traffic while its threads boot; running() waits for them', async () => {
    const network = new MemoryNetwork();
    const gates: Array<{ resolve: () => void }> = [];
    const make = async (host: string, inner: string) => {
      const { tun, settle } = gatedTun();
      gates.push(settle);
      const bind = network.bind(host);
      const device = new Device({ tun, bind, crypto });
      device.core.setPrivateKey(generatePrivateKey(crypto));
      await device.open(0);
      return { tun, bind, device, inner };
    };
    const a = await make('192.0.2.1', '10.0.0.1');
    const b = await make('192.0.2.2', '10.0.0.2');
    try {
      a.device.core.addPeer(b.device.core.ourPublicKey!, { endpoint: new Endpoint('192.0.2.2', b.bind.port), allowedIps: ['10.0.0.2/32'] });
      b.device.core.addPeer(a.device.core.ourPublicKey!, { endpoint: new Endpoint('192.0.2.1', a.bind.port), allowedIps: ['10.0.0.1/32'] });
      let running = false;
      const both = Promise.all([a.device.running(), b.device.running()]).then(() => { running = true; });
      // A burst and a lone ping, before any thread is reported running.
      for (let seq = 0; seq < 40; seq++) a.tun.inject(buildEchoRequest({ src: '10.0.0.1', dst: '10.0.0.2', id: 9, seq, payload: new Uint8Array(1000) }));
      await until(() => b.tun.written.length === 40);
      assert.deepEqual(b.tun.written.map((p) => parseEcho(p)?.seq), Array.from({ length: 40 }, (_, i) => i), 'all of them, in order');
      assert.equal(running, false, 'running() still waits for the threads');
      for (const gate of gates) gate.resolve();
      await both;
      assert.equal(running, true);
    } finally {
      await a.device.close();
      await b.device.close();
    }
  });

  test('close() waits until every reader thread has ended, also one still booting when ready() settled', async () => {
    // As when the interface is deleted under a booting queue: ready() stops waiting for the
    // stopped queue, yet its thread still loads koffi; the process must not exit before it ends.
    const { tun, settle } = gatedTun();
    let endThreads!: () => void;
    const ended = new Promise<void>((resolve) => { endThreads = resolve; });
    let endedAsked = false;
    Object.assign(tun, { threadsEnded: () => { endedAsked = true; return ended; } });
    const device = new Device({ tun, bind: new MemoryNetwork().bind('192.0.2.1'), crypto });
    await device.open(0);
    settle.resolve();
    let closed = false;
    const closing = device.close().then(() => { closed = true; });
    await until(() => endedAsked, 2000, 'close() asks whether the threads ended');
    await new Promise((resolve) => setTimeout(resolve, 50));
    assert.equal(closed, false, 'close() must not settle while a reader thread may still be booting');
    endThreads();
    await closing;
    assert.equal(closed, true);
  });

  test('running() rejects when a thread cannot start', async () => {
    const { tun, settle } = gatedTun();
    const device = new Device({ tun, bind: new MemoryNetwork().bind('192.0.2.1'), crypto });
    try {
      await device.open(0);
      settle.reject(new Error('a reader thread could not load its crypto providers'));
      await assert.rejects(device.running(), /could not load its crypto providers/);
    } finally {
      await device.close();
    }
  });
});
