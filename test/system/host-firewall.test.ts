/**
 * The node agent's host programming against the real kernel, in namespaces this test builds:
 *
 *   pod ── veth ── node ── veth ── outside
 *   10.244.1.2     10.244.1.1       192.0.2.2 / 2001:db8:1::2 (+ 10.244.2.2, fd00:10:244:2::2
 *   fd00:10:244:1::2               standing in for a pod on another node)
 *                  192.0.2.1 / 2001:db8:1::1
 *
 * The node forwards, and gets the ruleset from control/host/nftables.ts applied through the same
 * runner the agent uses. A small TCP server answers every connection with the peer address it
 * sees, so "was it masqueraded" is read off at the receiving end, and a connection that gets no
 * answer within a second and a half counts as dropped. Proven here:
 *
 *   - masquerade: pod → outside arrives from the node's address, per family; a disabled family
 *     keeps the pod source; pod → another pod CIDR is never masqueraded; host-originated traffic
 *     (even from the gateway address inside the pod CIDR) is never masqueraded; packets carrying
 *     kube-proxy's mark are left alone;
 *   - filter: a NEW connection from outside to a pod is dropped, per enabled family only, while
 *     pod-initiated connections and their replies pass; DNAT'd (NodePort-like) connections pass;
 *   - apply/remove are idempotent and atomic replacements of the one table;
 *   - routes, tunnel addresses and MTU reconciled on a real TUN device, other routes untouched;
 *   - a real CNI ADD/DEL of the rendered conflist with Debian's plugins in /usr/lib/cni.
 *
 * Needs root, iproute2, nftables, iputils-ping and containernetworking-plugins (the test command
 * installs them); their absence fails the test.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { requireRoot, reapStale, Scope, uniqueName, waitFor, type Namespace, type NsProcess } from './netns.ts';
import { assertPing } from './userspace-wg.ts';
import { applyRuleset, removeTable, renderRuleset, type FamilySwitch, type RulesetOptions } from '../../control/host/nftables.ts';
import { renderConflist } from '../../control/host/cni-config.ts';
import { cniAdd, cniDel } from '../../control/host/cni-exec.ts';
import { configureTunnelInterface, DEFAULT_ROUTE_PROTOCOL, reconcileRoutes, removeRoutes, type RouteReport } from '../../control/host/routes.ts';
import { globalUnicastAddresses } from '../../control/host/node-addresses.ts';
import { netnsRunner, type CommandRunner } from '../../control/host/runner.ts';

const ADDR = {
  node: { v4: '192.0.2.1', v6: '2001:db8:1::1' },
  outside: { v4: '192.0.2.2', v6: '2001:db8:1::2' },
  gateway: { v4: '10.244.1.1', v6: 'fd00:10:244:1::1' },
  pod: { v4: '10.244.1.2', v6: 'fd00:10:244:1::2' },
  remotePod: { v4: '10.244.2.2', v6: 'fd00:10:244:2::2' },
};
const LOCAL_PODS = { v4: ['10.244.1.0/24'], v6: ['fd00:10:244:1::/64'] };
const CLUSTER_PODS = { v4: ['10.244.0.0/24', '10.244.2.0/24'], v6: ['fd00:10:244::/64', 'fd00:10:244:2::/64'] };
const PORT = 7000;
const NODEPORT = 30080;
const DROP_TIMEOUT_MS = 1500;

/** A TCP server that writes the peer address it sees, and a client that prints what it got. */
const PROBE = `
import net from 'node:net';
const [mode, ...rest] = process.argv.slice(2);
if (mode === 'serve') {
  const server = net.createServer((s) => s.end(s.remoteAddress + '\\n'));
  server.listen({ port: Number(rest[0]), host: '::', ipv6Only: false }, () => console.log('listening'));
} else {
  const [host, port, timeoutMs, localAddress] = rest;
  const done = (result) => { console.log(JSON.stringify(result)); process.exit(0); };
  const timer = setTimeout(() => done({ ok: false, error: 'timeout' }), Number(timeoutMs));
  const s = net.connect({ host, port: Number(port), localAddress: localAddress || undefined });
  let data = '';
  s.on('data', (d) => { data += d; });
  s.on('end', () => { clearTimeout(timer); done({ ok: true, peer: data.trim() }); });
  s.on('error', (e) => { clearTimeout(timer); done({ ok: false, error: e.code || e.message }); });
}
`;

