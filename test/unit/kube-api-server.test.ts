// The fake Kubernetes API server, driven by the real @kubernetes/client-node over HTTP, plus the
// merge patch, the annotation patch helper and kubeconfig loading that sit on top of it.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { execFile, execFileSync } from 'node:child_process';
import { createServer, type AddressInfo, type Socket } from 'node:net';
import { ApiException, CoreV1Api, KubeConfig, PatchStrategy, setHeaderOptions, Watch } from '@kubernetes/client-node';
import { KubeApiServer, applyMergePatch, kubeConfigFor, type JsonValue } from '../../lab/kube-api-server.ts';
import { NodeApiError, patchNodeAnnotations, readNode } from '../../control/kube/node-patch.ts';
import { loadKubeConfig, resolveKubeConfig, SERVICE_ACCOUNT_DIR } from '../../control/kube/kube-config.ts';
import { deployPolicyAdmission } from '../../lab/admission-policy.ts';

interface WatchLine { type: string; object: { kind?: string; code?: number; reason?: string; metadata?: { name?: string; resourceVersion?: string; labels?: Record<string, string> } } }

/** Opens a watch with the client's Watch; collects events until the stream ends. */
async function openWatch(server: KubeApiServer, query: Record<string, string | number>) {
  const events: WatchLine[] = [];
  let resolveDone!: (err: unknown) => void;
  const done = new Promise<unknown>((resolve) => { resolveDone = resolve; });
  const controller = await new Watch(server.kubeConfig()).watch('/api/v1/nodes', query,
    (type, object) => events.push({ type, object }), (err) => resolveDone(err));
  return { events, done, controller };
}

