/**
 * Agents run with the identities deploy/roamguard.yaml gives them (lab World `identities`: https,
 * a token per agent bound to its node, the manifest's ValidatingAdmissionPolicy enforced by the
 * lab API server): the agents' own publishing passes the policy and the mesh forms; a token stolen
 * from node-1 cannot rewrite node-2's key or endpoint, and pod traffic is unaffected.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { CoreV1Api, PatchStrategy, setHeaderOptions } from '@kubernetes/client-node';
import { World, type Pod, type WorldNode } from '../../lab/world.ts';
import { Scope, waitFor } from './netns.ts';
import { assertPing, requireDaemonPrerequisites } from './userspace-wg.ts';

const LAN = { name: 'lan', ipv4: '10.78.0.0/24', ipv6: 'fd78::/64' };
const scope = new Scope();
let world: World;
const pods: Pod[] = [];

before(async () => {
  await requireDaemonPrerequisites(['roamguard-node'], ['nft']);
  world = await World.create(scope, { backbone: LAN, identities: true });
  for (const i of [1, 2]) await world.addNode(`node-${i}`, LAN.name, i, { podCidrs: [`10.245.${i}.0/24`, `fd00:245:${i}::/64`] });
});
after(async () => { await scope.cleanup(); });

const node = (i: number): WorldNode => world.nodes[i - 1];

describe('agents with node-bound tokens under the deploy/ admission policy', { timeout: 300_000 }, () => {
  test('each agent publishes its own annotations through the policy and the two mesh; pods reach each other', async (t) => {
    assert.match(world.apiUrl, /^https:/);
    for (const n of world.nodes) {
      assert.ok(n.token && n.env.KUBECONFIG, `${n.name} has its own token`);
      await world.startAgent(n);
    }
    for (const n of world.nodes) {
      await waitFor(() => world.publicKeyOf(n) !== undefined, 60_000, { description: `${n.name} to publish its key` });
      await waitFor(async () => (await world.wgPeers(n)).size === 1, 60_000, { description: `${n.name} to have its peer` });
    }
    // Everything the agent publishes about itself got through the policy.
    for (const n of world.nodes) {
      const annotations = world.api.getNode(n.name)!.metadata.annotations ?? {};
      for (const key of ['roamguard.io/public-key', 'roamguard.io/listen-port', 'roamguard.io/pod-cidrs']) {
        assert.ok(annotations[key], `${n.name} published ${key} through the policy: ${JSON.stringify(annotations)}`);
      }
    }
    // A refused request on the way there (one clean-clone run of the whole suite saw one; alone
    // the test never does) is shown, so that its cause can be read next time.
    const refused = world.nodes.flatMap((n) => n.agent!.stderr.split('\n').filter((l) => /403|Forbidden|is invalid/.test(l)).map((l) => `${n.name}: ${l.slice(0, 400)}`));
    for (const line of refused) t.diagnostic(`refused on the way: ${line}`);
    for (const n of world.nodes) pods.push(await world.addPod(n));
    await assertPing(pods[0].ns, pods[1].ipv4, { count: 2, deadlineS: 10 }, 'node-1 pod → node-2 pod');
    await assertPing(pods[1].ns, pods[0].ipv6, { count: 2, deadlineS: 10 }, 'node-2 pod → node-1 pod (IPv6)');
  });

  test('node-1\'s stolen token cannot rewrite node-2\'s key or endpoint; traffic is unaffected', async () => {
    const before = world.api.getNode('node-2')!.metadata.annotations;
    const stolen = world.api.kubeConfig(node(1).token).makeApiClient(CoreV1Api);
    const attack = { metadata: { annotations: { 'roamguard.io/public-key': 'AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=', 'roamguard.io/force-endpoint': `${node(1).ipv4}:51820` } } };
    const err = await stolen.patchNode({ name: 'node-2', body: attack }, setHeaderOptions('Content-Type', PatchStrategy.MergePatch)).then(() => undefined, (e: unknown) => e as { code?: number; body?: string });
    assert.equal(err?.code, 403, `refused: ${JSON.stringify(err)}`);
    assert.match(String(err?.body), /may change only the Node it is bound to/);
    assert.deepEqual(world.api.getNode('node-2')!.metadata.annotations, before, 'node-2 untouched');
    // The same token still publishes for its own node (what the agent needs, nothing more).
    await stolen.patchNode({ name: 'node-1', body: { metadata: { annotations: { 'roamguard.io/test-marker': '1' } } } }, setHeaderOptions('Content-Type', PatchStrategy.MergePatch));
    await assertPing(pods[0].ns, pods[1].ipv4, { count: 2, deadlineS: 10 }, 'node-1 pod → node-2 pod after the attempt');
    assert.equal((await world.wgPeers(node(1))).get(world.publicKeyOf(node(2))!)?.endpoint, `${node(2).ipv4}:51820`);
  });
});
