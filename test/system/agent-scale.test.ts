/**
 * The agent-scale run's quick variant (bench/suite/agent-scale.ts) in the default suite: one real
 * agent and its real data plane, 500 simulated Nodes (one in ten behind NAT), then changes at
 * 10/s (Nodes added and deleted, a listen-port changed, a key rotated, a NAT mapping moved).
 * Correctness only: every change reaches the data plane, and afterwards the data plane holds
 * exactly the peers and allowed IPs the Nodes describe (nothing lost, nothing left over, no
 * allowed IP on two peers). The timings belong to the bench (`roamguard bench --agent-scale`).
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { AGENT_SCALE_DEFAULTS, runAgentScale } from '../../bench/suite/agent-scale.ts';
import { requireDaemonPrerequisites } from './userspace-wg.ts';

test('500 Nodes with churn: every change lands in the data plane, nothing lost or duplicated', { timeout: 150_000 }, async () => {
  await requireDaemonPrerequisites(['roamguard-node'], ['nft']);
  const result = await runAgentScale({
    ...AGENT_SCALE_DEFAULTS, nodes: 500, steadySeconds: 3, churnRate: 10, churnSeconds: 12, pollIntervalMs: 100,
    startTimeoutMs: 60_000, settleTimeoutMs: 20_000, seed: 500,
  }, (line) => process.stderr.write(`${line}\n`));

  // Startup: exactly the 500 simulated peers (50 behind NAT, at their observed mappings).
  assert.equal(result.natNodes, 50);
  // 120 changes, every kind made.
  assert.equal(result.churn.changes, 120, `changes made: ${JSON.stringify(result.churn.byKind)}; ${result.notes.join('; ')}`);
  for (const kind of ['add', 'delete', 'port', 'rotate', 'remap']) assert.ok((result.churn.byKind[kind] ?? 0) >= 20, `${kind} changes: ${result.churn.byKind[kind]}`);
  assert.deepEqual(result.lost, [], 'changes that never reached the data plane');
  assert.equal(result.churn.landed, result.churn.changes);
  const f = result.final;
  assert.deepEqual({ missing: f.missing, extra: f.extra, wrong: f.wrong, duplicatedAllowedIps: f.duplicatedAllowedIps }, { missing: [], extra: [], wrong: [], duplicatedAllowedIps: [] });
  // As many adds as deletes: the cluster is back at 500 peers, and the data plane agrees.
  assert.equal(f.expectedPeers, 500 + (result.churn.byKind.add ?? 0) - (result.churn.byKind.delete ?? 0));
  assert.equal(f.seenPeers, f.expectedPeers);
});
