/**
 * The pipeline can never stall for good (issue 12, item 3):
 * - bounded queues: a pool that never completes and 10^5 packets into a Device cost bounded
 *   memory, and what does not fit is dropped and counted as 'queue-full'; inbound, which the
 *   bind opens on arrival, does not depend on the pool at all;
 * - the crypto pool's own per-worker bound refuses work past QUEUE_LIMIT, and the key copies it
 *   held are zeroed;
 * - a crypto worker killed under traffic is replaced, the tasks it held are failed and counted,
 *   and traffic resumes;
 * - the watchdog: a lost wake-up and a worker that stops taking tasks are detected within the
 *   bound, logged once, counted in the stats and recovered.
 */
import { before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import type { Crypto } from '../../dataplane/crypto/primitives.ts';
import { CryptoPoolError, QUEUE_LIMIT, WorkerCryptoPool, type CryptoPool } from '../../dataplane/pool/crypto-pool.ts';
import { PacketBatch } from '../../dataplane/pool/packet-batch.ts';
import { MAX_IN_FLIGHT_BATCHES } from '../../dataplane/device/send.ts';
import { formatStatsResponse, parseStatsResponse } from '../../dataplane/uapi/uapi-stats.ts';
import type { StallReport } from '../../dataplane/watchdog.ts';
import type { Logger } from '../../dataplane/log.ts';
import { buildEchoRequest, parseEcho } from '../system/packets.ts';
import { makeDevicePair } from '../helpers/device-pair.ts';
import { until } from '../helpers/until.ts';

let crypto: Crypto;
before(async () => { crypto = await selectCrypto(); });


/** A pool whose tasks never complete: a worker that has stopped, as the black hole looked. */
const neverPool = (): CryptoPool => ({
  threads: 1,
  seal: () => new Promise(() => {}),
  close: async () => {},
});

const ping = (seq: number, size = 0, src = '10.0.0.1', dst = '10.0.0.2') =>
  buildEchoRequest({ src, dst, id: 7, seq: seq & 0xffff, payload: new Uint8Array(size) });

function capture(): Logger & { errors: string[] } {
  const errors: string[] = [];
  return { errors, error: (m) => { errors.push(m); }, verbose: () => {} };
}

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

/**
 * What the bounds allow a device to hold in batches: MAX_IN_FLIGHT_BATCHES in flight plus the
 * BatchPool's free list (256), 128 slots of 1600 bytes each (MTU 1420 -> slots for 1500).
 */
const BATCH_BYTES = 128 * 1600;
const ALLOWED_BUFFERS = (MAX_IN_FLIGHT_BATCHES + 256) * BATCH_BYTES + 16 * 2 ** 20;
const ALLOWED_HEAP = 64 * 2 ** 20;
const mib = (n: number) => (n / 2 ** 20).toFixed(1);
/** Batches in the device's free list (BatchPool keeps at most 256). */
const freeBatches = (device: unknown) => (device as { outbound: { batches: { free: unknown[] } } }).outbound.batches.free.length;

describe('bounded queues', () => {
  const PACKETS = 100_000;

  test(`outbound: ${PACKETS} packets into a device whose pool never completes: at most ${MAX_IN_FLIGHT_BATCHES} batches held, the rest dropped as queue-full`, { timeout: 60_000 }, async () => {
    const pair = await makeDevicePair(crypto, {}, { a: { pool: neverPool(), tunSeals: false } });
    try {
      pair.a.tun.inject(ping(0)); // lone and small: the direct path, which starts the handshake
      await until(() => pair.b.tun.written.length === 1, 10_000, 'the first ping');
      const growth = await retainedGrowth(async () => {
        for (let sent = 0; sent < PACKETS;) {
          for (let i = 0; i < 500; i++, sent++) pair.a.tun.inject(ping(sent + 1, 1000));
          await new Promise((r) => setImmediate(r));
        }
        await until(() => pair.a.tun.pending === 0, 30_000, 'the TUN queue to drain');
      });
      const drops = pair.a.device.core.drops;
      const inFlight = (pair.a.device as unknown as { outbound: { inFlight: Map<unknown, number> } }).outbound.inFlight;
      const held = [...inFlight.values()].reduce((a, b) => a + b, 0);
      assert.equal(held, MAX_IN_FLIGHT_BATCHES, 'the peer holds exactly the bound of batches');
      assert.ok(drops.get('queue-full') > 0, 'overflow is counted as queue-full');
      assert.ok(drops.get('queue-full') >= PACKETS - MAX_IN_FLIGHT_BATCHES * 128, `queue-full=${drops.get('queue-full')}`);
      assert.equal(drops.get('crypto-worker-failed'), 0, 'distinct from a worker failure');
      // Without the bound the 10^5 packets would hold ~780 batches (~160 MiB of shared memory).
      assert.ok(freeBatches(pair.a.device) <= 256, 'the free list is bounded too');
      assert.ok(growth.buffers < ALLOWED_BUFFERS, `array buffers grew by ${mib(growth.buffers)} MiB (allowed ${mib(ALLOWED_BUFFERS)})`);
      assert.ok(growth.heap < ALLOWED_HEAP, `heap grew by ${mib(growth.heap)} MiB`);
      console.log(`retained after ${PACKETS} packets: heap ${mib(growth.heap)} MiB, array buffers ${mib(growth.buffers)} MiB`);
      assert.equal(pair.a.device.stats().drops['queue-full'], drops.get('queue-full'), 'in get=roamguard-stats');
    } finally {
      await pair.close();
    }
  });

  test(`inbound does not wait for the pool: ${PACKETS} datagrams into a device whose pool never completes are opened on arrival and delivered, in order, in bounded memory`, { timeout: 60_000 }, async () => {
    const pair = await makeDevicePair(crypto, {}, { b: { pool: neverPool() } });
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
      assert.deepEqual(pair.b.device.core.drops.snapshot(), {}, 'nothing dropped');
      assert.ok(growth.buffers < ALLOWED_BUFFERS, `array buffers grew by ${mib(growth.buffers)} MiB (allowed ${mib(ALLOWED_BUFFERS)})`);
      assert.ok(growth.heap < ALLOWED_HEAP, `heap grew by ${mib(growth.heap)} MiB`);
      console.log(`retained after ${PACKETS} packets: heap ${mib(growth.heap)} MiB, array buffers ${mib(growth.buffers)} MiB`);
    } finally {
      await pair.close();
    }
  });

  test(`the worker pool holds at most ${QUEUE_LIMIT} tasks per worker, refuses the rest as queue-full, and zeroes the key copies it held`, { timeout: 60_000 }, async () => {
    const pool = new WorkerCryptoPool(1, { watchdog: false, faults: [{ stallAfter: 0 }] });
    await pool.ready;
    const batch = new PacketBatch(64, 1);
    const key = new Uint8Array(32).fill(0xa5);
    const outcomes: Promise<unknown>[] = [];
    for (let i = 0; i < QUEUE_LIMIT + 500; i++) outcomes.push(pool.seal(batch, key, i, 1420).catch((err: unknown) => err));
    assert.equal(pool.queueDepth, QUEUE_LIMIT);
    const worker = (pool as unknown as { workers: { backlog: { key: Uint8Array }[]; tasks8: Uint8Array }[] }).workers[0];
    const copies = worker.backlog.map((b) => b.key);
    assert.equal(copies.length, QUEUE_LIMIT - 256, 'ring (256) + backlog = the bound');
    assert.ok(copies.every((k) => k.every((x) => x === 0xa5)), 'the backlog holds copies of the key');
    await pool.close(); // the wedged worker is terminated; what it held fails
    const results = await Promise.all(outcomes);
    const refused = results.filter((r) => r instanceof CryptoPoolError && r.reason === 'queue-full').length;
    const failed = results.filter((r) => r instanceof CryptoPoolError && r.reason === 'crypto-worker-failed').length;
    assert.equal(refused, 500);
    assert.equal(failed, QUEUE_LIMIT);
    assert.ok(copies.every((k) => k.every((x) => x === 0)), 'every key copy was zeroed');
    assert.ok(worker.tasks8.every((x) => x === 0), 'the ring descriptors (keys) were zeroed');
  });
});

