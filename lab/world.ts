/**
 * A Kubernetes-shaped world built from network namespaces on one machine, for the system tests
 * and the local demo (`roamguard demo`):
 *
 *   fabric namespace   one Linux bridge per segment ("internet", office LANs…); the internet
 *                      bridge also holds the address where agents reach the API server
 *   routers            a namespace with a WAN leg on one segment and a LAN segment of its own,
 *                      doing what a home or office router does: masquerade (IPv4 and IPv6) and a
 *                      stateful firewall that drops unsolicited inbound traffic; no hairpin NAT
 *   nodes              a namespace on a segment, running `roamguard agent` (which starts its own
 *                      `roamguard wg`); pods are namespaces wired by the real CNI plugins with the
 *                      conflist the agent wrote
 *
 * The API server (KubeApiServer) runs in this process on loopback; a unix-socket relay carries
 * the agents' connections to it, so no traffic leaves the namespaces the world made.
 *
 * With `identities: true` the world is run as deploy/roamguard.yaml sets a cluster up: the API
 * server speaks https (a throwaway self-signed certificate), each agent gets its own token (the
 * roamguard service account, bound to its node: user extra authentication.kubernetes.io/node-name,
 * as a pod-bound token gives) through a kubeconfig, and the manifest's ValidatingAdmissionPolicy
 * is enforced on every Node write. Otherwise agents talk plain http, anonymously.
 */
