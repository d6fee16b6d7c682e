/**
 * The pure parts of `roamguard bench`: the throughput rows and their ratios, the Markdown
 * tables (throughput, microbenchmarks, scale run), iperf3 JSON parsing (UDP, parallel TCP), the
 * command-line options, the time-left estimate and the control-socket answer framing.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { parseBenchArgs, QUICK_SUBJECTS } from '../../bench/suite/options.ts';
import { SUBJECTS, requireCompiled, unavailableReason } from '../../bench/suite/subjects.ts';
import { estimateSecondsLeft, formatDuration } from '../../bench/suite/progress.ts';
import {
  formatCount, formatRatio, ratio, renderCpuTable, renderMarkdown, renderMicroTables, renderScaleTable, renderStartupTable, renderThroughputTable, referenceSubject, throughputRows,
} from '../../bench/suite/report.ts';
import { plan, summarize } from '../../bench/suite/runner.ts';
import { cpuSplit, schedRates, threadCpu, threadSched } from '../../bench/suite/procfs.ts';
import type { MicroRuntimeResult } from '../../bench/suite/micro-types.ts';
import type { ScaleResult } from '../../bench/suite/scale.ts';
import { scaleSourceAddress } from '../../bench/suite/scale.ts';
import { mergePings, parseIperfJson, parsePing, parseIperfUdpJson } from '../../bench/suite/tools.ts';
import { isCompleteAnswer } from '../../bench/suite/uapi-client.ts';
import { sampleResults, subject } from './bench-fixtures.ts';

const close = (a: number | undefined, b: number, what: string) => assert.ok(a !== undefined && Math.abs(a - b) < 1e-9, `${what}: ${a} ≠ ${b}`);

/** The cells of the Markdown table row that starts with `label`. */
function row(lines: readonly string[], label: string): string[] {
  const line = lines.find((l) => l.startsWith(`| ${label} |`));
  assert.ok(line, `no row for ${label}`);
  return line.slice(2, -2).split(' | ');
}

