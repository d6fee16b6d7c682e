/**
 * The agent end-to-end tests' cluster: a lab World (lab/world.ts) with one flat segment
 *
 *   lan 10.77.0.0/24, fd77::/64   node-N at .N (pod CIDRs 10.244.N.0/24, fd00:244:N::/64),
 *                                 the API server's relay at .254, an outside host at .200
 *
 * and nodes addressed by their index, as the tests think of them.
 */
import { hostAddress, World, type Pod, type WgPeerView, type WorldNode } from '../../lab/world.ts';
import type { Namespace, NsProcess, Scope } from './netns.ts';

export type { Pod };

const LAN = { name: 'lan', ipv4: '10.77.0.0/24', ipv6: 'fd77::/64' };
const OUTSIDE_INDEX = 200;
export const OUTSIDE = hostAddress(LAN, OUTSIDE_INDEX);

export type ClusterNode = WorldNode & { index: number };

export class AgentCluster {
  private constructor(readonly world: World, readonly outside: Namespace) {}

  /** `agentEnv`: settings every agent gets (e.g. POD_CIDR_ALLOWED_RANGES, which must agree cluster-wide). */
  static async create(scope: Scope, nodeCount: number, options: { agentEnv?: Record<string, string> } = {}): Promise<AgentCluster> {
    const world = await World.create(scope, { backbone: LAN, agentEnv: options.agentEnv });
    const cluster = new AgentCluster(world, await world.addHost(LAN.name, OUTSIDE_INDEX));
    for (let i = 1; i <= nodeCount; i++) await cluster.addNode(i);
    return cluster;
  }

  get api() { return this.world.api; }
  get nodes(): ClusterNode[] { return this.world.nodes as ClusterNode[]; }

  /** Creates node N (its namespace and Node object). */
  async addNode(index: number, options: { podCidrs?: string[] } = {}): Promise<ClusterNode> {
    const podCidrs = options.podCidrs ?? [`10.244.${index}.0/24`, `fd00:244:${index}::/64`];
    const node = await this.world.addNode(`node-${index}`, LAN.name, index, { podCidrs });
    return Object.assign(node, { index });
  }

  node(index: number): ClusterNode {
    const n = this.nodes.find((x) => x.index === index);
    if (!n) throw new Error(`no node ${index}`);
    return n;
  }

  removeNode(node: ClusterNode): void { this.world.removeNode(node); }
  startAgent(node: ClusterNode, env: Record<string, string> = {}): Promise<NsProcess> { return this.world.startAgent(node, env); }
  stopAgent(node: ClusterNode, signal: 'SIGTERM' | 'SIGKILL' = 'SIGTERM'): Promise<void> { return this.world.stopAgent(node, signal); }
  conflist(node: ClusterNode): string { return this.world.conflist(node); }
  addPod(node: ClusterNode): Promise<Pod> { return this.world.addPod(node); }
  wgPeers(node: ClusterNode): Promise<Map<string, WgPeerView>> { return this.world.wgPeers(node); }
  publicKeyOf(node: ClusterNode): string | undefined { return this.world.publicKeyOf(node); }
}
