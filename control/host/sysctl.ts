/**
 * Packet forwarding: a node routes between its pods' veths, the tunnel and its uplinks, which the
 * kernel only does with forwarding on. These switches are per network namespace. Turning IPv6
 * forwarding on makes the kernel ignore router advertisements on interfaces with accept_ra=1, so
 * it is only done for a family that has pod CIDRs on this node.
 */
import { existsSync } from 'node:fs';
import { readFile, writeFile } from 'node:fs/promises';

export const FORWARDING_PATHS = {
  ipv4: '/proc/sys/net/ipv4/ip_forward',
  ipv6: '/proc/sys/net/ipv6/conf/all/forwarding',
} as const;

/**
 * An unprivileged container's /proc/sys is read-only, and runtimes refuse a mount over it; the
 * DaemonSet mounts the host's /proc/sys/net here instead (a hostPath, as Cilium's does). With the
 * host network it is this namespace's /proc/sys/net, writable with CAP_NET_ADMIN.
 */
export const HOST_PROC_SYS_NET = '/host/proc/sys/net';

/** FORWARDING_PATHS, under HOST_PROC_SYS_NET when that is mounted. */
export function forwardingPaths(hostProcSysNet = HOST_PROC_SYS_NET): { ipv4: string; ipv6: string } {
  if (!existsSync(hostProcSysNet)) return FORWARDING_PATHS;
  return {
    ipv4: FORWARDING_PATHS.ipv4.replace('/proc/sys/net', hostProcSysNet),
    ipv6: FORWARDING_PATHS.ipv6.replace('/proc/sys/net', hostProcSysNet),
  };
}

/** Turns forwarding on for the chosen families; returns the families it had to change. */
export async function enableForwarding(families: { ipv4: boolean; ipv6: boolean }, paths: { ipv4: string; ipv6: string } = forwardingPaths()): Promise<string[]> {
  const changed: string[] = [];
  for (const family of ['ipv4', 'ipv6'] as const) {
    if (!families[family]) continue;
    const path = paths[family];
    if ((await readFile(path, 'utf8')).trim() === '1') continue;
    await writeFile(path, '1\n');
    changed.push(family);
  }
  return changed;
}
