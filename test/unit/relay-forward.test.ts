/**
 * The relay's forwarding: learning each side from its first WireGuard-looking datagram, only
 * from the IPs that side is known at, per-pair budgets, counters per pair and drop reason; and
 * the socket shell forwarding real datagrams on loopback between two "members".
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import dgram from 'node:dgram';
import { looksLikeWireGuard, RelayForwardCore, type PairConfig } from '../../control/relay/forward-core.ts';
import { RelayForwarder } from '../../control/relay/forwarder.ts';
import { RelayForwarderThread } from '../../control/relay/forwarder-thread.ts';

const A = '198.51.100.30', B = '198.51.100.40';
const pair: PairConfig = { id: 'a,b', ports: [51900, 51901], allowedSources: [new Set([A]), new Set([B])] };
const transport = (n = 96) => { const b = new Uint8Array(n); b[0] = 4; return b; };
const initiation = () => { const b = new Uint8Array(148); b[0] = 1; return b; };

describe('relay forwarding core', () => {
  test('WireGuard messages are recognised by type and size', () => {
    assert.equal(looksLikeWireGuard(initiation(), 148), true);
    assert.equal(looksLikeWireGuard(initiation(), 149), false);
    assert.equal(looksLikeWireGuard(transport(), 32), true);
    assert.equal(looksLikeWireGuard(transport(), 31), false);
    assert.equal(looksLikeWireGuard(Uint8Array.of(5, 0, 0, 0), 64), false);
    assert.equal(looksLikeWireGuard(Uint8Array.of(4, 1, 0, 0), 64), false);
  });

  test('forwards between the two sides once both are learned, out of the other side\'s port', () => {
    let now = 0;
    const core = new RelayForwardCore({ bytesPerSecond: 0, nowMs: () => now });
    core.setPairs([pair]);
    assert.deepEqual(core.onDatagram(51900, A, 40001, initiation(), 148), { action: 'drop', reason: 'other-side-unknown' });
    assert.deepEqual(core.onDatagram(51901, B, 50001, transport(), 96), { action: 'forward', fromPort: 51900, toHost: A, toPort: 40001 });
    assert.deepEqual(core.onDatagram(51900, A, 40001, transport(), 200), { action: 'forward', fromPort: 51901, toHost: B, toPort: 50001 });
    // A's NAT rebinds: the next datagram from A's IP moves the learned port.
    core.onDatagram(51900, A, 40777, transport(), 96);
    assert.deepEqual(core.onDatagram(51901, B, 50001, transport(), 96), { action: 'forward', fromPort: 51900, toHost: A, toPort: 40777 });
    const c = core.counters().get('a,b')!;
    assert.deepEqual(c.datagrams, [2, 2]);
    assert.deepEqual(c.bytes, [296, 192]);
    assert.equal(c.dropped['other-side-unknown'], 1);
  });

  test('an outsider cannot take a side over or get anything forwarded; junk is dropped and counted', () => {
    const core = new RelayForwardCore({ bytesPerSecond: 0, nowMs: () => 0 });
    core.setPairs([pair]);
    core.onDatagram(51900, A, 40001, transport(), 96);
    core.onDatagram(51901, B, 50001, transport(), 96);
    assert.deepEqual(core.onDatagram(51900, '192.0.2.66', 40001, transport(), 96), { action: 'drop', reason: 'unknown-source' });
    assert.deepEqual(core.onDatagram(51900, A, 40001, Uint8Array.of(0x47, 0x45, 0x54, 0x20), 500), { action: 'drop', reason: 'not-wireguard' });
    assert.deepEqual(core.onDatagram(52000, A, 40001, transport(), 96), { action: 'drop', reason: 'no-pair' });
    assert.deepEqual(core.learned('a,b'), [{ host: A, port: 40001 }, { host: B, port: 50001 }], 'nothing re-learned from the outsider');
    const c = core.counters().get('a,b')!;
    assert.equal(c.dropped['unknown-source'], 1);
    assert.equal(c.dropped['not-wireguard'], 1);
    assert.equal(core.unassigned, 1);
  });

  test('a pair over its byte budget is dropped until the budget refills; other pairs are unaffected', () => {
    let now = 0;
    const core = new RelayForwardCore({ bytesPerSecond: 1_000_000, nowMs: () => now });
    const other: PairConfig = { id: 'c,d', ports: [51902, 51903], allowedSources: [new Set([A]), new Set([B])] };
    core.setPairs([pair, other]);
    for (const p of [pair, other]) { core.onDatagram(p.ports[0], A, 1, transport(), 96); core.onDatagram(p.ports[1], B, 2, transport(), 96); }
    let forwarded = 0;
    for (let i = 0; i < 400; i++) if (core.onDatagram(51900, A, 1, transport(1400), 1400).action === 'forward') forwarded++;
    assert.ok(forwarded > 150 && forwarded < 250, `a burst of about 262 kB passes (${forwarded} datagrams)`);
    assert.equal(core.counters().get('a,b')!.dropped['rate-limited'], 400 - forwarded);
    assert.equal(core.onDatagram(51902, A, 1, transport(1400), 1400).action, 'forward', 'the other pair has its own budget');
    now += 100; // 100 ms = 100 kB
    let again = 0;
    for (let i = 0; i < 200; i++) if (core.onDatagram(51900, A, 1, transport(1400), 1400).action === 'forward') again++;
    assert.ok(again >= 70 && again <= 72, `refilled at the rate (${again} datagrams)`);
  });

  test('a pair that stays keeps what it learned and its counters; a removed pair forwards nothing', () => {
    const core = new RelayForwardCore({ bytesPerSecond: 0, nowMs: () => 0 });
    core.setPairs([pair]);
    core.onDatagram(51900, A, 1, transport(), 96);
    core.onDatagram(51901, B, 2, transport(), 96);
    core.setPairs([pair]);
    assert.equal(core.onDatagram(51900, A, 1, transport(), 96).action, 'forward');
    core.setPairs([]);
    assert.deepEqual(core.onDatagram(51900, A, 1, transport(), 96), { action: 'drop', reason: 'no-pair' });
  });
});

describe('relay forwarder sockets', () => {
  for (const [where, start] of [
    ['in the caller\'s thread', () => new RelayForwarder({ bytesPerSecond: 0, bindAddress: '127.0.0.1' })],
    ['in a thread of its own (as the agent runs it)', () => new RelayForwarderThread({ bytesPerSecond: 0, bindAddress: '127.0.0.1', countersIntervalMs: 50 })],
  ] as const) test(`forwards real datagrams between two members on loopback, byte for byte, ${where}`, async () => {
    const forwarder = start();
    const members = [dgram.createSocket('udp4'), dgram.createSocket('udp4')];
    try {
      await Promise.all(members.map((s) => new Promise<void>((r) => s.bind(0, '127.0.0.1', () => r()))));
      // Ports from the ephemeral range are taken by others at random: try a few pairs.
      let ready: PairConfig[] = [];
      for (let base = 41000 + Math.floor(Math.random() * 1000) * 2; ready.length === 0 && base < 60000; base += 2000) {
        ready = await forwarder.setPairs([{ id: 'a,b', ports: [base, base + 1], allowedSources: [new Set(['127.0.0.1']), new Set(['127.0.0.1'])] }]);
      }
      const [portA, portB] = ready[0].ports;
      const got = (s: dgram.Socket) => new Promise<{ msg: Buffer; port: number }>((r) => s.once('message', (msg, info) => r({ msg, port: info.port })));
      members[0].send(Buffer.from(transport(64)), portA, '127.0.0.1');
      await new Promise((r) => setTimeout(r, 50));
      const toA = got(members[0]);
      const payload = Buffer.from(transport(1200)).fill(7, 4);
      members[1].send(payload, portB, '127.0.0.1');
      const received = await toA;
      assert.deepEqual(received.msg, payload);
      assert.equal(received.port, portA, 'A hears B from A\'s own relay port: the relay is one fixed endpoint for it');
      const toB = got(members[1]);
      members[0].send(payload, portA, '127.0.0.1');
      assert.deepEqual((await toB).msg, payload);
      let c = forwarder.counters().get('a,b');
      // The thread reports its counters every 50 ms here.
      for (let i = 0; i < 40 && c?.datagrams[1] !== 1; i++) { await new Promise((r) => setTimeout(r, 25)); c = forwarder.counters().get('a,b'); }
      assert.ok(c);
      assert.deepEqual(c.datagrams, [1, 1]);
      assert.equal(c.dropped['other-side-unknown'], 1);
    } finally {
      forwarder.close();
      for (const s of members) s.close();
    }
  });
});

describe('relay forwarding thread', () => {
  test('a port another socket holds is reported unusable and the pair is not ready; close ends the thread and later calls reject', async () => {
    const squatter = dgram.createSocket('udp4');
    await new Promise<void>((r) => squatter.bind(0, '127.0.0.1', () => r()));
    const taken = squatter.address().port;
    const errors: number[] = [];
    const forwarder = new RelayForwarderThread({ bytesPerSecond: 0, bindAddress: '127.0.0.1', onError: (port) => errors.push(port) });
    try {
      const ready = await forwarder.setPairs([{ id: 'a,b', ports: [taken, taken + 1], allowedSources: [new Set(['127.0.0.1']), new Set(['127.0.0.1'])] }]);
      assert.deepEqual(ready, []);
      assert.ok(forwarder.unusable.has(taken), 'the taken port is marked unusable');
      for (let i = 0; i < 40 && errors.length === 0; i++) await new Promise((r) => setTimeout(r, 25));
      assert.deepEqual(errors, [taken]);
      assert.equal(forwarder.alive, true);
    } finally {
      forwarder.close();
      squatter.close();
    }
    assert.equal(forwarder.alive, false);
    await assert.rejects(forwarder.setPairs([]), /closed/);
  });
});