async function waitFor(what: string, predicate: () => boolean, timeoutMs = 15_000): Promise<void> {
  const start = Date.now();
  while (!predicate()) {
    if (Date.now() - start > timeoutMs) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

function withTimeout<T>(promise: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout;
  return Promise.race([
    promise.finally(() => clearTimeout(timer)),
    new Promise<never>((_, reject) => { timer = setTimeout(() => reject(new Error(`timed out: ${what}`)), ms); }),
  ]);
}

function node(name: string, annotations: Record<string, string> = {}, labels: Record<string, string> = {}) {
  return { metadata: { name, annotations, labels }, spec: { podCIDRs: ['10.244.1.0/24'] }, status: { addresses: [{ type: 'InternalIP', address: '192.0.2.1' }] } };
}

describe('JSON merge patch (RFC 7386)', () => {
  test('the RFC\'s examples', () => {
    const cases: Array<[JsonValue, JsonValue, JsonValue]> = [
      [{ a: 'b' }, { a: 'c' }, { a: 'c' }],
      [{ a: 'b' }, { b: 'c' }, { a: 'b', b: 'c' }],
      [{ a: 'b' }, { a: null }, {}],
      [{ a: 'b', b: 'c' }, { a: null }, { b: 'c' }],
      [{ a: ['b'] }, { a: 'c' }, { a: 'c' }],
      [{ a: 'c' }, { a: ['b'] }, { a: ['b'] }],
      [{ a: { b: 'c' } }, { a: { b: 'd', c: null } }, { a: { b: 'd' } }],
      [{ a: [{ b: 'c' }] }, { a: [1] }, { a: [1] }],
      [['a', 'b'], ['c', 'd'], ['c', 'd']],
      [{ a: 'b' }, ['c'], ['c']],
      [{ a: 'foo' }, null, null],
      [{ e: null }, { a: 1 }, { e: null, a: 1 }],
      [[1, 2], { a: 'b', c: null }, { a: 'b' }],
      [{}, { a: { bb: { ccc: null } } }, { a: { bb: {} } }],
    ];
    for (const [target, patch, expected] of cases) {
      const before = JSON.stringify(target);
      assert.deepEqual(applyMergePatch(target, patch), expected, `${before} + ${JSON.stringify(patch)}`);
      assert.equal(JSON.stringify(target), before, 'the target is not modified');
    }
  });
});

describe('fake Kubernetes API server with the real client', () => {
  const server = new KubeApiServer();
  let core: CoreV1Api;
  before(async () => {
    await server.start();
    core = server.kubeConfig().makeApiClient(CoreV1Api);
  });
  after(() => server.close());

  test('list and get: NodeList resourceVersion, per-object metadata, 404 as a Status', async () => {
    const a = server.createNode(node('list-a', { keep: 'x' }, { role: 'edge' }));
    server.createNode(node('list-b'));
    assert.match(a.metadata.uid, /^[0-9a-f-]{36}$/);
    assert.match(a.metadata.creationTimestamp, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$/);

    const list = await core.listNode();
    assert.equal(list.metadata?.resourceVersion, server.resourceVersion);
    const names = list.items.map((n) => n.metadata?.name);
    assert.ok(names.includes('list-a') && names.includes('list-b'));
    const listedA = list.items.find((n) => n.metadata?.name === 'list-a')!;
    assert.equal(listedA.metadata?.resourceVersion, a.metadata.resourceVersion);
    assert.ok(Number(list.metadata?.resourceVersion) >= Number(a.metadata.resourceVersion));

    const selected = await core.listNode({ labelSelector: 'role=edge' });
    assert.deepEqual(selected.items.map((n) => n.metadata?.name), ['list-a']);
    const notEdge = await core.listNode({ labelSelector: 'role!=edge' });
    assert.ok(!notEdge.items.some((n) => n.metadata?.name === 'list-a'));
    const byName = await core.listNode({ fieldSelector: 'metadata.name=list-b' });
    assert.deepEqual(byName.items.map((n) => n.metadata?.name), ['list-b']);

    const got = await core.readNode({ name: 'list-a' });
    assert.equal(got.metadata?.annotations?.keep, 'x');
    assert.deepEqual(got.spec?.podCIDRs, ['10.244.1.0/24']);

    await assert.rejects(core.readNode({ name: 'missing' }), (err: unknown) => {
      assert.ok(err instanceof ApiException);
      assert.equal(err.code, 404);
      const body = typeof err.body === 'string' ? JSON.parse(err.body) : err.body;
      assert.equal(body.kind, 'Status');
      assert.equal(body.reason, 'NotFound');
      assert.equal(body.message, 'nodes "missing" not found');
      return true;
    });
  });

  test('create, duplicate create (409 AlreadyExists), delete', async () => {
    const created = await core.createNode({ body: { metadata: { name: 'made-by-client', labels: { a: 'b' } } } });
    assert.equal(created.metadata?.name, 'made-by-client');
    assert.ok(created.metadata?.uid);
    assert.equal(server.getNode('made-by-client')?.metadata.labels?.a, 'b');
    await assert.rejects(core.createNode({ body: { metadata: { name: 'made-by-client' } } }),
      (err: unknown) => err instanceof ApiException && err.code === 409 && JSON.stringify(err.body).includes('AlreadyExists'));
    await assert.rejects(core.createNode({ body: { metadata: { name: 'Not_A_DNS_Name' } } }),
      (err: unknown) => err instanceof ApiException && err.code === 422);
    await core.deleteNode({ name: 'made-by-client' });
    assert.equal(server.getNode('made-by-client'), undefined);
    await assert.rejects(core.deleteNode({ name: 'made-by-client' }), (err: unknown) => err instanceof ApiException && err.code === 404);
  });

  test('annotation patch: merge semantics, null deletes, a PATCH with the merge-patch content type', async () => {
    server.createNode(node('patch-me', { 'other.io/keep': 'kept', 'roamguard.io/old': 'gone soon' }, { zone: 'a' }));
    server.clearRequests();
    const rvBefore = Number(server.getNode('patch-me')!.metadata.resourceVersion);

    const patched = await patchNodeAnnotations(server.kubeConfig(), 'patch-me', {
      'roamguard.io/public-key': 'abc=', 'roamguard.io/old': null,
    });
    assert.deepEqual(patched.metadata?.annotations, { 'other.io/keep': 'kept', 'roamguard.io/public-key': 'abc=' });
    const stored = server.getNode('patch-me')!;
    assert.deepEqual(stored.metadata.annotations, { 'other.io/keep': 'kept', 'roamguard.io/public-key': 'abc=' });
    assert.deepEqual(stored.metadata.labels, { zone: 'a' }, 'labels untouched');
    assert.deepEqual(stored.spec, { podCIDRs: ['10.244.1.0/24'] }, 'spec untouched');
    assert.ok(Number(stored.metadata.resourceVersion) > rvBefore);

    const writes = server.requests.filter((r) => r.method !== 'GET');
    assert.equal(writes.length, 1);
    assert.equal(writes[0].method, 'PATCH');
    assert.equal(writes[0].path, '/api/v1/nodes/patch-me');
    assert.equal(writes[0].contentType, 'application/merge-patch+json');

    // The same patch again changes nothing: no new resourceVersion (and no watch event).
    const rv = stored.metadata.resourceVersion;
    await patchNodeAnnotations(server.kubeConfig(), 'patch-me', { 'roamguard.io/public-key': 'abc=' });
    assert.equal(server.getNode('patch-me')!.metadata.resourceVersion, rv);

    const read = await readNode(server.kubeConfig(), 'patch-me');
    assert.equal(read.metadata?.annotations?.['roamguard.io/public-key'], 'abc=');
  });

  test('patch content types: JSON patch is 415, strategic merge is applied as a merge, bad JSON is 400', async () => {
    server.createNode(node('types'));
    // Without the header option the generated client sends application/json-patch+json.
    await assert.rejects(core.patchNode({ name: 'types', body: { metadata: { annotations: { x: 'y' } } } }),
      (err: unknown) => err instanceof ApiException && err.code === 415);
    const patchUrl = `${server.url}/api/v1/nodes/types`;
    const strategic = await fetch(patchUrl, {
      method: 'PATCH', headers: { 'Content-Type': 'application/strategic-merge-patch+json' },
      body: JSON.stringify({ metadata: { labels: { tier: 'x' } } }),
    });
    assert.equal(strategic.status, 200);
    assert.equal(server.getNode('types')!.metadata.labels?.tier, 'x');
    const bad = await fetch(patchUrl, { method: 'PATCH', headers: { 'Content-Type': 'application/merge-patch+json' }, body: '{"metadata":' });
    assert.equal(bad.status, 400);
    const status = await bad.json() as { kind: string; reason: string };
    assert.equal(status.kind, 'Status');
    assert.equal(status.reason, 'BadRequest');
    const rename = await fetch(patchUrl, { method: 'PATCH', headers: { 'Content-Type': 'application/merge-patch+json' }, body: '{"metadata":{"name":"other"}}' });
    assert.equal(rename.status, 400, 'the name cannot be patched');
    const stale = await fetch(patchUrl, { method: 'PATCH', headers: { 'Content-Type': 'application/merge-patch+json' }, body: '{"metadata":{"resourceVersion":"1","labels":{"a":"b"}}}' });
    assert.equal(stale.status, 409, 'a stale resourceVersion precondition is a conflict');
  });

  test('patch retries conflicts and 5xx, not 4xx; bad input is refused before any request', async () => {
    server.createNode(node('retry-me'));
    const delays: number[] = [];
    const sleep = async (ms: number) => { delays.push(ms); };
    const isPatch = (r: { method: string }) => r.method === 'PATCH';

    server.setFailure({ status: 409, count: 2, reason: 'Conflict', match: isPatch });
    const ok = await patchNodeAnnotations(server.kubeConfig(), 'retry-me', { 'a.io/b': 'c' }, { sleep, initialDelayMs: 10 });
    assert.equal(ok.metadata?.annotations?.['a.io/b'], 'c');
    assert.deepEqual(delays, [10, 20]);

    server.setFailure({ status: 503, match: isPatch });
    await assert.rejects(patchNodeAnnotations(server.kubeConfig(), 'retry-me', { 'a.io/b': 'd' }, { sleep, attempts: 3 }),
      (err: unknown) => err instanceof NodeApiError && err.statusCode === 503 && err.attempts === 3 && /after 3 attempts/.test(err.message));
    server.setFailure({ status: 403, match: isPatch });
    await assert.rejects(patchNodeAnnotations(server.kubeConfig(), 'retry-me', { 'a.io/b': 'd' }, { sleep }),
      (err: unknown) => err instanceof NodeApiError && err.statusCode === 403 && err.attempts === 1);
    server.setFailure(undefined);
    await assert.rejects(patchNodeAnnotations(server.kubeConfig(), 'absent', { 'a.io/b': 'd' }, { sleep }),
      (err: unknown) => err instanceof NodeApiError && err.statusCode === 404);

    server.clearRequests();
    await assert.rejects(patchNodeAnnotations(server.kubeConfig(), 'retry-me', {}), /no annotations given/);
    await assert.rejects(patchNodeAnnotations(server.kubeConfig(), 'retry-me', { 'Bad Key': 'x' }), /annotation key "Bad Key"/);
    await assert.rejects(patchNodeAnnotations(server.kubeConfig(), 'retry-me', { 'UPPER.io/x': 'x' }), /prefix must be a lowercase DNS subdomain/);
    await assert.rejects(patchNodeAnnotations(server.kubeConfig(), '', { 'a.io/b': 'x' }), /non-empty string/);
    await assert.rejects(patchNodeAnnotations(server.kubeConfig(), 'retry-me', { 'a.io/b': 5 as unknown as string }), /string or null/);
    assert.equal(server.requests.length, 0);
  });

  test('a request that gets no answer (a dead connection) fails after the request timeout and is retried, never hangs', async (t) => {
    // A server that accepts connections and never answers: what a connection looks like after a
    // NAT on the way lost its state.
    const held: Socket[] = [];
    const blackHole = createServer((socket) => { held.push(socket); });
    await new Promise<void>((resolve) => blackHole.listen(0, '127.0.0.1', resolve));
    t.after(() => { for (const s of held) s.destroy(); blackHole.close(); });
    const kc = new KubeConfig();
    kc.loadFromOptions({
      clusters: [{ name: 'hole', server: `http://127.0.0.1:${(blackHole.address() as AddressInfo).port}`, skipTLSVerify: true }],
      users: [{ name: 'u' }], contexts: [{ name: 'c', cluster: 'hole', user: 'u' }], currentContext: 'c',
    });
    const started = Date.now();
    await assert.rejects(patchNodeAnnotations(kc, 'n1', { 'a.io/b': 'c' }, { requestTimeoutMs: 300, attempts: 2, initialDelayMs: 10 }),
      (err: unknown) => err instanceof NodeApiError && err.attempts === 2 && /no answer within 300 ms/.test(err.message));
    const took = Date.now() - started;
    assert.ok(took >= 600 && took < 5000, `two tries of 300 ms took ${took} ms`);
    assert.equal(held.length, 2, 'each try was a request of its own');
    await assert.rejects(readNode(kc, 'n1', { requestTimeoutMs: 200, attempts: 1 }), /no answer within 200 ms/);

    // An answer within the timeout is taken as before.
    server.createNode(node('slow-answer'));
    server.setLatency(100);
    try {
      const ok = await patchNodeAnnotations(server.kubeConfig(), 'slow-answer', { 'a.io/b': 'c' }, { requestTimeoutMs: 2000 });
      assert.equal(ok.metadata?.annotations?.['a.io/b'], 'c');
    } finally {
      server.setLatency(0);
    }
  });

  test('watch: events after the given resourceVersion, in order, with their resourceVersions', async () => {
    server.createNode(node('w-1'));
    const from = server.resourceVersion;
    server.updateNode('w-1', (n) => { n.metadata.annotations = { step: '1' }; });
    server.createNode(node('w-2'));
    const watch = await openWatch(server, { resourceVersion: from });
    server.deleteNode('w-1');
    server.updateNode('w-2', (n) => { n.metadata.labels = { step: '2' }; });
    await waitFor('4 events', () => watch.events.length >= 4);
    assert.deepEqual(watch.events.map((e) => `${e.type} ${e.object.metadata?.name}`), ['MODIFIED w-1', 'ADDED w-2', 'DELETED w-1', 'MODIFIED w-2']);
    const rvs = watch.events.map((e) => Number(e.object.metadata?.resourceVersion));
    assert.deepEqual(rvs, [...rvs].sort((x, y) => x - y));
    assert.ok(rvs[0] > Number(from));
    assert.equal(rvs[3], Number(server.resourceVersion));
    watch.controller.abort();
    await withTimeout(watch.done, 10_000, 'watch end after abort');
  });

  test('watch from resourceVersion 0 starts with the current objects; a label selector turns exits into DELETED', async () => {
    server.createNode(node('sel-1', {}, { mesh: 'yes' }));
    server.createNode(node('sel-2', {}, { mesh: 'no' }));
    const watch = await openWatch(server, { resourceVersion: '0', labelSelector: 'mesh=yes' });
    await waitFor('initial ADDED', () => watch.events.some((e) => e.object.metadata?.name === 'sel-1'));
    assert.ok(!watch.events.some((e) => e.object.metadata?.name === 'sel-2'));
    server.updateNode('sel-2', (n) => { n.metadata.labels = { mesh: 'yes' }; });
    server.updateNode('sel-1', (n) => { n.metadata.labels = { mesh: 'no' }; });
    await waitFor('selector events', () => watch.events.length >= 3);
    assert.deepEqual(watch.events.slice(-2).map((e) => `${e.type} ${e.object.metadata?.name}`), ['ADDED sel-2', 'DELETED sel-1']);
    watch.controller.abort();
    await withTimeout(watch.done, 10_000, 'watch end after abort');
  });

  test('a watch from an expired resourceVersion gets one ERROR event with a 410 Status, then the stream ends', async () => {
    server.createNode(node('expire-1'));
    const old = server.resourceVersion;
    server.updateNode('expire-1', (n) => { n.metadata.annotations = { v: '2' }; });
    server.expireHistory();
    const watch = await openWatch(server, { resourceVersion: old });
    const err = await withTimeout(watch.done, 10_000, 'the 410 stream to end');
    assert.equal(err, null, 'a clean end, as kube-apiserver does');
    assert.equal(watch.events.length, 1);
    assert.equal(watch.events[0].type, 'ERROR');
    assert.equal(watch.events[0].object.kind, 'Status');
    assert.equal(watch.events[0].object.code, 410);
    assert.equal(watch.events[0].object.reason, 'Expired');

    // The current resourceVersion is still fine to watch from.
    const fresh = await openWatch(server, { resourceVersion: server.resourceVersion });
    server.updateNode('expire-1', (n) => { n.metadata.annotations = { v: '3' }; });
    await waitFor('event after expiry', () => fresh.events.length === 1);
    assert.equal(fresh.events[0].type, 'MODIFIED');
    fresh.controller.abort();
    await withTimeout(fresh.done, 10_000, 'watch end after abort');
  });

  test('the event history is bounded: watches from before it get 410', async () => {
    const small = new KubeApiServer({ historyLimit: 2 });
    await small.start();
    try {
      small.createNode(node('h'));
      const first = small.resourceVersion;
      for (let i = 0; i < 3; i++) small.updateNode('h', (n) => { n.metadata.annotations = { i: String(i) }; });
      const tooOld = await openWatch(small, { resourceVersion: first });
      await withTimeout(tooOld.done, 10_000, '410 stream end');
      assert.equal(tooOld.events[0]?.object.code, 410);
      const recent = await openWatch(small, { resourceVersion: String(Number(small.resourceVersion) - 2) });
      await waitFor('two retained events', () => recent.events.length === 2);
      assert.ok(recent.events.every((e) => e.type === 'MODIFIED'));
      recent.controller.abort();
      await withTimeout(recent.done, 10_000, 'watch end after abort');
    } finally {
      await small.close();
    }
  });

  test('timeoutSeconds ends the watch cleanly', async () => {
    const started = Date.now();
    const watch = await openWatch(server, { resourceVersion: server.resourceVersion, timeoutSeconds: 1 });
    assert.equal(await withTimeout(watch.done, 10_000, 'timeoutSeconds'), null);
    assert.ok(Date.now() - started >= 900, 'not before the timeout');
  });

  test('dropWatches resets open watches; setUnavailable refuses everything until cleared', async () => {
    const watch = await openWatch(server, { resourceVersion: server.resourceVersion });
    await waitFor('the watch to be open', () => server.openWatches >= 1);
    server.dropWatches();
    const err = await withTimeout(watch.done, 10_000, 'dropped watch');
    assert.ok(err instanceof Error, 'an abrupt drop is an error, not a clean end');

    server.setUnavailable(true);
    await assert.rejects(core.listNode(), (e: unknown) => !(e instanceof ApiException), 'a network error, not an HTTP status');
    const down = await openWatch(server, { resourceVersion: server.resourceVersion });
    assert.ok(await withTimeout(down.done, 10_000, 'watch while unavailable') instanceof Error);
    server.setUnavailable(false);
    const list = await core.listNode();
    assert.equal(list.metadata?.resourceVersion, server.resourceVersion);
  });

  test('setFailure answers the next N matching requests with that status; setLatency delays answers', async () => {
    server.setFailure({ status: 500, count: 2 });
    for (let i = 0; i < 2; i++) {
      await assert.rejects(core.listNode(), (e: unknown) => e instanceof ApiException && e.code === 500);
    }
    await core.listNode();
    server.setLatency(150);
    try {
      const started = Date.now();
      await core.listNode();
      assert.ok(Date.now() - started >= 140, 'latency applied');
    } finally {
      server.setLatency(0);
    }
    assert.throws(() => server.setFailure({ status: 200 }), /400\.\.599/);
    assert.throws(() => server.setLatency(-1), /milliseconds/);
  });

  test('kubeConfigFor: a kubeconfig file that the client (and kubectl) can load', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'roamguard-kube-'));
    try {
      const file = path.join(dir, 'config');
      fs.writeFileSync(file, kubeConfigFor(server.url));
      const kc = new KubeConfig();
      kc.loadFromFile(file);
      assert.equal(kc.getCurrentCluster()?.server, server.url);
      const list = await kc.makeApiClient(CoreV1Api).listNode();
      assert.equal(list.metadata?.resourceVersion, server.resourceVersion);
      assert.throws(() => kubeConfigFor('ftp://x'), /http:\/\/ or https:\/\//);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  test('programmatic API: copies out, input checks, name is immutable', () => {
    server.createNode(node('prog'));
    const copy = server.getNode('prog')!;
    copy.metadata.labels = { changed: 'yes' };
    assert.deepEqual(server.getNode('prog')!.metadata.labels, {}, 'getNode returns a copy');
    assert.throws(() => server.createNode(node('prog')), /already exists/);
    assert.throws(() => server.updateNode('nope', () => {}), /not found/);
    assert.throws(() => server.updateNode('prog', (n) => { n.metadata.name = 'other'; }), /does not match/);
    assert.throws(() => server.createNode({ metadata: { name: 'bad', labels: { x: 1 as unknown as string } } }), /map of strings/);
    const rv = server.resourceVersion;
    server.updateNode('prog', () => {});
    assert.equal(server.resourceVersion, rv, 'an unchanged object commits nothing');
    assert.ok(server.listNodes().some((n) => n.metadata.name === 'prog'));
  });

  test('close() ends open watches and stops listening', async () => {
    const own = new KubeApiServer();
    await own.start();
    const url = own.url;
    const watch = await openWatch(own, { resourceVersion: own.resourceVersion });
    await waitFor('watch open', () => own.openWatches === 1);
    await withTimeout(own.close(), 10_000, 'close');
    await withTimeout(watch.done, 10_000, 'the watch to end on close');
    await assert.rejects(fetch(`${url}/api/v1/nodes`));
  });
});

describe('loadKubeConfig', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'roamguard-kubeconfig-'));
  const kubeconfig = path.join(dir, 'kubeconfig');
  fs.writeFileSync(kubeconfig, kubeConfigFor('http://127.0.0.1:1'));
  const saPrefix = path.join(dir, 'sa-root');
  const saDir = `${saPrefix}${SERVICE_ACCOUNT_DIR}`;
  fs.mkdirSync(saDir, { recursive: true });
  fs.writeFileSync(`${saDir}/token`, 'token');
  fs.writeFileSync(`${saDir}/ca.crt`, 'not a real CA');
  const inCluster = { KUBERNETES_SERVICE_HOST: 'fd00::1', KUBERNETES_SERVICE_PORT: '443' };
  after(() => fs.rmSync(dir, { recursive: true, force: true }));

  test('explicit API server URL > KUBECONFIG > in-cluster', () => {
    let r = resolveKubeConfig({ apiServer: 'https://10.0.0.1:6443/', env: { KUBECONFIG: kubeconfig, ...inCluster }, pathPrefix: saPrefix });
    assert.equal(r.source, 'api-server');
    assert.equal(r.server, 'https://10.0.0.1:6443');
    assert.equal(r.credentials, 'none', 'the kubeconfig user has no credentials');
    assert.equal(r.kubeConfig.getCurrentCluster()?.server, 'https://10.0.0.1:6443');

    r = resolveKubeConfig({ apiServer: 'https://10.0.0.1:6443', env: inCluster, pathPrefix: saPrefix });
    assert.equal(r.source, 'api-server');
    assert.equal(r.credentials, 'service-account');
    assert.equal(r.kubeConfig.getCurrentCluster()?.caFile, `${saDir}/ca.crt`);

    r = resolveKubeConfig({ env: { KUBECONFIG: kubeconfig, ...inCluster }, pathPrefix: saPrefix });
    assert.equal(r.source, 'kubeconfig');
    assert.equal(r.server, 'http://127.0.0.1:1');

    r = resolveKubeConfig({ kubeconfigPath: kubeconfig, env: {}, pathPrefix: path.join(dir, 'none') });
    assert.equal(r.source, 'kubeconfig');

    r = resolveKubeConfig({ env: inCluster, pathPrefix: saPrefix });
    assert.equal(r.source, 'in-cluster');
    assert.equal(r.server, 'https://[fd00::1]:443');
    assert.equal(r.kubeConfig.getCurrentUser()?.authProvider?.config?.tokenFile, `${saDir}/token`);

    r = resolveKubeConfig({ apiServer: 'http://127.0.0.1:8080', env: {}, pathPrefix: path.join(dir, 'none') });
    assert.equal(r.credentials, 'none');
    assert.equal(r.kubeConfig.getCurrentCluster()?.skipTLSVerify, true, 'client-node requires it for http://');
    assert.ok(loadKubeConfig({ apiServer: 'http://127.0.0.1:8080', env: {}, pathPrefix: path.join(dir, 'none') }) instanceof KubeConfig);
  });

  test('plain http:// is refused whenever credentials would be sent, naming the setting', () => {
    const withToken = path.join(dir, 'kubeconfig-token');
    fs.writeFileSync(withToken, kubeConfigFor('http://127.0.0.1:1').replace('  user: {}', '  user:\n    token: secret-token'));
    const none = path.join(dir, 'none');
    // A kubeconfig whose server is http:// and whose user has a token.
    assert.throws(() => loadKubeConfig({ env: { KUBECONFIG: withToken } }), (err: Error) => /^KUBECONFIG \(.*kubeconfig-token, cluster .*\): API server http:\/\/127\.0\.0\.1:1 is plain http:\/\/ and the kubeconfig user's credentials would be sent in clear; use https:\/\/$/.test(err.message) && !err.message.includes('secret-token'));
    // KUBE_API_SERVER http:// with that kubeconfig, or with the service account token.
    assert.throws(() => loadKubeConfig({ apiServer: 'http://10.0.0.1:8080', env: { KUBECONFIG: withToken } }), /^Error: KUBE_API_SERVER: API server http:\/\/10\.0\.0\.1:8080 is plain http:\/\/ and the kubeconfig user's credentials/);
    assert.throws(() => loadKubeConfig({ apiServer: 'http://10.0.0.1:8080', env: {}, pathPrefix: saPrefix }), /^Error: KUBE_API_SERVER: .*the service account token would be sent in clear/);
    // In-cluster on a port client-node treats as plain HTTP.
    assert.throws(() => loadKubeConfig({ env: { KUBERNETES_SERVICE_HOST: '10.96.0.1', KUBERNETES_SERVICE_PORT: '8080' }, pathPrefix: saPrefix }), /^Error: KUBERNETES_SERVICE_HOST\/KUBERNETES_SERVICE_PORT: API server http:\/\/10\.96\.0\.1:8080 .*service account token/);
    // https:// with the same credentials, and http:// without any, still work.
    assert.equal(resolveKubeConfig({ apiServer: 'https://10.0.0.1:6443', env: { KUBECONFIG: withToken } }).credentials, 'kubeconfig');
    assert.equal(resolveKubeConfig({ apiServer: 'http://10.0.0.1:8080', env: {}, pathPrefix: none }).credentials, 'none');
    assert.equal(resolveKubeConfig({ env: { KUBECONFIG: kubeconfig } }).server, 'http://127.0.0.1:1');
  });

  test('clear errors when nothing works', () => {
    assert.throws(() => loadKubeConfig({ env: {}, pathPrefix: path.join(dir, 'none') }), /no Kubernetes API configuration found: set KUBE_API_SERVER.*KUBECONFIG.*service account/);
    assert.throws(() => loadKubeConfig({ env: { KUBECONFIG: path.join(dir, 'missing') } }), /kubeconfig .*missing is not readable: ENOENT/);
    assert.throws(() => loadKubeConfig({ apiServer: '10.0.0.1:6443' }), /not a URL|must start with https:\/\//);
    assert.throws(() => loadKubeConfig({ apiServer: 'ftp://10.0.0.1' }), /must start with https:\/\/ or http:\/\//);
    assert.throws(() => loadKubeConfig({ env: {}, pathPrefix: saPrefix }), /KUBERNETES_SERVICE_HOST/);
    const empty = path.join(dir, 'empty');
    fs.writeFileSync(empty, 'apiVersion: v1\nkind: Config\n');
    assert.throws(() => loadKubeConfig({ kubeconfigPath: empty, env: {} }), /has no current-context/);
  });
});

describe('identities and the deploy/ admission policy (a stolen agent token)', () => {
  const AGENT = 'system:serviceaccount:roamguard:roamguard';
  const agentOf = (node: string) => ({ username: AGENT, groups: ['system:serviceaccounts', 'system:serviceaccounts:roamguard', 'system:authenticated'], extra: { 'authentication.kubernetes.io/node-name': [node] } });
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'roamguard-kubectl-'));
  // https://: kubectl sends no bearer token over plain http (seen: the header is left off).
  execFileSync('openssl', ['req', '-x509', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes', '-days', '1', '-subj', '/CN=127.0.0.1',
    '-addext', 'subjectAltName=IP:127.0.0.1', '-keyout', path.join(dir, 'key.pem'), '-out', path.join(dir, 'cert.pem')], { stdio: 'ignore' });
  const server = new KubeApiServer({
    tls: { key: fs.readFileSync(path.join(dir, 'key.pem'), 'utf8'), cert: fs.readFileSync(path.join(dir, 'cert.pem'), 'utf8') },
    tokens: {
      'token-agent-a': agentOf('node-a'),
      'token-agent-b': agentOf('node-b'),
      // A legacy (Secret) token of the same account: no node-name claim.
      'token-legacy': { username: AGENT, groups: ['system:serviceaccounts'] },
      'token-admin': { username: 'kubernetes-admin', groups: ['system:masters', 'system:authenticated'] },
    },
    admission: deployPolicyAdmission(),
  });
  const node = (name: string) => ({ metadata: { name, labels: { 'kubernetes.io/hostname': name }, annotations: { 'roamguard.io/public-key': `key-of-${name}` } }, spec: { podCIDRs: ['10.244.9.0/24'] } });
  before(async () => {
    await server.start();
    server.createNode(node('node-a'));
    server.createNode(node('node-b'));
  });
  after(async () => {
    await server.close();
    fs.rmSync(dir, { recursive: true, force: true });
  });
  const core = (token?: string) => server.kubeConfig(token).makeApiClient(CoreV1Api);
  /** The HTTP status and Status body of a refused client-node call. */
  const refusal = async (call: Promise<unknown>) => {
    const err = await call.then(() => undefined, (e: unknown) => e);
    assert.ok(err instanceof NodeApiError || err instanceof ApiException, `refused (got ${String(err)})`);
    const cause = (err instanceof NodeApiError ? err.cause : err) as ApiException<unknown>;
    const body = (typeof cause.body === 'string' ? JSON.parse(cause.body) : cause.body) as { reason?: string; message?: string } | undefined;
    return { code: cause.code, reason: body?.reason, message: body?.message ?? '' };
  };
  const noRetry = { attempts: 1 };

  test('tokens: none or unknown is 401; a known one reads', async () => {
    assert.match(server.url, /^https:\/\/127\.0\.0\.1:\d+$/);
    assert.equal((await refusal(core().listNode())).code, 401);
    assert.equal((await refusal(core('token-nobody').listNode())).code, 401);
    assert.equal((await core('token-agent-a').listNode()).items.length, 2);
  });

  test('an agent publishes its own roamguard.io/* annotations (the agent\'s own patch code)', async () => {
    const patched = await patchNodeAnnotations(server.kubeConfig('token-agent-a'), 'node-a', { 'roamguard.io/public-key': 'new-key-a', 'roamguard.io/endpoint': '192.0.2.1:51820' }, noRetry);
    assert.equal(patched.metadata?.annotations?.['roamguard.io/public-key'], 'new-key-a');
    await patchNodeAnnotations(server.kubeConfig('token-agent-a'), 'node-a', { 'roamguard.io/endpoint': null }, noRetry);
    assert.equal(server.getNode('node-a')!.metadata.annotations!['roamguard.io/endpoint'], undefined);
  });

  test('agent A\'s stolen token cannot rewrite node B\'s key or endpoint: 403 with the policy\'s message, node B untouched', async () => {
    const before = server.getNode('node-b');
    const answer = await refusal(patchNodeAnnotations(server.kubeConfig('token-agent-a'), 'node-b', { 'roamguard.io/public-key': 'attacker-key', 'roamguard.io/force-endpoint': '198.51.100.9:51820' }, noRetry));
    assert.equal(answer.code, 403);
    assert.equal(answer.reason, 'Forbidden');
    assert.match(answer.message, /^nodes "node-b" is forbidden: ValidatingAdmissionPolicy 'roamguard-own-node' with binding 'roamguard-own-node' denied request: a roamguard token may change only the Node it is bound to/);
    // A full replace (PUT) is refused the same way.
    const replaced = server.getNode('node-b')!;
    replaced.metadata.annotations!['roamguard.io/public-key'] = 'attacker-key';
    assert.equal((await refusal(core('token-agent-a').replaceNode({ name: 'node-b', body: replaced as never }))).code, 403);
    assert.equal((await refusal(core('token-agent-a').deleteNode({ name: 'node-b' }))).code, 403);
    assert.deepEqual(server.getNode('node-b'), before);
  });

  test('on its own node, labels and spec are refused (422 Invalid); a token without the node claim gets nothing', async () => {
    const labels = await refusal(core('token-agent-a').patchNode({ name: 'node-a', body: { metadata: { labels: { 'node-role.kubernetes.io/control-plane': '' } } } }, setHeaderOptions('Content-Type', PatchStrategy.MergePatch)));
    assert.deepEqual([labels.code, labels.reason], [422, 'Invalid']);
    assert.match(labels.message, /^Node "node-a" is invalid: .*labels/);
    const spec = await refusal(core('token-agent-a').patchNode({ name: 'node-a', body: { spec: { podCIDRs: ['10.0.0.0/8'] } } }, setHeaderOptions('Content-Type', PatchStrategy.MergePatch)));
    assert.match(spec.message, /spec or status/);
    const legacy = await refusal(patchNodeAnnotations(server.kubeConfig('token-legacy'), 'node-a', { 'roamguard.io/public-key': 'x' }, noRetry));
    assert.equal(legacy.code, 403);
    // Other users are not the policy's business.
    const admin = await core('token-admin').patchNode({ name: 'node-b', body: { metadata: { labels: { team: 'net' } } } }, setHeaderOptions('Content-Type', PatchStrategy.MergePatch));
    assert.equal(admin.metadata?.labels?.team, 'net');
  });

  test('kubectl with agent A\'s token: annotating node A works, node B is refused', async () => {
    const kubeconfig = path.join(dir, 'agent-a');
    fs.writeFileSync(kubeconfig, kubeConfigFor(server.url, 'token-agent-a'), { mode: 0o600 });
    // Asynchronously: the server answers from this process's event loop.
    const kubectl = (...args: string[]) => new Promise<{ status: number; stderr: string }>((resolve) => {
      execFile('/usr/bin/kubectl', ['--kubeconfig', kubeconfig, '--cache-dir', path.join(dir, 'cache'), ...args], { encoding: 'utf8', timeout: 60_000, env: { ...process.env, HOME: dir } },
        (err, _stdout, stderr) => resolve({ status: err ? Number((err as { code?: number }).code ?? 1) || 1 : 0, stderr }));
    });
    const own = await kubectl('annotate', 'node', 'node-a', '--overwrite', 'roamguard.io/force-endpoint=192.0.2.1:51820');
    assert.equal(own.status, 0, own.stderr);
    assert.equal(server.getNode('node-a')!.metadata.annotations!['roamguard.io/force-endpoint'], '192.0.2.1:51820');
    const other = await kubectl('annotate', 'node', 'node-b', '--overwrite', 'roamguard.io/force-endpoint=198.51.100.9:51820');
    assert.notEqual(other.status, 0);
    assert.match(other.stderr, /Error from server \(Forbidden\): nodes "node-b" is forbidden: ValidatingAdmissionPolicy 'roamguard-own-node'/);
    assert.equal(server.getNode('node-b')!.metadata.annotations!['roamguard.io/force-endpoint'], undefined);
    const label = await kubectl('label', 'node', 'node-a', 'evil=1');
    assert.notEqual(label.status, 0);
    assert.match(label.stderr, /is invalid: .*labels/);
  });
});
