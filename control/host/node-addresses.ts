/**
 * The node's own addresses for the mesh: the usable unicast addresses of named interfaces (kubelet
 * and cloud controllers often publish only one family in Node.status.addresses, so an operator can
 * name interfaces whose addresses join the node's), and the choice of the address peers should
 * send WireGuard packets to.
 *
 * "Usable" means an address another host could send to: not unspecified, loopback, link-local,
 * multicast or broadcast, not IPv4-mapped, and not deprecated, tentative or failed DAD (a
 * tentative address cannot be used as a source yet; a deprecated one is on its way out).
 * Unique-local IPv6 (fc00::/7) and private IPv4 are kept: inside a site they are the addresses
 * nodes reach each other by.
 */
import { formatIp, isIpv4Mapped, parseIp } from '../../dataplane/net/ip.ts';
import { runChecked, systemRunner, type CommandRunner } from './runner.ts';
import { validateDeviceName } from './routes.ts';

export type EndpointFamily = 'ipv4' | 'ipv6' | 'dualstack';

/** True for an address another host can reach (see the module comment); `address` is 4 or 16 bytes. */
export function isUsableUnicast(address: Uint8Array): boolean {
  if (address.length === 4) {
    const [a, b] = address;
    if (a === 0) return false; // 0.0.0.0/8 "this network"
    if (a === 127) return false; // loopback
    if (a === 169 && b === 254) return false; // link-local
    if (a >= 224 && a <= 239) return false; // multicast
    if (address.every((x) => x === 255)) return false; // limited broadcast
    return true;
  }
  if (address.length !== 16) throw new Error(`an IP address has 4 or 16 bytes, got ${address.length}`);
  if (address[0] === 0xff) return false; // multicast
  if (address[0] === 0xfe && (address[1] & 0xc0) === 0x80) return false; // fe80::/10 link-local
  if (isIpv4Mapped(address)) return false;
  const allZeroButLast = address.subarray(0, 15).every((x) => x === 0);
  if (allZeroButLast && (address[15] === 0 || address[15] === 1)) return false; // :: and ::1
  return true;
}

/** Canonical address order: IPv4 before IPv6, then numerically; duplicates removed. Throws on a non-address. */
export function sortAddresses(addresses: readonly string[]): string[] {
  if (!Array.isArray(addresses)) throw new Error('addresses must be an array of IP address strings');
  const parsed = addresses.map((text) => {
    if (typeof text !== 'string') throw new Error(`not an IP address: ${JSON.stringify(text)}`);
    return parseIp(text.trim());
  });
  parsed.sort((a, b) => {
    if (a.length !== b.length) return a.length - b.length;
    for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return a[i] - b[i];
    return 0;
  });
  const texts = parsed.map(formatIp);
  return texts.filter((t, i) => i === 0 || t !== texts[i - 1]);
}

interface AddrInfo {
  family?: unknown;
  local?: unknown;
  scope?: unknown;
  deprecated?: unknown;
  tentative?: unknown;
  dadfailed?: unknown;
}

/**
 * The usable addresses in `ip -j addr show` output, in canonical order. Besides the address class
 * the kernel's scope must be global: an address an admin scoped "host" or "link" is not meant to be
 * reached from other nodes.
 */
export function parseUsableAddresses(json: string): string[] {
  let links: unknown;
  try {
    links = json.trim() === '' ? [] : JSON.parse(json);
  } catch (err) {
    throw new Error(`cannot parse \`ip -j addr\` output: ${(err as Error).message}`);
  }
  if (!Array.isArray(links)) throw new Error('cannot parse `ip -j addr` output: expected a JSON array');
  const out: string[] = [];
  for (const link of links) {
    const infos = (link as { addr_info?: unknown }).addr_info;
    if (!Array.isArray(infos)) continue;
    for (const info of infos as AddrInfo[]) {
      if (info.family !== 'inet' && info.family !== 'inet6') continue;
      if (typeof info.local !== 'string' || info.scope !== 'global') continue;
      if (info.deprecated === true || info.tentative === true || info.dadfailed === true) continue;
      let bytes: Uint8Array;
      try {
        bytes = parseIp(info.local);
      } catch {
        continue;
      }
      if (isUsableUnicast(bytes)) out.push(formatIp(bytes));
    }
  }
  return sortAddresses(out);
}

/**
 * The usable addresses of the named interfaces (`ip -j addr show dev X` each), canonical and
 * de-duplicated. A missing interface is an error: a configured interface name that does not exist
 * is a mistake to report, not an empty answer.
 */
export async function globalUnicastAddresses(interfaces: readonly string[], runner: CommandRunner = systemRunner): Promise<string[]> {
  if (!Array.isArray(interfaces)) throw new Error('interfaces must be an array of interface names');
  const all: string[] = [];
  for (const name of interfaces) {
    validateDeviceName(name);
    const result = await runChecked(runner, `read the addresses of interface ${name}`, 'ip', ['-j', 'addr', 'show', 'dev', name]);
    all.push(...parseUsableAddresses(result.stdout));
  }
  return sortAddresses(all);
}

/**
 * The address to publish as this node's WireGuard endpoint: the first address of the wanted
 * family in canonical order (so the choice does not depend on the order addresses were listed);
 * `dualstack` takes IPv4 when there is one, else IPv6. Undefined when there is none.
 */
export function selectEndpointAddress(addresses: readonly string[], family: EndpointFamily): string | undefined {
  if (family !== 'ipv4' && family !== 'ipv6' && family !== 'dualstack') {
    throw new Error(`endpoint family must be ipv4, ipv6 or dualstack, got ${JSON.stringify(family)}`);
  }
  const sorted = sortAddresses(addresses);
  const v4 = sorted.find((a) => !a.includes(':'));
  const v6 = sorted.find((a) => a.includes(':'));
  if (family === 'ipv4') return v4;
  if (family === 'ipv6') return v6;
  return v4 ?? v6;
}
