/**
 * Micro-benchmark of the UDP bind (dataplane/bind/ffi-udp-bind.ts): 1452-byte datagrams per
 * second sent and received on loopback, and the CPU time they cost, under Node.js and Bun. (The
 * node:dgram bind it was measured against is gone; run this file of an older checkout for it.)
 * No root needed (as root the FFI bind's socket buffers are forced to 7 MiB).
 *
 *   node --import tsx bench/udp-micro.ts [--seconds S] [--runtimes node,bun] [--cases send-ffi,...]
 *
 * Cases (each in a fresh process):
 *   send-ffi        FfiUdpBind.send (one sendto each), 64 per turn
 *   send-ffi-batch  FfiUdpBind.sendBatch of a 128-slot shared-memory batch (PacketBatch layout,
 *                   one sendmmsg), one batch per turn
 *   recv-ffi        FfiUdpBind receiving (reader thread, recvmmsg, shared ring), handler counts
 *
 * Sending goes to a socket that is bound but never read: on loopback the sender's system call also
 * carries the datagram into the receiving socket's queue (where it is dropped once the queue is
 * full), so that work counts as the sender's. Receiving is fed by a separate flood process (the
 * same runtime, FfiUdpBind.sendBatch at full speed); what the receiver cannot take is dropped by
 * the kernel and shown as "kernel drops" (Udp RcvbufErrors of /proc/net/snmp{,6}).
 *
 * "main µs" is CPU time (user + system) of the main thread, the one that also runs the data plane,
 * per datagram; "process µs" adds the other threads (the FFI bind's reader, the runtime's own).
 * The machine matters: on two vCPUs the flood process, the reader thread and the main thread share
 * two cores.
 */
import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { Bind } from '../dataplane/bind/bind.ts';
import { FfiUdpBind } from '../dataplane/bind/ffi-udp-bind.ts';
import { Endpoint } from '../dataplane/net/endpoint.ts';
import { AF_INET, SOCK_CLOEXEC, SOCK_DGRAM, SOCK_NONBLOCK, loadLibc } from '../dataplane/sys/libc.ts';
import { isBun } from '../dataplane/sys/threads.ts';

const DATAGRAM_BYTES = 1452;
const BATCH = 128;
const STRIDE = 1536;
const CASES = ['send-ffi', 'send-ffi-batch', 'recv-ffi'] as const;
type Case = (typeof CASES)[number];

const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, '..');
const self = fileURLToPath(import.meta.url);
const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));
const turn = () => new Promise<void>((resolve) => setImmediate(resolve));

function arg(name: string, fallback: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 && process.argv[i + 1] !== undefined ? process.argv[i + 1] : fallback;
}

/** The command that runs this file under `runtime`. */
function selfCommand(runtime: string): string[] {
  if (runtime === 'bun') return [join(root, 'node_modules', '.bin', 'bun'), self];
  const node = isBun ? (spawnSync('sh', ['-c', 'command -v node'], { encoding: 'utf8' }).stdout.trim() || 'node') : process.execPath;
  return [node, '--import', 'tsx', self];
}

// --- measuring ----------------------------------------------------------------------------------------

/** utime + stime, in clock ticks (USER_HZ = 100), of /proc/self/stat or one of its tasks. */
function cpuTicks(path: string): number {
  const text = readFileSync(path, 'utf8');
  const fields = text.slice(text.lastIndexOf(')') + 2).split(' ');
  return Number(fields[11]) + Number(fields[12]);
}

/** Udp RcvbufErrors of both families (datagrams the kernel dropped for want of receive-buffer room). */
function kernelDrops(): number {
  let total = 0;
  for (const [path, prefix] of [['/proc/net/snmp', 'Udp:'], ['/proc/net/snmp6', 'Udp6RcvbufErrors']] as const) {
    let text: string;
    try {
      text = readFileSync(path, 'utf8');
    } catch {
      continue;
    }
    if (prefix === 'Udp:') {
      const lines = text.split('\n').filter((l) => l.startsWith('Udp:'));
      if (lines.length >= 2) {
        const names = lines[0].split(/\s+/);
        const values = lines[1].split(/\s+/);
        total += Number(values[names.indexOf('RcvbufErrors')] ?? 0);
      }
    } else {
      const line = text.split('\n').find((l) => l.startsWith(prefix));
      if (line) total += Number(line.split(/\s+/)[1]);
    }
  }
  return total;
}

