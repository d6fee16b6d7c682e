/**
 * The node agent's settings, read from the environment (a DaemonSet sets them), validated all at
 * once before anything else happens. A wrong value stops the agent with one line naming the
 * variable, the value and what is accepted: `SettingError.message` is that line.
 *
 * Every setting, its default and its meaning is listed in SETTINGS below; the README and the
 * DaemonSet manifest are written from the same list.
 */
import { formatIp, formatPrefix, parseIp, parsePrefix } from '../../dataplane/net/ip.ts';
import {
  SettingError, bool, fail, integer, markdownTable, oneOf, readSetting, text, type Env, type Spec,
} from '../../dataplane/setting-spec.ts';

// The agent's commands and tests import it from here.
export { SettingError };

export type IpFamilyChoice = 'ipv4' | 'ipv6' | 'dualstack';
export type PodCidrSource = 'none' | 'spec' | 'file';
/** Which data plane the agent starts when no daemon answers on the control socket. */
export type DataplaneChoice = 'roamguard' | 'wireguard-go' | 'external';

export interface PerFamily<T> { ipv4: T; ipv6: T }

export interface Settings {
  nodeName: string;
  interfaceName: string;
  listenPort: number;
  /** Seconds; 0 turns persistent keepalive off. */
  persistentKeepalive: number;
  /** The tunnel MTU; undefined = derived from the uplink (see control/host/uplink-mtu.ts). */
  mtu: number | undefined;
  /** Learn each peer's path MTU through the tunnel and set it on that peer's routes. */
  pathMtuDiscovery: boolean;
  wgIpFamily: IpFamilyChoice;
  privateKeyPath: string;
  /** Seconds between automatic key rotations (measured from when the key file was written); 0 = never. */
  keyRotationInterval: number;
  cniConfigPath: string;
  /** Written only when set: the conflist's `dataDir` for host-local IPAM. */
  cniIpamDataDir: string;
  masquerade: PerFamily<boolean>;
  filter: PerFamily<boolean>;
  nativeRouting: PerFamily<boolean>;
  firewallOnly: boolean;
  podCidrSource: PerFamily<PodCidrSource>;
  podCidrSourcePath: string;
  /** Canonical prefixes where pod CIDRs of a family without `spec.podCIDRs` may lie (every agent the same). */
  podCidrAllowedRanges: string[];
  nodeIpInterfaces: string[];
  kubeconfig: string;
  /** An explicit API server URL: used before kube-proxy makes the in-cluster Service reachable. */
  apiServer: string;
  logLevel: 'debug' | 'info' | 'warn' | 'error' | 'silent';
  /** auto = JSON lines unless stderr is a terminal. */
  logFormat: 'auto' | 'json' | 'text';
  dataplane: DataplaneChoice;
  socketDir: string;
  nftTable: string;
  /** Seconds between full re-applications of routes and firewall rules (repairs outside edits). */
  resyncInterval: number;
  /** Read by bin/roamguard (Node's --max-old-space-size); validated here like every setting. */
  agentHeapMib: number;
  /** Address for /metrics, /healthz and /readyz (`host:port`); empty turns the endpoint off. */
  metricsAddress: string;
  /** Use relays for peers that cannot be reached directly, and relay for others when public. */
  relay: boolean;
  /** UDP ports this node may allocate when it relays (two per pair). */
  relayPorts: { min: number; max: number };
  /** Pairs this node relays at once. */
  relayMaxPairs: number;
  /** Per relayed pair, Mbit/s forwarded at most; 0 = unlimited. */
  relayPairMbit: number;
}

/** `auto` (the default) or an integer in min..max. */
function integerOrAuto(min: number, max: number, doc: string): Spec<number | undefined> {
  const whole = integer(0, min, max, doc);
  return {
    default: 'auto', doc,
    parse(value, name) {
      if (value.trim().toLowerCase() === 'auto') return undefined;
      try {
        return whole.parse(value, name);
      } catch {
        return fail(name, value, `auto or an integer from ${min} to ${max}`);
      }
    },
  };
}

