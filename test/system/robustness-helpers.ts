/**
 * Small helpers shared by the robustness system tests (test/system/robustness-*.test.ts): the
 * daemon's drop counters (`get=roamguard-stats` on its control socket), the kernel's count of
 * datagrams it dropped before the daemon saw them, and a process's descriptors.
 */
import { readdirSync, readlinkSync } from 'node:fs';
import type { DeviceStats } from '../../dataplane/uapi/uapi-stats.ts';
import { UapiClient } from '../../dataplane/uapi/uapi-client.ts';
import { WG_SOCKET_DIR, type Namespace } from './netns.ts';
import type { UserspaceWg } from './userspace-wg.ts';

/** A roamguard daemon's counters; fails if it does not answer them. */
export async function daemonStats(daemon: UserspaceWg): Promise<DeviceStats> {
  const stats = await UapiClient.forInterface(WG_SOCKET_DIR, daemon.ifname, 15_000).stats();
  if (!stats) throw new Error(`${daemon.label} does not answer get=roamguard-stats`);
  return stats;
}

/** Drops of outbound packets (from the TUN side), not of anything received. */
export const OUTBOUND_DROPS: readonly string[] = ['no-route', 'no-endpoint', 'staged-overflow', 'handshake-gave-up', 'packet-too-large'];

/**
 * The drop counters that moved between two snapshots, and by how much; with `inboundOnly`, only
 * those of received datagrams (the daemon's own stray outbound packets, e.g. IPv6 router
 * solicitations to addresses no peer owns, are left out).
 */
export function dropsDelta(before: DeviceStats, after: DeviceStats, options: { inboundOnly?: boolean } = {}): Record<string, number> {
  const out: Record<string, number> = {};
  for (const [reason, n] of Object.entries(after.drops)) {
    if (options.inboundOnly && OUTBOUND_DROPS.includes(reason)) continue;
    const d = n - (before.drops[reason] ?? 0);
    if (d !== 0) out[reason] = d;
  }
  return out;
}

/**
 * Datagrams the kernel of `ns` dropped because a UDP socket's receive queue was full (IPv4 and
 * IPv6 together): those never reach the daemon, so its counters cannot include them.
 */
export async function udpReceiveQueueDrops(ns: Namespace): Promise<number> {
  const text = (await ns.exec('cat', ['/proc/net/snmp', '/proc/net/snmp6'])).stdout;
  const lines = text.split('\n');
  const header = lines.find((l) => l.startsWith('Udp: ') && /RcvbufErrors/.test(l));
  const values = lines.find((l) => l.startsWith('Udp: ') && !/RcvbufErrors/.test(l));
  let total = 0;
  if (header && values) {
    const at = header.trim().split(/\s+/).indexOf('RcvbufErrors');
    total += Number(values.trim().split(/\s+/)[at]) || 0;
  }
  const v6 = /^Udp6RcvbufErrors\s+(\d+)/m.exec(text);
  if (v6) total += Number(v6[1]);
  return total;
}

export function fdCount(pid: number): number {
  return readdirSync(`/proc/${pid}/fd`).length;
}

/** What a process's descriptors point at, counted by kind (`socket`, `anon_inode:[eventfd]`, a path…). */
export function fdKinds(pid: number): Record<string, number> {
  const out: Record<string, number> = {};
  for (const fd of readdirSync(`/proc/${pid}/fd`)) {
    let target: string;
    try { target = readlinkSync(`/proc/${pid}/fd/${fd}`); } catch { continue; }
    const kind = target.replace(/:\[\d+\]$/, '');
    out[kind] = (out[kind] ?? 0) + 1;
  }
  return out;
}

export function mib(bytes: number): string {
  return (bytes / 1048576).toFixed(0);
}