interface Window {
  seconds: number;
  mainTicks: number;
  processTicks: number;
  drops: number;
}

function startWindow(): () => Window {
  const mainPath = `/proc/self/task/${process.pid}/stat`;
  const main0 = cpuTicks(mainPath);
  const all0 = cpuTicks('/proc/self/stat');
  const drops0 = kernelDrops();
  const t0 = performance.now();
  return () => ({
    seconds: (performance.now() - t0) / 1000,
    mainTicks: cpuTicks(mainPath) - main0,
    processTicks: cpuTicks('/proc/self/stat') - all0,
    drops: kernelDrops() - drops0,
  });
}

interface Result {
  runtime: string;
  case: Case;
  datagramsPerSecond: number;
  mbitPerSecond: number;
  mainUs: number;
  processUs: number;
  kernelDrops: number;
  errors: number;
  /** Receiving with FfiUdpBind: datagrams per wake-up of the main thread. */
  averageBatch?: number;
}

function result(c: Case, datagrams: number, w: Window, errors: number): Result {
  const perDatagram = (ticks: number) => Number(((ticks * 10_000) / Math.max(1, datagrams)).toFixed(2));
  return {
    runtime: isBun ? 'bun' : 'node',
    case: c,
    datagramsPerSecond: Math.round(datagrams / w.seconds),
    mbitPerSecond: Math.round((datagrams * DATAGRAM_BYTES * 8) / w.seconds / 1e6),
    mainUs: perDatagram(w.mainTicks),
    processUs: perDatagram(w.processTicks),
    kernelDrops: w.drops,
    errors,
  };
}

function newBind(): Bind {
  return new FfiUdpBind();
}

/** A 128-slot batch in shared memory, as PacketBatch lays it out, every datagram DATAGRAM_BYTES long. */
function sharedBatch(): { data: Uint8Array; lengths: Int32Array } {
  const data = new Uint8Array(new SharedArrayBuffer(BATCH * STRIDE));
  for (let i = 0; i < data.length; i++) data[i] = i & 0xff;
  const lengths = new Int32Array(new SharedArrayBuffer(4 * BATCH)).fill(DATAGRAM_BYTES);
  return { data, lengths };
}

// --- the cases ------------------------------------------------------------------------------------------

async function runSend(c: Case, seconds: number): Promise<Result> {
  // The sink: a bound socket nobody reads (through libc, so no runtime reads it either).
  const libc = await loadLibc();
  const sink = libc.socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  const address = new Uint8Array(16);
  new Uint16Array(address.buffer, 0, 1)[0] = AF_INET;
  address.set([127, 0, 0, 1], 4);
  if (sink < 0 || libc.bind(sink, address, 16) !== 0) throw new Error('sink socket');
  const nameLength = new Uint8Array(new Uint32Array([16]).buffer);
  libc.getsockname(sink, address, nameLength);
  const to = new Endpoint('127.0.0.1', (address[2] << 8) | address[3]);

  const bind = newBind();
  await bind.open(0);
  const datagram = new Uint8Array(DATAGRAM_BYTES).fill(7);
  const { data, lengths } = sharedBatch();
  const burst = c === 'send-ffi-batch'
    ? () => bind.sendBatch!(to, data, STRIDE, lengths, BATCH)
    : () => { for (let i = 0; i < 64; i++) bind.send(to, datagram); };
  try {
    const warm = performance.now() + 500;
    while (performance.now() < warm) { burst(); await turn(); }
    const sent0 = bind.stats.sent;
    const errors0 = bind.stats.sendErrors;
    const stop = startWindow();
    const end = performance.now() + seconds * 1000;
    while (performance.now() < end) { burst(); await turn(); }
    await sleep(50); // the last sends complete
    const w = stop();
    const errors = bind.stats.sendErrors - errors0;
    return result(c, bind.stats.sent - sent0 - errors, w, errors);
  } finally {
    await bind.close();
    libc.close(sink);
  }
}

