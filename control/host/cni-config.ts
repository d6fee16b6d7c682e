/**
 * The CNI network configuration list the container runtime uses for every pod on this node:
 *
 *   ptp        a veth per pod, routed (no bridge); the pod MTU is set here, so pods fit their
 *              packets into the tunnel instead of relying on path-MTU discovery (Wigglenet leaves
 *              it unset); IPAM host-local hands out one address per family from this node's pod
 *              CIDRs, gateway = network + 1, default routes for the families present.
 *   portmap    hostPort support (the runtime passes portMappings as a capability).
 *
 * cniVersion 1.0.0 by default: Debian's containernetworking-plugins 1.1.1 accept 0.1.0 … 1.0.0,
 * and so do containerd ≥ 1.6 and CRI-O ≥ 1.24; "0.4.0" is available for older runtimes.
 *
 * host-local's `ranges` holds range SETS, and a pod gets one address from each set. We put all
 * CIDRs of one family into one set (normally one CIDR per family, so `[[{v4}], [{v6}]]`), so a
 * node with two IPv4 pod CIDRs still gives each pod exactly one IPv4 address.
 */
import { randomBytes } from 'node:crypto';
import { mkdir, open, readFile, rename, unlink } from 'node:fs/promises';
import { basename, dirname, join } from 'node:path';
import { formatIp, formatPrefix } from '../../dataplane/net/ip.ts';
import { canonicalPrefixes, gatewayAddress, parseCidrList, prefixesOverlap, splitByFamily } from './cidrs.ts';

export const DEFAULT_NETWORK_NAME = 'roamguard';
export const DEFAULT_IPAM_DATA_DIR = '/run/cni-ipam-state';
export type CniVersion = '0.4.0' | '1.0.0';
export const SUPPORTED_CNI_VERSIONS: readonly CniVersion[] = ['0.4.0', '1.0.0'];

export interface ConflistOptions {
  /** Network name (the runtime shows it; host-local keys its state directory by it). */
  name: string;
  /** MTU of the pod interface: the tunnel MTU, so pod packets fit into the tunnel. */
  mtu: number;
  /** This node's pod CIDRs, either family; at least one. */
  podCidrs: readonly string[];
  /** host-local's state directory. Default /run/cni-ipam-state (reset at reboot, as pods are). */
  dataDir?: string;
  /** Default 1.0.0. */
  cniVersion?: CniVersion;
}

/** CNI network names: the libcni rule (alphanumerics, then also `_`, `.`, `-`). */
export function validateNetworkName(name: string): string {
  if (typeof name !== 'string' || !/^[a-zA-Z0-9][a-zA-Z0-9_.-]*$/.test(name) || name.length > 128) {
    throw new Error(`bad CNI network name ${JSON.stringify(name)}: start with a letter or digit, then letters, digits, "_", "." or "-"`);
  }
  return name;
}

