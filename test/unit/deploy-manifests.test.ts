/**
 * deploy/roamguard.yaml against the Kubernetes schemas (kubernetes-models' validators) and
 * against the agent: every setting the agent reads (SETTINGS) is in the agent container's env
 * with its default and a comment, and nothing else is; the RBAC is Nodes only; the DaemonSet has
 * what a node network needs (host network, tolerations, host paths, the data plane in its own
 * container, probes on the metrics port). Also the Dockerfile's use of the tree-building script.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { isDeepStrictEqual } from 'node:util';
import { dumpYaml, loadAllYaml } from '@kubernetes/client-node';
import { parse, parseAllDocuments } from 'yaml';
import { DaemonSet } from 'kubernetes-models/apps/v1';
import { ClusterRole, ClusterRoleBinding } from 'kubernetes-models/rbac.authorization.k8s.io/v1';
import { Namespace, ServiceAccount } from 'kubernetes-models/v1';
import { SETTINGS } from '../../control/config/settings.ts';
import { parseListenAddress } from '../../control/metrics/server.ts';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '../..');
const MANIFEST = join(ROOT, 'deploy/roamguard.yaml');
const text = readFileSync(MANIFEST, 'utf8');
const parsed = parseAllDocuments(text);
// Plain JSON objects, exactly as written (a typo'd field stays, so the schema check sees it).
const docs = (Array.isArray(parsed) ? parsed : [parsed]).map((d) => {
  if (d.errors.length > 0) throw new Error(`${MANIFEST}: ${d.errors[0].message}`);
  return d.toJS();
}).filter((d) => d !== null && d !== undefined) as Array<Record<string, any>>;
/**
 * Fields the Kubernetes API does not know. The schemas above accept any extra property (as the API
 * server's own validation does, silently dropping them), so a typo'd field would pass: the typed
 * round trip through client-node's models drops unknown fields, and any difference names one.
 */
function unknownFields(manifest: string): string[] {
  const raw = parseAllDocuments(manifest).map((d) => d.toJS());
  return loadAllYaml(manifest).flatMap((typed, i) => (isDeepStrictEqual(parse(dumpYaml(typed)), raw[i]) ? [] : [`${raw[i].kind} ${raw[i].metadata?.name}`]));
}
const byKind = (kind: string) => docs.filter((d) => d.kind === kind);
const daemonSet = byKind('DaemonSet')[0];
const pod = daemonSet?.spec?.template?.spec;
const container = (name: string) => (pod?.containers ?? []).find((c: { name: string }) => c.name === name);

/** Values deliberately different from the setting's default, and why. */
const OVERRIDES: Record<string, unknown> = {
  NODE_NAME: { valueFrom: { fieldRef: { fieldPath: 'spec.nodeName' } } }, // required, from the downward API
  WG_DATAPLANE: { value: 'external' }, // the "dataplane" container runs it
};

