/**
 * The node's nftables ruleset: pod masquerade and the optional "no new inbound connections to
 * pods" filter, in one table of its own (`inet roamguard` by default).
 *
 * The whole table is rendered as text and replaced in ONE `nft -f` transaction:
 *
 *     table inet roamguard {}        # make sure it exists, so the delete cannot fail on a first run
 *     delete table inet roamguard    # drop whatever is there (ours, an older version, a partial edit)
 *     table inet roamguard { … }     # the complete desired table
 *
 * The kernel applies a transaction as a whole or not at all, so packets never see a half-built
 * table, and re-applying after someone flushed our rules simply restores them.
 *
 * When only set contents changed, nftables-update.ts plans `delete element` / `add element` lines
 * instead (same contents, one transaction), so a pass at 10 000 pod CIDRs need not rebuild all.
 *
 * Layout (every rule family-gated; chains are only present when they have work to do):
 *
 *   sets  pod-cidrs-v4 / pod-cidrs-v6              every node's pod CIDRs (summarized; intervals)
 *         local-pod-cidrs-v4 / local-pod-cidrs-v6  this node's pod CIDRs
 *   chain postrouting   nat hook postrouting, priority srcnat — only if a family masquerades
 *         meta mark & 0x4000 == 0x4000 return       kube-proxy marked it; kube-proxy masquerades it
 *         fib saddr type local return               host-originated (also from the gateway address
 *                                                   ptp puts on every host veth): never masqueraded
 *         per ENABLED family: nfproto F, saddr in pod set, daddr not in pod set,
 *                             daddr not local → masquerade
 *   chain mss           filter hook forward, priority mangle — only with a tunnel and path MTU discovery
 *         SYNs into the tunnel: TCP MSS set to the route's MTU (only ever lowered)
 *   chain forward       filter hook forward, priority filter, policy ACCEPT — only if a family filters
 *         per ENABLED family: established,related accept; (v6) icmpv6 accept; pod source accept;
 *                             to pods and not new accept; to local pods with ct status dnat accept;
 *                             to local pods and new → drop
 *
 * Two mistakes of Wigglenet's layout are avoided on purpose (see the CNI/NAT reference, §1.8):
 * its final `masquerade` matched neither family nor source, so host traffic was masqueraded and a
 * family with masquerade off was masqueraded anyway. Here a disabled family produces no
 * masquerade rule at all, and the only source that is masqueraded is a pod address.
 *
 * NodePort / LoadBalancer / hostPort: kube-proxy (iptables or nftables mode) and CNI portmap DNAT
 * such traffic in prerouting, so in the forward hook it is a NEW connection from an outside source
 * to a local pod — exactly what the filter drops. Those services are published deliberately, so
 * the filter accepts connections whose conntrack entry was destination-NATed (`ct status dnat`)
 * before its drop. The filter therefore blocks direct, routed access to pod addresses, not
 * services. (kube-proxy in IPVS mode delivers through the output path and never meets this chain.)
 */
import { formatPrefix, type Prefix } from '../../dataplane/net/ip.ts';
import { parseCidrList, prefixFamily, summarizePrefixes } from './cidrs.ts';
import { runChecked, systemRunner, type CommandRunner } from './runner.ts';

export const DEFAULT_TABLE_NAME = 'roamguard';
/** The bit kube-proxy sets on packets it wants masqueraded (its `--masquerade-bit` 14 default). */
export const KUBE_PROXY_MASQUERADE_MARK = 0x4000;

export const SET_NAMES = {
  clusterV4: 'pod-cidrs-v4',
  clusterV6: 'pod-cidrs-v6',
  localV4: 'local-pod-cidrs-v4',
  localV6: 'local-pod-cidrs-v6',
} as const;

export interface FamilySwitch {
  ipv4: boolean;
  ipv6: boolean;
}

export interface CidrsByFamily {
  v4: readonly string[];
  v6: readonly string[];
}