/** The conflist as a JSON text (2-space indent, trailing newline); same options, same bytes. */
export function renderConflist(options: ConflistOptions): string {
  if (!options || typeof options !== 'object') throw new Error('renderConflist needs an options object');
  const name = validateNetworkName(options.name);
  const cniVersion = options.cniVersion ?? '1.0.0';
  if (!SUPPORTED_CNI_VERSIONS.includes(cniVersion)) {
    throw new Error(`cniVersion must be one of ${SUPPORTED_CNI_VERSIONS.join(', ')}, got ${JSON.stringify(cniVersion)}`);
  }
  const dataDir = options.dataDir ?? DEFAULT_IPAM_DATA_DIR;
  if (typeof dataDir !== 'string' || !dataDir.startsWith('/')) {
    throw new Error(`dataDir must be an absolute path, got ${JSON.stringify(dataDir)}`);
  }
  if (!Array.isArray(options.podCidrs) || options.podCidrs.length === 0) {
    throw new Error('podCidrs must list at least one pod CIDR of this node');
  }
  const prefixes = canonicalPrefixes(parseCidrList(options.podCidrs, 'podCidrs'));
  for (let i = 1; i < prefixes.length; i++) {
    for (let j = 0; j < i; j++) {
      // host-local refuses overlapping ranges; say which ones here rather than at the first pod.
      if (prefixesOverlap(prefixes[i], prefixes[j])) {
        throw new Error(`pod CIDRs ${formatPrefix(prefixes[j])} and ${formatPrefix(prefixes[i])} overlap`);
      }
    }
  }
  const byFamily = splitByFamily(prefixes);
  const mtu = options.mtu;
  // IPv6 cannot run below 1280; IPv4 below 576 breaks too much to be intended.
  const minMtu = byFamily.v6.length > 0 ? 1280 : 576;
  if (!Number.isInteger(mtu) || mtu < minMtu || mtu > 65535) {
    throw new Error(`mtu must be an integer ${minMtu}..65535${byFamily.v6.length > 0 ? ' (IPv6 needs 1280)' : ''}, got ${mtu}`);
  }

  const rangeSet = (family: typeof byFamily.v4) => family.map((p) => ({
    subnet: formatPrefix(p),
    gateway: formatIp(gatewayAddress(p)), // also checks the CIDR leaves room for pods
  }));
  const ranges = [byFamily.v4, byFamily.v6].filter((f) => f.length > 0).map(rangeSet);
  const routes = [
    ...(byFamily.v4.length > 0 ? [{ dst: '0.0.0.0/0' }] : []),
    ...(byFamily.v6.length > 0 ? [{ dst: '::/0' }] : []),
  ];
  const conflist = {
    cniVersion,
    name,
    plugins: [
      {
        type: 'ptp',
        mtu,
        ipam: { type: 'host-local', dataDir, ranges, routes },
      },
      {
        type: 'portmap',
        capabilities: { portMappings: true },
      },
    ],
  };
  return `${JSON.stringify(conflist, null, 2)}\n`;
}

/**
 * Writes `text` to `path` so a reader (the runtime watches /etc/cni/net.d) sees either the old or
 * the new file, never a partial one: temp file in the same directory (a rename is atomic only
 * within one filesystem), fsync, rename over, fsync the directory. The temp name ends in neither
 * .conf nor .conflist nor .json, so a runtime never loads it. Returns false (and writes nothing)
 * when the file already holds exactly `text`. Missing directories are created. The file gets mode 0644 whatever the umask.
 */
export async function writeConflistAtomically(path: string, text: string): Promise<boolean> {
  if (typeof path !== 'string' || !path.startsWith('/')) throw new Error(`conflist path must be absolute, got ${JSON.stringify(path)}`);
  if (typeof text !== 'string' || text === '') throw new Error('writeConflistAtomically needs the conflist text');
  try {
    if ((await readFile(path, 'utf8')) === text) return false;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw new Error(`cannot read ${path}: ${(err as Error).message}`);
  }
  const dir = dirname(path);
  // On a fresh host /etc/cni/net.d may not exist yet (the runtime creates it lazily).
  await mkdir(dir, { recursive: true, mode: 0o755 });
  const temp = join(dir, `.${basename(path)}.tmp-${process.pid}-${randomBytes(4).toString('hex')}`);
  let renamed = false;
  try {
    const handle = await open(temp, 'wx', 0o644);
    try {
      await handle.writeFile(text, 'utf8');
      await handle.chmod(0o644); // the umask may have narrowed the mode given to open
      await handle.sync();
    } finally {
      await handle.close();
    }
    await rename(temp, path);
    renamed = true;
    // Make the rename itself durable; some filesystems cannot fsync a directory, which is fine.
    const dirHandle = await open(dir, 'r');
    try {
      await dirHandle.sync();
    } catch { /* not supported here */ } finally {
      await dirHandle.close();
    }
  } catch (err) {
    if (!renamed) await unlink(temp).catch(() => {});
    throw new Error(`cannot write ${path}: ${(err as Error).message}`);
  }
  return true;
}
