// The machine's kubectl against the lab API server (what `roamguard demo` prints a KUBECONFIG
// for): discovery, get (plain, wide, yaml, watch), describe, annotate, label, create -f, delete.
// Server-side printing is also checked piece by piece (lab/kube-table.ts).
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execFile, spawn } from 'node:child_process';
import { KubeApiServer, kubeConfigFor, type KubeNode } from '../../lab/kube-api-server.ts';
import { humanAge, nodeCells, nodeTable, tableVersionAccepted } from '../../lab/kube-table.ts';

const KUBECTL = '/usr/bin/kubectl';

describe('server-side printing (Table)', () => {
  test('Accept negotiation as kubectl sends it; plain JSON otherwise', () => {
    const kubectlAccept = 'application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json';
    assert.equal(tableVersionAccepted(kubectlAccept), 'meta.k8s.io/v1');
    assert.equal(tableVersionAccepted('application/json;as=Table;v=v1beta1;g=meta.k8s.io'), 'meta.k8s.io/v1beta1');
    assert.equal(tableVersionAccepted('application/json'), undefined);
    assert.equal(tableVersionAccepted('application/json, application/json;as=Table;v=v1;g=meta.k8s.io'), undefined);
    assert.equal(tableVersionAccepted(undefined), undefined);
    assert.equal(tableVersionAccepted('application/json;as=Table;v=v2;g=meta.k8s.io'), undefined);
  });

  test('ages as kube-apiserver prints them', () => {
    const s = 1000;
    assert.deepEqual([5 * s, 119 * s, 200 * s, 600 * s, 3 * 3600 * s, 5 * 3600 * s + 180 * s, 20 * 3600 * s, 3 * 86400 * s + 4 * 3600 * s, 40 * 86400 * s, 800 * 86400 * s].map(humanAge),
      ['5s', '119s', '3m20s', '10m', '3h', '5h3m', '20h', '3d4h', '40d', '2y']);
  });

  const base: KubeNode = {
    apiVersion: 'v1', kind: 'Node',
    metadata: { name: 'o1', uid: 'u', resourceVersion: '7', creationTimestamp: '2026-12-01T08:00:00Z', labels: { 'node-role.kubernetes.io/office': '', 'kubernetes.io/role': 'edge' } },
    spec: { unschedulable: true },
    status: {
      conditions: [{ type: 'Ready', status: 'False' }],
      addresses: [{ type: 'InternalIP', address: '192.168.1.11' }, { type: 'ExternalIP', address: '203.0.113.10' }],
      nodeInfo: { kubeletVersion: 'lab', osImage: 'Debian', kernelVersion: '6.1', containerRuntimeVersion: 'cni' },
    },
  };

  test('cells: Ready condition, roles, age, version, addresses, node info', () => {
    assert.deepEqual(nodeCells(base, Date.parse('2026-12-01T08:00:42Z')),
      ['o1', 'NotReady,SchedulingDisabled', 'edge,office', '42s', 'lab', '192.168.1.11', '203.0.113.10', 'Debian', '6.1', 'cni']);
    const bare: KubeNode = { apiVersion: 'v1', kind: 'Node', metadata: { name: 'x', uid: 'u', resourceVersion: '1', creationTimestamp: '2026-12-01T08:00:00Z' } };
    assert.deepEqual(nodeCells(bare, Date.parse('2026-12-01T08:00:00Z')), ['x', 'Unknown', '<none>', '0s', '', '<none>', '<none>', '<unknown>', '<unknown>', '<unknown>']);
  });

  test('rows carry the object as kubectl asked (metadata by default)', () => {
    const t = nodeTable([base], { version: 'meta.k8s.io/v1', resourceVersion: '7', include: 'Metadata' }) as { rows: Array<{ object: { kind: string; metadata: { name: string } } }>; columnDefinitions: unknown[] };
    assert.equal(t.columnDefinitions.length, 10);
    assert.equal(t.rows[0].object.kind, 'PartialObjectMetadata');
    assert.equal(t.rows[0].object.metadata.name, 'o1');
    const full = nodeTable([base], { version: 'meta.k8s.io/v1', include: 'Object' }) as { rows: Array<{ object: { kind: string } }> };
    assert.equal(full.rows[0].object.kind, 'Node');
    const none = nodeTable([base], { version: 'meta.k8s.io/v1', include: 'None' }) as { rows: Array<{ object?: unknown }> };
    assert.equal(none.rows[0].object, undefined);
  });
});