describe('throughput rows and ratios', () => {
  const rows = throughputRows(sampleResults());

  test('each figure divided by wireguard-go\'s and by the raw link\'s', () => {
    const node = rows.find((r) => r.label === 'roamguard node')!;
    close(node.vsWireguardGo.tcp1, 0.2 / 0.25, 'TCP 1 ÷ wg-go');
    close(node.vsWireguardGo.tcpParallel, 0.15 / 0.3, 'TCP 4 ÷ wg-go');
    close(node.vsWireguardGo.udp, 90 / 180, 'UDP ÷ wg-go');
    close(node.vsRaw.tcp1, 0.2 / 15, 'TCP 1 ÷ raw');
    close(node.vsRaw.tcpParallel, 0.15 / 12, 'TCP 4 ÷ raw');
    close(node.vsRaw.udp, 0.09 / 0.9, 'UDP ÷ raw');
    const wg = rows.find((r) => r.kind === 'wireguard-go')!;
    close(wg.vsWireguardGo.tcp1, 1, 'wg-go ÷ itself');
  });

  test('the raw link has no ratio to wireguard-go; a subject without figures has none at all', () => {
    const raw = rows.find((r) => r.kind === 'raw')!;
    assert.deepEqual(raw.vsWireguardGo, {});
    close(raw.vsRaw.tcp1, 1, 'raw ÷ raw');
    assert.equal(raw.udpSenderLimited, true);
    const failed = rows.find((r) => r.label === 'roamguard node --threads 0')!;
    assert.equal(failed.tcp1, undefined);
    assert.equal(failed.vsWireguardGo.tcp1, undefined);
  });

  test('the newest wireguard-go is the reference when it ran, Debian\'s otherwise', () => {
    const r = sampleResults();
    r.subjects.push(subject('wireguard-go-modern', 'wireguard-go 0.0.20250522', 'wireguard-go', { gbps: 1.0, parallelGbps: 1.2, udpMbps: 300, udpPps: 31_250, udpStoppedBy: 'converged' }));
    assert.equal(referenceSubject(r.subjects)?.id, 'wireguard-go-modern');
    const node = throughputRows(r).find((x) => x.label === 'roamguard node')!;
    close(node.vsWireguardGo.tcp1, 0.2 / 1.0, 'TCP 1 ÷ the newest wireguard-go');
    assert.match(renderMarkdown(r), /against \*\*wireguard-go 0\.0\.20250522\*\*/);
    r.subjects.at(-1)!.summary = undefined; // it failed: Debian's is the reference
    assert.equal(referenceSubject(r.subjects)?.id, 'wireguard-go');
    close(throughputRows(r).find((x) => x.label === 'roamguard node')!.vsWireguardGo.tcp1, 0.2 / 0.25, 'TCP 1 ÷ Debian\'s');
  });

  test('without wireguard-go there are no wg-go ratios', () => {
    const r = sampleResults();
    r.subjects = r.subjects.filter((s) => s.kind !== 'wireguard-go');
    for (const x of throughputRows(r)) assert.equal(x.vsWireguardGo.tcp1, undefined);
  });

  test('the Markdown throughput table', () => {
    const lines = renderThroughputTable(sampleResults());
    assert.ok(lines[0].startsWith('### Throughput'));
    const head = row(lines, 'subject');
    assert.deepEqual(head.slice(0, 6), ['subject', 'TCP 1 Gbit/s', 'TCP 4 Gbit/s', 'TCP 4 retransmits', 'UDP Mbit/s', 'UDP kpps']);
    const node = row(lines, 'roamguard node');
    assert.deepEqual(node, ['roamguard node', '0.20', '0.15', '0', '90', '9.4', '0.80×', '0.50×', '0.50×', '0.013×', '0.012×', '0.10×']);
    const raw = row(lines, 'raw veth link');
    assert.equal(raw[4], '≥ 900', 'a sender-limited UDP figure is a lower bound');
    assert.deepEqual(raw.slice(6, 9), ['–', '–', '–']);
    const failed = row(lines, 'roamguard node --threads 0');
    assert.equal(failed[1], 'failed');
    assert.equal(failed.length, head.length, 'every row has as many cells as the head');
    for (const l of lines.filter((x) => x.startsWith('| '))) assert.equal(l.split(' | ').length, head.length, l);
  });

  test('renderMarkdown carries the new tables after the one-stream table', () => {
    const md = renderMarkdown(sampleResults());
    const main = md.indexOf('| subject | Gbit/s |');
    const throughput = md.indexOf('### Throughput');
    assert.ok(main >= 0 && throughput > main);
  });

  test('each roamguard subject names its data threads: TUN queues today, a crypto pool in an old baseline', () => {
    const results = sampleResults();
    const node = results.subjects.find((s) => s.id === 'node')!;
    const bun = results.subjects.find((s) => s.id === 'bun')!;
    node.info = { 'TUN queues': '2', crypto: 'aead=openssl-ffi' };
    bun.info = { 'crypto threads': '2', crypto: 'aead=openssl-ffi' };
    const md = renderMarkdown(results);
    assert.match(md, /- roamguard node: TUN queues 2 \(a data thread each\) \(aead=openssl-ffi\)/);
    assert.match(md, /- roamguard bun: crypto threads 2 \(aead=openssl-ffi\)/);
    assert.ok(!md.includes('crypto threads ?'));
  });
});

describe('what the bench runs', () => {
  test('a roamguard checkout whose compiled JavaScript is missing or stale stops the bench, naming the fix', () => {
    const root = mkdtempSync(join(tmpdir(), 'rg-bench-stale-'));
    try {
      mkdirSync(join(root, 'bin'));
      const node = SUBJECTS.find((s) => s.id === 'node-baseline')!;
      const spec = { ...node, bin: join(root, 'bin', 'roamguard') };
      assert.throws(() => requireCompiled(spec), /not compiled; run `npm run build` there first/);
      writeFileSync(join(root, 'a.ts'), 'export const a = 1;\n');
      writeFileSync(join(root, 'a.js'), 'export const a = 1;\n');
      writeFileSync(join(root, '.compiled.json'), JSON.stringify({ format: 1, files: { 'a.ts': { size: 1, mtimeMs: 0, sha256: 'x' } } }));
      assert.throws(() => requireCompiled(spec), /a\.ts changed since it was compiled/);
      const wireguardGo = SUBJECTS.find((s) => s.kind === 'wireguard-go')!;
      requireCompiled({ ...wireguardGo, bin: spec.bin }); // not a roamguard checkout: nothing to check
    } finally {
      rmSync(root, { recursive: true, force: true });
    }
  });
});

