/**
 * The measuring tools, run inside a namespace: iperf3 (TCP, one stream, JSON output) and ping
 * (ICMP echo at a short interval, one RTT per reply). Both return parsed figures or throw with
 * the tool's own message.
 */
import { waitFor, type Namespace, type NsProcess, type Scope } from '../../test/system/netns.ts';
import { median, percentile } from './stats.ts';

export const IPERF_PORT = 5201;

export interface IperfRun {
  /** Receiver-side goodput of the measured interval (omitted warm-up excluded), bits per second. */
  bitsPerSecond: number;
  /** Sender-side rate of the measured interval, bits per second. */
  sentBitsPerSecond: number;
  /** TCP retransmissions counted by the sender in the measured interval. */
  retransmits: number;
  /** Payload bytes over the whole run, warm-up included (what the tunnel actually carried). */
  totalBytes: number;
  /** Measured seconds (warm-up excluded). */
  seconds: number;
  /** iperf3's own CPU use, percent of one core: this end (client) and the other end (server). */
  iperfCpu: { client: number; server: number };
  /** Per-interval goodput (bits per second) of the measured seconds, sender side. */
  intervals: number[];
  /** The sender's TCP round-trip estimate during the transfer (latency under load), ms; NaN if absent. */
  tcpRttMs: { mean: number; min: number; max: number };
  /** Largest congestion window the sender reached, bytes. */
  maxSendCwnd: number;
}

interface IperfJson {
  error?: string;
  intervals?: Array<{ sum?: { bytes?: number; seconds?: number; bits_per_second?: number; omitted?: boolean } }>;
  end?: {
    sum_sent?: { bytes?: number; seconds?: number; bits_per_second?: number; retransmits?: number };
    sum_received?: { bytes?: number; seconds?: number; bits_per_second?: number };
    cpu_utilization_percent?: { host_total?: number; remote_total?: number };
    streams?: Array<{ sender?: { mean_rtt?: number; min_rtt?: number; max_rtt?: number; max_snd_cwnd?: number } }>;
  };
}

/** Parses `iperf3 --json` output of a TCP test (exported for tests). */
export function parseIperfJson(text: string): IperfRun {
  let json: IperfJson;
  try {
    json = JSON.parse(text) as IperfJson;
  } catch {
    throw new Error(`iperf3 printed no JSON: ${text.trim().slice(0, 300) || '(nothing)'}`);
  }
  if (json.error) throw new Error(`iperf3: ${json.error}`);
  const sent = json.end?.sum_sent;
  const received = json.end?.sum_received;
  if (!sent || !received || typeof received.bits_per_second !== 'number') throw new Error('iperf3 JSON has no end summary');
  const intervals = json.intervals ?? [];
  // With --reverse the client is the receiver and has no sender figures (rtt, cwnd).
  const tcp = json.end?.streams?.[0]?.sender;
  const usToMs = (us: number | undefined) => (typeof us === 'number' ? us / 1000 : Number.NaN);
  return {
    bitsPerSecond: received.bits_per_second,
    sentBitsPerSecond: sent.bits_per_second ?? Number.NaN,
    retransmits: sent.retransmits ?? Number.NaN,
    totalBytes: intervals.reduce((sum, i) => sum + (i.sum?.bytes ?? 0), 0),
    seconds: received.seconds ?? Number.NaN,
    iperfCpu: {
      client: json.end?.cpu_utilization_percent?.host_total ?? Number.NaN,
      server: json.end?.cpu_utilization_percent?.remote_total ?? Number.NaN,
    },
    intervals: intervals.filter((i) => !i.sum?.omitted).map((i) => i.sum?.bits_per_second ?? Number.NaN),
    tcpRttMs: { mean: usToMs(tcp?.mean_rtt), min: usToMs(tcp?.min_rtt), max: usToMs(tcp?.max_rtt) },
    maxSendCwnd: tcp?.max_snd_cwnd ?? Number.NaN,
  };
}

export interface IperfOptions {
  seconds: number;
  omitSeconds: number;
  /** Server sends, client receives (`-R`). */
  reverse?: boolean;
}

