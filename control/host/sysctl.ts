/**
 * Packet forwarding: a node routes between its pods' veths, the tunnel and its uplinks, which the
 * kernel only does with forwarding on. These switches are per network namespace. Turning IPv6
 * forwarding on makes the kernel ignore router advertisements on interfaces with accept_ra=1, so
 * it is only done for a family that has pod CIDRs on this node.
 */
import { readFile, writeFile } from 'node:fs/promises';

export const FORWARDING_PATHS = {
  ipv4: '/proc/sys/net/ipv4/ip_forward',
  ipv6: '/proc/sys/net/ipv6/conf/all/forwarding',
} as const;

/** Turns forwarding on for the chosen families; returns the families it had to change. */
export async function enableForwarding(families: { ipv4: boolean; ipv6: boolean }, paths = FORWARDING_PATHS): Promise<string[]> {
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
