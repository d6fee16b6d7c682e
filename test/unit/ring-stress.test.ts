/**
 * Stress of the reader rings' hand-off (reader thread -> shared ring -> main thread's
 * Atomics.waitAsync), with the real reader threads and the real main-thread code, as far as it
 * can be driven without root, under Node and Bun (`npx bun test`):
 *
 * - the UDP ring: FfiUdpBind on loopback (udp-reader-worker.ts: poll + recvmmsg into the ring);
 * - the TUN ring: LinuxTun's worker reader (reader-worker.ts: poll + read into the ring) over a
 *   datagram socket instead of /dev/net/tun (LinuxTun.overDescriptorForTests): one read, one
 *   "packet", exactly as a TUN fd without a vnet header behaves.
 *
 * Each item is a datagram carrying its sequence number, sent in random bursts (up to a window
 * the kernel's socket buffer surely holds, so that none is dropped before the ring) while the
 * main thread pauses at random inside the handler and between bursts. Every item must arrive,
 * in order, once, and the ring must never hold items without progress for longer than a bound.
 * The watchdog is off: the protocol itself is under test. "detects a broken notify" loses one
 * wake-up of the waiting main thread (the `loseWakeUp` test switch) and requires the harness to
 * report it; with the watchdog on, the same lost wake-up must be detected, logged once, counted
 * and recovered. ROAMGUARD_SOAK=1 runs ten times as many items.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { createSocket } from 'node:dgram';
import { FfiUdpBind } from '../../dataplane/bind/ffi-udp-bind.ts';
import { LinuxTun } from '../../dataplane/tun/linux-tun.ts';
import type { Liveness, StallReport } from '../../dataplane/watchdog.ts';
import { loopbackSocket } from '../helpers/loopback-socket.ts';
import { loadLibc } from '../../dataplane/sys/libc.ts';
import { startWorker } from '../../dataplane/sys/threads.ts';
import type { TunQueueRing } from '../../dataplane/tun/tun.ts';
import type { ReplyHelperConfig } from './reply-reader-worker.ts';

const SOAK = process.env.ROAMGUARD_SOAK === '1';
const ITEMS = SOAK ? 6_000_000 : 300_000;
/** Items sent and not yet seen at most: well inside a loopback socket's default receive buffer. */
const WINDOW = 96;
const STALL_BOUND_MS = 3000;

interface Receiver {
  /** Starts delivering; `onItem` gets each item's bytes (valid during the call). */
  start(onItem: (bytes: Uint8Array) => void): Promise<void>;
  port: number;
  close(): Promise<void>;
  liveness: Liveness;
}

interface Faults {
  watchdog?: boolean;
  loseWakeUp?: number;
  startSequence?: number;
}

async function udpReceiver({ watchdog = false, loseWakeUp, startSequence }: Faults = {}): Promise<Receiver> {
  const bind = new FfiUdpBind({ watchdog, loseWakeUp, startSequence, offload: false });
  const port = await bind.open(0);
  return {
    port,
    liveness: bind.liveness,
    async start(onItem) {
      bind.onReceive((datagram) => onItem(datagram));
      await bind.ready();
    },
    close: () => bind.close(),
  };
}

/**
 * The TUN ring with two readers by turns (tun/queue-token.ts): the queue's own thread and a
 * second thread that keeps reading the queue as the UDP reader reads a reply (tun/reply-reader.ts,
 * reply-reader-worker.ts), at random moments. Items must still come out once and in order.
 * `helped()` is how many items the second thread read.
 */
async function sharedTunReceiver(): Promise<Receiver & { helped(): number }> {
  const { fd, port } = await loopbackSocket();
  const tun = await LinuxTun.overDescriptorForTests(fd, { watchdog: false });
  const libc = await loadLibc();
  const control = new Int32Array(new SharedArrayBuffer(8));
  let exited: Promise<unknown> = Promise.resolve();
  return {
    port,
    liveness: tun,
    helped: () => Atomics.load(control, 1),
    async start(onItem) {
      tun.start((packets, count) => { for (let i = 0; i < count; i++) onItem(packets[i]); });
      await tun.ready();
      // The queue's ring, as the TUN hands it to the UDP reader when its queues' threads send.
      const queue = (tun as unknown as { queues: { shared: TunQueueRing }[] }).queues[0].shared;
      const config: ReplyHelperConfig = { fd: libc.dup(fd), queue, control: control.buffer as SharedArrayBuffer, seed: 77 };
      const worker = startWorker(new URL('./reply-reader-worker.ts', import.meta.url), { ...config });
      exited = new Promise((resolve) => worker.once('exit', resolve));
    },
    close: async () => {
      Atomics.store(control, 0, 1);
      Atomics.notify(control, 0);
      await exited;
      tun.close();
    },
  };
}

async function tunReceiver({ watchdog = false, loseWakeUp, startSequence }: Faults = {}): Promise<Receiver> {
  // A datagram socket is the TUN reader's stand-in for a TUN fd: one read, one packet.
  const { fd, port } = await loopbackSocket();
  const tun = await LinuxTun.overDescriptorForTests(fd, { watchdog, loseWakeUp, startSequence });
  return {
    port,
    liveness: tun,
    async start(onItem) {
      tun.start((packets, count) => { for (let i = 0; i < count; i++) onItem(packets[i]); });
      await tun.ready();
    },
    close: async () => tun.close(),
  };
}

