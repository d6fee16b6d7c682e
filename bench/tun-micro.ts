/**
 * Micro-benchmark of the Linux TUN device (dataplane/tun/): packets per second read from the
 * kernel and written to it, under Node.js and Bun. Needs root (it builds its own network
 * namespace and removes it afterwards).
 *
 *   node --import tsx bench/tun-micro.ts [--seconds S] [--runtimes node,bun] [--designs worker,threadpool,ffi-write] [--work-us U]
 *
 * read:  a separate process floods UDP datagrams (64-byte payload) from inside the namespace at an
 *        address routed into the TUN; the reader counts the packets handed to it during a timed
 *        window after a warm-up, plus the number of wake-ups (batches). With --work-us U the
 *        handler also busy-waits U µs per packet on the main thread, standing in for the data
 *        plane's own work (routing, sealing, sending), which is where the designs differ most.
 * write: the main thread writes prebuilt 84-byte IPv4 packets (ICMP echo requests to an address
 *        that is not local; forwarding is off, so the kernel drops them after accepting them) in
 *        batches of 64 as fast as it can.
 *
 * Reader designs measured:
 *   worker      the device's reader (Node and Bun): reader worker_thread + SharedArrayBuffer ring + Atomics.waitAsync
 *   threadpool  only here, for the comparison: a blocking fd read with fs.read through the libuv
 *               thread pool, one packet per round trip
 * (Reading on the event loop through koffi's libuv poll handle, once the device's alternative
 * reader, was removed from the product; its figures are in docs/performance.md, and this file of
 * an older checkout measures it.)
 *
 * The machine matters: on two vCPUs the flood sender, the reader thread and the main thread share
 * two cores, so the figures are lower bounds of what the device path can do.
 */
import { spawn, spawnSync } from 'node:child_process';
import { read as fsRead } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import { existsSync, readFileSync } from 'node:fs';
import { openTun, type Tun } from '../dataplane/tun/tun.ts';
import {
  IFF_NO_PI, IFF_TUN, IFREQ_SIZE, O_CLOEXEC, O_NONBLOCK, O_RDWR, TUNSETIFF, cString, loadLibc, type Libc,
} from '../dataplane/sys/libc.ts';
import { buildEchoRequest } from '../test/system/packets.ts';
import { isBun } from '../dataplane/sys/threads.ts';

type Impl = 'worker' | 'threadpool';
interface CpuCost {
  /** CPU time of the main thread (the one that also runs the data plane) per packet, in µs. */
  mainUsPerPacket: number;
  /** CPU time of the whole process (all threads) per packet, in µs. */
  processUsPerPacket: number;
}
interface ReadResult extends CpuCost { impl: Impl; mode: 'read'; packetsPerSecond: number; batches: number; averageBatch: number; maxBatch: number }
interface WriteResult extends CpuCost { impl: 'ffi-write'; mode: 'write'; packetsPerSecond: number; errors: number }

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, '..');
const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

function arg(name: string, fallback: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && process.argv[i + 1] !== undefined ? process.argv[i + 1] : fallback;
}

function ipCommand(args: string[]): void {
  const r = spawnSync('ip', args, { encoding: 'utf8', env: { ...process.env, PATH: `${process.env.PATH}:/usr/sbin:/sbin` } });
  if (r.status !== 0) throw new Error(`ip ${args.join(' ')}: ${r.stderr}`);
}

/** utime + stime in clock ticks (USER_HZ = 100 on Linux) of /proc/self/stat or one of its tasks. */
function cpuTicks(path: string): number {
  const text = readFileSync(path, 'utf8');
  const fields = text.slice(text.lastIndexOf(')') + 2).split(' ');
  return Number(fields[11]) + Number(fields[12]); // fields 14 and 15 of stat(5)
}

/** Starts measuring the CPU time of the main thread (tid = pid) and of the whole process. */
function cpuMeter(): (packets: number) => CpuCost {
  const mainPath = `/proc/self/task/${process.pid}/stat`;
  const main0 = cpuTicks(mainPath);
  const all0 = cpuTicks('/proc/self/stat');
  return (packets) => {
    const us = (ticks: number) => (ticks * 10_000) / Math.max(1, packets);
    return {
      mainUsPerPacket: Number(us(cpuTicks(mainPath) - main0).toFixed(2)),
      processUsPerPacket: Number(us(cpuTicks('/proc/self/stat') - all0).toFixed(2)),
    };
  };
}