describe('start-up and idle cost', () => {
  test('the idle cost comes from every thread\'s schedstat: a thread new in the second reading counts from zero, one that ended not at all', async () => {
    const before = new Map([[10, { cpuNs: 1e6, runs: 5 }], [11, { cpuNs: 7e6, runs: 9 }]]);
    const after = new Map([[10, { cpuNs: 3e6, runs: 9 }], [12, { cpuNs: 2e6, runs: 2 }]]);
    assert.deepEqual(schedRates(before, after, 2), { cpuMsPerSecond: 2, runsPerSecond: 3 });
    // This process: its threads are there, and busy work shows as CPU time.
    const first = threadSched(process.pid);
    assert.ok(first.has(process.pid), 'the main thread is read');
    const until = performance.now() + 30;
    while (performance.now() < until) { /* busy */ }
    const rates = schedRates(first, threadSched(process.pid), 1);
    assert.ok(rates.cpuMsPerSecond >= 20 && rates.runsPerSecond >= 1, JSON.stringify(rates));
  });

  test('summarize takes the medians (and range) of the starts', () => {
    const r = subject('node', 'roamguard node', 'roamguard', undefined, {
      startup: {
        idleMs: 2000,
        samples: [
          { readyMs: 300, idleRssBytes: 100 * 2 ** 20, threads: 15, idleCpuMsPerSecond: 2.5, idleRunsPerSecond: 14 },
          { readyMs: 900, idleRssBytes: 96 * 2 ** 20, threads: 15, idleCpuMsPerSecond: 9, idleRunsPerSecond: 60 },
          { readyMs: 320, idleRssBytes: 98 * 2 ** 20, threads: 14, idleCpuMsPerSecond: 3, idleRunsPerSecond: 15.5 },
        ],
      },
    });
    const m = summarize(r, 'roamguard');
    assert.deepEqual([m.startupMs, m.startupMsMin, m.startupMsMax, m.idleRssBytes, m.idleThreads], [320, 300, 900, 98 * 2 ** 20, 15]);
    assert.deepEqual([m.idleCpuMsPerSecond, m.idleRunsPerSecond], [3, 15.5], 'the idle cost: medians too');
    assert.equal(summarize(subject('raw', 'raw', 'raw', undefined), 'raw').startupMs, undefined, 'no starts, no figure');
  });

  test('the table: every measured subject with its ratios against wireguard-go', () => {
    const results = sampleResults();
    results.meta.options.startups = 3;
    results.meta.options.startupIdleMs = 2000;
    const set = (id: string, startupMs: number, idleMiB: number, idleCpuMsPerSecond: number, idleRunsPerSecond: number) => Object.assign(results.subjects.find((s) => s.id === id)!.summary!, {
      startupMs, startupMsMin: startupMs - 5, startupMsMax: startupMs + 5, idleRssBytes: idleMiB * 2 ** 20, idleThreads: 9, idleCpuMsPerSecond, idleRunsPerSecond,
    });
    set('node', 400, 98, 3.456, 14.04);
    set('wireguard-go', 20, 14, 0.02, 6);
    const lines = renderStartupTable(results);
    assert.equal(lines[0], '### Start-up and idle cost');
    assert.deepEqual(row(lines, 'roamguard node'), ['roamguard node', '400', '395–405', '98.0', '9', '3.46', '14.0', '20.00×', '7.00×']);
    assert.deepEqual(row(lines, 'wireguard-go'), ['wireguard-go', '20', '15–25', '14.0', '9', '0.02', '6.0', '1.00×', '1.00×']);
    assert.ok(!lines.some((l) => l.startsWith('| roamguard bun |')), 'a subject without starts has no row');
    assert.ok(renderMarkdown(results).includes('### Start-up and idle cost'), 'part of the report');
    assert.deepEqual(renderStartupTable(sampleResults()), [], 'no starts measured: no table');
  });
});