describe('kubectl against the lab API server', () => {
  let server: KubeApiServer;
  let dir: string;
  let kubeconfig: string;

  before(async () => {
    server = new KubeApiServer();
    await server.start();
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'roamguard-kubectl-'));
    kubeconfig = path.join(dir, 'kubeconfig');
    fs.writeFileSync(kubeconfig, kubeConfigFor(server.url), { mode: 0o600 });
    for (const [name, ip] of [['c1', '203.0.113.1'], ['o1', '192.168.1.11']]) {
      server.createNode({
        metadata: { name, labels: { 'kubernetes.io/hostname': name }, annotations: { 'roamguard.io/public-key': `key-of-${name}` } },
        spec: { podCIDR: '10.244.1.0/24', podCIDRs: ['10.244.1.0/24'] },
        status: { addresses: [{ type: 'InternalIP', address: ip }], conditions: [{ type: 'Ready', status: 'True' }], nodeInfo: { kubeletVersion: 'lab' } },
      });
    }
  });
  after(async () => {
    await server.close();
    fs.rmSync(dir, { recursive: true, force: true });
  });

  const env = () => ({ ...process.env, HOME: dir, KUBECONFIG: kubeconfig });
  // Asynchronously: the server answers from this process's event loop.
  const kubectl = (...args: string[]) => new Promise<{ status: number; stdout: string; stderr: string }>((resolve) => {
    execFile(KUBECTL, ['--cache-dir', path.join(dir, 'cache'), ...args], { encoding: 'utf8', timeout: 60_000, env: env() },
      (err, stdout, stderr) => resolve({ status: err ? Number((err as { code?: number }).code ?? 1) || 1 : 0, stdout, stderr }));
  });
  const ok = async (...args: string[]) => {
    const r = await kubectl(...args);
    assert.equal(r.status, 0, `kubectl ${args.join(' ')}: ${r.stderr}`);
    assert.doesNotMatch(r.stderr, /couldn't get current server API group list|Unhandled Error/);
    return r.stdout;
  };

  test('get nodes: the columns kubectl prints for a real cluster, -o wide, -o yaml', async () => {
    assert.match(await ok('get', 'nodes'), /^NAME +STATUS +ROLES +AGE +VERSION\nc1 +Ready +<none> +\d+s +lab\no1 +Ready/);
    assert.match(await ok('get', 'nodes', '-o', 'wide'), /^NAME +STATUS +ROLES +AGE +VERSION +INTERNAL-IP +EXTERNAL-IP +OS-IMAGE +KERNEL-VERSION +CONTAINER-RUNTIME\nc1 +Ready +<none> +\d+s +lab +203\.0\.113\.1 +<none>/);
    const yaml = await ok('get', 'node', 'o1', '-o', 'yaml');
    assert.match(yaml, /^apiVersion: v1\nkind: Node\n/);
    assert.match(yaml, /roamguard\.io\/public-key: key-of-o1/);
    assert.match(await ok('get', 'no', '--show-labels'), /kubernetes\.io\/hostname=c1/);
    assert.match(await ok('api-resources'), /^nodes +no +v1 +false +Node$/m);
  });

  test('describe node', async () => {
    const text = await ok('describe', 'node', 'c1');
    assert.match(text, /^Name: +c1$/m);
    assert.match(text, /Annotations: +roamguard\.io\/public-key: key-of-c1/);
    assert.match(text, /InternalIP: +203\.0\.113\.1/);
    assert.match(text, /PodCIDRs: +10\.244\.1\.0\/24/);
    assert.match(text, /Non-terminated Pods: +\(0 in total\)/);
  });

  test('annotate and label, then remove them', async () => {
    assert.match(await ok('annotate', 'node', 'o1', 'roamguard.io/force-endpoint=203.0.113.10:40000'), /node\/o1 annotated/);
    assert.equal(server.getNode('o1')!.metadata.annotations!['roamguard.io/force-endpoint'], '203.0.113.10:40000');
    await ok('label', 'node', 'o1', 'node-role.kubernetes.io/office=');
    assert.match(await ok('get', 'node', 'o1'), /o1 +Ready +office/);
    await ok('annotate', 'node', 'o1', 'roamguard.io/force-endpoint-');
    await ok('label', 'node', 'o1', 'node-role.kubernetes.io/office-');
    assert.equal(server.getNode('o1')!.metadata.annotations!['roamguard.io/force-endpoint'], undefined);
    assert.equal(server.getNode('o1')!.metadata.labels!['node-role.kubernetes.io/office'], undefined);
  });

  test('create -f (validated by the server: an unknown field is refused), then delete', async () => {
    const file = path.join(dir, 'x1.yaml');
    fs.writeFileSync(file, 'apiVersion: v1\nkind: Node\nmetadata:\n  name: x1\n  annotations:\n    roamguard.io/public-key: key-of-x1\nspec:\n  podCIDRs: ["10.244.9.0/24"]\n');
    assert.match(await ok('create', '-f', file), /node\/x1 created/);
    assert.equal(server.getNode('x1')!.metadata.annotations!['roamguard.io/public-key'], 'key-of-x1');
    const bad = path.join(dir, 'bad.yaml');
    fs.writeFileSync(bad, 'apiVersion: v1\nkind: Node\nmetadata:\n  name: x2\nspecc: {}\n');
    const refused = await kubectl('create', '-f', bad);
    assert.notEqual(refused.status, 0);
    assert.match(refused.stderr, /strict decoding error: unknown field "specc"/);
    assert.equal(server.getNode('x2'), undefined);
    assert.match(await ok('delete', 'node', 'x1'), /node "x1" deleted/);
    assert.equal(server.getNode('x1'), undefined);
    const missing = await kubectl('delete', 'node', 'x1');
    assert.match(missing.stderr, /Error from server \(NotFound\): nodes "x1" not found/);
  });

  test('get nodes -w prints each change as a row', async () => {
    const child = spawn(KUBECTL, ['--cache-dir', path.join(dir, 'cache'), 'get', 'nodes', '-w'], { env: env(), stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (c: Buffer) => { out += c.toString(); });
    child.stderr.on('data', (c: Buffer) => { out += c.toString(); });
    const until = async (re: RegExp) => {
      const start = Date.now();
      while (!re.test(out)) {
        if (Date.now() - start > 20_000 || child.exitCode !== null) assert.fail(`kubectl get -w never printed ${re}:\n${out}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    };
    try {
      await until(/^o1 +Ready/m);
      server.updateNode('c1', (n) => { n.metadata.labels = { ...n.metadata.labels, 'node-role.kubernetes.io/cloud': '' }; });
      await until(/^c1 +Ready +cloud/m);
      server.updateNode('o1', (n) => { n.status = { ...n.status, conditions: [{ type: 'Ready', status: 'False' }] }; });
      await until(/^o1 +NotReady/m);
      server.createNode({ metadata: { name: 'w1' } });
      await until(/^w1 +Unknown/m);
      assert.equal((out.match(/^NAME +STATUS/mg) ?? []).length, 1, 'one header');
    } finally {
      child.kill('SIGTERM');
    }
  });
});