/** A comma-separated list of CIDRs with host bits zero (prefix lengths /8../32 and /16../128), canonical. */
function cidrList(doc: string): Spec<string[]> {
  const accepted = 'comma-separated CIDRs with host bits zero, e.g. 10.250.0.0/16,fd00:250::/48 (IPv4 /8 or longer, IPv6 /16 or longer), or empty';
  return {
    default: '', doc,
    parse(value, name) {
      const out: string[] = [];
      for (const item of value.split(',').map((x) => x.trim()).filter(Boolean)) {
        let prefix;
        try {
          prefix = parsePrefix(item);
        } catch {
          return fail(name, value, accepted);
        }
        const slash = item.indexOf('/');
        if (slash < 0 || formatIp(parseIp(item.slice(0, slash))) !== formatIp(prefix.address)) fail(name, value, accepted);
        if (prefix.bits < (prefix.address.length === 4 ? 8 : 16)) fail(name, value, accepted);
        out.push(formatPrefix(prefix));
      }
      return [...new Set(out)];
    },
  };
}

const DURATION_UNITS: Record<string, number> = { '': 1, s: 1, m: 60, h: 3600, d: 86400 };

/** A duration in seconds: `0` (off), or a whole number with an optional unit s, m, h or d, at least `min` seconds. */
function duration(defaultValue: string, min: number, doc: string): Spec<number> {
  const accepted = `0 (off) or a duration such as 3600, 90m, 12h or 30d (at least ${min} s, at most 3650d)`;
  return {
    default: defaultValue, doc,
    parse(value, name) {
      const m = /^(\d{1,10})\s*([smhd]?)$/.exec(value.trim().toLowerCase());
      if (!m) return fail(name, value, accepted);
      const seconds = Number(m[1]) * DURATION_UNITS[m[2]];
      if (seconds !== 0 && (seconds < min || seconds > 3650 * 86400)) fail(name, value, accepted);
      return seconds;
    },
  };
}

/** `min-max` UDP ports, at least two of them. */
function portRange(defaultValue: string, doc: string): Spec<{ min: number; max: number }> {
  const accepted = 'a port range such as 51900-51999 (1-65535, at least two ports)';
  return {
    default: defaultValue, doc,
    parse(value, name) {
      const m = /^(\d{1,5})-(\d{1,5})$/.exec(value.trim());
      if (!m) return fail(name, value, accepted);
      const min = Number(m[1]), max = Number(m[2]);
      if (min < 1 || max > 65535 || max <= min) fail(name, value, accepted);
      return { min, max };
    },
  };
}

const INTERFACE_NAME = /^[A-Za-z0-9_.-]{1,15}$/;
const ABSOLUTE_PATH = { test: (v: string) => v.startsWith('/') && !v.includes('\0'), accepted: 'an absolute path' };
const OPTIONAL_PATH = { test: (v: string) => v === '' || ABSOLUTE_PATH.test(v), accepted: 'an absolute path or empty' };