describe('where the tunnel CPU goes', () => {
  test('the split counts threads of both readings, and the busiest one', () => {
    const before = [new Map([[10, { user: 1, system: 1 }], [11, { user: 5, system: 0 }], [12, { user: 9, system: 9 }]])];
    // 12 exited (not counted), 13 started (no first reading: not counted).
    const after = [new Map([[10, { user: 3, system: 2.5 }], [11, { user: 5.5, system: 0 }], [13, { user: 50, system: 50 }]])];
    const split = cpuSplit(before, after);
    close(split.user, 2.5, 'user');
    close(split.system, 1.5, 'system');
    close(split.busiestThread, 3.5, 'busiest thread');
  });

  test('this process\'s threads are read from /proc', () => {
    const threads = threadCpu(process.pid);
    assert.ok(threads.has(process.pid), 'the main thread is listed');
    for (const t of threads.values()) assert.ok(t.user >= 0 && t.system >= 0);
    assert.equal(threadCpu(2 ** 22 + 1).size, 0, 'a process that does not exist has no threads');
  });

  test('the summary per GB and the table with ratios against wireguard-go', () => {
    const run = (bytes: number, user: number, system: number, busiest: number) => ({
      direction: 'a-to-b' as const, gbps: 1, retransmits: 0, totalBytes: bytes, wallSeconds: 4, tunnelCpuSeconds: user + system, tunnelCpuBySide: {},
      tunnelCpuSplit: { user, system, busiestThread: busiest }, foreignCpuSeconds: 0, foreignTop: [],
      iperf: { bitsPerSecond: 1e9, retransmits: 0, totalBytes: bytes, tcpRttMs: { mean: 1 } } as never,
    });
    const m = summarize(subject('node', 'roamguard node', 'roamguard', undefined, { runs: [run(1e9, 6, 2, 3.6), run(1e9, 4, 2, 4)] }), 'roamguard');
    close(m.userCpuSecondsPerGB, 5, 'user s/GB');
    close(m.kernelCpuSecondsPerGB, 2, 'kernel s/GB');
    close(m.busiestThreadPercent, 95, 'busiest thread % (median of 90 and 100)');
    const results = sampleResults();
    results.subjects.push(subject('wireguard-go-modern', 'wireguard-go 0.0.20250522', 'wireguard-go', { gbps: 1, userCpuSecondsPerGB: 2.5, kernelCpuSecondsPerGB: 2, busiestThreadPercent: 40 }));
    Object.assign(results.subjects.find((s) => s.id === 'node')!.summary!, { userCpuSecondsPerGB: 5, kernelCpuSecondsPerGB: 1, busiestThreadPercent: 95 });
    const lines = renderCpuTable(results);
    assert.equal(lines[0], '### Where the tunnel CPU goes');
    assert.deepEqual(row(lines, 'roamguard node'), ['roamguard node', '5.00', '1.00', '95', '2.00×', '0.50×']);
    assert.ok(!lines.some((l) => l.startsWith('| roamguard bun |')), 'a subject without a split has no row');
    assert.ok(renderMarkdown(results).includes('### Where the tunnel CPU goes'), 'part of the report');
    assert.deepEqual(renderCpuTable(sampleResults()), [], 'no split measured: no table');
  });
});