const scope = new Scope();
let node: Namespace, pod: Namespace, outside: Namespace;
let nodeRunner: CommandRunner;
let probePath: string;

type Answer = { ok: true; peer: string } | { ok: false; error: string };

/** Connects from `from` to host:port; the peer address the server saw (IPv4-mapped form removed), or the failure. */
async function ask(from: Namespace, host: string, port = PORT, options: { localAddress?: string; timeoutMs?: number } = {}): Promise<Answer> {
  const result = await from.exec(process.execPath, [probePath, 'ask', host, String(port), String(options.timeoutMs ?? 5000), options.localAddress ?? ''], { timeoutMs: 20_000 });
  const answer = JSON.parse(result.stdout.trim()) as Answer;
  return answer.ok ? { ok: true, peer: answer.peer.replace(/^::ffff:/, '') } : answer;
}

async function seenAs(from: Namespace, host: string, localAddress?: string): Promise<string> {
  const answer = await ask(from, host, PORT, { localAddress });
  if (!answer.ok) assert.fail(`connection ${from.name} → ${host} failed: ${answer.error}`);
  return answer.peer;
}

async function serve(ns: Namespace): Promise<NsProcess> {
  const server = scope.spawn(ns, process.execPath, [probePath, 'serve', String(PORT)], { label: `probe server in ${ns.name}` });
  await waitFor(() => server.stdout.includes('listening') || !server.running, 10_000, { description: `probe server in ${ns.name}` });
  assert.ok(server.running, server.describe());
  return server;
}

async function apply(masquerade: FamilySwitch, filter: FamilySwitch, extra: Partial<RulesetOptions> = {}): Promise<void> {
  await applyRuleset(renderRuleset({ masquerade, filter, clusterPodCidrs: CLUSTER_PODS, localPodCidrs: LOCAL_PODS, ...extra }), nodeRunner);
}

const BOTH = { ipv4: true, ipv6: true };
const NONE = { ipv4: false, ipv6: false };

