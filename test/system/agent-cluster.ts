/**
 * A small cluster in network namespaces for the agent's end-to-end tests:
 *
 *   lan namespace: bridge br0 (10.77.0.254/24, fd77::fe/64) — the nodes' shared segment, and the
 *                  address where agents reach the API server (a relay to the test process)
 *   node N:        veth on br0 with 10.77.0.N/24 and fd77::N/64; runs `roamguard agent`, which
 *                  starts its own `roamguard wg` data plane; pods are namespaces wired by the
 *                  real CNI plugins with the conflist the agent wrote
 *   outside:       10.77.0.200 / fd77::c8 on br0, a host outside the cluster
 *
 * The API server runs in this process (KubeApiServer), so tests can change Nodes and inject faults.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { KubeApiServer } from '../../control/kube/api-server.ts';
import { cniAdd } from '../../control/host/cni-exec.ts';
import { netnsRunner } from '../../control/host/runner.ts';
import { parseSocketAddress, startRelay } from '../../lab/socket-relay.ts';
import { REPO_ROOT, ROAMGUARD_BIN } from './userspace-wg.ts';
import { type Namespace, type NsProcess, type Scope, uniqueName, waitFor, WG_SOCKET_DIR } from './netns.ts';

export const LAN = { bridge: 'br0', ipv4: '10.77.0.254', ipv6: 'fd77::fe', apiPort: 6443 };
export const OUTSIDE = { ipv4: '10.77.0.200', ipv6: 'fd77::c8' };

export interface ClusterNode {
  name: string;
  index: number;
  ns: Namespace;
  ipv4: string;
  ipv6: string;
  ifname: string;
  /** Per-node state directory: key, CNI config, IPAM state, pod CIDR file. */
  dir: string;
  podCidrs: string[];
  agent?: NsProcess;
  env: Record<string, string>;
}

export interface Pod {
  name: string;
  ns: Namespace;
  node: ClusterNode;
  ipv4: string;
  ipv6: string;
}

function podCidrsFor(index: number): string[] {
  return [`10.244.${index}.0/24`, `fd00:244:${index}::/64`];
}

export class AgentCluster {
  readonly nodes: ClusterNode[] = [];
  private constructor(
    readonly scope: Scope,
    readonly api: KubeApiServer,
    readonly lan: Namespace,
    readonly outside: Namespace,
  ) {}

  static async create(scope: Scope, nodeCount: number): Promise<AgentCluster> {
    const api = new KubeApiServer();
    await api.start();
    scope.defer('close the API server', () => api.close());
    const dir = scope.tempDir('roamguard-cluster-');

    const lan = await scope.namespace();
    await lan.ip(['link', 'add', LAN.bridge, 'type', 'bridge']);
    await lan.ip(['addr', 'add', `${LAN.ipv4}/24`, 'dev', LAN.bridge]);
    await lan.ip(['addr', 'add', `${LAN.ipv6}/64`, 'dev', LAN.bridge, 'nodad']);
    await lan.ip(['link', 'set', LAN.bridge, 'up']);

    // API server (loopback, this process) ← unix socket ← relay inside the lan namespace.
    const sock = join(dir, 'api.sock');
    const inner = await startRelay({ path: sock }, parseSocketAddress(new URL(api.url).host));
    scope.defer('stop the API relay', () => inner.close());
    const relay = scope.spawn(lan, process.execPath, ['--import', 'tsx', join(REPO_ROOT, 'lab/socket-relay.ts'), `${LAN.ipv4}:${LAN.apiPort}`, `unix:${sock}`], { label: 'api relay', cwd: REPO_ROOT });
    await waitFor(() => relay.stdout.includes('ready') || !relay.running, 20_000, { description: 'the API relay' });
    if (!relay.running) throw new Error(`API relay failed: ${relay.describe()}`);

    const outside = await scope.namespace();
    const cluster = new AgentCluster(scope, api, lan, outside);
    await cluster.attach(outside, `${OUTSIDE.ipv4}/24`, `${OUTSIDE.ipv6}/64`);
    for (let i = 1; i <= nodeCount; i++) await cluster.addNode(i);
    return cluster;
  }

  /** Plugs `ns` into the lan bridge with the given addresses. */
  private async attach(ns: Namespace, v4: string, v6: string): Promise<string> {
    const [end, lanEnd] = await this.scope.veth(ns, this.lan);
    await ns.ip(['addr', 'add', v4, 'dev', end.ifname]);
    await ns.ip(['addr', 'add', v6, 'dev', end.ifname, 'nodad']);
    await this.lan.ip(['link', 'set', lanEnd.ifname, 'master', LAN.bridge]);
    return end.ifname;
  }