describe('microbenchmark and scale tables', () => {
  const runtime = (name: 'node' | 'bun', factor: number): MicroRuntimeResult => ({
    runtime: name, version: `${name} 1`, selected: { aead: 'libsodium-ffi', dh: 'libsodium-ffi' },
    aead: [64, 512, 1420].flatMap((size) => [
      { provider: 'libsodium-ffi', size, sealMBps: size * factor, openMBps: size * factor },
      ...(name === 'node' ? [{ provider: 'node:crypto', size, sealMBps: size / 10, openMBps: size / 10, batchSealMBps: size / 5 }] : []),
    ]),
    aeadErrors: {}, handshakes: { perSecond: 900 * factor, count: 100 },
    allowedIps: [1, 1000, 100_000].map((prefixes) => ({ family: 4 as const, prefixes, lookupsPerSecond: 1e8 / prefixes ** 0.5, hitRatio: 0.5, nodes: prefixes })),
    peerMemory: { peers: 1000, heapBytesPerPeer: 4000 / factor }, errors: {}, elapsedSeconds: 5,
  });

  test('AEAD per provider and runtime, handshakes, lookups, heap per peer', () => {
    const r = sampleResults();
    r.micro = { runtimes: [runtime('node', 1), runtime('bun', 2)], failures: [{ runtime: 'bun', error: 'x\ny' }] };
    const lines = renderMicroTables(r);
    assert.deepEqual(row(lines, 'provider'), ['provider', 'node 64 B', 'node 512 B', 'node 1420 B', 'bun 64 B', 'bun 512 B', 'bun 1420 B']);
    assert.deepEqual(row(lines, 'libsodium-ffi'), ['libsodium-ffi', '64*', '512*', '1420*', '128*', '1024*', '2840*']);
    assert.deepEqual(row(lines, 'node:crypto'), ['node:crypto', '6 / 13', '51 / 102', '142 / 284', 'n/a', 'n/a', 'n/a']);
    assert.equal(row(lines, 'node 1')[1], '900');
    assert.equal(row(lines, 'bun 1')[2], '2000 (1000 peers)');
    assert.deepEqual(row(lines, 'IPv4, 1 prefix'), ['IPv4, 1 prefix', '100 M', '100 M']);
    assert.deepEqual(row(lines, 'IPv4, 100,000 prefixes'), ['IPv4, 100,000 prefixes', '316 k', '316 k']);
    assert.ok(lines.some((l) => l.includes('microbenchmarks under bun failed') && !l.includes('\n')));
    assert.deepEqual(renderMicroTables(sampleResults()), []);
  });

  test('the scale run', () => {
    const r = sampleResults();
    const scale: ScaleResult = {
      peers: 1000, daemon: 'roamguard node (pid 1)',
      rss: { idleBytes: 200 * 2 ** 20, withPeersBytes: 203 * 2 ** 20, afterHandshakesBytes: 230 * 2 ** 20, peakBytes: 240 * 2 ** 20 },
      rssPerPeerBytes: 3 * 2 ** 20 / 1000, setMs: 150, notes: [],
      getIdle: { samples: 10, medianMs: 20, maxMs: 80, bytes: 300 * 1024 },
      getAfter: { samples: 10, medianMs: 22, maxMs: 90, bytes: 345 * 1024 },
      handshakes: {
        peers: 1000, completed: 1000, allDoneMs: 6650, p50Ms: 6100, p90Ms: 6520, firstRound: 256, burstMs: 300,
        initiationsSent: 1744, responsesReceived: 1000, cookieRepliesReceived: 744, elapsedMs: 6700, timedOut: false,
        daemonConfirmed: 1000, daemonConfirmedMs: 6840, daemonCpuSeconds: 1.86, rate: 0, sources: 1000,
      },
    };
    r.scale = scale;
    const lines = renderScaleTable(r);
    assert.ok(lines[0].includes('1,000 peers'));
    assert.equal(row(lines, 'daemon RSS idle → with peers → after handshakes (peak)')[1], '200 → 203 → 230 MiB (240 MiB)');
    assert.equal(row(lines, 'daemon RSS per configured peer')[1], '3.1 KiB');
    assert.equal(row(lines, 'daemon showed every peer with a handshake (get=1)')[1], '6.84 s');
    assert.equal(row(lines, 'completed on the first initiation / cookie replies / initiations sent')[1], '256 / 744 / 1744');
    assert.ok(lines.some((l) => l.includes('under load')), 'explains the cookie replies');
    assert.deepEqual(renderScaleTable({ ...sampleResults(), scaleError: 'daemon died\nstack' }), ['### Scale run', '', '**failed**: daemon died', '']);
  });
});