function randomName(): string {
  return `rgb${Math.random().toString(36).slice(2, 8)}`;
}

// --- inner side (runs inside the namespace) ----------------------------------------------------------

/** A minimal reader for the comparison designs: returns a stop function. */
interface RawReader { stop(): void }

function openRawTun(libc: Libc, name: string, nonBlocking: boolean): number {
  const fd = libc.open(cString('/dev/net/tun'), O_RDWR | O_CLOEXEC | (nonBlocking ? O_NONBLOCK : 0), 0);
  if (fd < 0) throw new Error(`open /dev/net/tun: errno ${libc.errno()}`);
  const ifr = new Uint8Array(IFREQ_SIZE);
  ifr.set(new TextEncoder().encode(name));
  new Uint16Array(ifr.buffer, 16, 1)[0] = IFF_TUN | IFF_NO_PI;
  if (libc.ioctl(fd, TUNSETIFF, ifr) < 0) throw new Error(`TUNSETIFF: errno ${libc.errno()}`);
  return fd;
}

function startThreadpool(fd: number, onBatch: (count: number) => void): RawReader {
  const buffer = Buffer.alloc(65536);
  let stopped = false;
  const next = () => {
    if (stopped) return;
    fsRead(fd, buffer, 0, buffer.length, null, (err, n) => {
      if (stopped) return;
      if (!err && n > 0) onBatch(1);
      next();
    });
  };
  next();
  // A blocking read stays parked in a pool thread until a packet comes; the flood ends it.
  return { stop: () => { stopped = true; } };
}

const FLOOD = `
const dgram = require('node:dgram');
const s = dgram.createSocket('udp4');
const b = Buffer.alloc(64);
s.connect(9, process.argv[1], () => {
  const burst = () => { for (let i = 0; i < 64; i++) s.send(b); setImmediate(burst); };
  burst();
});
`;

/** Busy-waits about `us` microseconds: stands in for the per-packet work of the data plane. */
function spin(us: number): void {
  if (us <= 0) return;
  const end = performance.now() + us / 1000;
  while (performance.now() < end) { /* work */ }
}

async function innerRead(impl: Impl, seconds: number, nodePath: string, workUs: number): Promise<ReadResult> {
  const name = randomName();
  let batches = 0;
  let packets = 0;
  let maxBatch = 0;
  const onBatch = (count: number) => {
    batches++;
    packets += count;
    if (count > maxBatch) maxBatch = count;
    spin(workUs * count);
  };
  let tun: Tun | undefined;
  let raw: RawReader | undefined;
  let rawFd = -1;
  const libc = await loadLibc();
  if (impl === 'threadpool') {
    rawFd = openRawTun(libc, name, false);
    raw = startThreadpool(rawFd, onBatch);
  } else {
    tun = await openTun(name);
    tun.start((_p, count) => onBatch(count));
  }
  ipCommand(['addr', 'add', '10.77.0.1/24', 'dev', name]);
  ipCommand(['link', 'set', name, 'up']);
  const flood = spawn(nodePath, ['-e', FLOOD, '10.77.0.2'], { stdio: 'ignore' });
  try {
    await sleep(500); // warm-up
    const p0 = packets;
    const b0 = batches;
    maxBatch = 0;
    const meter = cpuMeter();
    const t0 = performance.now();
    await sleep(seconds * 1000);
    const elapsed = (performance.now() - t0) / 1000;
    const got = packets - p0;
    const wakeups = batches - b0;
    return {
      impl, mode: 'read', ...meter(got),
      packetsPerSecond: Math.round(got / elapsed),
      batches: wakeups,
      averageBatch: wakeups > 0 ? Number((got / wakeups).toFixed(2)) : 0,
      maxBatch,
    };
  } finally {
    if (flood.pid !== undefined) process.kill(flood.pid, 'SIGKILL');
    tun?.close();
    if (raw) {
      raw.stop();
      spawnSync('ip', ['link', 'del', name], { stdio: 'ignore', env: { ...process.env, PATH: `${process.env.PATH}:/usr/sbin:/sbin` } });
    }
  }
}