/** Every setting: environment variable → how to read it. The order is the documentation order. */
export const SETTINGS = {
  NODE_NAME: text('', 'this node\'s Node name (required; from the downward API spec.nodeName)',
    { test: (v) => /^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/.test(v), accepted: 'a Kubernetes node name (lowercase DNS subdomain)' }),
  WG_INTERFACE: text('roamguard0', 'name of the WireGuard (TUN) interface',
    { test: (v) => INTERFACE_NAME.test(v) && v !== '.' && v !== '..', accepted: 'an interface name of 1-15 letters, digits, "_", "." or "-"' }),
  WG_LISTEN_PORT: integer(51820, 1, 65535, 'UDP port the data plane listens on (published per node, so nodes may differ)'),
  WG_PERSISTENT_KEEPALIVE: integer(25, 0, 65535, 'seconds between keepalives to every peer (keeps NAT mappings open); 0 = off'),
  WG_MTU: integerOrAuto(1280, 65535, 'MTU of the tunnel interface; the pods\' MTU follows it. auto = the MTU of the interface that carries the node\'s address, less the WireGuard overhead (60 bytes with WG_IP_FAMILY=ipv4, else 80): 1420 on a 1500 link'),
  PATH_MTU_DISCOVERY: bool(true, 'probe each peer\'s path MTU through the tunnel and set it on the routes to that peer\'s pod CIDRs (pods then get "fragmentation needed", TCP MSS is clamped), so a narrower path between two nodes is no black hole'),
  WG_IP_FAMILY: oneOf<IpFamilyChoice>('dualstack', ['ipv4', 'ipv6', 'dualstack'], 'family of the tunnel endpoint address (dualstack prefers IPv4)'),
  PRIVATE_KEY_PATH: text('/var/lib/roamguard/private.key', 'WireGuard private key file (created 0600 on first start; keep it on persistent storage)', ABSOLUTE_PATH),
  KEY_ROTATION_INTERVAL: duration('0', 10, 'rotate the node\'s key this often (e.g. 30d), counted from when the key file was written; 0 = only on `roamguard rotate-key`'),
  CNI_CONFIG_PATH: text('/etc/cni/net.d/10-roamguard.conflist', 'where the CNI conflist is written', ABSOLUTE_PATH),
  CNI_IPAM_DATA_DIR: text('', 'host-local IPAM state directory (empty = the plugin\'s default)', OPTIONAL_PATH),
  MASQUERADE_IPV4: bool(true, 'masquerade IPv4 traffic from local pods to destinations outside the pod networks'),
  MASQUERADE_IPV6: bool(true, 'the same for IPv6'),
  FILTER_IPV4: bool(false, 'drop new IPv4 connections from outside the cluster to local pods (replies still pass)'),
  FILTER_IPV6: bool(false, 'the same for IPv6'),
  NATIVE_ROUTING_IPV4: bool(false, 'IPv4 pod traffic follows the host\'s routes instead of the tunnel'),
  NATIVE_ROUTING_IPV6: bool(false, 'the same for IPv6'),
  FIREWALL_ONLY: bool(false, 'only masquerade/filter rules: no tunnel, no CNI config'),
  POD_CIDR_SOURCE_IPV4: oneOf<PodCidrSource>('spec', ['none', 'spec', 'file'], 'where this node\'s IPv4 pod CIDRs come from'),
  POD_CIDR_SOURCE_IPV6: oneOf<PodCidrSource>('spec', ['none', 'spec', 'file'], 'where this node\'s IPv6 pod CIDRs come from'),
  POD_CIDR_SOURCE_PATH: text('', 'file with one pod CIDR per line (for the "file" source; watched for changes)', OPTIONAL_PATH),
  POD_CIDR_ALLOWED_RANGES: cidrList('where pod CIDRs of a family without spec.podCIDRs (the "file" source) may lie; the same on every agent, since each checks every node\'s claims against it'),
  NODE_IP_INTERFACES: text('', 'comma-separated interfaces whose global unicast addresses are added to the node addresses',
    { test: (v) => v === '' || v.split(',').every((n) => INTERFACE_NAME.test(n.trim())), accepted: 'a comma-separated list of interface names' }),
  KUBECONFIG: text('', 'kubeconfig file (empty = in-cluster service account)', OPTIONAL_PATH),
  KUBE_API_SERVER: text('', 'explicit API server URL, e.g. https://10.0.0.1:6443 (overrides the kubeconfig\'s server)',
    { test: (v) => v === '' || /^https?:\/\/[^\s/]+(\/.*)?$/.test(v), accepted: 'an http:// or https:// URL, or empty' }),
  LOG_LEVEL: oneOf<Settings['logLevel']>('info', ['debug', 'info', 'warn', 'error', 'silent'], 'log verbosity'),
  LOG_FORMAT: oneOf<Settings['logFormat']>('auto', ['auto', 'json', 'text'], 'log lines as JSON or as text; auto = JSON unless stderr is a terminal'),
  WG_DATAPLANE: oneOf<DataplaneChoice>('roamguard', ['roamguard', 'wireguard-go', 'external'],
    'data plane started when none answers on the control socket; external = never start one, wait for it'),
  WG_SOCKET_DIR: text('/var/run/wireguard', 'directory of the WireGuard control sockets', ABSOLUTE_PATH),
  NFT_TABLE: text('roamguard', 'name of the nftables table (family inet) the agent owns',
    { test: (v) => /^[A-Za-z][A-Za-z0-9_-]{0,31}$/.test(v), accepted: 'a table name (letter, then letters, digits, "_" or "-")' }),
  RESYNC_INTERVAL: integer(60, 1, 86400, 'seconds between full re-applications of routes and firewall rules'),
  AGENT_HEAP_MIB: integer(384, 64, 65536, 'the agent\'s V8 heap limit in MiB (bin/roamguard starts Node.js with it): with a limit, V8 collects at about 1.4 times the live heap instead of 4 times; the live heap at 5 000 Nodes is about 80 MiB'),
  RELAY: bool(true, 'relay for pairs of nodes that cannot meet (when this node is public) and use relays for peers this node cannot reach directly; false = neither'),
  RELAY_PORTS: portRange('51900-51999', 'UDP ports a public node may allocate for relayed pairs (two per pair); open them in cloud firewalls'),
  RELAY_MAX_PAIRS: integer(32, 0, 10000, 'pairs of nodes this node relays at once (0 = it never relays, but still uses relays)'),
  RELAY_PAIR_MBIT: integer(1000, 0, 1000000, 'Mbit/s forwarded per relayed pair at most; 0 = unlimited'),
  METRICS_ADDRESS: text(':9474', 'host:port for /metrics, /healthz and /readyz; empty = off',
    { test: (v) => v === '' || /^(\[[0-9a-fA-F:.]+\]|[0-9.]*|[A-Za-z0-9.-]+):\d{1,5}$/.test(v), accepted: 'host:port, :port or empty' }),
} as const;