describe('deploy/roamguard.yaml', () => {
  test('exactly the expected objects, each valid against the Kubernetes schema', () => {
    assert.deepEqual(docs.map((d) => d.kind), ['Namespace', 'ServiceAccount', 'ClusterRole', 'ClusterRoleBinding', 'DaemonSet']);
    const models = { Namespace, ServiceAccount, ClusterRole, ClusterRoleBinding, DaemonSet } as Record<string, new (d: unknown) => { validate(): void }>;
    for (const doc of docs) {
      assert.doesNotThrow(() => new models[doc.kind](doc).validate(), `${doc.kind} ${doc.metadata?.name}`);
    }
    assert.deepEqual(unknownFields(text), [], 'no field the API does not know (typos)');
    for (const doc of docs.filter((d) => d.kind === 'ServiceAccount' || d.kind === 'DaemonSet')) assert.equal(doc.metadata.namespace, 'roamguard');
  });

  test('the validator catches a broken manifest (so the test above can fail)', () => {
    assert.deepEqual(unknownFields(text.replace('hostNetwork: true', 'hostNetwork: true\n      hostNetwrok: true')), ['DaemonSet roamguard']);
    const broken = structuredClone(daemonSet);
    broken.spec.template.spec.containers[0].ports[0].containerPort = 'metrics';
    assert.throws(() => new DaemonSet(broken).validate(), /containerPort/);
    const noSelector = structuredClone(daemonSet);
    delete noSelector.spec.selector;
    assert.throws(() => new DaemonSet(noSelector).validate(), /selector/);
  });

  test('RBAC: get, list, watch and patch on Nodes, nothing else, bound to the pods\' service account', () => {
    const [role] = byKind('ClusterRole');
    assert.deepEqual(role.rules, [{ apiGroups: [''], resources: ['nodes'], verbs: ['get', 'list', 'watch', 'patch'] }]);
    const [binding] = byKind('ClusterRoleBinding');
    assert.deepEqual(binding.roleRef, { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: role.metadata.name });
    const [sa] = byKind('ServiceAccount');
    assert.deepEqual(binding.subjects, [{ kind: 'ServiceAccount', name: sa.metadata.name, namespace: sa.metadata.namespace }]);
    assert.equal(pod.serviceAccountName, sa.metadata.name);
  });

  test('the agent container\'s env is exactly SETTINGS: no missing, no unknown, defaults, one comment each', () => {
    const env = container('agent').env as Array<{ name: string; value?: string; valueFrom?: unknown }>;
    const names = env.map((e) => e.name);
    assert.equal(new Set(names).size, names.length, 'no duplicates');
    const settings = Object.keys(SETTINGS);
    assert.deepEqual(settings.filter((n) => !names.includes(n)), [], 'settings missing from the manifest');
    assert.deepEqual(names.filter((n) => !settings.includes(n)), [], 'env names the agent does not read');
    assert.deepEqual(names, settings, 'in the documentation order');
    for (const entry of env) {
      const spec = SETTINGS[entry.name as keyof typeof SETTINGS];
      const { name, ...rest } = entry;
      assert.deepEqual(rest, OVERRIDES[name] ?? { value: spec.default }, name);
      // The line before `- name: X` is a comment.
      const lines = text.split('\n');
      const at = lines.findIndex((l) => l.trim() === `- name: ${name}`);
      assert.match(lines[at - 1], /^\s*# \S/, `${name} has a comment`);
      if (!(name in OVERRIDES)) assert.ok(lines[at - 1].includes(`(default: ${spec.default === '' ? 'empty' : spec.default})`), `${name}'s comment names its default`);
    }
  });

  test('a node network: host network, every node, host paths, the data plane in its own container', () => {
    assert.equal(pod.hostNetwork, true);
    assert.deepEqual(pod.tolerations, [{ operator: 'Exists' }]);
    const agent = container('agent');
    const dataplane = container('dataplane');
    assert.deepEqual(pod.containers.map((c: { name: string }) => c.name), ['agent', 'dataplane']);
    assert.equal(agent.image, dataplane.image, 'one image');
    assert.deepEqual(agent.args, ['agent']);
    const ifname = agent.env.find((e: { name: string }) => e.name === 'WG_INTERFACE').value;
    assert.deepEqual(dataplane.args, ['wg', '-f', ifname]);
    // The probe sees a stalled pipeline, not only an answering socket (bin/commands/health.ts).
    assert.deepEqual(dataplane.livenessProbe.exec.command, ['roamguard', 'health', '--max-stall', '10', ifname]);
    assert.equal(agent.securityContext.privileged, true);
    assert.ok(dataplane.securityContext.privileged === true || dataplane.securityContext.capabilities.add.includes('NET_ADMIN'));
    const volumes = new Map(pod.volumes.map((v: { name: string; hostPath: { path: string } }) => [v.name, v.hostPath.path]));
    assert.deepEqual([...volumes.values()].sort(), ['/dev/net/tun', '/etc/cni/net.d', '/opt/cni/bin', '/var/lib/roamguard', '/var/run/wireguard']);
    const mounts = (c: { volumeMounts: Array<{ name: string; mountPath: string }> }) => Object.fromEntries(c.volumeMounts.map((m) => [volumes.get(m.name), m.mountPath]));
    assert.deepEqual(mounts(agent), { '/var/lib/roamguard': '/var/lib/roamguard', '/var/run/wireguard': '/var/run/wireguard', '/etc/cni/net.d': '/etc/cni/net.d', '/opt/cni/bin': '/opt/cni/bin' });
    assert.deepEqual(mounts(dataplane), { '/var/run/wireguard': '/var/run/wireguard', '/dev/net/tun': '/dev/net/tun' });
    // The paths the agent uses by default are under the mounts.
    const env = (n: string) => agent.env.find((e: { name: string }) => e.name === n).value as string;
    assert.ok(env('PRIVATE_KEY_PATH').startsWith('/var/lib/roamguard/'));
    assert.ok(env('CNI_CONFIG_PATH').startsWith('/etc/cni/net.d/'));
    assert.equal(env('WG_SOCKET_DIR'), '/var/run/wireguard');
    for (const c of [agent, dataplane]) assert.ok(c.resources.requests.cpu && c.resources.requests.memory, `${c.name} requests`);
  });

  test('probes: liveness /healthz and readiness /readyz on the METRICS_ADDRESS port', () => {
    const agent = container('agent');
    const address = agent.env.find((e: { name: string }) => e.name === 'METRICS_ADDRESS').value;
    const port = agent.ports.find((p: { name: string }) => p.name === 'metrics');
    assert.equal(port.containerPort, parseListenAddress(address).port);
    assert.deepEqual(agent.livenessProbe.httpGet, { path: '/healthz', port: 'metrics' });
    assert.deepEqual(agent.readinessProbe.httpGet, { path: '/readyz', port: 'metrics' });
    assert.equal(daemonSet.spec.template.metadata.annotations['prometheus.io/port'], String(port.containerPort));
  });
});

describe('Dockerfile', () => {
  const dockerfile = readFileSync(join(ROOT, 'Dockerfile'), 'utf8');
  test('multi-stage: builds the tree with the same script the image-tree test runs; Node.js 20 or Bun', () => {
    assert.equal((dockerfile.match(/^FROM /gm) ?? []).length, 2);
    assert.match(dockerfile, /^ARG NODE_IMAGE=node:20-bookworm-slim$/m);
    assert.match(dockerfile, /^ARG RUNTIME=node$/m);
    assert.match(dockerfile, /RUN bash scripts\/build-image-tree\.sh --runtime "\$\{RUNTIME\}"/);
    assert.match(dockerfile, /^COPY --from=build \/image\/ \/$/m);
    assert.match(dockerfile, /apt-get install -y --no-install-recommends nftables iproute2 libsodium23/);
    assert.match(dockerfile, /^ENV ROAMGUARD_RUNTIME=\$\{RUNTIME\}/m);
    // The script picks from the whole checkout, with the installed node_modules of the stage.
    assert.match(dockerfile, /^COPY package\.json package-lock\.json \.\/\nRUN npm ci /m);
    assert.match(dockerfile, /^COPY \. \.$/m);
    const ignored = readFileSync(join(ROOT, '.dockerignore'), 'utf8').split('\n').filter(Boolean);
    assert.deepEqual(ignored.filter((p) => /^\/?(bin|dataplane|control|bench|lab|test|scripts|deploy)\/?(\*\*?)?$/.test(p)), [], 'no source directory ignored');
  });
});