describe('host programming: nftables masquerade and filter in namespaces', () => {
  before(async () => {
    await requireRoot({ binaries: ['nft', 'ping'] });
    await reapStale();
    probePath = join(scope.tempDir('rg-host-fw-'), 'probe.mjs');
    writeFileSync(probePath, PROBE);
    node = await scope.namespace();
    pod = await scope.namespace();
    outside = await scope.namespace();
    nodeRunner = netnsRunner(node.name);
    await scope.veth(node, outside, { ipv4: [`${ADDR.node.v4}/24`, `${ADDR.outside.v4}/24`], ipv6: [`${ADDR.node.v6}/64`, `${ADDR.outside.v6}/64`] });
    await scope.veth(node, pod, { ipv4: [`${ADDR.gateway.v4}/24`, `${ADDR.pod.v4}/24`], ipv6: [`${ADDR.gateway.v6}/64`, `${ADDR.pod.v6}/64`] });
    await pod.ip(['route', 'add', 'default', 'via', ADDR.gateway.v4]);
    await pod.ip(['-6', 'route', 'add', 'default', 'via', ADDR.gateway.v6]);
    await node.exec('sysctl', ['-q', '-w', 'net.ipv4.ip_forward=1', 'net.ipv6.conf.all.forwarding=1']);
    // The outside host stands in for the rest of the world and for a remote node's pods, and can
    // route back to this node's pods (so an unmasqueraded connection still gets its answer).
    await outside.ip(['addr', 'add', `${ADDR.remotePod.v4}/32`, 'dev', 'lo']);
    await outside.ip(['addr', 'add', `${ADDR.remotePod.v6}/128`, 'dev', 'lo']);
    await outside.ip(['route', 'add', '10.244.0.0/16', 'via', ADDR.node.v4]);
    await outside.ip(['-6', 'route', 'add', 'fd00:10:244::/48', 'via', ADDR.node.v6]);
    await node.ip(['route', 'add', '10.244.2.0/24', 'via', ADDR.outside.v4]);
    await node.ip(['-6', 'route', 'add', 'fd00:10:244:2::/64', 'via', ADDR.outside.v6]);
    await serve(outside);
    await serve(pod);
    // Plain forwarding works before any rule exists (so a later failure is the ruleset's doing).
    assert.equal(await seenAs(pod, ADDR.outside.v4), ADDR.pod.v4);
    assert.equal(await seenAs(pod, ADDR.outside.v6), ADDR.pod.v6);
  });

  after(async () => {
    await scope.cleanup();
  });

  test('masquerade on: pod → outside arrives from the node, per family', async () => {
    await apply(BOTH, NONE);
    assert.equal(await seenAs(pod, ADDR.outside.v4), ADDR.node.v4);
    assert.equal(await seenAs(pod, ADDR.outside.v6), ADDR.node.v6);
  });

  test('masquerade for one family only: the other family keeps the pod source', async () => {
    await apply({ ipv4: true, ipv6: false }, NONE);
    assert.equal(await seenAs(pod, ADDR.outside.v4), ADDR.node.v4);
    assert.equal(await seenAs(pod, ADDR.outside.v6), ADDR.pod.v6, 'IPv6 must not be masqueraded');
    await apply({ ipv4: false, ipv6: true }, NONE);
    assert.equal(await seenAs(pod, ADDR.outside.v4), ADDR.pod.v4, 'IPv4 must not be masqueraded');
    assert.equal(await seenAs(pod, ADDR.outside.v6), ADDR.node.v6);
  });

  test('pod → a pod on another node keeps its source', async () => {
    await apply(BOTH, NONE);
    assert.equal(await seenAs(pod, ADDR.remotePod.v4), ADDR.pod.v4);
    assert.equal(await seenAs(pod, ADDR.remotePod.v6), ADDR.pod.v6);
  });

  test('host-originated traffic is never masqueraded, even from the gateway address in the pod CIDR', async () => {
    await apply(BOTH, NONE);
    assert.equal(await seenAs(node, ADDR.outside.v4), ADDR.node.v4);
    assert.equal(await seenAs(node, ADDR.outside.v6), ADDR.node.v6);
    assert.equal(await seenAs(node, ADDR.outside.v4, ADDR.gateway.v4), ADDR.gateway.v4);
    assert.equal(await seenAs(node, ADDR.outside.v6, ADDR.gateway.v6), ADDR.gateway.v6);
  });

  test('packets carrying kube-proxy\'s masquerade mark are left to kube-proxy', async () => {
    await apply(BOTH, NONE);
    await applyRuleset([
      'table inet rgtmark {}', 'delete table inet rgtmark',
      'table inet rgtmark {',
      '  chain pre { type filter hook prerouting priority mangle; policy accept;',
      `    ip saddr ${ADDR.pod.v4} ip daddr ${ADDR.outside.v4} meta mark set 0x4000`,
      '  }',
      '}', '',
    ].join('\n'), nodeRunner);
    try {
      assert.equal(await seenAs(pod, ADDR.outside.v4), ADDR.pod.v4, 'marked: not masqueraded by us');
      assert.equal(await seenAs(pod, ADDR.outside.v6), ADDR.node.v6, 'unmarked: masqueraded');
    } finally {
      await removeTable('rgtmark', nodeRunner);
    }
  });

  test('filter off: outside can open connections to the pod (the baseline)', async () => {
    await apply(NONE, NONE);
    assert.equal(await seenAs(outside, ADDR.pod.v4), ADDR.outside.v4);
    assert.equal(await seenAs(outside, ADDR.pod.v6), ADDR.outside.v6);
  });

  test('filter on: new connections from outside to the pod are dropped; pod-initiated ones and their replies pass', async () => {
    for (const masquerade of [BOTH, NONE]) {
      await apply(masquerade, BOTH);
      for (const family of ['v4', 'v6'] as const) {
        const inbound = await ask(outside, ADDR.pod[family], PORT, { timeoutMs: DROP_TIMEOUT_MS });
        assert.deepEqual(inbound, { ok: false, error: 'timeout' }, `outside → pod ${family} must be dropped (masquerade ${JSON.stringify(masquerade)})`);
        const expected = masquerade.ipv4 ? ADDR.node[family] : ADDR.pod[family];
        assert.equal(await seenAs(pod, ADDR.outside[family]), expected, `pod → outside ${family} with the filter on`);
      }
    }
    // Remote pods may still open connections to local pods.
    assert.equal(await seenAs(outside, ADDR.pod.v4, ADDR.remotePod.v4), ADDR.remotePod.v4);
    assert.equal(await seenAs(outside, ADDR.pod.v6, ADDR.remotePod.v6), ADDR.remotePod.v6);
  });

  test('filter for one family only leaves the other open', async () => {
    await apply(NONE, { ipv4: true, ipv6: false });
    assert.deepEqual(await ask(outside, ADDR.pod.v4, PORT, { timeoutMs: DROP_TIMEOUT_MS }), { ok: false, error: 'timeout' });
    assert.equal(await seenAs(outside, ADDR.pod.v6), ADDR.outside.v6);
    await apply(NONE, { ipv4: false, ipv6: true });
    assert.equal(await seenAs(outside, ADDR.pod.v4), ADDR.outside.v4);
    assert.deepEqual(await ask(outside, ADDR.pod.v6, PORT, { timeoutMs: DROP_TIMEOUT_MS }), { ok: false, error: 'timeout' });
  });

  test('filter on: DNAT\'d connections (NodePort-like) to the pod pass', async () => {
    await apply(BOTH, BOTH);
    await applyRuleset([
      'table inet rgtdnat {}', 'delete table inet rgtdnat',
      'table inet rgtdnat {',
      '  chain pre { type nat hook prerouting priority dstnat; policy accept;',
      `    meta nfproto ipv4 tcp dport ${NODEPORT} dnat ip to ${ADDR.pod.v4}:${PORT}`,
      `    meta nfproto ipv6 tcp dport ${NODEPORT} dnat ip6 to [${ADDR.pod.v6}]:${PORT}`,
      '  }',
      '}', '',
    ].join('\n'), nodeRunner);
    try {
      for (const family of ['v4', 'v6'] as const) {
        const answer = await ask(outside, ADDR.node[family], NODEPORT);
        assert.deepEqual(answer, { ok: true, peer: ADDR.outside[family] }, `NodePort ${family} with the filter on`);
        assert.deepEqual(await ask(outside, ADDR.pod[family], PORT, { timeoutMs: DROP_TIMEOUT_MS }), { ok: false, error: 'timeout' }, `direct ${family} still dropped`);
      }
    } finally {
      await removeTable('rgtdnat', nodeRunner);
    }
  });

  test('apply replaces the one table atomically; remove is idempotent', async () => {
    await apply(BOTH, BOTH);
    await apply(BOTH, BOTH); // re-applying the same ruleset is fine
    const listed = await node.exec('nft', ['list', 'tables']);
    assert.equal(listed.stdout.split('\n').filter((l) => l.trim() === 'table inet roamguard').length, 1);
    // Someone flushes our rules; the next sync restores them.
    await node.exec('nft', ['flush', 'chain', 'inet', 'roamguard', 'postrouting']);
    await apply(BOTH, NONE);
    const table = (await node.exec('nft', ['list', 'table', 'inet', 'roamguard'])).stdout;
    assert.match(table, /masquerade/);
    assert.doesNotMatch(table, /chain forward/, 'the filter chain went with the replacement');
    assert.match(table, /10\.244\.0\.0-10\.244\.2\.255|10\.244\.0\.0\/2[23]|10\.244\.0\.0\/24/, table);
    await removeTable('roamguard', nodeRunner);
    await removeTable('roamguard', nodeRunner);
    assert.doesNotMatch((await node.exec('nft', ['list', 'tables'])).stdout, /roamguard/);
    assert.equal(await seenAs(pod, ADDR.outside.v4), ADDR.pod.v4, 'no table, no masquerade');
  });
});

