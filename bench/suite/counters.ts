/**
 * Kernel drop counters that explain retransmissions: the UDP counters of a namespace
 * (/proc/net/snmp: datagrams dropped because a socket's receive buffer was full, send buffer
 * errors) and an interface's packet and drop counts (`ip -s -j link`). Read before and after a
 * subject's iperf3 runs and kept as differences.
 */
import type { Namespace } from '../../test/system/netns.ts';

export type Counters = Record<string, number>;

/** The `Udp:` counters of the namespace (InDatagrams, RcvbufErrors, SndbufErrors, InErrors…). */
export async function udpCounters(ns: Namespace): Promise<Counters> {
  const text = (await ns.exec('cat', ['/proc/net/snmp'], { timeoutMs: 5000 })).stdout;
  const rows = text.split('\n').filter((l) => l.startsWith('Udp: '));
  if (rows.length < 2) return {};
  const names = rows[0].split(/\s+/).slice(1), values = rows[1].split(/\s+/).slice(1).map(Number);
  const out: Counters = {};
  names.forEach((n, i) => { out[n] = values[i]; });
  return out;
}

/** rx/tx packets, errors and drops of one interface. */
export async function linkCounters(ns: Namespace, ifname: string): Promise<Counters> {
  const r = await ns.ip(['-s', '-j', 'link', 'show', 'dev', ifname], { allowFailure: true, timeoutMs: 5000 });
  if (r.code !== 0) return {};
  try {
    const [link] = JSON.parse(r.stdout) as Array<{ stats64?: Record<'rx' | 'tx', Record<string, number>> }>;
    const out: Counters = {};
    for (const dir of ['rx', 'tx'] as const) {
      for (const key of ['packets', 'errors', 'dropped', 'over_errors', 'carrier_errors'] as const) {
        const v = link?.stats64?.[dir]?.[key];
        if (typeof v === 'number') out[`${dir}_${key}`] = v;
      }
    }
    return out;
  } catch { return {}; }
}

/** after − before, keeping only counters present in both. */
export function difference(before: Counters, after: Counters): Counters {
  const out: Counters = {};
  for (const [k, v] of Object.entries(after)) if (typeof before[k] === 'number') out[k] = v - before[k];
  return out;
}

/** One look at the standing queues a tunnel's packets can wait in, outside the tunnel process. */
export interface QueueSample {
  /** Bytes and packets waiting in the qdisc of the interface (for a TUN: not yet read by the daemon). */
  qdiscBacklogBytes: number;
  qdiscBacklogPackets: number;
  /** Bytes waiting in the UDP socket(s) bound to the port (not yet read by the daemon). */
  udpRecvQueueBytes: number;
  /** The socket's receive buffer size (skmem rb), bytes; the most it can hold. */
  udpReceiveBufferBytes: number;
}

/** qdisc backlog of `ifname` and Recv-Q of the UDP sockets on `port`, in namespace `ns`. */
export async function sampleQueues(ns: Namespace, ifname: string, port: number): Promise<QueueSample> {
  const sample: QueueSample = { qdiscBacklogBytes: 0, qdiscBacklogPackets: 0, udpRecvQueueBytes: 0, udpReceiveBufferBytes: 0 };
  const tc = await ns.exec('tc', ['-s', '-j', 'qdisc', 'show', 'dev', ifname], { allowFailure: true, timeoutMs: 5000 });
  try {
    for (const q of JSON.parse(tc.stdout) as Array<{ root?: boolean; backlog?: number; qlen?: number }>) {
      // Only the root qdisc: with a multiqueue root the children's backlog is already counted in it.
      if (q.root) { sample.qdiscBacklogBytes += q.backlog ?? 0; sample.qdiscBacklogPackets += q.qlen ?? 0; }
    }
  } catch { /* no tc, or no JSON support */ }
  const ss = await ns.exec('ss', ['-H', '-u', '-a', '-n', '-m', `sport = :${port}`], { allowFailure: true, timeoutMs: 5000 });
  for (const line of ss.stdout.split('\n')) {
    // `ss -m` puts skmem on a continuation line of its own.
    const rb = /\brb(\d+)/.exec(line);
    if (rb) { sample.udpReceiveBufferBytes = Math.max(sample.udpReceiveBufferBytes, Number(rb[1])); continue; }
    const cols = line.trim().split(/\s+/);
    if (cols.length < 4) continue;
    const recvQ = Number(cols[1]);
    if (Number.isFinite(recvQ)) sample.udpRecvQueueBytes += recvQ;
  }
  return sample;
}
