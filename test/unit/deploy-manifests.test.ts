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
import { ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding } from 'kubernetes-models/admissionregistration.k8s.io/v1';
import { Namespace, ServiceAccount } from 'kubernetes-models/v1';
import { SETTINGS } from '../../control/config/settings.ts';
import { parseListenAddress } from '../../control/metrics/server.ts';
import { HOST_PROC_SYS_NET } from '../../control/host/sysctl.ts';
import { admit, type AdmissionRequest, type ValidatingAdmissionPolicy as Policy } from '../../lab/admission-policy.ts';

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
    assert.deepEqual(docs.map((d) => d.kind), ['Namespace', 'ServiceAccount', 'ClusterRole', 'ClusterRoleBinding', 'ValidatingAdmissionPolicy', 'ValidatingAdmissionPolicyBinding', 'DaemonSet']);
    const models = { Namespace, ServiceAccount, ClusterRole, ClusterRoleBinding, ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding, DaemonSet } as Record<string, new (d: unknown) => { validate(): void }>;
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
    const volumes = new Map(pod.volumes.filter((v: { hostPath?: unknown }) => v.hostPath).map((v: { name: string; hostPath: { path: string } }) => [v.name, v.hostPath.path]));
    assert.deepEqual([...volumes.values()].sort(), ['/dev/net/tun', '/etc/cni/net.d', '/opt/cni/bin', '/proc/sys/net', '/var/lib/roamguard', '/var/run/wireguard']);
    const mounts = (c: { volumeMounts: Array<{ name: string; mountPath: string }> }) => Object.fromEntries(c.volumeMounts.filter((m) => volumes.has(m.name)).map((m) => [volumes.get(m.name), m.mountPath]));
    assert.deepEqual(mounts(agent), { '/var/lib/roamguard': '/var/lib/roamguard', '/var/run/wireguard': '/var/run/wireguard', '/etc/cni/net.d': '/etc/cni/net.d', '/opt/cni/bin': '/opt/cni/bin', '/proc/sys/net': HOST_PROC_SYS_NET });
    assert.deepEqual(mounts(dataplane), { '/var/run/wireguard': '/var/run/wireguard', '/dev/net/tun': '/dev/net/tun' });
    // The paths the agent uses by default are under the mounts.
    const env = (n: string) => agent.env.find((e: { name: string }) => e.name === n).value as string;
    assert.ok(env('PRIVATE_KEY_PATH').startsWith('/var/lib/roamguard/'));
    assert.ok(env('CNI_CONFIG_PATH').startsWith('/etc/cni/net.d/'));
    assert.equal(env('WG_SOCKET_DIR'), '/var/run/wireguard');
    for (const c of [agent, dataplane]) assert.ok(c.resources.requests.cpu && c.resources.requests.memory, `${c.name} requests`);
  });

  test('least privilege: no privileged container, NET_ADMIN only (and NET_RAW for the agent\'s path-MTU pings), seccomp, read-only roots, the token in the agent only', () => {
    assert.equal(pod.automountServiceAccountToken, false, 'no token in every container');
    assert.deepEqual(pod.securityContext.seccompProfile, { type: 'RuntimeDefault' });
    for (const c of pod.containers) {
      assert.deepEqual(c.securityContext, {
        privileged: false,
        allowPrivilegeEscalation: false,
        readOnlyRootFilesystem: true,
        capabilities: { drop: ['ALL'], add: c.name === 'agent' ? ['NET_ADMIN', 'NET_RAW'] : ['NET_ADMIN'] },
        seccompProfile: { type: 'RuntimeDefault' },
      }, c.name);
      // A read-only root: scratch space on an emptyDir.
      const tmp = c.volumeMounts.find((m: { mountPath: string }) => m.mountPath === '/tmp');
      assert.ok(pod.volumes.find((v: { name: string; emptyDir?: unknown }) => v.name === tmp?.name)?.emptyDir, `${c.name} /tmp is an emptyDir`);
    }
    // The TUN device, as a character device, only where the data plane is.
    assert.deepEqual(pod.volumes.find((v: { name: string }) => v.name === 'tun').hostPath, { path: '/dev/net/tun', type: 'CharDevice' });
    // The service account token: projected (bound to the pod, so it names the node), in the agent
    // container only, where client-node's in-cluster loading looks for it.
    const projected = pod.volumes.filter((v: { projected?: { sources: Array<Record<string, unknown>> } }) => v.projected?.sources.some((s) => s.serviceAccountToken));
    assert.equal(projected.length, 1);
    const [tokenVolume] = projected;
    assert.deepEqual(tokenVolume.projected.sources.map((s: Record<string, unknown>) => Object.keys(s)[0]), ['serviceAccountToken', 'configMap', 'downwardAPI']);
    assert.equal(tokenVolume.projected.sources[0].serviceAccountToken.path, 'token');
    assert.equal(tokenVolume.projected.defaultMode, 0o400, 'readable by root only');
    assert.equal(tokenVolume.projected.sources[1].configMap.items[0].path, 'ca.crt');
    const holders = pod.containers.filter((c: { volumeMounts: Array<{ name: string }> }) => c.volumeMounts.some((m) => m.name === tokenVolume.name));
    assert.deepEqual(holders.map((c: { name: string }) => c.name), ['agent']);
    const mount = container('agent').volumeMounts.find((m: { name: string }) => m.name === tokenVolume.name);
    assert.deepEqual(mount, { name: tokenVolume.name, mountPath: '/var/run/secrets/kubernetes.io/serviceaccount', readOnly: true });
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

describe('the admission policy: the roamguard token changes only its own Node\'s roamguard.io/* annotations', () => {
  const [policy] = byKind('ValidatingAdmissionPolicy') as Policy[];
  const [binding] = byKind('ValidatingAdmissionPolicyBinding');
  const AGENT = 'system:serviceaccount:roamguard:roamguard';
  interface SampleNode {
    apiVersion: string;
    kind: string;
    metadata: { name: string; uid: string; resourceVersion: string; labels: Record<string, string>; annotations: Record<string, string>; finalizers?: string[] };
    spec: { podCIDR: string; podCIDRs: string[]; unschedulable?: boolean };
    status: { addresses: Array<{ type: string; address: string }>; conditions: Array<{ type: string; status: string }> };
  }
  const node = (name: string, annotations: Record<string, string> = {}): SampleNode => ({
    apiVersion: 'v1',
    kind: 'Node',
    metadata: { name, uid: `uid-${name}`, resourceVersion: '7', labels: { 'kubernetes.io/hostname': name }, annotations: { 'node.alpha.kubernetes.io/ttl': '0', 'roamguard.io/public-key': 'old-key', ...annotations } },
    spec: { podCIDR: '10.244.1.0/24', podCIDRs: ['10.244.1.0/24', 'fd00:244:1::/64'] },
    status: { addresses: [{ type: 'InternalIP', address: '192.0.2.1' }], conditions: [{ type: 'Ready', status: 'True' }] },
  });
  /** An update of node `name` by `username` (token bound to `boundTo`), changing the copy with `change`. */
  const update = (name: string, change: (n: SampleNode) => void, user: { username?: string; boundTo?: string | null } = {}): AdmissionRequest => {
    const oldObject = node(name);
    const object = structuredClone(oldObject);
    change(object);
    const boundTo = user.boundTo === undefined ? name : user.boundTo;
    return {
      operation: 'UPDATE', resource: 'nodes', name, object, oldObject,
      userInfo: {
        username: user.username ?? AGENT,
        groups: ['system:serviceaccounts', 'system:serviceaccounts:roamguard', 'system:authenticated'],
        extra: boundTo === null ? {} : { 'authentication.kubernetes.io/node-name': [boundTo], 'authentication.kubernetes.io/pod-name': ['roamguard-x1'] },
      },
    };
  };
  const publish = (n: SampleNode) => { n.metadata.annotations['roamguard.io/public-key'] = 'new-key'; n.metadata.annotations['roamguard.io/force-endpoint'] = '198.51.100.9:51820'; };
  const decide = (request: AdmissionRequest) => admit(policy, request, binding.metadata.name);

  test('the binding denies on the policy, which fails closed and applies to the agents\' service account only', () => {
    assert.deepEqual(binding.spec, { policyName: policy.metadata.name, validationActions: ['Deny'] });
    assert.equal(policy.spec.failurePolicy, 'Fail');
    assert.deepEqual(policy.spec.matchConditions!.map((c) => c.expression), [`request.userInfo.username == '${AGENT}'`]);
    const [sa] = byKind('ServiceAccount');
    assert.equal(AGENT, `system:serviceaccount:${sa.metadata.namespace}:${sa.metadata.name}`);
  });

  test('own node, roamguard.io/* annotations set or removed: allowed', () => {
    assert.deepEqual(decide(update('node-a', publish)), { matched: true, allowed: true });
    assert.deepEqual(decide(update('node-a', (n) => { delete n.metadata.annotations['roamguard.io/public-key']; })), { matched: true, allowed: true });
    assert.deepEqual(decide(update('node-a', () => {})), { matched: true, allowed: true }, 'a no-op patch');
  });

  test('another node: denied (Forbidden), even for roamguard.io/* annotations', () => {
    const decision = decide(update('node-b', publish, { boundTo: 'node-a' }));
    assert.equal(decision.matched && !decision.allowed && decision.reason, 'Forbidden');
    assert.match((decision as { message: string }).message, /^ValidatingAdmissionPolicy 'roamguard-own-node' with binding 'roamguard-own-node' denied request: a roamguard token may change only the Node it is bound to/);
  });

  test('a token without the node-name claim, or with two: denied', () => {
    for (const request of [update('node-a', publish, { boundTo: null }), (() => { const r = update('node-a', publish); delete r.userInfo.extra; return r; })(),
      (() => { const r = update('node-a', publish); r.userInfo.extra!['authentication.kubernetes.io/node-name'] = ['node-a', 'node-b']; return r; })()]) {
      const decision = decide(request);
      assert.equal(decision.matched && !decision.allowed && decision.reason, 'Forbidden', JSON.stringify(request.userInfo));
    }
  });

  const deniedFor = (change: (n: SampleNode) => void) => {
    const decision = decide(update('node-a', change));
    assert.ok(decision.matched && !decision.allowed, 'denied');
    return decision.message;
  };

  test('labels, foreign annotations, finalizers, owner references: denied on the own node too', () => {
    assert.match(deniedFor((n) => { n.metadata.labels['node-role.kubernetes.io/control-plane'] = ''; }), /labels/);
    assert.match(deniedFor((n) => { n.metadata.labels = undefined as unknown as Record<string, string>; }), /labels/);
    assert.match(deniedFor((n) => { n.metadata.annotations['flannel.alpha.coreos.com/public-ip'] = '203.0.113.1'; }), /only roamguard\.io\/\* annotations/);
    assert.match(deniedFor((n) => { n.metadata.annotations['node.alpha.kubernetes.io/ttl'] = '30'; }), /only roamguard\.io\/\* annotations/);
    assert.match(deniedFor((n) => { delete n.metadata.annotations['node.alpha.kubernetes.io/ttl']; }), /only roamguard\.io\/\* annotations/);
    // A prefix that only looks like ours.
    assert.match(deniedFor((n) => { n.metadata.annotations['roamguard.io.evil/x'] = '1'; }), /only roamguard\.io\/\* annotations/);
    assert.match(deniedFor((n) => { n.metadata.finalizers = ['example.com/hold']; }), /finalizers/);
  });

  test('spec and status: denied on the own node too', () => {
    assert.match(deniedFor((n) => { n.spec.podCIDRs = ['10.0.0.0/8']; }), /spec or status/);
    assert.match(deniedFor((n) => { n.spec.unschedulable = true; }), /spec or status/);
    assert.match(deniedFor((n) => { n.status.addresses[0].address = '192.0.2.66'; }), /spec or status/);
  });

  test('create and delete: denied; requests by other users or on other resources: not matched', () => {
    for (const operation of ['CREATE', 'DELETE'] as const) {
      const request = { ...update('node-a', () => {}), operation };
      if (operation === 'DELETE') request.object = null;
      if (operation === 'CREATE') request.oldObject = null;
      const decision = decide(request);
      assert.equal(decision.matched && !decision.allowed && decision.reason, 'Forbidden', operation);
    }
    assert.deepEqual(decide(update('node-b', (n) => { n.spec.podCIDRs = []; }, { username: 'system:node:node-b', boundTo: null })), { matched: false });
    assert.deepEqual(decide(update('node-b', publish, { username: 'system:serviceaccount:kube-system:roamguard', boundTo: 'node-a' })), { matched: false }, 'same name, other namespace');
    assert.deepEqual(decide({ ...update('node-a', publish), resource: 'pods' }), { matched: false });
    // The status subresource is covered too.
    assert.equal(decide({ ...update('node-b', publish, { boundTo: 'node-a' }), resource: 'nodes/status' }).matched, true);
  });

  test('fails closed: an expression that errors denies', () => {
    const broken = structuredClone(policy);
    broken.spec.validations[1].expression = 'variables.boundNode[5] == request.name';
    const decision = admit(broken, update('node-a', publish));
    assert.ok(decision.matched && !decision.allowed && /resulted in error/.test(decision.message));
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
    assert.match(dockerfile, /apt-get install -y --no-install-recommends nftables iproute2 iputils-ping libsodium23/);
    assert.match(dockerfile, /^ENV ROAMGUARD_RUNTIME=\$\{RUNTIME\}/m);
    // The script picks from the whole checkout, with the installed node_modules of the stage.
    assert.match(dockerfile, /^COPY package\.json package-lock\.json \.\/\n((COPY |#)[^\n]*\n)*RUN npm ci /m);
    assert.match(dockerfile, /^COPY \. \.$/m);
    const ignored = readFileSync(join(ROOT, '.dockerignore'), 'utf8').split('\n').filter(Boolean);
    assert.deepEqual(ignored.filter((p) => /^\/?(bin|dataplane|control|bench|lab|test|scripts|deploy)\/?(\*\*?)?$/.test(p)), [], 'no source directory ignored');
  });
});
