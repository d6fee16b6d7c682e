/**
 * What a scrape flood may cost (issue 13): the metrics endpoint listens on every address, so anyone
 * who reaches the node can call it as often as they like.
 *
 * - Scrapes share one reading of the data plane: while it runs every scrape waits for it, and
 *   after it settled it answers every scrape for a second (an injected monotonic clock here).
 *   The fake data plane counts its queries and how many were in flight at once.
 * - Over real HTTP on loopback: 1000 concurrent scrapes in rounds for ~3 s cost at most one
 *   reading per second; /healthz and /readyz cost none.
 * - Slow clients (a connection that sends nothing, one that sends half a request) are closed
 *   within the header timeout; connections past the limit are closed at accept and counted.
 */
import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { request, Agent as HttpAgent } from 'node:http';
import { connect } from 'node:net';
import type { DeviceSnapshot } from '../../dataplane/uapi/uapi-protocol.ts';
import type { DeviceStats } from '../../dataplane/uapi/uapi-stats.ts';
import { AgentMetrics, SCRAPE_CACHE_MS } from '../../control/metrics/metrics.ts';
import { startMetricsServer, type MetricsServer } from '../../control/metrics/server.ts';
import type { AgentStatusSource, DataplaneReader } from '../../control/metrics/status-source.ts';

/** A data plane that counts its queries, can be held, and records the most in flight at once. */
class CountingDataplane implements DataplaneReader {
  gets = 0;
  statsCalls = 0;
  inFlight = 0;
  maxInFlight = 0;
  fail = false;
  private held: Array<() => void> = [];
  hold = false;

  private async query<T>(value: () => T): Promise<T> {
    this.inFlight++;
    this.maxInFlight = Math.max(this.maxInFlight, this.inFlight);
    try {
      if (this.hold) await new Promise<void>((resolve) => this.held.push(resolve));
      else await new Promise((resolve) => setImmediate(resolve));
      return value();
    } finally {
      this.inFlight--;
    }
  }

  release(): void {
    this.hold = false;
    for (const resolve of this.held.splice(0)) resolve();
  }

  get(): Promise<DeviceSnapshot> {
    this.gets++;
    return this.query(() => {
      if (this.fail) throw new Error('connect ENOENT /var/run/wireguard/x.sock');
      return { listenPort: 51820, fwmark: 0, peers: [] };
    });
  }

  stats(): Promise<DeviceStats | undefined> {
    this.statsCalls++;
    return this.query(() => ({ version: 1, workerThreads: 0, workerQueueDepth: 0, drops: {}, peers: [] }));
  }
}

function source(dataplane: DataplaneReader): AgentStatusSource {
  return {
    nodeName: 'node-1', state: 'running', ready: true, lastMesh: undefined, reconciles: 1, reconcileErrors: 0,
    reconcileDurationMsTotal: 10, lastReconcileDurationMs: 10, informer: { state: 'synced', synced: true, restarts: 0 }, dataplane,
  };
}

describe('scrapes share one reading of the data plane', () => {
  test('1000 concurrent scrapes: one get and one stats, the same text for all', async () => {
    const dataplane = new CountingDataplane();
    const metrics = new AgentMetrics(source(dataplane), { defaultMetrics: false, monotonicMs: () => 0 });
    const texts = await Promise.all(Array.from({ length: 1000 }, () => metrics.scrape()));
    assert.equal(dataplane.gets, 1);
    assert.equal(dataplane.statsCalls, 1);
    assert.equal(dataplane.maxInFlight, 1);
    assert.equal(new Set(texts).size, 1);
    assert.match(texts[0], /^roamguard_dataplane_up 1$/m);
  });

  test('a reading that runs is shared however long it takes; a settled one answers for a second', async () => {
    const dataplane = new CountingDataplane();
    let clock = 0;
    const metrics = new AgentMetrics(source(dataplane), { defaultMetrics: false, monotonicMs: () => clock });
    dataplane.hold = true;
    const waiting = [metrics.scrape()];
    await new Promise((resolve) => setImmediate(resolve));
    clock += 10 * SCRAPE_CACHE_MS; // a slow data plane: the reading is still running
    for (let i = 0; i < 100; i++) waiting.push(metrics.scrape());
    assert.equal(dataplane.gets, 1);
    dataplane.release();
    await Promise.all(waiting);
    assert.equal(dataplane.gets, 1);
    assert.equal(dataplane.statsCalls, 1);

    clock += SCRAPE_CACHE_MS - 1;
    await metrics.scrape();
    assert.equal(dataplane.gets, 1, 'within a second of the reading settling: the cached text');
    clock += 1;
    await metrics.scrape();
    assert.equal(dataplane.gets, 2, 'a second later: a new reading');
    assert.equal(dataplane.maxInFlight, 1);
  });

  test('a failed reading is cached too: a dead data plane is not asked again and again', async () => {
    const dataplane = new CountingDataplane();
    let clock = 0;
    const metrics = new AgentMetrics(source(dataplane), { defaultMetrics: false, monotonicMs: () => clock });
    dataplane.fail = true;
    const texts = await Promise.all(Array.from({ length: 50 }, () => metrics.scrape()));
    assert.match(texts[0], /^roamguard_dataplane_up 0$/m);
    clock += SCRAPE_CACHE_MS / 2;
    await metrics.scrape();
    assert.equal(dataplane.gets, 1);
    assert.equal(dataplane.statsCalls, 0, 'no stats after a failed get');
    dataplane.fail = false;
    clock += SCRAPE_CACHE_MS;
    assert.match(await metrics.scrape(), /^roamguard_dataplane_up 1$/m);
    assert.equal(dataplane.gets, 2);
  });
});