/** Starts an iperf3 server in `ns` (stopped with `scope`) and waits until it listens. */
export async function startIperfServer(scope: Scope, ns: Namespace): Promise<NsProcess> {
  const server = scope.spawn(ns, 'iperf3', ['--server', '--port', String(IPERF_PORT)], { label: `iperf3 server in ${ns.name}`, stopTimeoutMs: 1000 });
  await waitFor(async () => {
    if (!server.running) throw new Error(`the iperf3 server exited\n${server.describe()}`);
    const ss = await ns.exec('ss', ['-Hltn', `sport = :${IPERF_PORT}`], { allowFailure: true });
    return ss.stdout.trim().length > 0;
  }, 10_000, { description: 'the iperf3 server to listen' });
  return server;
}

/**
 * One iperf3 TCP single-stream test from `ns` to the server at `target`. The client is a tracked
 * process of `scope`: it is stopped at once when one of `watch` (the tunnel processes) exits or
 * the run overstays, so a dead tunnel never leaves a client running into the next measurement.
 */
export async function iperf(scope: Scope, ns: Namespace, target: string, options: IperfOptions, watch: readonly NsProcess[] = []): Promise<IperfRun> {
  const args = [
    '--client', target, '--port', String(IPERF_PORT), '--json',
    '--time', String(options.seconds), '--omit', String(options.omitSeconds),
    '--connect-timeout', '3000',
  ];
  if (options.reverse) args.push('--reverse');
  const client = scope.spawn(ns, 'iperf3', args, { label: 'iperf3 client', keepOutputBytes: 16 << 20, stopTimeoutMs: 1000 });
  // 'close' (not 'exit'): all of stdout has been read by then.
  const closed = new Promise<'done'>((resolve) => client.child.once('close', () => resolve('done')));
  const timeoutMs = (options.seconds + options.omitSeconds + 20) * 1000;
  let timer: NodeJS.Timeout | undefined;
  const overstayed = new Promise<'timeout'>((resolve) => { timer = setTimeout(() => resolve('timeout'), timeoutMs); });
  const died = watch.map((p) => p.exited.then(() => p));
  const outcome = await Promise.race([closed, overstayed, ...died]);
  clearTimeout(timer);
  if (outcome !== 'done') {
    await client.stop();
    if (outcome === 'timeout') throw new Error(`iperf3 did not finish within ${timeoutMs / 1000} s\n${client.describe()}`);
    throw new Error(`${outcome.label} exited during the iperf3 run\n${outcome.describe()}`);
  }
  // On failure iperf3 still prints JSON with an "error" member, which parseIperfJson reports.
  const code = client.exitStatus?.code;
  if (code !== 0 && !client.stdout.trim()) throw new Error(`iperf3 failed (exit ${code}): ${client.stderr.trim()}`);
  return parseIperfJson(client.stdout);
}

export interface PingResult {
  sent: number;
  received: number;
  /** Round-trip times of the replies, milliseconds, in arrival order. */
  rttsMs: number[];
  medianMs: number;
  p99Ms: number;
}

/** Parses ping's per-reply lines (`… icmp_seq=N ttl=T time=0.123 ms`) (exported for tests). */
export function parsePing(text: string, sent: number): PingResult {
  const rttsMs: number[] = [];
  for (const m of text.matchAll(/icmp_seq=\d+ .*?time=([\d.]+) ms/g)) rttsMs.push(Number(m[1]));
  return { sent, received: rttsMs.length, rttsMs, medianMs: median(rttsMs), p99Ms: percentile(rttsMs, 99) };
}

/** `count` echo requests from `ns` to `target`, `intervalS` seconds apart (below 0.2 s needs root). */
export async function ping(ns: Namespace, target: string, count: number, intervalS: number): Promise<PingResult> {
  const result = await ns.exec('ping', ['-n', '-c', String(count), '-i', String(intervalS), '-W', '1', target], {
    allowFailure: true,
    timeoutMs: (count * intervalS + 10) * 1000,
  });
  const parsed = parsePing(result.stdout, count);
  if (parsed.received === 0) throw new Error(`ping ${target}: no replies (exit ${result.code}) ${result.stderr.trim()}`);
  return parsed;
}

/** True once one echo request to `target` is answered within a second. */
export async function pingOnce(ns: Namespace, target: string): Promise<boolean> {
  const r = await ns.exec('ping', ['-n', '-c', '1', '-W', '1', target], { allowFailure: true, timeoutMs: 5000 });
  return r.code === 0;
}