async function runReceive(c: Case, seconds: number): Promise<Result> {
  const bind = newBind();
  let received = 0;
  bind.onReceive(() => { received++; });
  const port = await bind.open(0);
  if (bind instanceof FfiUdpBind) await bind.ready();
  const [command, ...args] = selfCommand(isBun ? 'bun' : 'node');
  const flood: ChildProcess = spawn(command, [...args, '--flood', String(port)], { cwd: root, stdio: ['ignore', 'pipe', 'inherit'] });
  try {
    await new Promise<void>((resolve, reject) => {
      flood.stdout!.on('data', (chunk: Buffer) => { if (chunk.toString().includes('flooding')) resolve(); });
      flood.once('exit', (code) => reject(new Error(`flood process exited (${code})`)));
    });
    await sleep(500); // warm-up
    const r0 = received;
    const b0 = bind instanceof FfiUdpBind ? bind.stats.batches : 0;
    const stop = startWindow();
    await sleep(seconds * 1000);
    const w = stop();
    const row = result(c, received - r0, w, bind instanceof FfiUdpBind ? bind.stats.receiveErrors : 0);
    if (bind instanceof FfiUdpBind) row.averageBatch = Number(((received - r0) / Math.max(1, bind.stats.batches - b0)).toFixed(1));
    return row;
  } finally {
    flood.kill('SIGKILL');
    await bind.close();
  }
}

/** The flood process: FfiUdpBind.sendBatch to 127.0.0.1:port at full speed, until killed. */
async function flood(port: number): Promise<void> {
  const bind = new FfiUdpBind();
  await bind.open(0);
  const to = new Endpoint('127.0.0.1', port);
  const { data, lengths } = sharedBatch();
  process.stdout.write('flooding\n');
  for (;;) {
    for (let i = 0; i < 4; i++) bind.sendBatch(to, data, STRIDE, lengths, BATCH);
    await turn();
  }
}

// --- outer side -------------------------------------------------------------------------------------------

async function outer(): Promise<void> {
  const seconds = arg('seconds', '3');
  const runtimes = arg('runtimes', 'node,bun').split(',');
  const cases = arg('cases', CASES.join(',')).split(',') as Case[];
  const rows: Result[] = [];
  for (const runtime of runtimes) {
    const [command, ...args] = selfCommand(runtime);
    if (runtime === 'bun' && !existsSync(command)) {
      console.log(`(bun not found at ${command}; skipped)`);
      continue;
    }
    for (const c of cases) {
      const r = spawnSync(command, [...args, '--inner', c, '--seconds', seconds], { cwd: root, encoding: 'utf8', timeout: 120_000 });
      const line = r.stdout.trim().split('\n').pop() ?? '';
      if (r.status !== 0 || !line.startsWith('{')) {
        console.log(`${runtime} ${c}: failed (${r.status}) ${r.stderr.trim().split('\n').slice(-3).join(' | ')}`);
        continue;
      }
      const row = JSON.parse(line) as Result;
      rows.push(row);
      console.log(JSON.stringify(row));
    }
  }
  console.log(`\n${DATAGRAM_BYTES}-byte datagrams on loopback, ${seconds} s per case`);
  console.log('runtime  case             datagrams/s   Mbit/s  main µs/dgram  process µs/dgram  kernel drops  errors  avg batch');
  for (const r of rows) {
    console.log(
      `${r.runtime.padEnd(8)} ${r.case.padEnd(15)} ${String(r.datagramsPerSecond).padStart(12)} ${String(r.mbitPerSecond).padStart(8)}` +
      `  ${String(r.mainUs).padStart(13)}  ${String(r.processUs).padStart(16)}  ${String(r.kernelDrops).padStart(12)}  ${String(r.errors).padStart(6)}` +
      `  ${String(r.averageBatch ?? '').padStart(9)}`,
    );
  }
}

if (process.argv.includes('--flood')) {
  await flood(Number(arg('flood', '0')));
} else if (process.argv.includes('--inner')) {
  const c = arg('inner', '') as Case;
  if (!CASES.includes(c)) throw new Error(`unknown case ${c}`);
  const seconds = Number(arg('seconds', '3'));
  const r = c.startsWith('send') ? await runSend(c, seconds) : await runReceive(c, seconds);
  process.stdout.write(`${JSON.stringify(r)}\n`);
  process.exit(0);
} else {
  await outer();
}