interface Answer { status: number; body: string }

function get(port: number, path: string, agent: HttpAgent | false = false): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path, agent }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (c: string) => { body += c; });
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end();
  });
}

/** `get`, retried while the server refuses the connection (its slots still held by a flood that is closing). */
async function getRetrying(port: number, path: string): Promise<Answer> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await get(port, path);
    } catch (err) {
      if (attempt >= 100) throw err;
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }
}

/** Resolves with how long (ms) until the server closed a connection that sent `text` (or nothing). */
function closedAfter(port: number, text: string | undefined, giveUpMs: number): Promise<number> {
  return new Promise((resolve) => {
    const started = performance.now();
    const socket = connect(port, '127.0.0.1');
    const timer = setTimeout(() => { socket.destroy(); resolve(Infinity); }, giveUpMs);
    socket.on('error', () => {});
    socket.on('data', () => {}); // read whatever the server says (a 408), so its close is seen
    socket.on('close', () => { clearTimeout(timer); resolve(performance.now() - started); });
    if (text !== undefined) socket.write(text);
  });
}

describe('the metrics server over HTTP', () => {
  const servers: MetricsServer[] = [];
  after(async () => { await Promise.all(servers.map((s) => s.close())); });

  test('a flood of 1000 concurrent scrapes costs at most one data plane reading a second; probes cost none', async (t) => {
    const dataplane = new CountingDataplane();
    const server = await startMetricsServer({ address: '127.0.0.1:0', source: source(dataplane), defaultMetrics: false });
    servers.push(server);
    const agent = new HttpAgent({ keepAlive: true, maxSockets: 1000 });
    const started = performance.now();
    let ok = 0;
    let refused = 0;
    let rounds = 0;
    // Rounds of 1000 requests at once until ~3 s have passed (bounded: no retry loop on refusals).
    while (performance.now() - started < 3000 && rounds < 50) {
      rounds++;
      const answers = await Promise.allSettled(Array.from({ length: 1000 }, () => get(server.port, '/metrics', agent)));
      for (const a of answers) {
        if (a.status === 'fulfilled' && a.value.status === 200 && /^roamguard_dataplane_up 1$/m.test(a.value.body)) ok++;
        else refused++;
      }
    }
    const seconds = (performance.now() - started) / 1000;
    agent.destroy();
    t.diagnostic(`${rounds} rounds of 1000 concurrent scrapes in ${seconds.toFixed(1)} s: ${ok} answered, ${refused} refused at the connection limit, ${dataplane.gets} data plane readings`);
    assert.ok(ok > 0, 'some scrapes were answered');
    assert.ok(dataplane.gets <= Math.ceil(seconds) + 1, `${dataplane.gets} gets in ${seconds.toFixed(1)} s (${ok} scrapes answered, ${refused} refused, ${rounds} rounds)`);
    assert.equal(dataplane.maxInFlight, 1);

    const before = dataplane.gets;
    const probeStarted = performance.now();
    while (performance.now() - probeStarted < 1500) {
      assert.equal((await getRetrying(server.port, '/healthz')).status, 200);
      assert.equal((await getRetrying(server.port, '/readyz')).status, 200);
    }
    assert.equal(dataplane.gets, before, '/healthz and /readyz never ask the data plane');
  });

  test('slow clients are closed within the header timeout; connections past the limit are closed at accept and counted', async () => {
    const dataplane = new CountingDataplane();
    const server = await startMetricsServer({
      address: '127.0.0.1:0', source: source(dataplane), defaultMetrics: false, maxConnections: 3, headersTimeoutMs: 300, requestTimeoutMs: 600,
    });
    servers.push(server);
    // Generous bounds: the timeout is 300 ms, node checks every 100 ms, the machine may be loaded.
    const [silent, half] = await Promise.all([
      closedAfter(server.port, undefined, 10_000),
      closedAfter(server.port, 'GET /metrics HTTP/1.1\r\nHost: x\r\n', 10_000),
    ]);
    assert.ok(silent < 5000, `a connection that sends nothing is closed (${silent.toFixed(0)} ms)`);
    assert.ok(half < 5000, `a connection that never finishes its headers is closed (${half.toFixed(0)} ms)`);

    // Three connections hold the slots; a fourth is closed at once, long before any timeout.
    const holders = Array.from({ length: 3 }, () => {
      const socket = connect(server.port, '127.0.0.1');
      socket.on('error', () => {});
      return socket;
    });
    await Promise.all(holders.map((s) => new Promise((resolve) => s.once('connect', resolve))));
    await new Promise((resolve) => setTimeout(resolve, 50));
    const extra = await closedAfter(server.port, undefined, 10_000);
    for (const s of holders) s.destroy();
    assert.ok(extra < 5000, `the connection past the limit was closed (${extra.toFixed(0)} ms)`);
    let text = '';
    for (let i = 0; i < 50 && !/^roamguard_metrics_refused_connections_total [1-9]/m.test(text); i++) {
      await new Promise((resolve) => setTimeout(resolve, 100));
      text = await get(server.port, '/metrics').then((a) => a.body, () => '');
    }
    assert.match(text, /^roamguard_metrics_refused_connections_total [1-9]\d*$/m);
  });
});
