/**
 * The node agent end to end: three nodes in namespaces, each running `roamguard agent` (which
 * starts its own `roamguard wg`), a Kubernetes-API-compatible server the real client library
 * talks to, pods wired by Debian's CNI plugins with the conflist the agent wrote, and real
 * nftables. The tests run in order on one cluster; each leaves it working for the next.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { AgentCluster, OUTSIDE, type ClusterNode, type Pod } from './agent-cluster.ts';
import { Scope, waitFor, type Namespace, type NsProcess } from './netns.ts';
import { assertPing, longestGap, ping, startContinuousPing, requireDaemonPrerequisites, REPO_ROOT } from './userspace-wg.ts';

const scope = new Scope();
let cluster: AgentCluster;
const pods = new Map<number, Pod>();

before(async () => {
  await requireDaemonPrerequisites(['roamguard-node'], ['nft', 'conntrack']);
  cluster = await AgentCluster.create(scope, 3);
});
after(async () => { await scope.cleanup(); });

/** A TCP listener in `ns` that reports, one line per connection, the peer address it saw. */
function sourceReporter(ns: Namespace, host: string, port: number): NsProcess {
  const script = `
    const net = require('node:net');
    const s = net.createServer((c) => { console.log('from ' + c.remoteAddress); c.end('hello\\n'); });
    s.listen(${port}, ${JSON.stringify(host)}, () => console.log('listening'));`;
  return scope.spawn(ns, process.execPath, ['-e', script], { label: `reporter ${host}:${port}` });
}

/** Opens a TCP connection from `ns` and resolves with what the server sent, or throws. */
async function tcpHello(ns: Namespace, host: string, port: number, timeoutMs = 3000): Promise<string> {
  const script = `
    const net = require('node:net');
    const c = net.connect(${port}, ${JSON.stringify(host)});
    let data = '';
    c.setTimeout(${timeoutMs}, () => { console.error('timeout'); process.exit(3); });
    c.on('data', (d) => { data += d; });
    c.on('end', () => { process.stdout.write(data); process.exit(0); });
    c.on('error', (e) => { console.error(e.message); process.exit(2); });`;
  return (await ns.exec(process.execPath, ['-e', script], { timeoutMs: timeoutMs + 5000 })).stdout;
}

async function sourcesSeen(reporter: NsProcess, count: number): Promise<string[]> {
  await waitFor(() => (reporter.stdout.match(/^from /gm) ?? []).length >= count, 5000, { description: 'a connection at the reporter' });
  return [...reporter.stdout.matchAll(/^from (.+)$/gm)].map((m) => m[1].replace(/^::ffff:/, ''));
}

async function nftRuleset(node: ClusterNode): Promise<string> {
  return (await node.ns.exec('nft', ['list', 'table', 'inet', 'roamguard'])).stdout;
}

async function restartAgent(node: ClusterNode, env: Record<string, string> = {}): Promise<void> {
  await cluster.stopAgent(node);
  await cluster.startAgent(node, env);
}

describe('agent end to end (three nodes)', { timeout: 600_000 }, () => {
  test('every agent publishes its identity and meshes with the other two by public key', async () => {
    for (const node of cluster.nodes) await cluster.startAgent(node);
    const keys = cluster.nodes.map((n) => cluster.publicKeyOf(n));
    assert.ok(keys.every((k) => k && /^[A-Za-z0-9+/]{43}=$/.test(k)), `keys published: ${keys.join(' ')}`);
    for (const node of cluster.nodes) {
      const annotations = cluster.api.getNode(node.name)!.metadata.annotations!;
      assert.deepEqual(JSON.parse(annotations['roamguard.io/pod-cidrs']), node.podCidrs);
      assert.equal(annotations['roamguard.io/listen-port'], '51820');
    }
    for (const node of cluster.nodes) {
      await waitFor(async () => (await cluster.wgPeers(node)).size === 2, 20_000, { description: `${node.name} to have two peers` });
      const peers = await cluster.wgPeers(node);
      for (const other of cluster.nodes.filter((o) => o !== node)) {
        const peer = peers.get(cluster.publicKeyOf(other)!);
        assert.ok(peer, `${node.name} has ${other.name} as a peer`);
        assert.equal(peer.endpoint, `${other.ipv4}:51820`);
        assert.deepEqual(peer.allowedIps, [`${other.ipv4}/32`, `${other.podCidrs[0]}`, `${other.ipv6}/128`, `${other.podCidrs[1]}`].sort());
      }
      const conflist = JSON.parse(cluster.conflist(node));
      assert.equal(conflist.plugins[0].type, 'ptp');
      assert.equal(conflist.plugins[0].mtu, 1420);
      assert.match(JSON.stringify(conflist.plugins[0].ipam.ranges), new RegExp(node.podCidrs[0].replace(/\./g, '\\.')));
    }
  });

  test('pods on different nodes reach each other over IPv4 and IPv6', async () => {
    for (const node of cluster.nodes) pods.set(node.index, await cluster.addPod(node));
    for (const a of pods.values()) {
      for (const b of pods.values()) {
        if (a === b) continue;
        await assertPing(a.ns, b.ipv4, { count: 2, deadlineS: 10 }, `${a.node.name} pod → ${b.node.name} pod (IPv4)`);
        await assertPing(a.ns, b.ipv6, { count: 2, deadlineS: 10 }, `${a.node.name} pod → ${b.node.name} pod (IPv6)`);
      }
    }
  });

  test('a host reaches pods on other nodes', async () => {
    const host = cluster.node(1);
    await assertPing(host.ns, pods.get(2)!.ipv4, { count: 2, deadlineS: 10 }, 'node-1 host → node-2 pod');
    await assertPing(host.ns, pods.get(3)!.ipv6, { count: 2, deadlineS: 10 }, 'node-1 host → node-3 pod (IPv6)');
  });
});