export interface RulesetOptions {
  /** Table name (family inet). Default `roamguard`. */
  tableName?: string;
  /** Masquerade pod traffic that leaves the cluster's pod networks, per family. */
  masquerade: FamilySwitch;
  /** Drop new forwarded connections to local pods from non-pod sources, per family. */
  filter: FamilySwitch;
  /** The union of every node's pod CIDRs (this node's are added in any case). */
  clusterPodCidrs: CidrsByFamily;
  /** This node's pod CIDRs. */
  localPodCidrs: CidrsByFamily;
  /**
   * The tunnel interface: TCP SYNs forwarded into it get their MSS clamped to the route's MTU, so
   * pods' connections fit a peer whose path is narrower (per-peer route MTUs, path-mtu.ts).
   */
  clampMssTo?: string;
  /** kube-proxy's masquerade mark; packets carrying it are left to kube-proxy. Default 0x4000. */
  kubeProxyMasqueradeMark?: number;
}

/** nft identifiers: a letter, then letters, digits, `_` and `-`; the kernel allows 255 bytes. */
export function validateTableName(name: string): string {
  if (typeof name !== 'string' || !/^[A-Za-z][A-Za-z0-9_-]{0,62}$/.test(name)) {
    throw new Error(`bad nftables table name ${JSON.stringify(name)}: use a letter, then letters, digits, "_" or "-" (at most 63)`);
  }
  return name;
}

function checkSwitch(value: unknown, what: string): FamilySwitch {
  const v = value as Partial<FamilySwitch> | undefined;
  if (!v || typeof v.ipv4 !== 'boolean' || typeof v.ipv6 !== 'boolean') {
    throw new Error(`${what} must be {ipv4: boolean, ipv6: boolean}, got ${JSON.stringify(value)}`);
  }
  return { ipv4: v.ipv4, ipv6: v.ipv6 };
}

/** Parses one family's list and refuses CIDRs of the other family (a v6 CIDR in `v4` is a bug upstream). */
export function familyPrefixes(list: readonly string[] | undefined, family: 4 | 6, what: string): Prefix[] {
  if (!Array.isArray(list)) throw new Error(`${what} must be an array of CIDR strings`);
  const prefixes = parseCidrList(list, what);
  const wrong = prefixes.filter((p) => prefixFamily(p) !== family);
  if (wrong.length > 0) {
    throw new Error(`${what} may hold only IPv${family} CIDRs, got ${wrong.map(formatPrefix).join(', ')}`);
  }
  return prefixes;
}

/**
 * Everything of a ruleset except the contents of its sets, checked and with defaults filled in.
 * Two rulesets with equal shapes differ at most in set elements, which nft can change in place.
 */
export interface RulesetShape {
  table: string;
  masquerade: FamilySwitch;
  filter: FamilySwitch;
  mark: number;
  clampMssTo: string | undefined;
}

/** Checks every option but the CIDR lists; throws a descriptive error for the first bad one. */
export function checkRulesetShape(options: RulesetOptions, caller = 'renderRuleset'): RulesetShape {
  if (!options || typeof options !== 'object') throw new Error(`${caller} needs an options object`);
  const table = validateTableName(options.tableName ?? DEFAULT_TABLE_NAME);
  const masquerade = checkSwitch(options.masquerade, 'masquerade');
  const filter = checkSwitch(options.filter, 'filter');
  const mark = options.kubeProxyMasqueradeMark ?? KUBE_PROXY_MASQUERADE_MARK;
  if (!Number.isInteger(mark) || mark <= 0 || mark > 0xffffffff) {
    throw new Error(`kubeProxyMasqueradeMark must be a non-zero 32-bit mark, got ${mark}`);
  }
  const tunnel = options.clampMssTo;
  if (tunnel !== undefined && (typeof tunnel !== 'string' || !/^[A-Za-z0-9_.-]{1,15}$/.test(tunnel))) {
    throw new Error(`bad interface name ${JSON.stringify(tunnel)} for MSS clamping`);
  }
  return { table, masquerade, filter, mark, clampMssTo: tunnel };
}

