/**
 * Key rotation end to end: two nodes in namespaces, node-1 on roamguard's data plane, node-2 on
 * Debian's wireguard-go, a pod on each, and a 50 pings/s ping between the pods while a node's key
 * rotates (`roamguard rotate-key`, then `KEY_ROTATION_INTERVAL`). Each rotation may cost at most
 * one second of pings (50). Rotations that cannot complete at once — an API server outage, an
 * agent that is down when the key file changes — must converge once they can. The tests run in
 * order on one cluster; each leaves it working for the next.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname } from 'node:path';
import { AgentCluster, type ClusterNode, type Pod } from './agent-cluster.ts';
import { Scope, waitFor } from './netns.ts';
import { assertPing, requireDaemonPrerequisites, ROAMGUARD_BIN, startContinuousPing, longestGap, type PingTrace } from './userspace-wg.ts';

const scope = new Scope();
let cluster: AgentCluster;
const pods = new Map<number, Pod>();
/** 50 pings/s: a lost ping is 20 ms of lost traffic. */
const PING_INTERVAL_S = 0.02;
const MAX_LOST_PER_ROTATION = 50; // one second

before(async () => {
  await requireDaemonPrerequisites(['roamguard-node', 'wireguard-go']);
  cluster = await AgentCluster.create(scope, 2);
});
after(async () => { await scope.cleanup(); });

async function rotateKey(node: ClusterNode, waitS: number): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return node.ns.exec(ROAMGUARD_BIN, ['rotate-key', '--wait', String(waitS)], { env: { ...process.env, ...node.env }, timeoutMs: (waitS + 60) * 1000, allowFailure: true });
}

async function dataplaneKey(node: ClusterNode): Promise<string> {
  return (await node.ns.exec('wg', ['show', node.ifname, 'public-key'])).stdout.trim();
}

/** Both pods ping each other at 50/s for `durationS` (IPv4 one way, IPv6 the other). */
function pingBothWays(durationS: number): { forward: Promise<PingTrace>; backward: Promise<PingTrace> } {
  return {
    forward: startContinuousPing(scope, pods.get(1)!.ns, pods.get(2)!.ipv4, { durationS, intervalS: PING_INTERVAL_S }),
    backward: startContinuousPing(scope, pods.get(2)!.ns, pods.get(1)!.ipv6, { durationS, intervalS: PING_INTERVAL_S }),
  };
}

function lost(trace: PingTrace): number {
  return trace.transmitted - trace.replies.length;
}

/** The longest time between two replies (seconds). */
function longestGapS(trace: PingTrace): number {
  if (trace.replies.length === 0) return Infinity;
  return longestGap(trace, trace.replies[0].at, trace.replies.at(-1)!.at);
}

function describeLoss(trace: PingTrace): string {
  return `${lost(trace)} of ${trace.transmitted} lost (${(lost(trace) * PING_INTERVAL_S * 1000).toFixed(0)} ms), longest gap ${(longestGapS(trace) * 1000).toFixed(0)} ms`;
}

/** Every peer holds `node`'s published key (and not `oldKey`), and the pods reach each other. */
async function assertConverged(node: ClusterNode, oldKey: string, timeoutMs: number): Promise<string> {
  await waitFor(() => cluster.publicKeyOf(node) !== oldKey, timeoutMs, { description: `${node.name} to publish a new key` });
  const newKey = cluster.publicKeyOf(node)!;
  for (const other of cluster.nodes.filter((n) => n !== node)) {
    await waitFor(async () => {
      const peers = await cluster.wgPeers(other);
      return peers.has(newKey) && !peers.has(oldKey) && peers.get(newKey)!.allowedIps.includes(node.podCidrs[0]);
    }, timeoutMs, { description: `${other.name} to replace ${node.name}'s peer with its new key` });
  }
  assert.equal(await dataplaneKey(node), newKey, `${node.name}'s data plane holds the published key`);
  return newKey;
}

