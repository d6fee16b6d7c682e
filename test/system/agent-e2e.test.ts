/**
 * The node agent end to end: three nodes in namespaces, each running `roamguard agent` (which
 * starts its own `roamguard wg`), a Kubernetes-API-compatible server the real client library
 * talks to, pods wired by Debian's CNI plugins with the conflist the agent wrote, and real
 * nftables. The tests run in order on one cluster; each leaves it working for the next.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { chmodSync, readFileSync, renameSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { AgentCluster, OUTSIDE, type ClusterNode, type Pod } from './agent-cluster.ts';
import { Scope, waitFor, type Namespace, type NsProcess } from './netns.ts';
import { assertPing, commandLine, killAtCleanup, ping, ROAMGUARD_BIN, socketOwnerPids, startContinuousPing, requireDaemonPrerequisites } from './userspace-wg.ts';

const scope = new Scope();
/** How long the API server stays unreachable: seconds in the default run, minutes with ROAMGUARD_SOAK=1. */
const OUTAGE_S = process.env.ROAMGUARD_SOAK === '1' ? 240 : 6;
let cluster: AgentCluster;
const ALLOWED_RANGES = ['10.250.0.0/16'];
const pods = new Map<number, Pod>();

before(async () => {
  await requireDaemonPrerequisites(['roamguard-node', 'wireguard-go'], ['nft', 'conntrack']);
  // Pod CIDRs of a family without spec.podCIDRs (the file source test) must lie in this, on every agent.
  cluster = await AgentCluster.create(scope, 3, { agentEnv: { POD_CIDR_ALLOWED_RANGES: ALLOWED_RANGES.join(',') } });
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

function statusAddressesOf(node: { status?: unknown }): Array<{ type: string; address: string }> {
  return ((node.status as { addresses?: Array<{ type: string; address: string }> } | undefined)?.addresses ?? []);
}

/** A JSON merge patch of a Node's annotations straight to the API server, as anyone holding a token could send it. */
async function mergePatchNode(name: string, annotations: Record<string, string | null>): Promise<void> {
  const response = await fetch(`${cluster.api.url}/api/v1/nodes/${name}`, {
    method: 'PATCH', headers: { 'Content-Type': 'application/merge-patch+json' }, body: JSON.stringify({ metadata: { annotations } }),
  });
  assert.equal(response.status, 200, `PATCH node ${name}: ${await response.text()}`);
}

async function restartAgent(node: ClusterNode, env: Record<string, string> = {}): Promise<void> {
  await cluster.stopAgent(node);
  await cluster.startAgent(node, env);
}

describe('agent end to end (three nodes)', { timeout: 720_000 + OUTAGE_S * 1000 }, () => {
  test('every agent publishes its identity and meshes with the other two by public key', async () => {
    // node-3's agent drives Debian's wireguard-go instead of roamguard's data plane: any
    // UAPI-speaking WireGuard works the same way (and that one cannot remove single prefixes).
    cluster.node(3).env.WG_DATAPLANE = 'wireguard-go';
    for (const node of cluster.nodes) await cluster.startAgent(node);
    for (const node of cluster.nodes) {
      const owners = await socketOwnerPids(node.ns, node.ifname);
      const expected = node.index === 3 ? /wireguard-go/ : /(roamguard\.ts|launch\.mjs) wg /;
      assert.ok(owners.some((pid) => expected.test(commandLine(pid) ?? '')), `${node.name}'s data plane is ${expected}: ${owners.map((p) => commandLine(p)).join('; ')}`);
    }
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

  test('traffic from pods to outside the pod networks is masqueraded to the node address, per family', async () => {
    const reporter = sourceReporter(cluster.outside, '::', 7000);
    await waitFor(() => reporter.stdout.includes('listening'), 10_000, { description: 'the reporter' });
    const pod = pods.get(1)!;
    assert.match(await tcpHello(pod.ns, OUTSIDE.ipv4, 7000), /hello/);
    assert.match(await tcpHello(pod.ns, OUTSIDE.ipv6, 7000), /hello/);
    // A host's own traffic keeps its address; so does pod-to-pod traffic (checked below).
    await tcpHello(cluster.node(1).ns, OUTSIDE.ipv4, 7000);
    assert.deepEqual(await sourcesSeen(reporter, 3), [cluster.node(1).ipv4, cluster.node(1).ipv6, cluster.node(1).ipv4]);

    // MASQUERADE_IPV4=0: IPv4 keeps the pod source (no route back: the connection fails, the source is seen).
    await restartAgent(cluster.node(1), { MASQUERADE_IPV4: '0' });
    const ruleset = await nftRuleset(cluster.node(1));
    assert.doesNotMatch(ruleset, /ip saddr @pod-cidrs-v4.*masquerade/);
    assert.match(ruleset, /ip6 saddr @pod-cidrs-v6.*masquerade/);
    await cluster.outside.ip(['route', 'replace', cluster.node(1).podCidrs[0], 'via', cluster.node(1).ipv4]);
    assert.match(await tcpHello(pod.ns, OUTSIDE.ipv4, 7000), /hello/);
    assert.match(await tcpHello(pod.ns, OUTSIDE.ipv6, 7000), /hello/);
    const seen = await sourcesSeen(reporter, 5);
    assert.deepEqual(seen.slice(3), [pod.ipv4, cluster.node(1).ipv6], 'IPv4 not masqueraded, IPv6 still masqueraded');
    await cluster.outside.ip(['route', 'del', cluster.node(1).podCidrs[0]]);
    await restartAgent(cluster.node(1));
    await reporter.stop();
  });

  test('pod-to-pod traffic across nodes keeps the pod source address', async () => {
    const server = sourceReporter(pods.get(2)!.ns, '::', 7001);
    await waitFor(() => server.stdout.includes('listening'), 10_000, { description: 'the pod reporter' });
    await tcpHello(pods.get(1)!.ns, pods.get(2)!.ipv4, 7001);
    await tcpHello(pods.get(1)!.ns, pods.get(2)!.ipv6, 7001);
    assert.deepEqual(await sourcesSeen(server, 2), [pods.get(1)!.ipv4, pods.get(1)!.ipv6]);
    await server.stop();
  });

  test('FILTER_IPV4 drops new connections from outside to a pod; replies and pod-initiated traffic pass', async () => {
    const node = cluster.node(2);
    const pod = pods.get(2)!;
    const inPod = sourceReporter(pod.ns, '::', 7002);
    const outside = sourceReporter(cluster.outside, '::', 7003);
    await waitFor(() => inPod.stdout.includes('listening') && outside.stdout.includes('listening'), 10_000, { description: 'reporters' });
    await cluster.outside.ip(['route', 'replace', node.podCidrs[0], 'via', node.ipv4]);
    await cluster.outside.ip(['-6', 'route', 'replace', node.podCidrs[1], 'via', node.ipv6]);
    assert.match(await tcpHello(cluster.outside, pod.ipv4, 7002), /hello/, 'without the filter, outside reaches the pod');

    await restartAgent(node, { FILTER_IPV4: '1' });
    await assert.rejects(tcpHello(cluster.outside, pod.ipv4, 7002, 1500), 'a new IPv4 connection from outside is dropped');
    assert.match(await tcpHello(cluster.outside, pod.ipv6, 7002), /hello/, 'IPv6 is not filtered');
    assert.match(await tcpHello(pod.ns, OUTSIDE.ipv4, 7003), /hello/, 'pod-initiated connections and their replies pass');
    assert.match(await tcpHello(pods.get(1)!.ns, pod.ipv4, 7002), /hello/, 'pod-to-pod passes');
    assert.match(await tcpHello(cluster.node(1).ns, pod.ipv4, 7002), /hello/, 'a cluster host reaches the pod');

    await restartAgent(node);
    assert.doesNotMatch(await nftRuleset(node), /chain forward/, 'filter off again');
    await cluster.outside.ip(['route', 'del', node.podCidrs[0]]);
    await cluster.outside.ip(['-6', 'route', 'del', node.podCidrs[1]]);
    await inPod.stop();
    await outside.stop();
  });

  test('restarting (even killing) the agent while a ping runs loses at most one packet', async () => {
    const from = pods.get(1)!, to = pods.get(3)!;
    const trace = startContinuousPing(scope, from.ns, to.ipv4, { durationS: 12, intervalS: 0.1 });
    await new Promise((r) => setTimeout(r, 2000));
    await cluster.stopAgent(cluster.node(1), 'SIGKILL');
    await cluster.stopAgent(cluster.node(3));
    await cluster.startAgent(cluster.node(1));
    await cluster.startAgent(cluster.node(3));
    const result = await trace;
    const lost = result.transmitted - result.replies.length;
    assert.ok(result.transmitted >= 80, `ping ran: ${result.transmitted} sent`);
    assert.ok(lost <= 1, `lost ${lost} of ${result.transmitted} pings across agent restarts`);
  });

  test('the data plane killed with SIGKILL under traffic: the agent starts it again and traffic returns', async () => {
    const node = cluster.node(1);
    const [pid] = await socketOwnerPids(node.ns, node.ifname);
    assert.ok(pid, 'found the data plane');
    await assertPing(pods.get(1)!.ns, pods.get(2)!.ipv4, { count: 2, deadlineS: 10 }, 'before the kill');
    const killedAt = Date.now();
    process.kill(pid, 'SIGKILL');
    // (ping(8) gives up at the first "network unreachable" while the interface is gone: probe one by one.)
    let outage: number | undefined;
    while (Date.now() - killedAt < 40_000) {
      if ((await ping(pods.get(1)!.ns, pods.get(2)!.ipv4, { count: 1, deadlineS: 1 })).received === 1) {
        outage = (Date.now() - killedAt) / 1000;
        break;
      }
    }
    assert.ok(outage !== undefined, `traffic never came back:\n${node.agent!.describe()}`);
    // The agent notices within its 5 s poll, starts `roamguard wg` (a few seconds under tsx on a
    // busy machine), reconfigures it, and the first packet triggers one handshake.
    assert.ok(outage < 25, `traffic back ${outage.toFixed(1)} s after the kill`);
    await waitFor(() => /started the data plane/.test(node.agent!.stderr), 10_000, { description: "the agent reporting the restart" });
    const [newPid] = await socketOwnerPids(node.ns, node.ifname);
    assert.ok(newPid && newPid !== pid, 'a new data plane process');
    killAtCleanup(scope, newPid, /roamguard/);
  });

  test('hostile or malformed Nodes are skipped with a log line naming them; the mesh is unaffected', async () => {
    const victim = cluster.node(1), watcher = cluster.node(2);
    const before = await cluster.wgPeers(watcher);
    cluster.api.createNode({ metadata: { name: 'evil', annotations: {
      'roamguard.io/public-key': cluster.publicKeyOf(victim)!, 'roamguard.io/pod-cidrs': JSON.stringify([victim.podCidrs[0]]),
    } } });
    cluster.api.createNode({ metadata: { name: 'garbage', annotations: {
      'roamguard.io/public-key': 'AAAA', 'roamguard.io/pod-cidrs': '[not json',
    } } });
    // Fresh, valid keys, each with one hostile claim or an absurd size.
    const freshKey = (fill: number) => Buffer.alloc(32, fill).toString('base64');
    const many = Array.from({ length: 5000 }, (_, i) => `10.${100 + (i >> 8)}.${i & 255}.0/24`);
    const hostile: Record<string, Record<string, string>> = {
      'huge-list': { 'roamguard.io/public-key': freshKey(21), 'roamguard.io/pod-cidrs': JSON.stringify(many) },
      'many-cidrs': { 'roamguard.io/public-key': freshKey(26), 'roamguard.io/pod-cidrs': JSON.stringify(many.slice(0, 40)) },
      'huge-value': { 'roamguard.io/public-key': freshKey(22), 'roamguard.io/node-ips': JSON.stringify(['10.0.0.1'.padEnd(200_000, ' ')]) },
      'wide-claim': { 'roamguard.io/public-key': freshKey(24), 'roamguard.io/pod-cidrs': '["0.0.0.0/1"]' },
      'own-key': { 'roamguard.io/public-key': cluster.publicKeyOf(watcher)!, 'roamguard.io/pod-cidrs': '["10.244.77.0/24"]' },
      'bad-key': { 'roamguard.io/public-key': Buffer.alloc(31, 1).toString('base64'), 'roamguard.io/pod-cidrs': '["10.244.78.0/24"]' },
      'bad-port': { 'roamguard.io/public-key': freshKey(25), 'roamguard.io/listen-port': '70000' },
    };
    for (const [name, annotations] of Object.entries(hostile)) cluster.api.createNode({ metadata: { name, annotations } });
    // A claim inside the node's own spec that overlaps an older node's CIDR: that claim is refused, the node stays a peer without it.
    const wide = victim.podCidrs[0].replace(/\.\d+\.0\/24$/, '.0.0/16');
    const overlappingKey = freshKey(23);
    cluster.api.createNode({ metadata: { name: 'overlapping', annotations: { 'roamguard.io/public-key': overlappingKey, 'roamguard.io/pod-cidrs': JSON.stringify([wide]) } }, spec: { podCIDRs: [wide] } });
    const names = ['evil', 'garbage', ...Object.keys(hostile)];
    await waitFor(() => names.every((n) => new RegExp(`skipping a node.*node=${n}\\b`).test(watcher.agent!.stderr)), 15_000, { description: 'log lines naming every bad node' });
    await waitFor(() => /WARN.*refused a claim of a node.*node=overlapping.*field=roamguard.io\/pod-cidrs.*overlaps a pod CIDR of node node-\d/.test(watcher.agent!.stderr), 15_000, { description: 'the refused claim named' });
    assert.match(watcher.agent!.stderr, /node=evil.*already used by node node-1/);
    assert.match(watcher.agent!.stderr, /node=own-key.*this node's own public key/);
    const logLines = watcher.agent!.stderr.split('\n').filter((l) => /skipping a node/.test(l));
    assert.ok(logLines.every((l) => l.length < 2000), 'each log line is bounded, however big the annotation');
    const after = await cluster.wgPeers(watcher);
    assert.deepEqual([...after.keys()].filter((k) => k !== overlappingKey).sort(), [...before.keys()].sort(), 'the same peers (and the node whose claim was refused)');
    assert.deepEqual(after.get(overlappingKey)?.allowedIps ?? [], [], 'holding nothing');
    assert.deepEqual((await cluster.wgPeers(watcher)).get(cluster.publicKeyOf(victim)!)?.allowedIps, before.get(cluster.publicKeyOf(victim)!)?.allowedIps);
    await assertPing(pods.get(2)!.ns, pods.get(1)!.ipv4, { count: 2, deadlineS: 10 }, 'node-2 pod → node-1 pod with hostile Nodes around');
    for (const name of [...names, 'overlapping']) cluster.api.deleteNode(name);
  });

  test('a compromised node claiming what the cluster did not give it gets none of it; a stolen-token patch of another node is undone by that node', async (t) => {
    // The hostile node is the oldest: under "the older node wins" alone it would take the victim's range.
    const hostile = cluster.node(1), observer = cluster.node(2), victim = cluster.node(3);
    const hostileKey = cluster.publicKeyOf(hostile)!, victimKey = cluster.publicKeyOf(victim)!;
    const podH = pods.get(1)!, podO = pods.get(2)!, podV = pods.get(3)!;
    const allowedBefore = new Map(await Promise.all([observer, victim].map(async (n) => [n.name, (await cluster.wgPeers(n)).get(hostileKey)?.allowedIps] as const)));
    for (const [name, allowed] of allowedBefore) assert.ok(allowed?.includes(hostile.podCidrs[0]), `${name} meshes the hostile node to begin with: ${allowed}`);
    // node-2 also sits on a LAN (its kubelet reports the address): no node may claim that LAN as pods.
    cluster.api.updateNode(observer.name, (n) => { n.status = { ...(n.status ?? {}), addresses: [...statusAddressesOf(n), { type: 'InternalIP', address: '192.168.77.2' }] }; });

    // node-1 is compromised: its agent is gone (the attacker holds its token), its data plane still runs.
    await cluster.stopAgent(hostile);
    const hostileClaims = [victim.podCidrs[0], '169.254.0.0/16', '192.168.77.0/24', '8.0.0.0/8'];
    await mergePatchNode(hostile.name, {
      'roamguard.io/pod-cidrs': JSON.stringify([...hostile.podCidrs, ...hostileClaims]),
      'roamguard.io/node-ips': JSON.stringify([hostile.ipv4, podV.ipv4]),
    });
    for (const n of [observer, victim]) {
      const refusedAll = () => hostileClaims.every((c) => new RegExp(`WARN.*refused a claim of a node.*node=${hostile.name} field=roamguard.io/pod-cidrs claim=${c.replace(/\./g, '\\.')}`).test(n.agent!.stderr))
        && new RegExp(`refused a claim of a node.*node=${hostile.name} field=roamguard.io/node-ips claim=${podV.ipv4.replace(/\./g, '\\.')}`).test(n.agent!.stderr);
      const allowedNow = async () => (await cluster.wgPeers(n)).get(hostileKey)?.allowedIps;
      // Whichever comes first: the agent's verdict, or a change of what node-3 holds.
      await waitFor(async () => refusedAll() || JSON.stringify(await allowedNow()) !== JSON.stringify(allowedBefore.get(n.name)), 20_000, { description: `${n.name} acting on the hostile claims` });
      assert.deepEqual(await allowedNow(), allowedBefore.get(n.name), `${n.name}: the hostile node holds what it held before, nothing more`);
      assert.ok(refusedAll(), `${n.name}: one WARN per refused claim`);
      for (const dst of ['169.254.1.1', '192.168.77.5', '8.8.8.8']) {
        const route = await n.ns.exec('ip', ['route', 'get', dst], { allowFailure: true });
        assert.ok(!route.stdout.includes(`dev ${n.ifname}`), `${n.name}: ${dst} is not routed into the tunnel: ${route.stdout}${route.stderr}`);
      }
    }
    // A canary on the hostile node: what arrives from its tunnel for the claimed ranges is counted.
    const canary = `rgcanary${process.pid}`;
    await hostile.ns.exec('nft', ['-f', '-'], { input: `table inet ${canary} {
  chain pre {
    type filter hook prerouting priority -300; policy accept;
    iifname "${hostile.ifname}" ip daddr { ${victim.podCidrs[0]}, 169.254.0.0/16, 192.168.77.0/24, 8.0.0.0/8 } counter comment "stolen"
    iifname "${hostile.ifname}" ip daddr ${hostile.podCidrs[0]} counter comment "own"
  }
}
` });
    const sendUdp = (from: Pod, dst: string) => from.ns.exec('bash', ['-c', `for i in 1 2 3; do echo canary > /dev/udp/${dst}/9999; done`], { allowFailure: true });
    for (const from of [podO, podV]) for (const dst of [podV.ipv4, podO.ipv4, '169.254.1.1', '192.168.77.5', '8.8.8.8']) await sendUdp(from, dst);
    await sendUdp(podO, podH.ipv4); // the control: the canary does see what is the hostile node's own
    const counted = async (comment: string) => {
      const text = (await hostile.ns.exec('nft', ['list', 'table', 'inet', canary])).stdout;
      return Number(new RegExp(`counter packets (\\d+) bytes \\d+ comment "${comment}"`).exec(text)?.[1] ?? NaN);
    };
    await waitFor(async () => (await counted('own')) >= 1, 10_000, { description: 'the canary counting traffic to the hostile node\'s own pods' });
    assert.equal(await counted('stolen'), 0, 'no pod traffic of the others reached the hostile node');
    await assertPing(podO.ns, podV.ipv4, { count: 2, deadlineS: 10 }, 'node-2 pod → node-3 pod with node-1 claiming node-3\'s range and pod IP');
    await hostile.ns.exec('nft', ['delete', 'table', 'inet', canary]);

    // node-1's agent comes back and publishes what is its own again.
    await cluster.startAgent(hostile);
    await waitFor(() => JSON.parse(cluster.api.getNode(hostile.name)!.metadata.annotations!['roamguard.io/pod-cidrs']).length === hostile.podCidrs.length, 15_000, { description: 'node-1 publishing its own claims again' });

    // A stolen token patches node-3 directly: another key (a man in the middle) and another endpoint.
    const thiefKey = Buffer.alloc(32, 0x5a).toString('base64');
    const patchedAt = performance.now();
    await mergePatchNode(victim.name, { 'roamguard.io/public-key': thiefKey, 'roamguard.io/force-endpoint': '10.77.0.99:51820' });
    await waitFor(() => cluster.publicKeyOf(victim) === victimKey, 20_000, { description: 'node-3 restoring its public key' });
    const restoredS = (performance.now() - patchedAt) / 1000;
    assert.ok(restoredS < Number(victim.env.RESYNC_INTERVAL) + 5, `restored within one resync (${restoredS.toFixed(1)} s)`);
    t.diagnostic(`a stolen-token patch of node-3's public key restored after ${restoredS.toFixed(2)} s (RESYNC_INTERVAL ${victim.env.RESYNC_INTERVAL} s)`);
    await waitFor(() => /WARN.*someone else changed an annotation of this Node.*field=roamguard.io\/public-key/.test(victim.agent!.stderr)
      && /WARN.*force-endpoint changed.*to=10\.77\.0\.99:51820/.test(victim.agent!.stderr), 10_000, { description: 'node-3 warning about both fields' });
    assert.equal(cluster.api.getNode(victim.name)!.metadata.annotations!['roamguard.io/force-endpoint'], '10.77.0.99:51820', 'force-endpoint is the operator\'s: reported, not undone');
    await mergePatchNode(victim.name, { 'roamguard.io/force-endpoint': null }); // the operator takes it back
    for (const n of [observer, hostile]) {
      await waitFor(async () => { const peers = await cluster.wgPeers(n); return peers.has(victimKey) && !peers.has(thiefKey); }, 20_000, { description: `${n.name} back on node-3's own key` });
    }
    await assertPing(podO.ns, podV.ipv4, { count: 2, deadlineS: 20 }, 'node-2 pod → node-3 pod after the restore');
    await assertPing(podH.ns, podV.ipv6, { count: 2, deadlineS: 20 }, 'node-1 pod → node-3 pod after the restore');
    cluster.api.updateNode(observer.name, (n) => { n.status = { ...(n.status ?? {}), addresses: statusAddressesOf(n).filter((a) => a.address !== '192.168.77.2') }; });
  });

  test('a key file with loose permissions stops the agent with one clear line; the key is not replaced', async () => {
    const node = cluster.node(2);
    const key = readFileSync(node.env.PRIVATE_KEY_PATH, 'utf8');
    await cluster.stopAgent(node);
    chmodSync(node.env.PRIVATE_KEY_PATH, 0o644);
    const result = await node.ns.exec(ROAMGUARD_BIN, ['agent'], { env: { ...process.env, ...node.env }, allowFailure: true, timeoutMs: 60_000 });
    assert.equal(result.code, 1);
    assert.match(result.stderr, /^roamguard agent: private key .* has mode 0644; it must not be readable by group or others \(chmod 600 .*\)$/m);
    assert.equal(readFileSync(node.env.PRIVATE_KEY_PATH, 'utf8'), key, 'the key file is untouched');
    chmodSync(node.env.PRIVATE_KEY_PATH, 0o600);
    await cluster.startAgent(node);
  });

  test('a missing key file: a new key, a warning naming the key it replaces, and the peers follow it', async () => {
    const node = cluster.node(2);
    const oldKey = cluster.publicKeyOf(node)!;
    await cluster.stopAgent(node);
    renameSync(node.env.PRIVATE_KEY_PATH, `${node.env.PRIVATE_KEY_PATH}.lost`);
    await cluster.startAgent(node);
    const newKey = cluster.publicKeyOf(node)!;
    assert.notEqual(newKey, oldKey, 'a new key is published');
    assert.equal(statSync(node.env.PRIVATE_KEY_PATH).mode & 0o777, 0o600);
    const warning = node.agent!.stderr.split('\n').find((l) => /private key file was missing/.test(l));
    assert.ok(warning && /WARN/.test(warning) && warning.includes(oldKey.slice(0, 8)) && warning.includes(newKey.slice(0, 8)), `a warning naming both keys: ${warning}`);
    assert.ok(!node.agent!.stderr.includes(readFileSync(node.env.PRIVATE_KEY_PATH, 'utf8').trim()), 'the private key is not logged');
    for (const other of [cluster.node(1), cluster.node(3)]) {
      await waitFor(async () => { const peers = await cluster.wgPeers(other); return peers.has(newKey) && !peers.has(oldKey); }, 20_000, { description: `${other.name} switching to the new key` });
    }
    await assertPing(pods.get(1)!.ns, pods.get(2)!.ipv4, { count: 2, deadlineS: 20 }, 'node-1 pod → node-2 pod with the new key');
    await assertPing(pods.get(2)!.ns, pods.get(3)!.ipv6, { count: 2, deadlineS: 20 }, 'node-2 pod → node-3 pod (wireguard-go) with the new key');
  });

  test('a pod CIDR file change is picked up live: annotation, CNI config, peers and routes follow', async () => {
    const node = cluster.node(3);
    const file = join(node.dir, 'pod-cidrs.txt');
    // The file source is for a family without spec.podCIDRs: every agent then bounds it by POD_CIDR_ALLOWED_RANGES.
    const fileCidr = '10.250.33.0/24';
    cluster.api.updateNode(node.name, (n) => { n.spec = { podCIDRs: [node.podCidrs[1]] }; });
    writeFileSync(file, `# node-3\n${fileCidr}\n`);
    await restartAgent(node, { POD_CIDR_SOURCE_IPV4: 'file', POD_CIDR_SOURCE_IPV6: 'spec', POD_CIDR_SOURCE_PATH: file });
    const added = '10.250.3.0/24';
    const outside = '10.251.3.0/24';
    writeFileSync(file, `# node-3\n${fileCidr}\n${added}\n${outside}\n`);
    await waitFor(() => JSON.parse(cluster.api.getNode(node.name)!.metadata.annotations!['roamguard.io/pod-cidrs']).includes(added), 15_000, { description: 'the new CIDR published' });
    await waitFor(() => cluster.conflist(node).includes('10.250.3.0/24'), 15_000, { description: 'the CNI config rewritten' });
    const key = cluster.publicKeyOf(node)!;
    await waitFor(async () => (await cluster.wgPeers(cluster.node(1))).get(key)?.allowedIps.includes(added), 15_000, { description: 'node-1 routes the new CIDR to node-3' });
    await waitFor(async () => (await cluster.node(1).ns.ip(['route', 'show', added])).stdout.includes(`dev ${cluster.node(1).ifname}`), 10_000, { description: 'node-1 routes the new CIDR into the tunnel' });
    await waitFor(() => new RegExp(`refused a claim of a node.*node=${node.name}.*claim=${outside.replace(/\./g, '\\.')}.*POD_CIDR_ALLOWED_RANGES`).test(cluster.node(1).agent!.stderr), 10_000, { description: 'node-1 refusing the CIDR outside the allow-list' });
    assert.ok(!(await cluster.wgPeers(cluster.node(1))).get(key)?.allowedIps.includes(outside), 'outside the allow-list: not routed to node-3');
    // Back to the original: the prefix leaves the peer again (a set difference, not a peer replace).
    writeFileSync(file, `${fileCidr}\n`);
    await waitFor(async () => !(await cluster.wgPeers(cluster.node(1))).get(key)?.allowedIps.includes(added), 15_000, { description: 'the CIDR removed again' });
    // Routes follow the peer change in the same pass, just after it.
    await waitFor(async () => (await cluster.node(1).ns.ip(['route', 'show', added])).stdout.trim() === '', 10_000, { description: 'the route removed' });
    cluster.api.updateNode(node.name, (n) => { n.spec = { podCIDR: node.podCidrs[0], podCIDRs: node.podCidrs }; });
    await restartAgent(node);
  });

  test('FIREWALL_ONLY: rules with the cluster pod CIDRs, no tunnel, no CNI config, not a peer', async () => {
    const node = await cluster.addNode(4, { podCidrs: ['10.244.4.0/24'] });
    await cluster.startAgent(node, { FIREWALL_ONLY: '1' });
    const ruleset = await nftRuleset(node);
    assert.match(ruleset, /set pod-cidrs-v4/);
    for (const other of cluster.nodes) {
      // Adjacent CIDRs are merged in the set, so ask nft whether a pod address is in it.
      for (const cidr of other.podCidrs) {
        const family = cidr.includes(':') ? 'v6' : 'v4';
        const address = cidr.replace(/\/\d+$/, '').replace(/0$/, '5').replace(/::$/, '::5');
        await node.ns.exec('nft', ['get', 'element', 'inet', 'roamguard', `pod-cidrs-${family}`, `{ ${address} }`]);
      }
    }
    assert.equal((await node.ns.ip(['link', 'show', node.ifname], { allowFailure: true })).code !== 0, true, 'no tunnel interface');
    assert.throws(() => readFileSync(node.env.CNI_CONFIG_PATH), /ENOENT/);
    assert.equal(cluster.publicKeyOf(node), undefined, 'publishes no key');
    const peers = await cluster.wgPeers(cluster.node(1));
    assert.equal(peers.size, 2, 'the others do not make it a peer');
    await cluster.stopAgent(node);
    cluster.removeNode(node);
  });

  test('native routing for IPv6: IPv6 pod traffic follows the host routes, IPv4 stays in the tunnel', async () => {
    for (const node of cluster.nodes) await restartAgent(node, { NATIVE_ROUTING_IPV6: '1' });
    for (const node of cluster.nodes) {
      await waitFor(async () => [...(await cluster.wgPeers(node)).values()].every((p) => !p.allowedIps.some((a) => a.startsWith('fd00:244:'))), 15_000, { description: `${node.name}: IPv6 pod CIDRs out of the tunnel` });
      const others = cluster.nodes.filter((o) => o !== node).map((o) => o.podCidrs[1]);
      await waitFor(async () => {
        const v6routes = (await node.ns.ip(['-6', 'route', 'show', 'dev', node.ifname])).stdout;
        return others.every((cidr) => !v6routes.includes(cidr));
      }, 10_000, { description: `${node.name}: no route for another node's IPv6 pod CIDR into the tunnel` });
    }
    // The operator's routes for IPv6 pod CIDRs (as a cloud router would provide), added once no
    // agent routes that family into the tunnel any more (`replace` would swap ours otherwise).
    for (const node of cluster.nodes) {
      for (const other of cluster.nodes) if (other !== node) await node.ns.ip(['-6', 'route', 'replace', other.podCidrs[1], 'via', other.ipv6]);
    }
    const a = pods.get(1)!, b = pods.get(2)!;
    await assertPing(a.ns, b.ipv6, { count: 3, deadlineS: 10 }, 'IPv6 pod to pod, natively routed');
    await assertPing(a.ns, b.ipv4, { count: 3, deadlineS: 10 }, 'IPv4 pod to pod, through the tunnel');
    for (const node of cluster.nodes) await restartAgent(node);
  });

  test('a deleted Node\'s peer is removed everywhere; the rest of the mesh keeps working', async () => {
    const gone = cluster.node(3);
    const key = cluster.publicKeyOf(gone)!;
    await cluster.stopAgent(gone);
    cluster.api.deleteNode(gone.name);
    for (const node of [cluster.node(1), cluster.node(2)]) {
      await waitFor(async () => !(await cluster.wgPeers(node)).has(key), 15_000, { description: `${node.name} drops the deleted node's peer` });
      await waitFor(async () => (await node.ns.ip(['route', 'show', gone.podCidrs[0]])).stdout.trim() === '', 10_000, { description: 'its route removed' });
    }
    await assertPing(pods.get(1)!.ns, pods.get(2)!.ipv4, { count: 2, deadlineS: 10 }, 'node-1 pod → node-2 pod after the deletion');
  });

  test(`API server unreachable for ${OUTAGE_S} s: the mesh keeps working (fail static), and the agents catch up once it is back`, { timeout: (OUTAGE_S + 120) * 1000 }, async (t) => {
    const trace = startContinuousPing(scope, pods.get(1)!.ns, pods.get(2)!.ipv4, { durationS: OUTAGE_S + 2, intervalS: 0.1 });
    cluster.api.setUnavailable(true);
    await new Promise((r) => setTimeout(r, OUTAGE_S * 1000));
    cluster.api.setUnavailable(false);
    const result = await trace;
    t.diagnostic(`API server down ${OUTAGE_S} s: ${result.replies.length} of ${result.transmitted} pings answered`);
    assert.ok(result.transmitted - result.replies.length <= 1, `lost ${result.transmitted - result.replies.length} pings while the API server was down`);
    // A node that joins after the outage is meshed by the agents' restarted watches.
    const ghostKey = Buffer.alloc(32, 7).toString('base64');
    cluster.api.createNode({
      metadata: { name: 'late-node', annotations: { 'roamguard.io/public-key': ghostKey, 'roamguard.io/pod-cidrs': '["10.244.9.0/24"]' } },
      spec: { podCIDRs: ['10.244.9.0/24'] },
      status: { addresses: [{ type: 'InternalIP', address: '10.77.0.9' }] },
    });
    const joinedAt = performance.now();
    await waitFor(async () => (await cluster.wgPeers(cluster.node(1))).get(ghostKey)?.allowedIps.includes('10.244.9.0/24'), 60_000, { description: 'node-1 meshing the late node' });
    t.diagnostic(`a node created after the outage meshed by node-1 after ${((performance.now() - joinedAt) / 1000).toFixed(1)} s`);
    cluster.api.deleteNode('late-node');
    await waitFor(async () => !(await cluster.wgPeers(cluster.node(1))).has(ghostKey), 15_000, { description: 'the late node removed again' });
    assert.match(cluster.node(1).agent!.stderr, /WARN|ERROR/, 'the outage was logged');
  });

  test('API server slow, answering errors, dropping watches and expiring their history: the mesh keeps working and the agents converge once it is healthy', { timeout: 240_000 }, async (t) => {
    const trace = startContinuousPing(scope, pods.get(1)!.ns, pods.get(2)!.ipv4, { durationS: 25, intervalS: 0.1 });
    const api = cluster.api;
    const live = cluster.nodes.filter((n) => n.agent?.running); // node-3's agent was stopped with its Node deleted
    assert.equal(live.length, 2);
    api.setLatency(1500);
    api.setFailure({ status: 500, count: 25, message: 'injected: etcd timeout' });
    api.dropWatches();
    api.expireHistory();
    const lateKey = Buffer.alloc(32, 9).toString('base64');
    api.createNode({
      metadata: { name: 'late-slow', annotations: { 'roamguard.io/public-key': lateKey, 'roamguard.io/pod-cidrs': '["10.244.8.0/24"]' } },
      spec: { podCIDRs: ['10.244.8.0/24'] },
      status: { addresses: [{ type: 'InternalIP', address: '10.77.0.8' }] },
    });
    await new Promise((r) => setTimeout(r, 8000));
    // A second round: watches cut again, history gone again (a resume gets 410), errors on watches only.
    api.setFailure({ status: 503, count: 10, match: (req) => req.watch });
    api.dropWatches();
    api.expireHistory();
    await new Promise((r) => setTimeout(r, 7000));
    // Healthy again: each agent's next retry (backoff at most 30 s + 20 % jitter) resumes, gets
    // 410 for its old resourceVersion, relists and meshes the node created during the faults.
    api.setLatency(0);
    api.setFailure(undefined);
    const healthyAt = performance.now();
    for (const node of live) {
      await waitFor(async () => (await cluster.wgPeers(node)).get(lateKey)?.allowedIps.includes('10.244.8.0/24') ?? false, 60_000, { description: `${node.name} meshing the node created during the faults` });
      t.diagnostic(`${node.name} meshed the node created during the faults ${((performance.now() - healthyAt) / 1000).toFixed(1)} s after the API server was healthy again`);
    }
    const result = await trace;
    t.diagnostic(`pings during the faults: ${result.replies.length} of ${result.transmitted} answered`);
    assert.ok(result.transmitted - result.replies.length <= 1, `lost ${result.transmitted - result.replies.length} of ${result.transmitted} pings during the API faults`);
    api.deleteNode('late-slow');
    for (const node of live) {
      await waitFor(async () => !(await cluster.wgPeers(node)).has(lateKey), 30_000, { description: `${node.name} removing the node again` });
    }
    assert.ok(live.every((n) => n.agent?.running), 'every agent still running');
    await assertPing(pods.get(2)!.ns, pods.get(1)!.ipv4, { count: 2, deadlineS: 10 }, 'node-2 pod → node-1 pod after the faults');
  });

  test('roamguard agent --cleanup removes the table, routes, CNI config and tunnel it created', async () => {
    const node = cluster.node(2);
    await cluster.stopAgent(node);
    assert.match(await nftRuleset(node), /table inet roamguard/);
    const result = await node.ns.exec(ROAMGUARD_BIN, ['agent', '--cleanup'], { env: { ...process.env, ...node.env }, timeoutMs: 60_000 });
    assert.match(result.stderr, /removed/);
    assert.notEqual((await node.ns.exec('nft', ['list', 'table', 'inet', 'roamguard'], { allowFailure: true })).code, 0, 'table gone');
    assert.throws(() => readFileSync(node.env.CNI_CONFIG_PATH), /ENOENT/, 'CNI config gone');
    await waitFor(async () => (await node.ns.ip(['link', 'show', node.ifname], { allowFailure: true })).code !== 0, 10_000, { description: 'the tunnel interface gone' });
    assert.equal((await node.ns.ip(['route', 'show', 'proto', '147'])).stdout.trim(), '', 'no routes of ours left');
  });
});