/** A route report without `applied` (the routes after the call): what the call changed. */
function routeChanges({ applied: _applied, ...rest }: RouteReport) {
  return rest;
}

describe('host programming: routes, tunnel addresses and MTU on a real TUN device', () => {
  const routesScope = new Scope();
  after(async () => {
    await routesScope.cleanup();
  });

  test('reconcile adds, removes and leaves foreign routes alone; addresses follow the local pod CIDRs', async () => {
    await requireRoot();
    const ns = await routesScope.namespace();
    const runner = netnsRunner(ns.name);
    const tun = uniqueName('rt');
    await ns.ip(['tuntap', 'add', 'dev', tun, 'mode', 'tun']);
    await ns.ip(['link', 'set', tun, 'up']);
    await ns.ip(['route', 'add', '10.250.0.0/24', 'dev', tun, 'proto', 'static']);
    await ns.ip(['route', 'add', '10.244.9.0/24', 'dev', tun, 'proto', String(DEFAULT_ROUTE_PROTOCOL)]);

    const ours = async (family: 4 | 6) => JSON.parse((await ns.ip(['-j', `-${family}`, 'route', 'show', 'dev', tun, 'proto', String(DEFAULT_ROUTE_PROTOCOL)])).stdout || '[]').map((r: { dst: string }) => r.dst);
    const report = await reconcileRoutes({
      device: tun, runner, cidrs: ['10.244.2.0/24', '10.244.4.0/25', '10.244.4.128/25', 'fd00:10:244:2::/64', 'fd00:10:244:3::7/128'],
    });
    assert.deepEqual(routeChanges(report), { added: ['10.244.2.0/24', '10.244.4.0/24', 'fd00:10:244:2::/64', 'fd00:10:244:3::7/128'], removed: ['10.244.9.0/24'], changed: [], conflicts: [] });
    assert.deepEqual(await ours(4), ['10.244.2.0/24', '10.244.4.0/24']);
    assert.deepEqual(await ours(6), ['fd00:10:244:2::/64', 'fd00:10:244:3::7']);
    assert.match((await ns.ip(['route', 'show', 'dev', tun])).stdout, /10\.250\.0\.0\/24 proto static/);
    assert.match((await ns.ip(['route', 'get', '10.244.4.200'])).stdout, new RegExp(`dev ${tun}`));

    assert.deepEqual(routeChanges(await reconcileRoutes({ device: tun, runner, cidrs: ['fd00:10:244:3::7/128', '10.244.4.0/24', 'fd00:10:244:2::/64', '10.244.2.0/24'] })), { added: [], removed: [], changed: [], conflicts: [] });

    // A LAN's connected route (the kernel's) is never taken over, in either family: `ip route
    // replace` used to swap it for one into the tunnel.
    const lan = uniqueName('lan');
    await ns.ip(['link', 'add', lan, 'type', 'veth', 'peer', 'name', `${lan}p`]);
    await ns.ip(['link', 'set', lan, 'up']);
    await ns.ip(['link', 'set', `${lan}p`, 'up']);
    await ns.ip(['addr', 'add', '192.168.51.5/24', 'dev', lan]);
    await ns.ip(['addr', 'add', 'fd51::5/64', 'dev', lan, 'nodad']);
    const wanted = ['fd00:10:244:3::7/128', '10.244.4.0/24', 'fd00:10:244:2::/64', '10.244.2.0/24', '192.168.51.0/24', 'fd51::/64'];
    const conflicted = await reconcileRoutes({ device: tun, runner, cidrs: wanted });
    assert.deepEqual(routeChanges(conflicted), { added: [], removed: [], changed: [], conflicts: [
      { dst: '192.168.51.0/24', existing: `dev ${lan} proto kernel` }, { dst: 'fd51::/64', existing: `dev ${lan} proto kernel` },
    ] });
    assert.match((await ns.ip(['route', 'get', '192.168.51.9'])).stdout, new RegExp(`dev ${lan}`));
    assert.match((await ns.ip(['-6', 'route', 'get', 'fd51::9'])).stdout, new RegExp(`dev ${lan}`));
    assert.doesNotMatch((await ns.ip(['-6', 'route', 'show', 'dev', tun])).stdout, /fd51::/);
    await ns.ip(['link', 'del', lan]);

    assert.deepEqual(await configureTunnelInterface({ device: tun, mtu: 1380, localPodCidrs: ['10.244.1.0/24', 'fd00:10:244:1::/64'], runner }), {
      added: ['10.244.1.1/32', 'fd00:10:244:1::1/128'], removed: [],
    });
    const link = JSON.parse((await ns.ip(['-j', 'addr', 'show', 'dev', tun])).stdout)[0];
    assert.equal(link.mtu, 1380);
    const global = link.addr_info.filter((a: { scope: string }) => a.scope === 'global');
    assert.deepEqual(global.map((a: { local: string; prefixlen: number }) => `${a.local}/${a.prefixlen}`), ['10.244.1.1/32', 'fd00:10:244:1::1/128']);
    assert.ok(global.every((a: { tentative?: boolean }) => !a.tentative), 'usable at once (nodad)');
    assert.deepEqual(await globalUnicastAddresses([tun], runner), ['10.244.1.1', 'fd00:10:244:1::1']);

    // The node's pod CIDR moved: the old gateway goes, the new one comes.
    assert.deepEqual(await configureTunnelInterface({ device: tun, mtu: 1380, localPodCidrs: ['10.244.7.0/24'], runner }), {
      added: ['10.244.7.1/32'], removed: ['10.244.1.1/32', 'fd00:10:244:1::1/128'],
    });

    assert.deepEqual((await removeRoutes({ device: tun, runner })).removed, ['10.244.2.0/24', '10.244.4.0/24', 'fd00:10:244:2::/64', 'fd00:10:244:3::7/128']);
    assert.deepEqual(await ours(4), []);
    assert.deepEqual(await ours(6), []);
    assert.match((await ns.ip(['route', 'show', 'dev', tun])).stdout, /10\.250\.0\.0\/24 proto static/, 'the foreign route survives');
    await assert.rejects(globalUnicastAddresses(['rgnosuchdev'], runner), /cannot read the addresses of interface rgnosuchdev/);
  });
});