import { randomBytes } from 'node:crypto';
import { readFileSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { release } from 'node:os';
import { fileURLToPath } from 'node:url';
import { cniAdd } from '../control/host/cni-exec.ts';
import { netnsRunner } from '../control/host/runner.ts';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import { KubeApiServer, kubeConfigFor, type RequestUser } from './kube-api-server.ts';
import { parseSocketAddress, startRelay } from './socket-relay.ts';
import { type Namespace, type NsProcess, run, type Scope, uniqueName, waitFor, WG_SOCKET_DIR } from './netns.ts';

export const REPO_ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
export const ROAMGUARD = join(REPO_ROOT, 'bin/roamguard');

export interface SegmentSpec {
  name: string;
  /** IPv4 /24, e.g. 203.0.113.0/24: host N gets .N. */
  ipv4: string;
  /** IPv6 /64, e.g. 2001:db8:1::/64: host N gets ::N (hex). */
  ipv6: string;
}

export interface Segment {
  spec: SegmentSpec;
  bridge: string;
  /** The router on this segment, when it is a LAN behind one. */
  gateway?: { ipv4: string; ipv6: string };
}

export interface WorldNode {
  name: string;
  ns: Namespace;
  segment: Segment;
  ipv4: string;
  ipv6: string;
  /** The node's uplink inside its namespace. */
  uplink: string;
  /** The uplink's other end: a port of the segment's bridge in the fabric. */
  uplinkFabric: string;
  ifname: string;
  listenPort: number;
  dir: string;
  podCidrs: string[];
  env: Record<string, string>;
  agent?: NsProcess;
  /** With `identities`: this node's agent token (what an attacker on the node would steal). */
  token?: string;
}

/** The agents' service account, as deploy/roamguard.yaml names it. */
export const AGENT_USERNAME = 'system:serviceaccount:roamguard:roamguard';

/** The user a pod-bound token of the agents' service account on `node` authenticates as. */
export function agentUser(node: string): RequestUser {
  return {
    username: AGENT_USERNAME,
    groups: ['system:serviceaccounts', 'system:serviceaccounts:roamguard', 'system:authenticated'],
    extra: { 'authentication.kubernetes.io/node-name': [node], 'authentication.kubernetes.io/pod-name': [`roamguard-${node}`] },
  };
}

export interface Router {
  name: string;
  ns: Namespace;
  /** fabricIfname: the WAN link's other end, a port of the segment's bridge. */
  wan: { segment: Segment; ipv4: string; ipv6: string; ifname: string; fabricIfname: string };
  lan: Segment;
}

export interface Pod {
  name: string;
  ns: Namespace;
  node: WorldNode;
  ipv4: string;
  ipv6: string;
}

export interface WgPeerView { endpoint: string; allowedIps: string[]; latestHandshake: number; rx: number; tx: number }

export function hostAddress(spec: SegmentSpec, index: number): { ipv4: string; ipv6: string } {
  if (!Number.isInteger(index) || index < 1 || index > 254) throw new Error(`host index ${index} out of 1..254`);
  const v4 = spec.ipv4.replace(/\.0\/24$/, `.${index}`);
  const v6 = spec.ipv6.replace(/::\/64$/, `::${index.toString(16)}`);
  if (v4 === spec.ipv4 || v6 === spec.ipv6) throw new Error(`segment ${spec.name}: expected an x.y.z.0/24 and a ...::/64`);
  return { ipv4: v4, ipv6: v6 };
}

/** Where the agents reach the API server: this host index on the first segment. */
const API_HOST = 254;
const API_PORT = 6443;

export interface WorldOptions {
  /** The segment the API server is reachable on (the "internet"). */
  backbone: SegmentSpec;
  /** Environment for every agent (settings shared by all nodes). */
  agentEnv?: Record<string, string>;
  /** Keep this many bytes of each agent's log. Default 256 KiB. */
  keepLogBytes?: number;
  /** https, a token per agent and deploy/roamguard.yaml's admission policy (see the file comment). */
  identities?: boolean;
}

export class World {
  readonly segments = new Map<string, Segment>();
  readonly routers = new Map<string, Router>();
  readonly nodes: WorldNode[] = [];
  private podCidrCounter = 0;

  private constructor(
    readonly scope: Scope,
    readonly api: KubeApiServer,
    readonly fabric: Namespace,
    readonly backbone: Segment,
    readonly apiUrl: string,
    private readonly options: WorldOptions,
  ) {}

  static async create(scope: Scope, options: WorldOptions): Promise<World> {
    const dir = scope.tempDir('roamguard-world-');
    let api: KubeApiServer;
    if (options.identities) {
      const key = join(dir, 'api-key.pem');
      const cert = join(dir, 'api-cert.pem');
      await promisify(execFile)('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-days', '1',
        '-subj', '/CN=roamguard-lab-api', '-keyout', key, '-out', cert]);
      // Loaded only here: its CEL library is a devDependency, which the demo's image lacks.
      const { deployPolicyAdmission } = await import('./admission-policy.ts');
      api = new KubeApiServer({ tls: { key: readFileSync(key, 'utf8'), cert: readFileSync(cert, 'utf8') }, admission: deployPolicyAdmission() });
    } else {
      api = new KubeApiServer();
    }
    await api.start();
    scope.defer('close the API server', () => api.close());
    const fabric = await scope.namespace();
    const backbone = await World.bridge(fabric, options.backbone);
    const apiAddress = hostAddress(options.backbone, API_HOST);
    await fabric.ip(['addr', 'add', `${apiAddress.ipv4}/24`, 'dev', backbone.bridge]);
    await fabric.ip(['addr', 'add', `${apiAddress.ipv6}/64`, 'dev', backbone.bridge, 'nodad']);

    // API server (loopback, this process) ← unix socket ← relay inside the fabric namespace.
    const sock = join(dir, 'api.sock');
    const inner = await startRelay({ path: sock }, parseSocketAddress(new URL(api.url).host));
    scope.defer('stop the API relay', () => inner.close());
    const relay = scope.spawn(fabric, process.execPath, ['--import', 'tsx', join(REPO_ROOT, 'lab/socket-relay.ts'), `${apiAddress.ipv4}:${API_PORT}`, `unix:${sock}`], { label: 'api relay', cwd: REPO_ROOT });
    await waitFor(() => relay.stdout.includes('ready') || !relay.running, 20_000, { description: 'the API relay' });
    if (!relay.running) throw new Error(`API relay failed: ${relay.describe()}`);

    const world = new World(scope, api, fabric, backbone, `${options.identities ? 'https' : 'http'}://${apiAddress.ipv4}:${API_PORT}`, options);
    world.segments.set(backbone.spec.name, backbone);
    return world;
  }

  private static async bridge(fabric: Namespace, spec: SegmentSpec): Promise<Segment> {
    const bridge = `br-${spec.name}`.slice(0, 15);
    await fabric.ip(['link', 'add', bridge, 'type', 'bridge']);
    await fabric.ip(['link', 'set', bridge, 'up']);
    return { spec, bridge };
  }

  segment(name: string): Segment {
    const s = this.segments.get(name);
    if (!s) throw new Error(`no segment ${name}`);
    return s;
  }

  /** Plugs `ns` into `segment` as host `index`; returns the interface name inside `ns`. */
  async plug(ns: Namespace, segment: Segment, index: number): Promise<{ ifname: string; fabricIfname: string; ipv4: string; ipv6: string }> {
    const { ipv4, ipv6 } = hostAddress(segment.spec, index);
    const [end, fabricEnd] = await this.scope.veth(ns, this.fabric);
    await ns.ip(['addr', 'add', `${ipv4}/24`, 'dev', end.ifname]);
    await ns.ip(['addr', 'add', `${ipv6}/64`, 'dev', end.ifname, 'nodad']);
    await this.fabric.ip(['link', 'set', fabricEnd.ifname, 'master', segment.bridge]);
    if (segment.gateway) {
      await ns.ip(['route', 'replace', 'default', 'via', segment.gateway.ipv4]);
      await ns.ip(['-6', 'route', 'replace', 'default', 'via', segment.gateway.ipv6]);
    }
    return { ifname: end.ifname, fabricIfname: fabricEnd.ifname, ipv4, ipv6 };
  }

  /** A plain host (no agent) on a segment, e.g. an outside observer. */
  async addHost(segmentName: string, index: number): Promise<Namespace & { ipv4: string; ipv6: string }> {
    const ns = await this.scope.namespace();
    const { ipv4, ipv6 } = await this.plug(ns, this.segment(segmentName), index);
    return Object.assign(ns, { ipv4, ipv6 });
  }

  /**
   * A NAT router: WAN leg on `wan.segment` as host `wan.index`, and a new LAN segment behind it
   * (the router is host 1 there). Masquerade for both families; unsolicited inbound is dropped
   * before conntrack confirms it, as a home router's firewall does (so it cannot steal the ports
   * that outbound flows want to keep); no hairpin NAT.
   */
  async addRouter(name: string, wan: { segment: string; index: number }, lan: SegmentSpec): Promise<Router> {
    const ns = await this.scope.namespace();
    const wanSegment = this.segment(wan.segment);
    const up = await this.plug(ns, wanSegment, wan.index);
    const lanSegment = await World.bridge(this.fabric, lan);
    this.segments.set(lan.name, lanSegment);
    const gateway = hostAddress(lan, 1);
    const [end, fabricEnd] = await this.scope.veth(ns, this.fabric);
    await ns.ip(['addr', 'add', `${gateway.ipv4}/24`, 'dev', end.ifname]);
    await ns.ip(['addr', 'add', `${gateway.ipv6}/64`, 'dev', end.ifname, 'nodad']);
    await this.fabric.ip(['link', 'set', fabricEnd.ifname, 'master', lanSegment.bridge]);
    lanSegment.gateway = gateway;
    await ns.exec('sysctl', ['-q', '-w', 'net.ipv4.ip_forward=1', 'net.ipv6.conf.all.forwarding=1']);
    const router: Router = { name, ns, wan: { segment: wanSegment, ...up }, lan: lanSegment };
    await this.applyRouterRules(router);
    this.routers.set(name, router);
    return router;
  }

  /** (Re)installs a router's NAT and firewall (the demo's "router restart" reinstalls them). */
  async applyRouterRules(router: Router, options: { portRange?: string } = {}): Promise<void> {
    const wan = router.wan.ifname;
    // A port range needs a transport protocol match: UDP (WireGuard) gets it, the rest does not.
    const udpRange = options.portRange ? `\n    oifname "${wan}" meta l4proto udp masquerade to :${options.portRange}` : '';
    const rules = `table inet router {}
delete table inet router
table inet router {
  chain input {
    type filter hook input priority filter; policy accept;
    iifname "${wan}" ct state new drop
  }
  chain forward {
    type filter hook forward priority filter; policy accept;
    iifname "${wan}" ct state new drop
  }
  chain postrouting {
    type nat hook postrouting priority srcnat; policy accept;${udpRange}
    oifname "${wan}" masquerade
  }
}
`;
    await router.ns.exec('nft', ['-f', '-'], { input: rules });
  }

  /**
   * Makes a router's WAN link a narrow hop that hides it: both ends get `mtu` (the bridge drops
   * larger frames towards the router silently), and the router drops the ICMP "fragmentation
   * needed" / "packet too big" it would send for larger packets out (as many paths do). A path
   * MTU black hole, unless the endpoints find the MTU themselves.
   */
  async narrowRouterUplink(router: Router, mtu: number): Promise<void> {
    await router.ns.ip(['link', 'set', router.wan.ifname, 'mtu', String(mtu)]);
    await this.fabric.ip(['link', 'set', router.wan.fabricIfname, 'mtu', String(mtu)]);
    // A UDP GSO run (one skb carrying many datagrams) passes a veth whatever its MTU; one segment
    // per skb on the way into the hop makes the kernel split the run first, so that each datagram
    // meets the MTU as it would on a real link.
    await this.fabric.ip(['link', 'set', router.wan.fabricIfname, 'gso_max_segs', '1']);
    await router.ns.ip(['link', 'set', router.wan.ifname, 'gso_max_segs', '1']);
    await router.ns.exec('nft', ['-f', '-'], {
      input: `table inet blackhole {
  chain sent {
    type filter hook output priority filter; policy accept;
    icmp type destination-unreachable icmp code frag-needed drop
    icmpv6 type packet-too-big drop
  }
  chain forwarded {
    type filter hook forward priority filter; policy accept;
    icmp type destination-unreachable icmp code frag-needed drop
    icmpv6 type packet-too-big drop
  }
}
`,
    });
  }

  /**
   * Forgets a router's UDP mappings only (what a NAT that changes its port policy does to the
   * tunnels), leaving TCP connections such as the agents' API watches as they are.
   */
  async flushRouterUdp(router: Router): Promise<void> {
    await router.ns.exec('conntrack', ['-D', '-p', 'udp'], { allowFailure: true });
  }

  /** Forgets every NAT mapping of a router (as a reboot or a conntrack flush does). */
  async flushRouterState(router: Router): Promise<void> {
    await router.ns.exec('conntrack', ['-F'], { allowFailure: true });
  }

  /** Creates a node's namespace on `segment` as host `index`, and its Node object. */
  async addNode(name: string, segmentName: string, index: number, options: { listenPort?: number; podCidrs?: string[]; env?: Record<string, string> } = {}): Promise<WorldNode> {
    const segment = this.segment(segmentName);
    const ns = await this.scope.namespace();
    const up = await this.plug(ns, segment, index);
    this.podCidrCounter++;
    const podCidrs = options.podCidrs ?? [`10.244.${this.podCidrCounter}.0/24`, `fd00:244:${this.podCidrCounter.toString(16)}::/64`];
    const ifname = uniqueName('rgw', 5);
    const dir = this.scope.tempDir(`roamguard-${name}-`);
    this.scope.removeFileAtCleanup(join(WG_SOCKET_DIR, `${ifname}.sock`));
    const listenPort = options.listenPort ?? 51820;
    const node: WorldNode = {
      name, ns, segment, ipv4: up.ipv4, ipv6: up.ipv6, uplink: up.ifname, uplinkFabric: up.fabricIfname, ifname, listenPort, dir, podCidrs,
      env: {
        NODE_NAME: name,
        KUBE_API_SERVER: this.apiUrl,
        WG_INTERFACE: ifname,
        WG_LISTEN_PORT: String(listenPort),
        PRIVATE_KEY_PATH: join(dir, 'private.key'),
        CNI_CONFIG_PATH: join(dir, 'cni', '10-roamguard.conflist'),
        CNI_IPAM_DATA_DIR: join(dir, 'ipam'),
        LOG_LEVEL: 'debug',
        LOG_FORMAT: 'text',
        RESYNC_INTERVAL: '10',
        METRICS_ADDRESS: '',
        ...this.options.agentEnv,
        ...options.env,
      },
    };
    if (this.options.identities) {
      // A kubeconfig with this node's own token; the lab's certificate is not verified (the
      // agent reads the kubeconfig as it would any other).
      node.token = randomBytes(16).toString('hex');
      this.api.addToken(node.token, agentUser(name));
      const kubeconfig = join(dir, 'kubeconfig');
      writeFileSync(kubeconfig, kubeConfigFor(this.apiUrl, node.token), { mode: 0o600 });
      node.env.KUBECONFIG = kubeconfig;
      node.env.KUBE_API_SERVER = '';
    }
    this.api.createNode({
      metadata: { name, labels: { 'kubernetes.io/hostname': name } },
      spec: { podCIDR: podCidrs[0], podCIDRs: podCidrs },
      status: { addresses: this.statusAddresses(node) },
    });
    this.nodes.push(node);
    return node;
  }

  private statusAddresses(node: WorldNode) {
    return [
      { type: 'InternalIP', address: node.ipv4 },
      { type: 'InternalIP', address: node.ipv6 },
      { type: 'Hostname', address: node.name },
    ];
  }

  /**
   * Moves a node to another segment as host `index` (a laptop changing networks): new uplink,
   * new addresses, and its Node status updated as the kubelet would.
   */
  async moveNode(node: WorldNode, segmentName: string, index: number): Promise<void> {
    await node.ns.ip(['link', 'del', node.uplink]);
    const segment = this.segment(segmentName);
    const up = await this.plug(node.ns, segment, index);
    Object.assign(node, { segment, ipv4: up.ipv4, ipv6: up.ipv6, uplink: up.ifname, uplinkFabric: up.fabricIfname });
    this.api.updateNode(node.name, (n) => { n.status = { ...(n.status ?? {}), addresses: this.statusAddresses(node) }; });
  }

  /** Sets the MTU of a node's uplink (both ends of its link to the segment). */
  async setUplinkMtu(node: WorldNode, mtu: number): Promise<void> {
    await node.ns.ip(['link', 'set', node.uplink, 'mtu', String(mtu)]);
    await this.fabric.ip(['link', 'set', node.uplinkFabric, 'mtu', String(mtu)]);
  }

  node(name: string): WorldNode {
    const n = this.nodes.find((x) => x.name === name);
    if (!n) throw new Error(`no node ${name}`);
    return n;
  }

  /**
   * Deletes the Node object (unless someone already did, e.g. kubectl against the demo) and
   * forgets the node (its namespace stays until cleanup).
   */
  removeNode(node: WorldNode): void {
    if (this.api.getNode(node.name)) this.api.deleteNode(node.name);
    const at = this.nodes.indexOf(node);
    if (at >= 0) this.nodes.splice(at, 1);
  }

  /**
   * Posts the node's Ready condition and node info, as a kubelet would, so `kubectl get nodes`
   * reads Ready or NotReady (the demo: Ready while the node's agent runs). No-op without a Node.
   */
  setNodeReady(node: WorldNode, ready: boolean, reason: string, message: string): void {
    if (!this.api.getNode(node.name)) return;
    const now = new Date().toISOString().replace(/\.\d{3}Z$/, 'Z');
    this.api.updateNode(node.name, (n) => {
      const status = n.status ?? {};
      const previous = (Array.isArray(status.conditions) ? status.conditions : []).find((c) => typeof c === 'object' && c !== null && !Array.isArray(c) && c.type === 'Ready') as Record<string, string> | undefined;
      const value = ready ? 'True' : 'False';
      const since = previous?.status === value ? previous.lastTransitionTime ?? now : now;
      n.status = {
        ...status,
        conditions: [{ type: 'Ready', status: value, reason, message, lastHeartbeatTime: now, lastTransitionTime: since }],
        nodeInfo: { kubeletVersion: 'lab', osImage: 'roamguard lab (network namespace)', kernelVersion: release(), containerRuntimeVersion: 'cni://ptp', operatingSystem: 'linux', architecture: process.arch },
      };
    });
  }

  /** The pid of the node's data plane (`roamguard wg IFNAME`, started detached by its agent). */
  async dataplanePid(node: WorldNode): Promise<number | undefined> {
    const pids = (await run('ip', ['netns', 'pids', node.ns.name], { allowFailure: true })).stdout.split(/\s+/).filter(Boolean).map(Number);
    for (const pid of pids) {
      let args: string[];
      try { args = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0'); } catch { continue; }
      const at = args.indexOf('wg');
      if (at >= 0 && args.slice(at + 1).includes(node.ifname) && !args.includes('agent')) return pid;
    }
    return undefined;
  }

  /** Starts the node's agent and waits until it reports ready. */
  async startAgent(node: WorldNode, env: Record<string, string> = {}, options: { readyTimeoutMs?: number } = {}): Promise<NsProcess> {
    if (node.agent?.running) throw new Error(`${node.name}: agent already running`);
    const agent = this.scope.spawn(node.ns, ROAMGUARD, ['agent'], {
      env: { ...process.env, ...node.env, ...env }, label: `agent ${node.name}`, cwd: REPO_ROOT,
      keepOutputBytes: this.options.keepLogBytes ?? 256 * 1024,
    });
    node.agent = agent;
    await waitFor(() => !agent.running || /ready: the Node list is synced/.test(agent.stderr), options.readyTimeoutMs ?? 90_000, {
      description: `${node.name}'s agent to become ready`,
    }).catch((err: Error) => { throw new Error(`${err.message}\n${agent.describe()}`); });
    if (!agent.running) throw new Error(`agent on ${node.name} exited:\n${agent.describe()}`);
    return agent;
  }

  async stopAgent(node: WorldNode, signal: 'SIGTERM' | 'SIGKILL' = 'SIGTERM'): Promise<void> {
    const agent = node.agent;
    if (!agent) return;
    if (signal === 'SIGKILL') {
      try { process.kill(agent.pid, 'SIGKILL'); } catch { /* already gone */ }
      await agent.exited;
    } else {
      await agent.stop();
    }
    node.agent = undefined;
  }

  conflist(node: WorldNode): string {
    return readFileSync(node.env.CNI_CONFIG_PATH, 'utf8');
  }

  /** A pod on `node`: a namespace wired by the real CNI plugins with the agent's conflist. */
  async addPod(node: WorldNode, name = uniqueName('pod', 4)): Promise<Pod> {
    const ns = await this.scope.namespace();
    const result = await cniAdd(this.conflist(node), {
      containerId: `${name}-${ns.name}`, netns: `/var/run/netns/${ns.name}`, ifname: 'eth0', runner: netnsRunner(node.ns.name),
    }) as { ips?: Array<{ address: string }> };
    const ips = (result.ips ?? []).map((ip) => ip.address.split('/')[0]);
    const ipv4 = ips.find((ip) => !ip.includes(':'));
    const ipv6 = ips.find((ip) => ip.includes(':'));
    if (!ipv4 || !ipv6) throw new Error(`pod ${name} on ${node.name} did not get both addresses: ${JSON.stringify(result)}`);
    return { name, ns, node, ipv4, ipv6 };
  }

  /** The node's data plane as `wg show IFNAME dump` reports it, peers by public key. */
  async wgPeers(node: WorldNode): Promise<Map<string, WgPeerView>> {
    const out = (await node.ns.exec('wg', ['show', node.ifname, 'dump'])).stdout.trim().split('\n').slice(1);
    const peers = new Map<string, WgPeerView>();
    for (const line of out) {
      if (!line) continue;
      const [key, , endpoint, allowed, handshake, rx, tx] = line.split('\t');
      peers.set(key, { endpoint, allowedIps: allowed === '(none)' ? [] : allowed.split(',').sort(), latestHandshake: Number(handshake), rx: Number(rx), tx: Number(tx) });
    }
    return peers;
  }

  publicKeyOf(node: WorldNode): string | undefined {
    return this.api.getNode(node.name)?.metadata.annotations?.['roamguard.io/public-key'];
  }

  nodeByKey(key: string): WorldNode | undefined {
    return this.nodes.find((n) => this.publicKeyOf(n) === key);
  }
}
