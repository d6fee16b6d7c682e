/**
 * The measuring tools, run inside a namespace: iperf3 (TCP with one or more streams, UDP at a
 * set rate; JSON output) and ping (ICMP echo at a short interval, one RTT per reply). All return
 * parsed figures or throw with the tool's own message.
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
  // With --reverse the client is the receiver and has no sender figures (rtt, cwnd). With
  // several streams: the mean of their RTT figures, the largest window.
  const senders = (json.end?.streams ?? []).map((st) => st.sender).filter((x) => x !== undefined);
  const meanOf = (pick: (x: NonNullable<typeof senders[number]>) => number | undefined): number | undefined => {
    const values = senders.map(pick).filter((v): v is number => typeof v === 'number');
    return values.length === 0 ? undefined : values.reduce((a, b) => a + b, 0) / values.length;
  };
  const tcp = senders.length === 0 ? undefined : {
    mean_rtt: meanOf((x) => x.mean_rtt), min_rtt: meanOf((x) => x.min_rtt), max_rtt: meanOf((x) => x.max_rtt),
    max_snd_cwnd: senders.some((x) => typeof x.max_snd_cwnd === 'number') ? Math.max(...senders.map((x) => x.max_snd_cwnd ?? 0)) : undefined,
  };
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
  /** Parallel TCP streams (`-P`); default 1. */
  parallel?: number;
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
 * Runs one iperf3 client in `ns` with `args` and returns its stdout (JSON). The client is a
 * tracked process of `scope`: it is stopped at once when one of `watch` (the tunnel processes)
 * exits or the run overstays, so a dead tunnel never leaves a client running into the next
 * measurement.
 */
async function runIperfClient(scope: Scope, ns: Namespace, args: string[], timeoutMs: number, watch: readonly NsProcess[]): Promise<string> {
  const client = scope.spawn(ns, 'iperf3', args, { label: 'iperf3 client', keepOutputBytes: 16 << 20, stopTimeoutMs: 1000 });
  // 'close' (not 'exit'): all of stdout has been read by then.
  const closed = new Promise<'done'>((resolve) => client.child.once('close', () => resolve('done')));
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
  // On failure iperf3 still prints JSON with an "error" member, which the parsers report.
  const code = client.exitStatus?.code;
  if (code !== 0 && !client.stdout.trim()) throw new Error(`iperf3 failed (exit ${code}): ${client.stderr.trim()}`);
  return client.stdout;
}

/** One iperf3 TCP test (one stream, or `parallel` streams) from `ns` to the server at `target`. */
export async function iperf(scope: Scope, ns: Namespace, target: string, options: IperfOptions, watch: readonly NsProcess[] = []): Promise<IperfRun> {
  const args = [
    '--client', target, '--port', String(IPERF_PORT), '--json',
    '--time', String(options.seconds), '--omit', String(options.omitSeconds),
    '--connect-timeout', '3000',
  ];
  if (options.reverse) args.push('--reverse');
  if (options.parallel !== undefined && options.parallel > 1) args.push('--parallel', String(options.parallel));
  return parseIperfJson(await runIperfClient(scope, ns, args, (options.seconds + options.omitSeconds + 20) * 1000, watch));
}

/** One UDP probe: iperf3 sending at a set rate, and what arrived. */
export interface UdpProbe {
  /** The rate asked of iperf3 (`-b`), bits per second of UDP payload. */
  targetBps: number;
  /** What the sender managed, bits per second. */
  sentBps: number;
  /** What the receiver got, bits per second. */
  receivedBps: number;
  /** Datagrams sent, and of them lost (counted by the receiver from sequence gaps). */
  packets: number;
  lostPackets: number;
  /**
   * Lost share of what was sent: the larger of lostPackets / packets and 1 − bytes received /
   * bytes sent (iperf3 counts only gaps, so datagrams lost after the last one received would be
   * missed otherwise); 1 when nothing was sent.
   */
  lossFraction: number;
  /** Datagrams received per second. */
  receivedPps: number;
  seconds: number;
  /** Set when iperf3 failed; the probe then counts as lost. */
  error?: string;
}

interface IperfUdpJson {
  error?: string;
  end?: {
    sum_sent?: { bits_per_second?: number; bytes?: number; packets?: number; seconds?: number };
    sum_received?: { bits_per_second?: number; bytes?: number; packets?: number; lost_packets?: number; seconds?: number };
    sum?: { bits_per_second?: number; bytes?: number; packets?: number; lost_packets?: number; seconds?: number };
  };
}

