/**
 * One path-MTU probe: does a packet of exactly `size` bytes (IP header included) with DF set reach
 * `address` and come back? iputils `ping -M do` sets DF and never fragments; a size above the
 * route's or the link's MTU fails locally ("message too long"), which is a "no" as well.
 *
 * Three echoes 200 ms apart, one second for the last answer: a single lost probe on a lossy path
 * does not shrink the MTU. Needs CAP_NET_RAW (the agent container has it; deploy/roamguard.yaml).
 */
import { parseIp } from '../../dataplane/net/ip.ts';
import { systemRunner, type CommandRunner } from './runner.ts';

const ICMP_ECHO_HEADERS = { 4: 20 + 8, 6: 40 + 8 } as const;

export function pingArguments(address: string, size: number): string[] {
  const family = parseIp(address).length === 4 ? 4 : 6;
  const payload = size - ICMP_ECHO_HEADERS[family];
  if (!Number.isInteger(size) || payload < 0 || size > 65535) throw new Error(`probe size must be an integer ${ICMP_ECHO_HEADERS[family]}..65535, got ${size}`);
  return [`-${family}`, '-n', '-q', '-c', '3', '-i', '0.2', '-W', '1', '-M', 'do', '-s', String(payload), address];
}

export async function pingFits(address: string, size: number, runner: CommandRunner = systemRunner): Promise<boolean> {
  const result = await runner('ping', pingArguments(address, size), { timeoutMs: 5000 });
  return result.code === 0;
}
