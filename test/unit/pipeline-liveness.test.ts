/**
 * The data path holds bounded memory under a flood of packets (issue 12, item 3), both ways:
 * - outbound through the core's single-packet path (what a TUN reader leaves: here TUNs that
 *   leave everything), 10^5 packets: each sealed and sent as it comes, in order, nothing queued;
 * - inbound, which the bind opens and delivers on arrival: 10^5 datagrams, in order.
 * (The reader rings' own bounds and their watchdog: ring-stress.test.ts and tun-reader-sender.test.ts.)
 */
import { before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import type { Crypto } from '../../dataplane/crypto/primitives.ts';
import { buildEchoRequest, parseEcho } from '../system/packets.ts';
import { makeDevicePair } from '../helpers/device-pair.ts';
import { until } from '../helpers/until.ts';

let crypto: Crypto;
before(async () => { crypto = await selectCrypto(); });

const ping = (seq: number, size = 0, src = '10.0.0.1', dst = '10.0.0.2') =>
  buildEchoRequest({ src, dst, id: 7, seq: seq & 0xffff, payload: new Uint8Array(size) });

/** Runs a full garbage collection (Node: through v8/vm, Bun: Bun.gc). */
async function collectGarbage(): Promise<void> {
  const bun = (globalThis as { Bun?: { gc(force: boolean): void } }).Bun;
  if (bun) return bun.gc(true);
  const v8 = await import('node:v8');
  const vm = await import('node:vm');
  v8.setFlagsFromString('--expose-gc');
  (vm.runInNewContext('gc') as () => void)();
}

/** Memory (JS heap and array buffers, shared ones included) still held after `run`, past what was held before. */
async function retainedGrowth(run: () => Promise<void>): Promise<{ heap: number; buffers: number }> {
  await collectGarbage();
  const before = process.memoryUsage();
  await run();
  // Shared memory is given back by finalizers after a collection: collect, let them run, collect again.
  for (let i = 0; i < 3; i++) {
    await collectGarbage();
    await new Promise((r) => setTimeout(r, 10));
  }
  const after = process.memoryUsage();
  return { heap: after.heapUsed - before.heapUsed, buffers: after.arrayBuffers - before.arrayBuffers };
}

/** What a flood may leave behind: no queue holds packets on either path, so little. */
const ALLOWED_BUFFERS = 16 * 2 ** 20;
const ALLOWED_HEAP = 64 * 2 ** 20;
const mib = (n: number) => (n / 2 ** 20).toFixed(1);

describe('bounded memory under a flood', () => {
  const PACKETS = 100_000;

  for (const direction of ['outbound (the core\'s single-packet path)', 'inbound (opened and delivered on arrival)'] as const) {
    test(`${direction}: ${PACKETS} packets delivered in order, in bounded memory`, { timeout: 60_000 }, async () => {
      const pair = await makeDevicePair(crypto, {}, direction.startsWith('outbound') ? { a: { tunSeals: false } } : {});
      try {
        pair.a.tun.inject(ping(0));
        await until(() => pair.b.tun.written.length === 1, 10_000, 'the first ping');
        let delivered = 0;
        let outOfOrder = 0;
        pair.b.tun.onWrite((packet) => {
          if (parseEcho(packet)?.seq !== (delivered + 1) % 65536) outOfOrder++;
          delivered++;
        });
        const growth = await retainedGrowth(async () => {
          for (let sent = 0; sent < PACKETS;) {
            for (let i = 0; i < 500; i++, sent++) pair.a.tun.inject(ping(sent + 1, 1000));
            await new Promise((r) => setImmediate(r));
            pair.b.tun.written.length = 0; // counted by the listener; not kept
          }
          await until(() => delivered === PACKETS, 30_000, `B to deliver every packet (${delivered})`);
          pair.b.tun.written.length = 0;
        });
        assert.equal(outOfOrder, 0, 'in order');
        assert.deepEqual(pair.a.device.core.drops.snapshot(), {}, 'nothing dropped at A');
        assert.deepEqual(pair.b.device.core.drops.snapshot(), {}, 'nothing dropped at B');
        if (direction.startsWith('outbound')) assert.equal(pair.a.tun.sealerCounts, undefined, 'A\'s TUN sealed nothing: every packet took the core\'s path');
        assert.ok(growth.buffers < ALLOWED_BUFFERS, `array buffers grew by ${mib(growth.buffers)} MiB (allowed ${mib(ALLOWED_BUFFERS)})`);
        assert.ok(growth.heap < ALLOWED_HEAP, `heap grew by ${mib(growth.heap)} MiB`);
        console.log(`${direction}: retained after ${PACKETS} packets: heap ${mib(growth.heap)} MiB, array buffers ${mib(growth.buffers)} MiB`);
      } finally {
        await pair.close();
      }
    });
  }
});
