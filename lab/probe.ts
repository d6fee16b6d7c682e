/**
 * Reachability and throughput probes inside namespaces (`ping`, `iperf3`), shared by the system
 * tests and the demo.
 */
import { type Namespace, type Scope, waitFor } from './netns.ts';

export interface PingOptions {
  /** Replies wanted. Default 3. */
  count?: number;
  /** Seconds between requests. Default 0.2. */
  intervalS?: number;
  /** Give up after this many seconds. Default 10. */
  deadlineS?: number;
}

export interface PingResult {
  transmitted: number;
  received: number;
  lossPercent: number;
  output: string;
}

/** `ping` statistics line: "N packets transmitted, M received, …". */
export function parsePingOutput(output: string): PingResult {
  const m = /(\d+) packets transmitted, (\d+) (?:packets )?received/.exec(output);
  if (!m) return { transmitted: 0, received: 0, lossPercent: 100, output };
  const transmitted = Number(m[1]);
  const received = Number(m[2]);
  return { transmitted, received, lossPercent: transmitted === 0 ? 100 : (100 * (transmitted - received)) / transmitted, output };
}

/** Runs `ping -c COUNT -i INTERVAL -w DEADLINE DST` in `ns`; never throws on lost replies. */
export async function ping(ns: Namespace, dst: string, options: PingOptions = {}): Promise<PingResult> {
  const count = options.count ?? 3;
  const deadline = options.deadlineS ?? 10;
  const result = await ns.exec('ping', ['-n', '-c', String(count), '-i', String(options.intervalS ?? 0.2), '-w', String(deadline), dst], {
    allowFailure: true,
    timeoutMs: (deadline + 10) * 1000,
  });
  return parsePingOutput(result.stdout + result.stderr);
}

export interface Iperf3Result {
  /** Receiver-side throughput over the whole run, bits/s. */
  receivedBitsPerSecond: number;
  sentBitsPerSecond: number;
  /** Bytes moved in each reporting interval (1 s by default), from the client's view. */
  intervalBytes: number[];
  retransmits?: number;
}

let nextIperfPort = 5201;

/**
 * A TCP iperf3 run of `seconds` from `clientNs` to `serverAddress` (an iperf3 server started in
 * `serverNs` for this one test, `-1`), with JSON output. Throws on any failure.
 */
export async function iperf3(scope: Scope, serverNs: Namespace, clientNs: Namespace, serverAddress: string, options: { seconds?: number; reverse?: boolean } = {}): Promise<Iperf3Result> {
  const seconds = options.seconds ?? 3;
  const port = nextIperfPort++;
  const server = scope.spawn(serverNs, 'iperf3', ['-s', '-1', '-p', String(port)], { label: `iperf3 server in ${serverNs.name}` });
  await waitFor(async () => {
    if (!server.running) throw new Error(`iperf3 server exited\n${server.describe()}`);
    const ss = await serverNs.exec('ss', ['-Hltn', `sport = :${port}`], { allowFailure: true });
    return ss.stdout.trim().length > 0;
  }, 5000, { description: 'the iperf3 server to listen' });
  const args = ['-c', serverAddress, '-p', String(port), '-t', String(seconds), '-i', '1', '-J', '--connect-timeout', '5000'];
  if (options.reverse) args.push('-R');
  const result = await clientNs.exec('iperf3', args, { allowFailure: true, timeoutMs: (seconds + 25) * 1000 });
  await Promise.race([server.exited, new Promise((r) => setTimeout(r, 3000).unref())]);
  await server.stop();
  let json: IperfJson;
  try {
    json = JSON.parse(result.stdout) as IperfJson;
  } catch {
    throw new Error(`iperf3 client gave no JSON (exit ${result.code}): ${result.stderr.trim()}\n${result.stdout.slice(0, 2000)}`);
  }
  if (result.code !== 0 || json.error) {
    throw new Error(`iperf3 to ${serverAddress} failed (exit ${result.code}): ${json.error ?? result.stderr.trim()}\n${server.describe()}`);
  }
  return {
    receivedBitsPerSecond: json.end?.sum_received?.bits_per_second ?? 0,
    sentBitsPerSecond: json.end?.sum_sent?.bits_per_second ?? 0,
    intervalBytes: (json.intervals ?? []).map((i) => i.sum?.bytes ?? 0),
    retransmits: json.end?.sum_sent?.retransmits,
  };
}

interface IperfJson {
  error?: string;
  intervals?: Array<{ sum?: { bytes?: number; seconds?: number } }>;
  end?: {
    sum_sent?: { bits_per_second?: number; retransmits?: number };
    sum_received?: { bits_per_second?: number };
  };
}