describe('host programming: CNI ADD and DEL with the rendered conflist and Debian\'s plugins', () => {
  const cniScope = new Scope();
  after(async () => {
    await cniScope.cleanup();
  });

  test('the pod gets addresses from the pod CIDRs and the MTU, reaches its gateway and the node; DEL removes it all', async () => {
    await requireRoot({ binaries: ['ping'] });
    for (const plugin of ['ptp', 'host-local', 'portmap']) assert.ok(existsSync(`/usr/lib/cni/${plugin}`), `/usr/lib/cni/${plugin} (containernetworking-plugins)`);
    const host = await cniScope.namespace();
    const podNs = await cniScope.namespace();
    const dataDir = cniScope.tempDir('rg-cni-ipam-');
    const conflist = renderConflist({ name: 'rgtest', mtu: 1400, podCidrs: ['10.244.5.0/24', 'fd00:10:244:5::/64'], dataDir });
    const invocation = {
      containerId: `rgtest-${cniScope.id}`, netns: `/var/run/netns/${podNs.name}`, ifname: 'eth0',
      pluginDirs: ['/usr/lib/cni'], runner: netnsRunner(host.name),
    };
    const result = await cniAdd(conflist, invocation) as { ips?: Array<{ address: string; gateway?: string }> };
    let deleted = false;
    cniScope.defer('CNI DEL', async () => { if (!deleted) await cniDel(conflist, { ...invocation, prevResult: result }).catch(() => {}); });

    const ips = (result.ips ?? []).map((ip) => ip.address).sort();
    assert.equal(ips.length, 2, JSON.stringify(result));
    const v4 = ips.find((a) => !a.includes(':'))!;
    const v6 = ips.find((a) => a.includes(':'))!;
    assert.match(v4, /^10\.244\.5\.\d+\/24$/);
    assert.match(v6, /^fd00:10:244:5::[0-9a-f]+\/64$/);
    assert.notEqual(v4, '10.244.5.1/24', 'the gateway is not handed to a pod');

    const eth0 = JSON.parse((await podNs.ip(['-j', 'addr', 'show', 'dev', 'eth0'])).stdout)[0];
    assert.equal(eth0.mtu, 1400, 'pod MTU from the conflist');
    const podAddresses = eth0.addr_info.filter((a: { scope: string }) => a.scope === 'global').map((a: { local: string; prefixlen: number }) => `${a.local}/${a.prefixlen}`).sort();
    assert.deepEqual(podAddresses, ips);
    assert.match((await podNs.ip(['route', 'show', 'default'])).stdout, /default via 10\.244\.5\.1 dev eth0/);
    assert.match((await podNs.ip(['-6', 'route', 'show', 'default'])).stdout, /default via fd00:10:244:5::1 dev eth0/);

    await assertPing(podNs, '10.244.5.1', { count: 2, deadlineS: 10 });
    await assertPing(podNs, 'fd00:10:244:5::1', { count: 2, deadlineS: 10 });
    await assertPing(host, v4.split('/')[0], { count: 2, deadlineS: 10 });
    await assertPing(host, v6.split('/')[0], { count: 2, deadlineS: 10 });
    assert.ok(readdirSync(join(dataDir, 'rgtest')).includes(v4.split('/')[0]), 'host-local recorded the lease in dataDir');

    await cniDel(conflist, { ...invocation, prevResult: result });
    deleted = true;
    assert.equal((await podNs.ip(['link', 'show', 'dev', 'eth0'], { allowFailure: true })).code, 1, 'eth0 removed from the pod');
    const hostLinks = JSON.parse((await host.ip(['-j', 'link', 'show'])).stdout) as Array<{ ifname: string }>;
    assert.deepEqual(hostLinks.map((l) => l.ifname), ['lo'], 'host veth removed');
    assert.ok(!readdirSync(join(dataDir, 'rgtest')).includes(v4.split('/')[0]), 'lease released');
    // DEL of something already gone succeeds, as the spec requires.
    await cniDel(conflist, { ...invocation, prevResult: result });
  });
});