describe('formatting', () => {
  test('ratio and formatRatio', () => {
    assert.equal(ratio(1, 4), '0.25×');
    assert.equal(ratio(0.017, 2), '0.0085×');
    assert.equal(ratio(1, 0), '–');
    assert.equal(ratio(undefined, 1), '–');
    assert.equal(ratio(Number.NaN, 1), '–');
    assert.equal(formatRatio(2), '2.00');
  });

  test('formatCount', () => {
    assert.equal(formatCount(65_700_000), '65.7 M');
    assert.equal(formatCount(857_000), '857 k');
    assert.equal(formatCount(1_500_000_000), '1.50 G');
    assert.equal(formatCount(12), '12.0');
    assert.equal(formatCount(undefined), '–');
  });

  test('formatDuration and the time-left estimate', () => {
    assert.equal(formatDuration(119.6), '2m00s');
    assert.equal(formatDuration(59.4), '59s');
    assert.equal(estimateSecondsLeft(100, 10, 30), 100, 'too early to correct');
    assert.equal(estimateSecondsLeft(50, 50, 75), 75, 'running 1.5× slower than planned');
    assert.equal(estimateSecondsLeft(50, 50, 500), 100, 'at most 2×');
    assert.equal(estimateSecondsLeft(50, 50, 10), 40, 'at least 0.8×');
  });

  test('the scale run\'s source addresses are distinct and in 198.19.0.0/16', () => {
    const seen = new Set<string>();
    for (let i = 0; i < 1000; i++) {
      const a = scaleSourceAddress(i);
      assert.match(a, /^198\.19\.\d+\.\d+$/);
      const last = Number(a.split('.')[3]);
      assert.ok(last >= 1 && last <= 250);
      seen.add(a);
    }
    assert.equal(seen.size, 1000);
    assert.throws(() => scaleSourceAddress(64_000));
  });

  test('control socket answers are complete at errno and an empty line', () => {
    assert.equal(isCompleteAnswer('errno=0\n\n'), true);
    assert.equal(isCompleteAnswer('private_key=ab\nlisten_port=1\nerrno=0\n\n'), true);
    assert.equal(isCompleteAnswer('errno=-22\n\n'), true);
    assert.equal(isCompleteAnswer('listen_port=1\nerrno=0\n'), false);
    assert.equal(isCompleteAnswer('public_key=aa\nrx_errno=0\n\n'), false);
  });
});

describe('idle ping', () => {
  const reply = (seq: number, ms: number) => `64 bytes from 10.0.0.2: icmp_seq=${seq} ttl=64 time=${ms} ms`;

  test('series merge into one: every reply counts toward the median, lost echoes stay lost', () => {
    const slow = parsePing([0.9, 1.0, 1.1].map((ms, i) => reply(i + 1, ms)).join('\n'), 3);
    const fast = parsePing([0.2, 0.3].map((ms, i) => reply(i + 1, ms)).join('\n'), 4);
    const merged = mergePings([slow, fast]);
    assert.deepEqual([merged.sent, merged.received], [7, 5]);
    assert.deepEqual(merged.rttsMs, [0.9, 1.0, 1.1, 0.2, 0.3]);
    close(merged.medianMs, 0.9, 'median of all five');
    assert.equal(slow.medianMs, 1.0, 'one series alone would say 1.0');
  });

  test('idle ping rounds follow every block, each round over all subjects, the order turned by one', () => {
    const opts = { ...parseBenchArgs(['--runs', '3']), micro: false, scale: false, startups: 0 };
    const ids = ['raw', 'node', 'wireguard-go-modern'];
    const specs = ids.map((id) => SUBJECTS.find((s) => s.id === id)!);
    const steps = plan(specs, opts, []);
    const firstPing = steps.findIndex((s) => s.kind === 'ping');
    assert.ok(steps.slice(firstPing).every((s) => s.kind === 'ping'), 'no block step after the first ping round');
    assert.deepEqual(steps.slice(0, firstPing).filter((s) => s.kind === 'iperf').length, 3 * ids.length, 'every block complete first');
    const rounds = steps.slice(firstPing).map((s) => `${s.run}:${s.subject!.id}`);
    assert.deepEqual(rounds, [
      '1:raw', '1:node', '1:wireguard-go-modern',
      '2:node', '2:wireguard-go-modern', '2:raw',
      '3:wireguard-go-modern', '3:raw', '3:node',
    ]);
    const pingSeconds = 2 * (200 * 0.01 + 0.3); // 200 warm-up echoes, then the 200 measured
    close(steps[firstPing].seconds, 0.1 + pingSeconds, 'raw: no start to speak of, no prime');
    close(steps[firstPing + 1].seconds, 3 + 2.7 + pingSeconds, 'roamguard: started afresh, primed, warmed');
    const cold = plan(specs, { ...opts, pingWarmup: 0 }, []);
    close(cold[firstPing].seconds, 0.1 + 200 * 0.01 + 0.3, '--ping-warmup 0: the measured echoes right after the prime');
  });

  test('--ping-warmup: 200 by default, 50 with --quick, any whole number given', () => {
    assert.equal(parseBenchArgs([]).pingWarmup, 200);
    assert.equal(parseBenchArgs(['--quick']).pingWarmup, 50);
    assert.equal(parseBenchArgs(['--quick', '--ping-warmup', '0']).pingWarmup, 0);
    assert.throws(() => parseBenchArgs(['--ping-warmup', '-1']), /--ping-warmup needs a whole number/);
  });

  test('the main table: the idle ping divided by wireguard-go\'s, and the fresh-start figure beside it', () => {
    const r = sampleResults();
    const node = r.subjects.find((x) => x.id === 'node')!;
    const wg = r.subjects.find((x) => x.kind === 'wireguard-go')!;
    node.summary!.rttMedianMs = 0.5;
    node.summary!.rttFreshMedianMs = 0.62;
    wg.summary!.rttMedianMs = 0.4;
    r.meta.options.pingWarmup = 200;
    const md = renderMarkdown(r).split('\n');
    const head = row(md, 'subject');
    const cells = row(md, 'roamguard node');
    assert.equal(cells[head.indexOf('RTT ÷ wireguard-go')], '1.25×');
    assert.equal(cells[head.indexOf('RTT fresh ms')], '0.620');
    assert.equal(row(md, 'raw veth link')[head.indexOf('RTT ÷ wireguard-go')], '–');
    assert.match(md.join('\n'), /after 200 warm-up echoes \(their median: RTT fresh\)/);
  });
});