  /** Creates node N's namespace and its Node object (pod CIDRs in spec, addresses in status). */
  async addNode(index: number, options: { podCidrs?: string[]; name?: string } = {}): Promise<ClusterNode> {
    const ns = await this.scope.namespace();
    await this.attach(ns, `10.77.0.${index}/24`, `fd77::${index.toString(16)}/64`);
    const name = options.name ?? `node-${index}`;
    const podCidrs = options.podCidrs ?? podCidrsFor(index);
    const ifname = uniqueName('rga', 5);
    const dir = this.scope.tempDir(`roamguard-${name}-`);
    this.scope.removeFileAtCleanup(join(WG_SOCKET_DIR, `${ifname}.sock`));
    const node: ClusterNode = {
      name, index, ns, ipv4: `10.77.0.${index}`, ipv6: `fd77::${index.toString(16)}`, ifname, dir, podCidrs,
      env: {
        NODE_NAME: name,
        KUBE_API_SERVER: `http://${LAN.ipv4}:${LAN.apiPort}`,
        WG_INTERFACE: ifname,
        PRIVATE_KEY_PATH: join(dir, 'private.key'),
        CNI_CONFIG_PATH: join(dir, 'cni', '10-roamguard.conflist'),
        CNI_IPAM_DATA_DIR: join(dir, 'ipam'),
        LOG_LEVEL: 'debug',
        LOG_FORMAT: 'text',
        RESYNC_INTERVAL: '10',
        METRICS_ADDRESS: '',
      },
    };
    this.api.createNode({
      metadata: { name, labels: { 'kubernetes.io/hostname': name } },
      spec: { podCIDR: podCidrs[0], podCIDRs: podCidrs },
      status: { addresses: [
        { type: 'InternalIP', address: node.ipv4 },
        { type: 'InternalIP', address: node.ipv6 },
        { type: 'Hostname', address: name },
      ] },
    });
    this.nodes.push(node);
    return node;
  }

  /** Deletes the Node object and forgets the node (its namespace stays until cleanup). */
  removeNode(node: ClusterNode): void {
    this.api.deleteNode(node.name);
    this.nodes.splice(this.nodes.indexOf(node), 1);
  }

  node(index: number): ClusterNode {
    const n = this.nodes.find((x) => x.index === index);
    if (!n) throw new Error(`no node ${index}`);
    return n;
  }

  /** Starts the node's agent and waits until its annotations are published and its tunnel exists. */
  async startAgent(node: ClusterNode, env: Record<string, string> = {}): Promise<NsProcess> {
    if (node.agent?.running) throw new Error(`${node.name}: agent already running`);
    node.agent = this.scope.spawn(node.ns, ROAMGUARD_BIN, ['agent'], {
      env: { ...process.env, ...node.env, ...env }, label: `agent ${node.name}`, cwd: REPO_ROOT, keepOutputBytes: 256 * 1024,
    });
    const agent = node.agent;
    await waitFor(() => !agent.running || /ready: the Node list is synced/.test(agent.stderr), 60_000, {
      description: `${node.name}'s agent to become ready`,
    });
    if (!agent.running) throw new Error(`agent on ${node.name} exited:\n${agent.describe()}`);
    return agent;
  }

  async stopAgent(node: ClusterNode, signal: 'SIGTERM' | 'SIGKILL' = 'SIGTERM'): Promise<void> {
    const agent = node.agent;
    if (!agent) return;
    if (signal === 'SIGKILL') {
      try { process.kill(agent.pid, 'SIGKILL'); } catch { /* gone */ }
      await agent.exited;
    } else {
      await agent.stop();
    }
    node.agent = undefined;
  }

  conflist(node: ClusterNode): string {
    return readFileSync(node.env.CNI_CONFIG_PATH, 'utf8');
  }

  /** A pod on `node`: a namespace wired by the real CNI plugins with the agent's conflist. */
  async addPod(node: ClusterNode, name = uniqueName('pod', 4)): Promise<Pod> {
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

  /** `wg show IFNAME dump` peers of a node's data plane, keyed by public key. */
  async wgPeers(node: ClusterNode): Promise<Map<string, { endpoint: string; allowedIps: string[]; latestHandshake: number }>> {
    const out = (await node.ns.exec('wg', ['show', node.ifname, 'dump'])).stdout.trim().split('\n').slice(1);
    const peers = new Map<string, { endpoint: string; allowedIps: string[]; latestHandshake: number }>();
    for (const line of out) {
      const [key, , endpoint, allowed, handshake] = line.split('\t');
      peers.set(key, { endpoint, allowedIps: allowed === '(none)' ? [] : allowed.split(',').sort(), latestHandshake: Number(handshake) });
    }
    return peers;
  }

  publicKeyOf(node: ClusterNode): string | undefined {
    return this.api.getNode(node.name)?.metadata.annotations?.['roamguard.io/public-key'];
  }
}