interface StressResult {
  sent: number;
  received: number;
  stall?: string;
}

async function stressRing(receiver: Receiver, items: number, seed: number): Promise<StressResult> {
  let state = seed >>> 0;
  const random = () => {
    state = (state * 1664525 + 1013904223) >>> 0;
    return state / 2 ** 32;
  };
  const spin = (us: number) => { const end = performance.now() + us / 1000; while (performance.now() < end) { /* a busy main thread */ } };
  let received = 0;
  let stall: string | undefined;
  await receiver.start((bytes) => {
    const seq = bytes.length === 4 ? new DataView(bytes.buffer, bytes.byteOffset, 4).getUint32(0, true) : -1;
    if (seq !== received) stall ??= `item ${received} expected, got ${seq} (${bytes.length} bytes)`;
    received++;
    if (random() < 0.0005) spin(random() * 300);
  });
  const sender = createSocket('udp4');
  await new Promise<void>((resolve) => sender.bind(0, '127.0.0.1', resolve));
  let sent = 0;
  let lastReceived = 0;
  let lastProgress = performance.now();
  const watcher = setInterval(() => {
    const now = performance.now();
    if (received !== lastReceived || received === sent) {
      lastReceived = received;
      lastProgress = now;
    } else if (now - lastProgress > STALL_BOUND_MS) {
      stall ??= `no item taken for ${Math.round(now - lastProgress)} ms with ${sent - received} sent and not received`;
    }
  }, 100);
  try {
    while (received < items && stall === undefined) {
      const burst = Math.min(WINDOW - (sent - received), items - sent, 1 + Math.floor(random() < 0.1 ? random() * WINDOW : random() * 8));
      for (let i = 0; i < burst; i++) {
        const datagram = Buffer.alloc(4);
        datagram.writeUInt32LE(sent++, 0);
        sender.send(datagram, receiver.port, '127.0.0.1');
      }
      const r = random();
      if (r < 0.6) await new Promise((resolve) => setImmediate(resolve));
      else if (r < 0.61) await new Promise((resolve) => setTimeout(resolve, random() * 3));
      else await new Promise((resolve) => setImmediate(resolve)).then(() => spin(random() * 50));
    }
  } finally {
    clearInterval(watcher);
    sender.close();
    await receiver.close();
  }
  return { sent, received, stall };
}

describe('thread hand-off stress: reader rings', () => {
  for (const [name, make] of [['UDP ring (FfiUdpBind)', udpReceiver], ['TUN ring (LinuxTun worker reader)', tunReceiver]] as const) {
    test(`${name}: ${ITEMS} items in random bursts, the main thread pausing at random: all arrive in order, none waits past ${STALL_BOUND_MS} ms`, { timeout: 120_000 }, async () => {
      const started = performance.now();
      const result = await stressRing(await make(), ITEMS, 4242);
      assert.equal(result.stall, undefined, result.stall);
      assert.equal(result.received, ITEMS);
      console.log(`${name}: ${ITEMS} items in ${Math.round(performance.now() - started)} ms`);
    });

    test(`${name}: sequence numbers across the Int32 wrap-around (the ring starts at 2^31 - 10^4)`, { timeout: 60_000 }, async () => {
      const result = await stressRing(await make({ startSequence: 2 ** 31 - 10_000 }), 50_000, 7);
      assert.equal(result.stall, undefined, result.stall);
      assert.equal(result.received, 50_000);
    });

    test(`${name}: the stress test detects a broken notify (one wake-up of the main thread lost)`, { timeout: 60_000 }, async () => {
      const result = await stressRing(await make({ loseWakeUp: 500 }), ITEMS, 99);
      assert.ok(result.stall !== undefined, `the harness did not notice the lost wake-up (${result.received}/${result.sent})`);
      assert.match(result.stall, /no item taken for \d+ ms/);
    });

    test(`${name}: with the watchdog on, the lost wake-up is detected within the bound, logged once, counted and recovered`, { timeout: 60_000 }, async () => {
      const receiver = await make({ watchdog: true, loseWakeUp: 500 });
      const reports: StallReport[] = [];
      receiver.liveness.onStall = (r) => reports.push(r);
      const result = await stressRing(receiver, 50_000, 99);
      assert.equal(result.stall, undefined, result.stall); // recovered well inside the harness's 3 s bound
      assert.equal(result.received, 50_000);
      assert.equal(receiver.liveness.stalls, 1, 'counted once');
      assert.equal(reports.length, 1, 'logged once');
      assert.ok(reports[0].stalledMs >= 1000 && reports[0].stalledMs < 3000, `after ${reports[0].stalledMs} ms`);
      assert.ok((reports[0].state.written as number) !== (reports[0].state.consumed as number), 'the state shows the items left in the ring');
    });
  }

  test(`TUN ring read by its thread and by turns by a second (reply-reader.ts): ${ITEMS} items in random bursts, all arrive once and in order`, { timeout: 120_000 }, async () => {
    const receiver = await sharedTunReceiver();
    const result = await stressRing(receiver, ITEMS, 2024);
    assert.equal(result.stall, undefined, result.stall);
    assert.equal(result.received, ITEMS);
    // The second reader must have taken part, or the order was never at stake.
    assert.ok(receiver.helped() >= ITEMS / 100, `the second thread read ${receiver.helped()} of ${ITEMS} items`);
    console.log(`shared TUN queue: the second thread read ${receiver.helped()} of ${ITEMS} items`);
  });
});