describe('iperf3 JSON', () => {
  test('UDP: sent and received sums, loss, packets per second', () => {
    const text = JSON.stringify({
      end: {
        sum_sent: { seconds: 1, bytes: 62_478_000, bits_per_second: 500e6, packets: 52065 },
        sum_received: { seconds: 1.0002, bytes: 62_414_400, bits_per_second: 499.2e6, packets: 52065, lost_packets: 53 },
      },
    });
    const p = parseIperfUdpJson(text, 500e6);
    assert.equal(p.targetBps, 500e6);
    assert.equal(p.sentBps, 500e6);
    assert.equal(p.receivedBps, 499.2e6);
    close(p.lossFraction, 53 / 52065, 'loss');
    close(p.receivedPps, (52065 - 53) / 1.0002, 'pps');
    assert.equal(p.error, undefined);
  });

  test('UDP: datagrams lost after the last one received count too (bytes received vs sent)', () => {
    // iperf3 counts gaps only: 391 datagrams at the end never arrived and are not in lost_packets.
    const text = JSON.stringify({
      end: {
        sum_sent: { seconds: 2, bytes: 49_982_400, bits_per_second: 199.9e6, packets: 41652 },
        sum_received: { seconds: 2.18, bytes: 34_489_200, bits_per_second: 126.6e6, packets: 41261, lost_packets: 12517 },
      },
    });
    const p = parseIperfUdpJson(text, 200e6);
    close(p.lossFraction, 1 - 34_489_200 / 49_982_400, 'loss from bytes');
    assert.ok(p.lossFraction > 12517 / 41261);
  });

  test('UDP: older iperf3 with only `sum`, and errors', () => {
    const p = parseIperfUdpJson(JSON.stringify({ end: { sum: { seconds: 2, bits_per_second: 1e6, packets: 100, lost_packets: 2 } } }), 1e6);
    close(p.lossFraction, 0.02, 'loss');
    assert.throws(() => parseIperfUdpJson(JSON.stringify({ error: 'unable to connect' }), 1), /unable to connect/);
    assert.throws(() => parseIperfUdpJson('garbage', 1), /no JSON/);
    assert.throws(() => parseIperfUdpJson('{"end":{}}', 1), /no UDP end summary/);
  });

  test('TCP with parallel streams: the sums, the mean RTT of the streams', () => {
    const stream = (rtt: number, cwnd: number) => ({ sender: { mean_rtt: rtt, min_rtt: rtt / 2, max_rtt: rtt * 2, max_snd_cwnd: cwnd } });
    const p = parseIperfJson(JSON.stringify({
      intervals: [{ sum: { bytes: 1000, bits_per_second: 8000, omitted: true } }, { sum: { bytes: 3000, bits_per_second: 24000 } }],
      end: {
        sum_sent: { bytes: 3000, seconds: 1, bits_per_second: 24000, retransmits: 7 },
        sum_received: { bytes: 3000, seconds: 1, bits_per_second: 23000 },
        streams: [stream(1000, 10), stream(3000, 30), stream(2000, 20), stream(2000, 5)],
      },
    }));
    assert.equal(p.bitsPerSecond, 23000);
    assert.equal(p.retransmits, 7);
    assert.equal(p.totalBytes, 4000);
    assert.deepEqual(p.intervals, [24000]);
    assert.equal(p.tcpRttMs.mean, 2);
    assert.equal(p.maxSendCwnd, 30);
  });
});