describe('a crypto worker dies under traffic', () => {
  test('killed with tasks in flight: its tasks fail and are counted, a new worker starts, traffic resumes', { timeout: 60_000 }, async () => {
    // Worker 0 stops taking tasks after 20 (the watchdog is off here: this test is about death),
    // so it surely holds tasks when it is killed.
    const pool = new WorkerCryptoPool(2, { watchdog: false, faults: [{ stallAfter: 20 }, undefined] });
    const lost: string[] = [];
    (pool as unknown as { options: { onWorkerLost: (m: string) => void } }).options.onWorkerLost = (m) => lost.push(m);
    await pool.ready;
    const pair = await makeDevicePair(crypto, { pool, tunSeals: false });
    try {
      pair.a.tun.inject(ping(0));
      await until(() => pair.b.tun.written.length === 1, 10_000, 'the first ping');
      let seq = 1;
      const burst = () => { for (let i = 0; i < 64; i++) pair.a.tun.inject(ping(seq++, 1300)); };
      const workers = (pool as unknown as { workers: { outstanding: number; seen: number; thread: { terminate(): Promise<number> } }[] }).workers;
      // Bursts until worker 0 holds tasks it will never finish: it has finished its 20 (collected,
      // `seen`) and still holds some. Holding tasks is not enough: before its 20th those finish
      // while terminate() is pending, and nothing would be lost.
      await until(() => { if (workers[0].outstanding === 0) burst(); return workers[0].seen >= 20 && workers[0].outstanding > 0; }, 20_000, 'worker 0 to hold tasks');
      const before = pair.b.tun.written.length;
      await workers[0].thread.terminate();
      await until(() => pool.restarts === 1, 10_000, 'the replacement');
      assert.ok(pool.lostTasks > 0, 'the tasks it held were failed');
      assert.equal(lost.length, 1, 'reported once');
      const failed = () => pair.a.device.core.drops.get('crypto-worker-failed') + pair.b.device.core.drops.get('crypto-worker-failed');
      await until(() => failed() > 0, 10_000, 'the failed batches to be counted');
      // Traffic flows again, through both the surviving and the new worker.
      for (let round = 0; round < 10; round++) {
        const want = pair.b.tun.written.length + 64;
        const first = seq;
        burst();
        await until(() => pair.b.tun.written.length >= want, 20_000, `burst ${round} after the death`);
        const seqs = pair.b.tun.written.slice(-64).map((p) => parseEcho(p)?.seq);
        assert.deepEqual(seqs, Array.from({ length: 64 }, (_, i) => first + i), 'complete and in order');
      }
      assert.ok(pair.b.tun.written.length > before);
      assert.equal(pair.a.device.stats().workerRestarts, 1, 'counted in get=roamguard-stats');
    } finally {
      await pair.close();
      await pool.close();
    }
  });
  test('workers that keep dying: after 5 replacements within a minute the pool gives up (onFatal: the daemon exits non-zero)', { timeout: 60_000 }, async () => {
    const fatal: Error[] = [];
    const pool = new WorkerCryptoPool(1, { watchdog: false, onFatal: (err) => fatal.push(err) });
    await pool.ready;
    const workers = (pool as unknown as { workers: { started: Promise<void>; thread: { terminate(): Promise<number> } }[] }).workers;
    try {
      for (let death = 1; death <= 6; death++) {
        const w = workers[0];
        await w.started; // a worker is never terminated while it loads (koffi would abort the process)
        await w.thread.terminate();
        await until(() => (death <= 5 ? pool.restarts === death : fatal.length === 1), 20_000, `death ${death} handled`);
      }
      assert.equal(pool.restarts, 5);
      assert.equal(fatal.length, 1);
      assert.match(fatal[0].message, /crypto workers keep failing \(5 replacements within 60 s/);
      await assert.rejects(pool.seal(new PacketBatch(64, 1), new Uint8Array(32), 0, 1420), (err: unknown) => err instanceof CryptoPoolError && err.reason === 'crypto-worker-failed');
    } finally {
      await pool.close();
    }
  });
});

describe('watchdog', () => {
  test('a lost wake-up of the main thread: detected within the bound, logged once, counted, recovered', { timeout: 60_000 }, async () => {
    const reports: StallReport[] = [];
    const pool = new WorkerCryptoPool(1, { loseWakeUp: 5 });
    pool.onStall = (r) => reports.push(r);
    await pool.ready;
    const batch = new PacketBatch(64, 1);
    const key = new Uint8Array(32);
    let slowest = 0;
    try {
      for (let i = 0; i < 50; i++) {
        const t = performance.now();
        await pool.seal(batch, key, i, 1420);
        slowest = Math.max(slowest, performance.now() - t);
        // Give the worker time to park, so that the next task wakes the main thread by notify.
        await new Promise((r) => setTimeout(r, 2));
      }
    } finally {
      await pool.close();
    }
    assert.equal(pool.stalls, 1, 'one stall');
    assert.equal(reports.length, 1, 'logged once');
    assert.equal(reports[0].queue, 'crypto worker 0');
    assert.ok(reports[0].stalledMs >= 1000);
    assert.equal(reports[0].state.completed, (reports[0].state.collected as number) + 1, 'the worker had finished; the main thread had not collected');
    assert.ok(slowest >= 1000 && slowest < 10_000, `the task waited ${Math.round(slowest)} ms: about the bound, not forever`);
    assert.doesNotMatch(JSON.stringify(reports[0]), /key/i);
  });

  test('a worker that stops taking tasks, under a Device: detected, logged once, counted in get=roamguard-stats, restarted; traffic resumes', { timeout: 60_000 }, async () => {
    const logger = capture();
    const pool = new WorkerCryptoPool(1, { faults: [{ stallAfter: 10 }] });
    await pool.ready;
    const pair = await makeDevicePair(crypto, { pool, logger, tunSeals: false }); // both devices log to it (they share the pool)
    try {
      pair.a.tun.inject(ping(0));
      await until(() => pair.b.tun.written.length === 1, 10_000, 'the first ping');
      let seq = 1;
      const started = performance.now();
      // Bulk traffic until the worker wedges, then on: the watchdog must get it going again.
      while (pool.restarts === 0) {
        for (let i = 0; i < 64; i++) pair.a.tun.inject(ping(seq++, 1300));
        await new Promise((r) => setTimeout(r, 20));
        if (performance.now() - started > 30_000) throw new Error('no restart within 30 s');
      }
      const stats = parseStatsResponse(formatStatsResponse(pair.a.device.stats()));
      assert.ok(stats.ok);
      assert.equal(stats.stats.pipelineStalls, 1, 'counted once');
      assert.equal(stats.stats.workerRestarts, 1);
      const stallLines = logger.errors.filter((l) => l.startsWith('pipeline stall: crypto worker 0'));
      assert.equal(stallLines.length, 1, `logged once: ${JSON.stringify(logger.errors)}`);
      assert.match(stallLines[0], /completed=\d+ inRing=\d+ backlog=\d+/);
      const want = pair.b.tun.written.length + 64;
      const first = seq;
      for (let i = 0; i < 64; i++) pair.a.tun.inject(ping(seq++, 1300));
      await until(() => pair.b.tun.written.length >= want, 20_000, 'traffic after the restart');
      assert.deepEqual(pair.b.tun.written.slice(-64).map((p) => parseEcho(p)?.seq), Array.from({ length: 64 }, (_, i) => (first + i) & 0xffff));
      assert.equal(pair.a.device.stats().pipelineStalledMs, 0, 'no stall in progress any more');
    } finally {
      await pair.close();
      await pool.close();
    }
  });
});