function assertKeyFile(node: ClusterNode): void {
  const path = node.env.PRIVATE_KEY_PATH;
  assert.equal(statSync(path).mode & 0o777, 0o600, 'key file mode 0600');
  assert.match(readFileSync(path, 'utf8'), /^[A-Za-z0-9+/]{43}=\n$/);
  assert.deepEqual(readdirSync(dirname(path)).filter((n) => n.includes('private.key') && n !== 'private.key'), [], 'no temporary key file left');
}

describe('key rotation (roamguard and wireguard-go nodes)', { timeout: 600_000 }, () => {
  test('the cluster meshes: node-1 on roamguard, node-2 on wireguard-go', async () => {
    cluster.node(2).env.WG_DATAPLANE = 'wireguard-go';
    for (const node of cluster.nodes) await cluster.startAgent(node);
    for (const node of cluster.nodes) pods.set(node.index, await cluster.addPod(node));
    await assertPing(pods.get(1)!.ns, pods.get(2)!.ipv4, { count: 2, deadlineS: 10 }, 'pod 1 → pod 2');
    await assertPing(pods.get(2)!.ns, pods.get(1)!.ipv6, { count: 2, deadlineS: 10 }, 'pod 2 → pod 1 (IPv6)');
  });

  for (const index of [1, 2]) {
    test(`roamguard rotate-key on node-${index} (${index === 1 ? 'roamguard' : 'wireguard-go'} data plane) under 50 pings/s both ways: at most one second of pings lost`, async (t) => {
      const node = cluster.node(index);
      const oldKey = cluster.publicKeyOf(node)!;
      const traces = pingBothWays(7);
      await new Promise((r) => setTimeout(r, 1500));
      const result = await rotateKey(node, 30);
      assert.equal(result.code, 0, `rotate-key: ${result.stdout}${result.stderr}`);
      assert.match(result.stdout, /wrote a new private key .* switched to it after/s);
      assert.doesNotMatch(result.stdout + result.stderr, new RegExp(readFileSync(node.env.PRIVATE_KEY_PATH, 'utf8').trim().replace(/[+/=]/g, '\\$&')), 'the private key is never printed');
      const newKey = await assertConverged(node, oldKey, 10_000);
      assertKeyFile(node);
      const forward = await traces.forward;
      const backward = await traces.backward;
      t.diagnostic(`node-${index} rotated ${oldKey.slice(0, 8)} → ${newKey.slice(0, 8)}; pod 1 → pod 2 (IPv4): ${describeLoss(forward)}; pod 2 → pod 1 (IPv6): ${describeLoss(backward)}`);
      // ping sends less while its packets go unanswered, so the longest silence is checked too.
      for (const [what, trace] of [['pod 1 → pod 2', forward], ['pod 2 → pod 1', backward]] as const) {
        assert.ok(lost(trace) <= MAX_LOST_PER_ROTATION, `${what}: ${describeLoss(trace)}`);
        assert.ok(longestGapS(trace) <= 1, `${what}: ${describeLoss(trace)}`);
      }
      assert.match(node.agent!.stderr, /rotated this node's key/);
      assert.ok(!node.agent!.stderr.includes(readFileSync(node.env.PRIVATE_KEY_PATH, 'utf8').trim()), 'the new private key is not in the log');
    });
  }

  test('a rotation during an API server outage: the node keeps its old key and traffic meanwhile, and converges once the API server is back', async (t) => {
    const node = cluster.node(1);
    const oldKey = cluster.publicKeyOf(node)!;
    cluster.api.setUnavailable(true);
    let restored = false;
    try {
      const duringOutage = pingBothWays(6);
      const result = await rotateKey(node, 3);
      assert.equal(result.code, 1, 'rotate-key says the switch did not happen yet');
      assert.match(result.stderr, /does not hold the new key .* API server reachable/s);
      assert.equal(await dataplaneKey(node), oldKey, 'the data plane keeps the old key while the new one cannot be published');
      const forward = await duringOutage.forward;
      const backward = await duringOutage.backward;
      t.diagnostic(`during the outage: pod 1 → pod 2 ${describeLoss(forward)}; pod 2 → pod 1 ${describeLoss(backward)}`);
      assert.ok(lost(forward) <= 2 && lost(backward) <= 2, 'traffic keeps flowing with the old key during the outage');
      assert.match(node.agent!.stderr, /cannot be published yet/);
      const afterOutage = pingBothWays(20);
      await new Promise((r) => setTimeout(r, 1000));
      cluster.api.setUnavailable(false);
      restored = true;
      const backAt = performance.now();
      await assertConverged(node, oldKey, 60_000);
      const convergedS = (performance.now() - backAt) / 1000;
      await assertPing(pods.get(1)!.ns, pods.get(2)!.ipv4, { count: 2, deadlineS: 10 }, 'pod 1 → pod 2 after the outage');
      t.diagnostic(`converged ${convergedS.toFixed(1)} s after the API server came back`);
      const forwardAfter = await afterOutage.forward;
      const backwardAfter = await afterOutage.backward;
      t.diagnostic(`after the outage (the peers' watches reconnecting with backoff): pod 1 → pod 2 ${describeLoss(forwardAfter)}; pod 2 → pod 1 ${describeLoss(backwardAfter)}`);
      assert.ok(forwardAfter.replies.length > 0 && backwardAfter.replies.length > 0);
    } finally {
      if (!restored) cluster.api.setUnavailable(false);
    }
  });

  test('a rotation while an agent is down (key file written, nothing published): the restarted agent completes it', async (t) => {
    const node = cluster.node(2);
    const oldKey = cluster.publicKeyOf(node)!;
    await cluster.stopAgent(node, 'SIGKILL');
    const traces = pingBothWays(10);
    const result = await rotateKey(node, 0);
    assert.equal(result.code, 0, result.stderr);
    assert.equal(await dataplaneKey(node), oldKey, 'nothing switches without the agent');
    const restartAt = performance.now();
    await cluster.startAgent(node);
    await assertConverged(node, oldKey, 20_000);
    t.diagnostic(`converged ${((performance.now() - restartAt) / 1000).toFixed(1)} s after the agent's start (its start-up included)`);
    const forward = await traces.forward;
    const backward = await traces.backward;
    t.diagnostic(`pod 1 → pod 2 ${describeLoss(forward)}; pod 2 → pod 1 ${describeLoss(backward)}`);
    await assertPing(pods.get(2)!.ns, pods.get(1)!.ipv4, { count: 2, deadlineS: 10 }, 'pod 2 → pod 1 after the restart');
  });

  test('KEY_ROTATION_INTERVAL rotates on its own, at most one second of pings lost per rotation', async (t) => {
    const node = cluster.node(1);
    const firstKey = cluster.publicKeyOf(node)!;
    await cluster.stopAgent(node);
    // The key file was written more than 10 s ago: due at once, then every 10 s.
    const traces = pingBothWays(20);
    await cluster.startAgent(node, { KEY_ROTATION_INTERVAL: '10s' });
    const rotationsLogged = () => (node.agent!.stderr.match(/rotated this node's key/g) ?? []).length;
    await waitFor(() => rotationsLogged() >= 2, 40_000, { description: 'two rotations by the interval' });
    const rotations = rotationsLogged();
    const forward = await traces.forward;
    const backward = await traces.backward;
    t.diagnostic(`${rotations} rotations in 20 s; pod 1 → pod 2 ${describeLoss(forward)}; pod 2 → pod 1 ${describeLoss(backward)}`);
    assert.ok(rotations >= 2, `${rotations} rotations`);
    for (const trace of [forward, backward]) {
      assert.ok(lost(trace) <= MAX_LOST_PER_ROTATION * rotations, describeLoss(trace));
      assert.ok(longestGapS(trace) <= 1, describeLoss(trace));
    }
    await assertConverged(node, firstKey, 20_000);
    assertKeyFile(node);
  });
});
