// NodeWatcher (client-node's informer, kept running) against the fake API server over HTTP:
// sync, events, relist after 410, re-watch after drops, fail-static outages with backoff, stop().
import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import type { V1Node } from '@kubernetes/client-node';
import { KubeApiServer } from '../../lab/kube-api-server.ts';
import { NodeWatcher, type NodeChange, type NodeWatcherOptions, type NodeWatcherState } from '../../control/kube/node-watcher.ts';

async function waitFor(what: string, predicate: () => boolean, timeoutMs = 20_000): Promise<void> {
  const start = Date.now();
  while (!predicate()) {
    if (Date.now() - start > timeoutMs) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

function node(name: string, annotations: Record<string, string> = {}, labels: Record<string, string> = {}) {
  return { metadata: { name, annotations, labels }, spec: { podCIDRs: ['10.244.0.0/24'] } };
}

const names = (nodes: readonly V1Node[]) => nodes.map((n) => n.metadata?.name ?? '?').sort();

/** Fast backoff without jitter, so the tests take milliseconds and the delays are exact. */
const FAST: NodeWatcherOptions['backoff'] = { initialMs: 20, maxMs: 160, factor: 2, jitter: 0 };

interface Harness {
  server: KubeApiServer;
  watcher: NodeWatcher;
  changes: NodeChange[];
  states: NodeWatcherState[];
}

const cleanups: Array<() => Promise<void>> = [];
after(async () => {
  for (const cleanup of cleanups.splice(0)) await cleanup();
});

async function harness(options: NodeWatcherOptions = {}, setup?: (server: KubeApiServer) => void): Promise<Harness> {
  const server = new KubeApiServer();
  await server.start();
  setup?.(server);
  const changes: NodeChange[] = [];
  const states: NodeWatcherState[] = [];
  const watcher = new NodeWatcher(server.kubeConfig(), {
    backoff: FAST, ...options,
    onChange: (c) => { changes.push(c); options.onChange?.(c); },
    onState: (s, err) => { states.push(s); options.onState?.(s, err); },
  });
  cleanups.push(async () => {
    await watcher.stop();
    await server.close();
  });
  return { server, watcher, changes, states };
}

describe('NodeWatcher', () => {
  test('first sync: list applied, watch open, one shape for listed and watched Nodes, managedFields dropped', async () => {
    const managedFields = [{ manager: 'kubelet', operation: 'Update', apiVersion: 'v1', fieldsType: 'FieldsV1', fieldsV1: { 'f:status': {} } }];
    const { server, watcher, changes, states } = await harness({}, (s) => {
      s.createNode({
        metadata: { name: 'a', managedFields, labels: { zone: 'z1' } },
        spec: { podCIDRs: ['10.244.1.0/24'], providerID: 'sim://a' },
        status: { addresses: [{ type: 'InternalIP', address: '192.0.2.1' }], images: [{ names: ['registry.example/app:1'], sizeBytes: 123 }], conditions: [{ type: 'Ready', status: 'True' }] },
      } as never);
      s.createNode(node('b'));
    });
    assert.equal(watcher.state, 'stopped');
    assert.equal(watcher.synced, false);
    await watcher.start();
    assert.equal(watcher.state, 'synced');
    assert.equal(watcher.synced, true);
    await watcher.waitForSync(1000);
    assert.deepEqual(names(watcher.list()), ['a', 'b']);
    assert.deepEqual(states, ['starting', 'synced']);
    const sync = changes.find((c) => c.type === 'sync');
    assert.ok(sync && sync.type === 'sync');
    assert.deepEqual(names(sync.nodes), ['a', 'b']);
    assert.deepEqual(changes.filter((c) => c.type === 'add').map((c) => c.type !== 'sync' && c.node.metadata?.name).sort(), ['a', 'b']);

    const listed = watcher.get('a')!;
    assert.equal(listed.metadata?.managedFields, undefined);
    assert.ok(listed.metadata?.creationTimestamp instanceof Date);
    assert.deepEqual(listed.spec?.podCIDRs, ['10.244.1.0/24']);
    // Only what the agent reads is cached: a real Node's images and conditions are not.
    assert.deepEqual(listed.metadata?.labels, { zone: 'z1' });
    assert.deepEqual(listed.status?.addresses?.map((a) => ({ type: a.type, address: a.address })), [{ type: 'InternalIP', address: '192.0.2.1' }]);
    assert.deepEqual(Object.keys(listed.status ?? {}), ['addresses']);
    assert.deepEqual(Object.keys(listed.spec ?? {}).sort(), ['podCIDRs']);

    server.createNode({
      metadata: { name: 'c', managedFields },
      spec: { podCIDRs: ['10.244.3.0/24'], taints: [{ key: 'k', effect: 'NoSchedule' }] },
      status: { addresses: [{ type: 'InternalIP', address: '192.0.2.3' }], images: [{ names: ['registry.example/app:1'], sizeBytes: 123 }], nodeInfo: { kubeletVersion: 'v1.34.0' } },
    } as never);
    await waitFor('c from the watch', () => watcher.get('c') !== undefined);
    const watched = watcher.get('c')!;
    assert.equal(watched.metadata?.managedFields, undefined, 'stripped from watch events too');
    assert.ok(watched.metadata?.creationTimestamp instanceof Date, 'watch objects deserialized like listed ones');
    assert.deepEqual(watched.spec?.podCIDRs, ['10.244.3.0/24']);
    assert.deepEqual(Object.keys(watched.status ?? {}), ['addresses'], 'watch events are cut down too');
    assert.deepEqual(Object.keys(watched.spec ?? {}), ['podCIDRs']);

    const listRequests = server.requests.filter((r) => r.path === '/api/v1/nodes' && !r.watch);
    assert.equal(listRequests.length, 1);
    const watchRequest = server.requests.find((r) => r.watch)!;
    assert.ok(Number(watchRequest.query.timeoutSeconds) >= 300 && Number(watchRequest.query.timeoutSeconds) < 600,
      'asks the server to end the watch after 5-10 minutes');
  });

  test('add, update and delete arrive in order and update list()', async () => {
    const { server, watcher, changes } = await harness({}, (s) => s.createNode(node('keep')));
    await watcher.start();
    changes.length = 0;
    server.createNode(node('n1'));
    server.updateNode('n1', (n) => { n.metadata.annotations = { 'roamguard.io/public-key': 'k1' }; });
    server.updateNode('keep', (n) => { n.metadata.labels = { x: 'y' }; });
    server.deleteNode('n1');
    await waitFor('4 changes', () => changes.length >= 4);
    assert.deepEqual(changes.map((c) => (c.type === 'sync' ? 'sync' : `${c.type} ${c.node.metadata?.name}`)),
      ['add n1', 'update n1', 'update keep', 'delete n1']);
    const update = changes[1];
    assert.ok(update.type === 'update');
    assert.equal(update.node.metadata?.annotations?.['roamguard.io/public-key'], 'k1');
    assert.deepEqual(names(watcher.list()), ['keep']);
    assert.deepEqual(watcher.get('keep')?.metadata?.labels, { x: 'y' });
  });

  test('410 Gone after an outage: relists, reports the deletion that happened while disconnected, converges', async () => {
    const { server, watcher, changes } = await harness({}, (s) => {
      s.createNode(node('stays'));
      s.createNode(node('deleted-while-away'));
      s.createNode(node('changed-while-away'));
    });
    await watcher.start();
    server.setUnavailable(true);
    await waitFor('error state', () => watcher.state === 'error');
    server.deleteNode('deleted-while-away');
    server.updateNode('changed-while-away', (n) => { n.metadata.annotations = { v: '2' }; });
    server.createNode(node('added-while-away'));
    server.expireHistory();
    changes.length = 0;
    server.clearRequests();
    server.setUnavailable(false);

    await waitFor('resync after 410', () => watcher.state === 'synced' && watcher.get('added-while-away') !== undefined);
    assert.deepEqual(names(watcher.list()), ['added-while-away', 'changed-while-away', 'stays']);
    assert.equal(watcher.get('changed-while-away')?.metadata?.annotations?.v, '2');
    const deletes = changes.filter((c) => c.type === 'delete').map((c) => c.type === 'delete' && c.node.metadata?.name);
    assert.deepEqual(deletes, ['deleted-while-away']);
    assert.ok(changes.some((c) => c.type === 'sync'), 'a relist is reported as a sync');

    // The path taken: a watch from the old resourceVersion (answered 410), then a list, then a new watch.
    // (The new watch may still be on its way when the list has been applied: wait for it.)
    await waitFor('a watch after the relist', () => {
      const at = server.requests.findIndex((r) => !r.watch);
      return at >= 0 && server.requests.length > at + 1;
    });
    const kinds = server.requests.map((r) => (r.watch ? `watch@${r.query.resourceVersion}` : 'list'));
    const listAt = kinds.indexOf('list');
    assert.ok(listAt > 0 && kinds[listAt - 1].startsWith('watch@'), `requests: ${kinds.join(', ')}`);
    assert.equal(kinds[listAt + 1], `watch@${server.requests[listAt + 1].query.resourceVersion}`);

    server.createNode(node('after'));
    await waitFor('events after the relist', () => watcher.get('after') !== undefined);
  });

  test('an abruptly dropped watch is re-watched from its resourceVersion without a relist', async () => {
    const { server, watcher } = await harness({}, (s) => s.createNode(node('x')));
    await watcher.start();
    server.clearRequests();
    server.dropWatches();
    await waitFor('a new watch', () => server.openWatches === 1 && server.requests.some((r) => r.watch));
    server.createNode(node('y'));
    await waitFor('y', () => watcher.get('y') !== undefined);
    assert.equal(server.requests.filter((r) => !r.watch).length, 0, 'no list: the resourceVersion was still valid');
    assert.equal(watcher.state, 'synced');
    assert.ok(watcher.restarts >= 1);
  });

  test('a watch the server ends cleanly (timeoutSeconds) is resumed', async () => {
    const { server, watcher } = await harness({ watchTimeoutSeconds: 1 }, (s) => s.createNode(node('t')));
    await watcher.start();
    await waitFor('a second watch request', () => server.requests.filter((r) => r.watch).length >= 2, 20_000);
    server.createNode(node('t2'));
    await waitFor('t2', () => watcher.get('t2') !== undefined);
    assert.equal(server.requests.filter((r) => !r.watch).length, 1, 'resumed from the resourceVersion, no relist');
    assert.equal(watcher.restarts, 0, 'a clean end is not an error');
  });

  test('API server unavailable: keeps the last list, reports error, backs off, recovers', async () => {
    const states: Array<[NodeWatcherState, string | undefined]> = [];
    const { server, watcher } = await harness({
      backoff: { initialMs: 40, maxMs: 320, factor: 2, jitter: 0 },
      onState: (s, err) => states.push([s, err?.message]),
    }, (s) => { s.createNode(node('p')); s.createNode(node('q')); });
    await watcher.start();
    const restartsBefore = watcher.restarts;
    const downAt = Date.now();
    server.setUnavailable(true);
    await waitFor('error state', () => watcher.state === 'error');
    assert.ok(states.some(([s, message]) => s === 'error' && message), 'the error is reported with its cause');
    assert.ok(watcher.lastError instanceof Error);
    assert.deepEqual(names(watcher.list()), ['p', 'q'], 'fail static: the last list stays');
    assert.equal(watcher.synced, true);

    // Three failed restarts need at least 40 + 80 + 160 ms of backoff.
    await waitFor('three restarts', () => watcher.restarts - restartsBefore >= 3);
    assert.ok(Date.now() - downAt >= 40 + 80 + 160 - 5, `restarts came too fast (${Date.now() - downAt} ms)`);
    assert.equal(watcher.state, 'error');
    assert.deepEqual(names(watcher.list()), ['p', 'q']);

    server.createNode(node('r'));
    server.setUnavailable(false);
    await waitFor('recovery', () => watcher.state === 'synced' && watcher.get('r') !== undefined);
    assert.deepEqual(names(watcher.list()), ['p', 'q', 'r']);
  });

  test('starting while the API server is down: error state, empty list, syncs once it is up', async () => {
    const { server, watcher } = await harness({}, (s) => { s.createNode(node('late')); s.setUnavailable(true); });
    await watcher.start();
    assert.equal(watcher.state, 'error');
    assert.equal(watcher.synced, false);
    assert.deepEqual(watcher.list(), []);
    const synced = watcher.waitForSync(20_000);
    server.setUnavailable(false);
    await synced;
    assert.deepEqual(names(watcher.list()), ['late']);
    await waitFor('synced state', () => watcher.state === 'synced');
  });

  test('HTTP errors on the list (500) are retried; a 500 on the watch alone does not relist', async () => {
    const { server, watcher } = await harness({}, (s) => {
      s.createNode(node('e'));
      s.setFailure({ status: 500, count: 2, match: (r) => !r.watch });
    });
    await watcher.start();
    assert.equal(watcher.state, 'error');
    await waitFor('synced after two failed lists', () => watcher.state === 'synced');
    assert.equal(server.requests.filter((r) => !r.watch).length, 3);
    server.clearRequests();
    server.setFailure({ status: 500, count: 1, match: (r) => r.watch });
    server.dropWatches();
    server.createNode(node('f'));
    await waitFor('f after a failed re-watch', () => watcher.get('f') !== undefined);
    assert.equal(server.requests.filter((r) => !r.watch).length, 0);
    assert.ok(server.requests.filter((r) => r.watch).length >= 2);
  });

  test('a label selector limits the Nodes; leaving the selector is a delete', async () => {
    const { server, watcher } = await harness({ labelSelector: 'roamguard.io/mesh=true' }, (s) => {
      s.createNode(node('in', {}, { 'roamguard.io/mesh': 'true' }));
      s.createNode(node('out'));
    });
    await watcher.start();
    assert.deepEqual(names(watcher.list()), ['in']);
    server.updateNode('out', (n) => { n.metadata.labels = { 'roamguard.io/mesh': 'true' }; });
    server.updateNode('in', (n) => { n.metadata.labels = {}; });
    await waitFor('selector changes', () => watcher.get('out') !== undefined && watcher.get('in') === undefined);
    assert.ok(server.requests.every((r) => r.query.labelSelector === 'roamguard.io/mesh=true'));
  });

  test('a throwing listener does not stop the watcher; onChange() unsubscribes', async () => {
    const { server, watcher } = await harness({}, (s) => s.createNode(node('l')));
    const seen: string[] = [];
    watcher.onChange(() => { throw new Error('listener bug'); });
    const off = watcher.onChange((c) => { if (c.type !== 'sync') seen.push(`${c.type} ${c.node.metadata?.name}`); });
    await watcher.start();
    server.createNode(node('m'));
    await waitFor('m', () => seen.includes('add m'));
    off();
    server.createNode(node('n'));
    await waitFor('n in the cache', () => watcher.get('n') !== undefined);
    assert.ok(!seen.includes('add n'));
    assert.equal(watcher.state, 'synced');
  });

  test('stop(): closes the watch, cancels a pending retry, keeps the list; start() again resumes', async () => {
    const { server, watcher } = await harness({ backoff: { initialMs: 200, maxMs: 200, jitter: 0 } }, (s) => s.createNode(node('s')));
    await watcher.start();
    assert.equal(server.openWatches, 1);
    await watcher.stop();
    assert.equal(watcher.state, 'stopped');
    await waitFor('the server to see the watch close', () => server.openWatches === 0);
    assert.deepEqual(names(watcher.list()), ['s']);
    await watcher.stop(); // idempotent

    await watcher.start();
    assert.equal(watcher.state, 'synced');
    server.createNode(node('t'));
    await waitFor('t after restart', () => watcher.get('t') !== undefined);

    server.setUnavailable(true);
    await waitFor('error with a retry pending', () => watcher.state === 'error');
    const restarts = watcher.restarts;
    await watcher.stop();
    await new Promise((r) => setTimeout(r, 400));
    assert.equal(watcher.restarts, restarts, 'no restart after stop()');
    assert.equal(watcher.state, 'stopped');
  });

  test('a list that gets no answer is retried soon: the first timeout is short, each next one twice as long up to listTimeoutMs', async () => {
    const { server, watcher } = await harness({ firstListTimeoutMs: 100, listTimeoutMs: 400, backoff: FAST }, (s) => { s.createNode(node('slow')); s.setLatency(300); });
    const errors: string[] = [];
    const seen = setInterval(() => { const m = watcher.lastError?.message; if (m && errors.at(-1) !== m) errors.push(m); }, 5);
    try {
      await watcher.start();
      await waitFor('synced once a list may take 400 ms', () => watcher.state === 'synced');
    } finally {
      clearInterval(seen);
    }
    assert.deepEqual(errors.filter((e) => /timed out/.test(e)), ['listing Nodes timed out after 100 ms', 'listing Nodes timed out after 200 ms']);
    assert.equal(server.requests.filter((r) => !r.watch).length, 3, 'three lists: 100, 200 and 400 ms allowed');
    await watcher.stop();
  });

  test('a hung list is abandoned after listTimeoutMs, and stop() abandons one at once', async () => {
    const { server, watcher } = await harness({ listTimeoutMs: 100 }, (s) => { s.createNode(node('slow')); s.setLatency(2000); });
    const started = Date.now();
    await watcher.start();
    assert.equal(watcher.state, 'error');
    assert.match(watcher.lastError?.message ?? '', /listing Nodes timed out after 100 ms/);
    assert.ok(Date.now() - started < 1500, 'did not wait for the server');
    server.setLatency(0);
    await waitFor('synced once the server answers in time', () => watcher.state === 'synced');
    await watcher.stop();

    const hung = new NodeWatcher(server.kubeConfig(), { backoff: FAST });
    cleanups.push(() => hung.stop());
    server.setLatency(5000);
    const startedAt = Date.now();
    const starting = hung.start();
    await waitFor('the list request to arrive', () => server.requests.filter((r) => !r.watch).length >= 2);
    await hung.stop();
    await starting;
    assert.ok(Date.now() - startedAt < 2500, 'start() settles without waiting for the hung list');
    assert.equal(hung.state, 'stopped');
    assert.equal(hung.synced, false);
    server.setLatency(0);
  });

  test('input checks', async () => {
    const server = new KubeApiServer();
    const kc = (await server.start(), server.kubeConfig());
    try {
      assert.throws(() => new NodeWatcher({} as never), /must be a KubeConfig/);
      assert.throws(() => new NodeWatcher(kc, { backoff: { initialMs: 0 } }), /bad backoff/);
      assert.throws(() => new NodeWatcher(kc, { backoff: { initialMs: 100, maxMs: 10 } }), /bad backoff/);
      assert.throws(() => new NodeWatcher(kc, { listTimeoutMs: 0 }), /listTimeoutMs/);
      assert.throws(() => new NodeWatcher(kc, { watchTimeoutSeconds: 0.5 }), /watchTimeoutSeconds/);
      const w = new NodeWatcher(kc);
      assert.throws(() => w.onChange('x' as never), /must be a function/);
      await assert.rejects(w.waitForSync(), /not started/);
      await w.start();
      await assert.rejects(w.start(), /already started/);
      await w.stop();
    } finally {
      await server.close();
    }
  });

  test('after stop() and close() nothing keeps the process alive', async () => {
    // A child process runs a synced watcher and one stuck in backoff, stops them, closes the
    // server and must then exit on its own: a leftover timer or socket would keep it running.
    const apiServer = fileURLToPath(new URL('../../lab/kube-api-server.ts', import.meta.url));
    const nodeWatcher = fileURLToPath(new URL('../../control/kube/node-watcher.ts', import.meta.url));
    const script = `
      const { KubeApiServer } = await import(${JSON.stringify(apiServer)});
      const { NodeWatcher } = await import(${JSON.stringify(nodeWatcher)});
      const server = new KubeApiServer();
      await server.start();
      server.createNode({ metadata: { name: 'a' } });
      const synced = new NodeWatcher(server.kubeConfig(), { backoff: { initialMs: 50, maxMs: 50 } });
      await synced.start();
      if (synced.state !== 'synced') throw new Error('not synced: ' + synced.state);
      const down = new KubeApiServer();
      await down.start();
      down.setUnavailable(true);
      const failing = new NodeWatcher(down.kubeConfig(), { backoff: { initialMs: 60000, maxMs: 60000 } });
      await failing.start();
      if (failing.state !== 'error') throw new Error('not failing: ' + failing.state);
      await synced.stop();
      await failing.stop();
      await server.close();
      await down.close();
      console.log('stopped');
    `;
    const bun = typeof (process.versions as Record<string, string | undefined>).bun === 'string';
    const args = bun ? ['-e', script] : ['--import', 'tsx', '--input-type=module', '-e', script];
    const child = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    child.stdout.on('data', (d) => { out += d; });
    child.stderr.on('data', (d) => { out += d; });
    const started = Date.now();
    const code = await new Promise<number | null>((resolve) => {
      const timer = setTimeout(() => { child.kill('SIGKILL'); resolve(null); }, 30_000);
      // 'close', not 'exit': 'exit' can come before the last output ("stopped") has been read.
      child.on('close', (c) => { clearTimeout(timer); resolve(c); });
    });
    assert.notEqual(code, null, `the child did not exit within 30 s after stopping (output: ${out})`);
    assert.equal(code, 0, out);
    assert.match(out, /stopped/);
    assert.ok(Date.now() - started < 30_000);
  });
});