/** The elements of the four sets as canonical CIDR text, summarized (no overlaps) and in canonical order. */
export interface RulesetSetElements {
  clusterV4: readonly string[];
  clusterV6: readonly string[];
  localV4: readonly string[];
  localV6: readonly string[];
}

/** Refuses a missing list pair with the same message whoever checks it. */
export function checkCidrLists(options: RulesetOptions): void {
  if (!options.clusterPodCidrs || !options.localPodCidrs) throw new Error('clusterPodCidrs and localPodCidrs are required ({v4: [], v6: []})');
}

function setElements(options: RulesetOptions): RulesetSetElements {
  checkCidrLists(options);
  const localV4 = familyPrefixes(options.localPodCidrs.v4, 4, 'localPodCidrs.v4');
  const localV6 = familyPrefixes(options.localPodCidrs.v6, 6, 'localPodCidrs.v6');
  // This node's pods belong to the cluster's pod networks even before our own Node annotation
  // has come back through the informer.
  const clusterV4 = summarizePrefixes([...familyPrefixes(options.clusterPodCidrs.v4, 4, 'clusterPodCidrs.v4'), ...localV4]);
  const clusterV6 = summarizePrefixes([...familyPrefixes(options.clusterPodCidrs.v6, 6, 'clusterPodCidrs.v6'), ...localV6]);
  return {
    clusterV4: clusterV4.map(formatPrefix),
    clusterV6: clusterV6.map(formatPrefix),
    localV4: summarizePrefixes(localV4).map(formatPrefix),
    localV6: summarizePrefixes(localV6).map(formatPrefix),
  };
}

function renderSet(name: string, type: 'ipv4_addr' | 'ipv6_addr', elements: readonly string[]): string[] {
  const lines = [`\tset ${name} {`, `\t\ttype ${type}`, '\t\tflags interval'];
  // `elements = { }` is a syntax error: an empty set simply has no elements line.
  if (elements.length > 0) lines.push(`\t\telements = { ${elements.join(', ')} }`);
  lines.push('\t}');
  return lines;
}

const hex = (n: number) => `0x${n.toString(16).padStart(8, '0')}`;

/**
 * The complete `nft -f` input that (re)creates the table atomically. Pure: same options, same
 * text (sets are summarized and canonically sorted).
 */
export function renderRuleset(options: RulesetOptions): string {
  const shape = checkRulesetShape(options);
  return renderTable(shape, setElements(options));
}

/**
 * {@link renderRuleset} from a checked shape and already summarized set elements, for callers
 * that keep the elements between passes (nftables-update.ts) instead of re-parsing every CIDR.
 */