describe('bench options', () => {
  test('defaults: every new part on', () => {
    const o = parseBenchArgs([]);
    assert.equal(o.parallel, true);
    assert.equal(o.streams, 4);
    assert.equal(o.udp, true);
    assert.equal(o.udpSize, 1200);
    assert.equal(o.micro, true);
    assert.equal(o.scale, true);
    assert.equal(o.peers, 1000);
    assert.equal(o.udpProbes, 8);
    assert.deepEqual([o.startups, o.startupIdleMs], [3, 2000]);
    assert.deepEqual([parseBenchArgs(['--quick']).startups, parseBenchArgs(['--quick', '--startups', '0']).startups], [2, 0]);
    assert.throws(() => parseBenchArgs(['--startups', '-1']), /whole number/);
  });

  test('--wireguard-go-modern PATH: the reference binary, resolved; a missing one skips the subject naming it', () => {
    assert.equal(parseBenchArgs([]).wireguardGoModern, undefined, 'default: the build beside the checkout');
    assert.equal(parseBenchArgs(['--wireguard-go-modern', 'anchors/wg']).wireguardGoModern, resolve('anchors/wg'));
    const modern = SUBJECTS.find((s) => s.id === 'wireguard-go-modern')!;
    assert.match(unavailableReason({ ...modern, bin: '/nonexistent/wireguard-go' }) ?? '', /^\/nonexistent\/wireguard-go not found: skipped \(ratios are against Debian's wireguard-go\)/);
    assert.equal(unavailableReason({ ...modern, bin: process.execPath }), undefined, 'an executable given: runs');
  });

  test('--quick: the short subset; explicit options still win', () => {
    const q = parseBenchArgs(['--quick']);
    assert.deepEqual(q.subjects, QUICK_SUBJECTS);
    assert.equal(q.udpProbeSeconds, 1);
    assert.equal(q.udpProbes, 5);
    assert.equal(q.runs, 1);
    const explicit = parseBenchArgs(['--udp-probes', '3', '--quick', '--only', 'node,wireguard-go', '--runs=2']);
    assert.equal(explicit.udpProbes, 3);
    assert.deepEqual(explicit.subjects, ['node', 'wireguard-go']);
    assert.equal(explicit.runs, 2);
  });

  test('the --no-… switches and value checks', () => {
    const o = parseBenchArgs(['--no-parallel', '--no-udp', '--no-micro', '--no-scale', '--peers', '200', '--scale-rate', '100', '--streams', '8', '--udp-size', '64']);
    assert.deepEqual([o.parallel, o.udp, o.micro, o.scale, o.peers, o.scaleRate, o.streams, o.udpSize], [false, false, false, false, 200, 100, 8, 64]);
    assert.throws(() => parseBenchArgs(['--udp-size', '1400']), /at most 1392/);
    assert.throws(() => parseBenchArgs(['--streams', '1']), /at least 2/);
    assert.throws(() => parseBenchArgs(['--peers', '0']), /positive/);
    assert.throws(() => parseBenchArgs(['--peers', '100000']), /at most/);
    assert.throws(() => parseBenchArgs(['--bogus']), /unknown argument/);
  });
});