type SettingName = keyof typeof SETTINGS;

/**
 * Reads and validates every setting. Throws a SettingError for the first bad value, naming it.
 * Unset and empty variables take their defaults (an empty NODE_NAME is an error: it is required).
 */
export function loadSettings(env: Env = process.env): Settings {
  const get = <N extends SettingName>(name: N): ReturnType<(typeof SETTINGS)[N]['parse']> => {
    return readSetting(env, name, SETTINGS[name] as Spec<unknown>) as ReturnType<(typeof SETTINGS)[N]['parse']>;
  };

  if ((env.NODE_NAME ?? '').trim() === '') throw new SettingError('NODE_NAME', env.NODE_NAME ?? '', 'the Node\'s name (set it from the downward API: spec.nodeName)');

  const settings: Settings = {
    nodeName: get('NODE_NAME'),
    interfaceName: get('WG_INTERFACE'),
    listenPort: get('WG_LISTEN_PORT'),
    persistentKeepalive: get('WG_PERSISTENT_KEEPALIVE'),
    mtu: get('WG_MTU'),
    pathMtuDiscovery: get('PATH_MTU_DISCOVERY'),
    wgIpFamily: get('WG_IP_FAMILY'),
    privateKeyPath: get('PRIVATE_KEY_PATH'),
    keyRotationInterval: get('KEY_ROTATION_INTERVAL'),
    cniConfigPath: get('CNI_CONFIG_PATH'),
    cniIpamDataDir: get('CNI_IPAM_DATA_DIR'),
    masquerade: { ipv4: get('MASQUERADE_IPV4'), ipv6: get('MASQUERADE_IPV6') },
    filter: { ipv4: get('FILTER_IPV4'), ipv6: get('FILTER_IPV6') },
    nativeRouting: { ipv4: get('NATIVE_ROUTING_IPV4'), ipv6: get('NATIVE_ROUTING_IPV6') },
    firewallOnly: get('FIREWALL_ONLY'),
    podCidrSource: { ipv4: get('POD_CIDR_SOURCE_IPV4'), ipv6: get('POD_CIDR_SOURCE_IPV6') },
    podCidrSourcePath: get('POD_CIDR_SOURCE_PATH'),
    podCidrAllowedRanges: get('POD_CIDR_ALLOWED_RANGES'),
    nodeIpInterfaces: get('NODE_IP_INTERFACES').split(',').map((s) => s.trim()).filter(Boolean),
    kubeconfig: get('KUBECONFIG'),
    apiServer: get('KUBE_API_SERVER'),
    logLevel: get('LOG_LEVEL'),
    logFormat: get('LOG_FORMAT'),
    dataplane: get('WG_DATAPLANE'),
    socketDir: get('WG_SOCKET_DIR'),
    nftTable: get('NFT_TABLE'),
    resyncInterval: get('RESYNC_INTERVAL'),
    agentHeapMib: get('AGENT_HEAP_MIB'),
    metricsAddress: get('METRICS_ADDRESS'),
    relay: get('RELAY'),
    relayPorts: get('RELAY_PORTS'),
    relayMaxPairs: get('RELAY_MAX_PAIRS'),
    relayPairMbit: get('RELAY_PAIR_MBIT'),
  };

  // Settings that are only wrong together.
  const usesFile = settings.podCidrSource.ipv4 === 'file' || settings.podCidrSource.ipv6 === 'file';
  if (usesFile && settings.podCidrSourcePath === '') {
    throw new SettingError('POD_CIDR_SOURCE_PATH', '', 'a file path, because a POD_CIDR_SOURCE_* is "file"');
  }
  return settings;
}

/** The settings documentation as Markdown table rows (README, manifest comments). */
export function settingsTable(): string {
  return markdownTable(SETTINGS);
}