export function renderTable(shape: RulesetShape, sets: RulesetSetElements): string {
  const { table, masquerade, filter, mark } = shape;
  const families = [
    { on: { masquerade: masquerade.ipv4, filter: filter.ipv4 }, nfproto: 'ipv4', addr: 'ip', cluster: SET_NAMES.clusterV4, local: SET_NAMES.localV4 },
    { on: { masquerade: masquerade.ipv6, filter: filter.ipv6 }, nfproto: 'ipv6', addr: 'ip6', cluster: SET_NAMES.clusterV6, local: SET_NAMES.localV6 },
  ] as const;

  const lines: string[] = [
    '# roamguard node ruleset: generated, replaced as a whole on every sync; do not edit.',
    `table inet ${table} {}`,
    `delete table inet ${table}`,
    `table inet ${table} {`,
    ...renderSet(SET_NAMES.clusterV4, 'ipv4_addr', sets.clusterV4),
    ...renderSet(SET_NAMES.clusterV6, 'ipv6_addr', sets.clusterV6),
    ...renderSet(SET_NAMES.localV4, 'ipv4_addr', sets.localV4),
    ...renderSet(SET_NAMES.localV6, 'ipv6_addr', sets.localV6),
  ];

  if (masquerade.ipv4 || masquerade.ipv6) {
    lines.push(
      '\tchain postrouting {',
      '\t\ttype nat hook postrouting priority srcnat; policy accept;',
      `\t\tmeta mark & ${hex(mark)} == ${hex(mark)} return comment "kube-proxy masquerades what it marked"`,
      '\t\tfib saddr type local return comment "host-originated traffic is never masqueraded"',
    );
    for (const f of families) {
      if (!f.on.masquerade) continue;
      lines.push(`\t\tmeta nfproto ${f.nfproto} ${f.addr} saddr @${f.cluster} ${f.addr} daddr != @${f.cluster} fib daddr type != local masquerade comment "pods leaving the pod network"`);
    }
    lines.push('\t}');
  }

  if (filter.ipv4 || filter.ipv6) {
    // policy accept: this chain only ever adds one narrow drop; a default drop would cut off
    // everything else this host forwards (and everything kube-proxy or others set up).
    lines.push('\tchain forward {', '\t\ttype filter hook forward priority filter; policy accept;');
    for (const f of families) {
      if (!f.on.filter) continue;
      const p = `meta nfproto ${f.nfproto}`;
      lines.push(`\t\t${p} ct state established,related accept`);
      if (f.nfproto === 'ipv6') lines.push(`\t\t${p} meta l4proto ipv6-icmp accept`);
      lines.push(
        `\t\t${p} ${f.addr} saddr @${f.cluster} accept comment "pod-sourced"`,
        `\t\t${p} ${f.addr} daddr @${f.cluster} ct state != new accept`,
        `\t\t${p} ${f.addr} daddr @${f.local} ct status dnat accept comment "published: NodePort, LoadBalancer, hostPort"`,
        `\t\t${p} ${f.addr} daddr @${f.local} ct state new drop comment "no new inbound connections to pods"`,
      );
    }
    lines.push('\t}');
  }

  if (shape.clampMssTo !== undefined) {
    const tunnel = shape.clampMssTo;
    // Priority mangle, before the filter: the clamp applies to whatever the filter then lets through.
    // The kernel only ever lowers an MSS this way.
    lines.push(
      '\tchain mss {',
      '\t\ttype filter hook forward priority mangle; policy accept;',
      `\t\toifname "${tunnel}" tcp flags & (syn | rst) == syn tcp option maxseg size set rt mtu comment "TCP from pods fits the route's (path) MTU"`,
      '\t}',
    );
  }

  lines.push('}', '');
  return lines.join('\n');
}

/** Checks a ruleset with the kernel without changing anything (`nft -c -f -`). Needs CAP_NET_ADMIN. */
export async function checkRuleset(ruleset: string, runner: CommandRunner = systemRunner): Promise<void> {
  if (typeof ruleset !== 'string' || ruleset.trim() === '') throw new Error('checkRuleset needs the ruleset text');
  await runChecked(runner, 'validate the nftables ruleset', 'nft', ['-c', '-f', '-'], { input: ruleset });
}

/** Applies a ruleset from {@link renderRuleset} in one transaction (`nft -f -`). */
export async function applyRuleset(ruleset: string, runner: CommandRunner = systemRunner): Promise<void> {
  if (typeof ruleset !== 'string' || ruleset.trim() === '') throw new Error('applyRuleset needs the ruleset text');
  await runChecked(runner, 'apply the nftables ruleset', 'nft', ['-f', '-'], { input: ruleset });
}

/** Removes the table if it exists; succeeds when it does not (same create-then-delete idiom). */
export async function removeTable(tableName: string = DEFAULT_TABLE_NAME, runner: CommandRunner = systemRunner): Promise<void> {
  const table = validateTableName(tableName);
  await runChecked(runner, `remove nftables table inet ${table}`, 'nft', ['-f', '-'], {
    input: `table inet ${table} {}\ndelete table inet ${table}\n`,
  });
}