async function innerWrite(seconds: number): Promise<WriteResult> {
  const name = randomName();
  const tun = await openTun(name);
  ipCommand(['addr', 'add', '10.77.0.1/24', 'dev', name]);
  ipCommand(['link', 'set', name, 'up']);
  const batch: Uint8Array[] = [];
  for (let i = 0; i < 64; i++) {
    batch.push(buildEchoRequest({ src: '10.77.0.2', dst: '10.99.0.1', id: 1, seq: i, payload: new Uint8Array(56) }));
  }
  try {
    const end = performance.now() + 300;
    while (performance.now() < end) tun.write(batch, batch.length); // warm-up
    const w0 = tun.stats.writePackets;
    const e0 = tun.stats.writeErrors;
    const meter = cpuMeter();
    const t0 = performance.now();
    const stopAt = t0 + seconds * 1000;
    while (performance.now() < stopAt) {
      for (let i = 0; i < 16; i++) tun.write(batch, batch.length);
    }
    const elapsed = (performance.now() - t0) / 1000;
    const written = tun.stats.writePackets - w0;
    return {
      impl: 'ffi-write', mode: 'write', ...meter(written),
      packetsPerSecond: Math.round(written / elapsed),
      errors: tun.stats.writeErrors - e0,
    };
  } finally {
    tun.close();
  }
}

async function inner(): Promise<void> {
  const mode = arg('mode', 'read');
  const seconds = Number(arg('seconds', '2'));
  const result = mode === 'write'
    ? await innerWrite(seconds)
    : await innerRead(arg('impl', 'worker') as Impl, seconds, arg('node', 'node'), Number(arg('work-us', '0')));
  process.stdout.write(`${JSON.stringify({ runtime: isBun ? 'bun' : 'node', ...result })}\n`);
  process.exit(0);
}

// --- outer side -------------------------------------------------------------------------------------

async function outer(): Promise<void> {
  const { Scope, requireRoot, which } = await import('../test/system/netns.ts');
  await requireRoot({ tun: true });
  const seconds = arg('seconds', '2');
  const runtimes = arg('runtimes', 'node,bun').split(',');
  const designs = arg('designs', 'worker,threadpool,ffi-write').split(',');
  const workUs = arg('work-us', '0');
  const nodePath = isBun ? which('node') ?? 'node' : process.execPath;
  const bunPath = join(root, 'node_modules', '.bin', 'bun');
  const self = fileURLToPath(import.meta.url);
  const scope = new Scope();
  try {
    const ns = await scope.namespace();
    const rows: Array<Record<string, unknown>> = [];
    for (const runtime of runtimes) {
      const command = runtime === 'bun' ? [bunPath, self] : [nodePath, '--import', 'tsx', self];
      if (runtime === 'bun' && !existsSync(bunPath)) {
        console.log(`(bun not found at ${bunPath}; skipped)`);
        continue;
      }
      let cases: string[][] = [['--mode', 'read', '--impl', 'worker']];
      if (runtime === 'node') cases.push(['--mode', 'read', '--impl', 'threadpool']);
      cases.push(['--mode', 'write', '--impl', 'ffi-write']);
      cases = cases.filter((c) => designs.includes(c[3]));
      for (const extra of cases) {
        const r = await ns.exec(command[0], [...command.slice(1), '--inner', ...extra, '--seconds', seconds, '--node', nodePath, '--work-us', workUs], {
          cwd: root, timeoutMs: 60_000,
        });
        const line = r.stdout.trim().split('\n').pop() ?? '{}';
        const row = JSON.parse(line) as Record<string, unknown>;
        rows.push(row);
        console.log(JSON.stringify(row));
      }
    }
    console.log('\nruntime  mode   design       packets/s   wake-ups  avg batch  max batch  errors  main µs/pkt  process µs/pkt');
    for (const r of rows) {
      console.log(
        `${String(r.runtime).padEnd(8)} ${String(r.mode).padEnd(6)} ${String(r.impl).padEnd(12)} ${String(r.packetsPerSecond).padStart(9)}` +
        `  ${String(r.batches ?? '').padStart(9)}  ${String(r.averageBatch ?? '').padStart(9)}  ${String(r.maxBatch ?? '').padStart(9)}  ${String(r.errors ?? '').padStart(6)}` +
        `  ${String(r.mainUsPerPacket).padStart(11)}  ${String(r.processUsPerPacket).padStart(14)}`,
      );
    }
  } finally {
    await scope.cleanup();
  }
}

if (process.argv.includes('--inner')) await inner();
else await outer();