/** Parses `iperf3 --udp --json` output (exported for tests). Throws on iperf3's own errors. */
export function parseIperfUdpJson(text: string, targetBps: number): UdpProbe {
  let json: IperfUdpJson;
  try {
    json = JSON.parse(text) as IperfUdpJson;
  } catch {
    throw new Error(`iperf3 printed no JSON: ${text.trim().slice(0, 300) || '(nothing)'}`);
  }
  if (json.error) throw new Error(`iperf3: ${json.error}`);
  // iperf3 3.12 and later: sum_sent and sum_received; older versions only `sum` (receiver's view).
  const received = json.end?.sum_received ?? json.end?.sum;
  const sent = json.end?.sum_sent ?? json.end?.sum;
  if (!received || typeof received.packets !== 'number' || typeof received.lost_packets !== 'number') throw new Error('iperf3 JSON has no UDP end summary');
  const packets = received.packets;
  const lostPackets = Math.max(0, Math.min(packets, received.lost_packets));
  const seconds = received.seconds ?? sent?.seconds ?? Number.NaN;
  const gapLoss = packets > 0 ? lostPackets / packets : 1;
  const sentBytes = json.end?.sum_sent?.bytes;
  const receivedBytes = json.end?.sum_received?.bytes;
  const byteLoss = typeof sentBytes === 'number' && typeof receivedBytes === 'number' && sentBytes > 0 ? Math.max(0, 1 - receivedBytes / sentBytes) : 0;
  return {
    targetBps,
    sentBps: sent?.bits_per_second ?? Number.NaN,
    receivedBps: received.bits_per_second ?? Number.NaN,
    packets,
    lostPackets,
    lossFraction: Math.max(gapLoss, byteLoss),
    receivedPps: seconds > 0 ? (packets - lostPackets) / seconds : Number.NaN,
    seconds,
  };
}

export interface UdpOptions {
  seconds: number;
  bitsPerSecond: number;
  /** UDP payload bytes per datagram (`-l`). */
  payloadBytes: number;
}

/**
 * One iperf3 UDP test from `ns` to the server at `target` at a fixed rate. An iperf3 failure
 * (e.g. its control connection lost in an overloaded tunnel) is returned as a probe with `error`
 * and total loss, not thrown; a tunnel process that exits is thrown.
 */
export async function iperfUdp(scope: Scope, ns: Namespace, target: string, options: UdpOptions, watch: readonly NsProcess[] = []): Promise<UdpProbe> {
  const args = [
    '--client', target, '--port', String(IPERF_PORT), '--json', '--udp',
    '--bitrate', String(Math.round(options.bitsPerSecond)), '--length', String(options.payloadBytes),
    '--time', String(options.seconds), '--connect-timeout', '3000',
  ];
  let text: string;
  try {
    text = await runIperfClient(scope, ns, args, (options.seconds + 20) * 1000, watch);
  } catch (err) {
    if (watch.some((p) => !p.running)) throw err;
    return failedProbe(options, (err as Error).message);
  }
  try {
    return parseIperfUdpJson(text, options.bitsPerSecond);
  } catch (err) {
    return failedProbe(options, (err as Error).message);
  }
}

function failedProbe(options: UdpOptions, error: string): UdpProbe {
  return {
    targetBps: options.bitsPerSecond, sentBps: 0, receivedBps: 0, packets: 0, lostPackets: 0, lossFraction: 1,
    receivedPps: 0, seconds: options.seconds, error: error.split('\n')[0],
  };
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
  return pingResult(sent, rttsMs);
}

/** The replies' figures: the count, median and 99th percentile of `rttsMs`, out of `sent` echoes. */
function pingResult(sent: number, rttsMs: number[]): PingResult {
  return { sent, received: rttsMs.length, rttsMs, medianMs: median(rttsMs), p99Ms: percentile(rttsMs, 99) };
}

/**
 * Several ping series as one: the replies of all, in order, their median and 99th percentile.
 * The bench takes a subject's series in rounds spread over the run (runner.ts, plan), so that
 * one unlucky moment of a noisy machine does not make a subject's idle RTT (exported for tests).
 */
export function mergePings(series: readonly PingResult[]): PingResult {
  return pingResult(series.reduce((sum, s) => sum + s.sent, 0), series.flatMap((s) => s.rttsMs));
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
