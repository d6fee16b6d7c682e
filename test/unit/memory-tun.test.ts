/**
 * MemoryTun, the in-memory TUN double: batching, ordering, copying, MTU, close and deletion behave
 * like the Linux device, so tests of the daemon can rely on it.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { MemoryTun } from '../../dataplane/tun/memory-tun.ts';
import type { Tun } from '../../dataplane/tun/tun.ts';
import { validateInterfaceName } from '../../dataplane/tun/tun.ts';
import { answerEchoRequest, buildEchoRequest, isEchoReplyTo, parseEcho } from '../system/packets.ts';
import { until } from '../helpers/until.ts';

const tick = () => new Promise<void>((resolve) => setImmediate(resolve));


const echo = (seq: number) => buildEchoRequest({ src: '10.0.0.1', dst: '10.0.0.2', id: 7, seq });

describe('MemoryTun', () => {
  test('is a Tun with name, MTU and zeroed stats', () => {
    const tun: Tun = new MemoryTun('rgmem1', 1420);
    assert.equal(tun.name, 'rgmem1');
    assert.equal(tun.mtu, 1420);
    assert.deepEqual({ ...tun.stats }, { readPackets: 0, writePackets: 0, writeErrors: 0, readErrors: 0 });
  });

  test('delivers injected packets in order, as one batch per turn, never re-entrantly', async () => {
    const tun = new MemoryTun();
    const seen: number[] = [];
    const batches: number[] = [];
    let inside = false;
    tun.start((packets, count) => {
      assert.equal(inside, false);
      inside = true;
      batches.push(count);
      for (let i = 0; i < count; i++) seen.push(parseEcho(packets[i])!.seq);
      inside = false;
    });
    for (let seq = 0; seq < 100; seq++) tun.inject(echo(seq));
    assert.equal(seen.length, 0, 'delivery is asynchronous');
    await until(() => seen.length === 100);
    assert.deepEqual(seen, [...Array(100).keys()]);
    assert.deepEqual(batches, [100]);
    assert.equal(tun.stats.readPackets, 100);
  });

  test('splits large bursts at maxBatch and keeps order', async () => {
    const tun = new MemoryTun('rgmem2', 1420, { maxBatch: 64 });
    const seen: number[] = [];
    const batches: number[] = [];
    tun.start((packets, count) => {
      batches.push(count);
      for (let i = 0; i < count; i++) seen.push(parseEcho(packets[i])!.seq);
    });
    for (let seq = 0; seq < 1000; seq++) tun.inject(echo(seq));
    await until(() => seen.length === 1000);
    assert.deepEqual(seen, [...Array(1000).keys()]);
    assert.ok(batches.every((n) => n <= 64));
    assert.equal(batches.length, Math.ceil(1000 / 64));
  });

  test('queues packets injected before start and copies them on inject', async () => {
    const tun = new MemoryTun();
    const packet = echo(1);
    tun.inject(packet);
    packet.fill(0); // the caller reuses its buffer
    assert.equal(tun.pending, 1);
    await tick();
    const got: Uint8Array[] = [];
    tun.start((packets, count) => { for (let i = 0; i < count; i++) got.push(packets[i].slice()); });
    await until(() => got.length === 1);
    assert.equal(parseEcho(got[0])!.seq, 1);
  });

  test('the batch array is reused: entries are cleared after the call', async () => {
    const tun = new MemoryTun();
    let kept: Uint8Array[] | undefined;
    tun.start((packets) => { kept = packets; });
    tun.inject(echo(1));
    await until(() => kept !== undefined);
    assert.equal(kept![0].length, 0);
  });

  test('write copies packets into `written`, counts them and refuses non-IP or empty packets', () => {
    const tun = new MemoryTun();
    const seenByListener: number[] = [];
    tun.onWrite((p) => seenByListener.push(parseEcho(p)!.seq));
    const reply = answerEchoRequest(echo(3))!;
    const batch = [reply, new Uint8Array(0), new Uint8Array([0x10, 0, 0, 0]), echo(4)];
    tun.write(batch, 3); // only the first three count
    reply.fill(0);
    assert.equal(tun.written.length, 1);
    assert.ok(isEchoReplyTo(tun.written[0], echo(3)));
    assert.deepEqual(seenByListener, [3]);
    assert.equal(tun.stats.writePackets, 1);
    assert.equal(tun.stats.writeErrors, 2);
  });

  test('setMtu changes the MTU and rejects out-of-range values', () => {
    const tun = new MemoryTun('rgmem3', 1500);
    tun.setMtu(1280);
    assert.equal(tun.mtu, 1280);
    assert.throws(() => tun.setMtu(67), RangeError);
    assert.throws(() => tun.setMtu(65536), RangeError);
    assert.throws(() => tun.setMtu(1400.5), RangeError);
    assert.equal(tun.mtu, 1280);
    assert.throws(() => new MemoryTun('rgmem4', 20), RangeError);
  });

  test('close stops delivery, drops pending packets and makes writes count as errors; idempotent', async () => {
    const tun = new MemoryTun();
    let delivered = 0;
    tun.start((_packets, count) => { delivered += count; });
    tun.inject(echo(1));
    tun.close();
    tun.close();
    tun.inject(echo(2));
    await tick();
    await tick();
    assert.equal(delivered, 0);
    tun.write([echo(3)], 1);
    assert.equal(tun.stats.writeErrors, 1);
    assert.equal(tun.written.length, 0);
    assert.throws(() => tun.setMtu(1400));
  });

  test('start twice throws', () => {
    const tun = new MemoryTun();
    tun.start(() => {});
    assert.throws(() => tun.start(() => {}));
  });

  test('deleteInterface fires onClose handlers once; a late handler still runs; explicit close does not fire', async () => {
    const tun = new MemoryTun();
    let fired = 0;
    tun.onClose(() => { fired++; });
    tun.onClose(() => { fired++; });
    tun.deleteInterface();
    tun.deleteInterface();
    assert.equal(fired, 2);
    let late = false;
    tun.onClose(() => { late = true; });
    await until(() => late);

    const other = new MemoryTun();
    let otherFired = false;
    other.onClose(() => { otherFired = true; });
    other.close();
    await tick();
    assert.equal(otherFired, false);
  });

  test('interface names are checked like the kernel does', () => {
    assert.doesNotThrow(() => validateInterfaceName('rg%d'));
    assert.doesNotThrow(() => validateInterfaceName('a'.repeat(15)));
    assert.throws(() => validateInterfaceName('a'.repeat(16)), RangeError);
    assert.throws(() => validateInterfaceName(''), TypeError);
    assert.throws(() => validateInterfaceName('bad/name'), RangeError);
    assert.throws(() => validateInterfaceName('has space'), RangeError);
    assert.throws(() => new MemoryTun('x'.repeat(16)), RangeError);
  });
});
