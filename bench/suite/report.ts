/**
 * The Markdown report of a run (the subjects' table, the throughput table with ratios, the
 * microbenchmarks and the scale run), and the result files: JSON with every figure, the Markdown
 * and the SVG chart next to it.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { IDLE_CPU_WINDOW_MS, type BenchResults, type SubjectResult } from './results.ts';

const num = (v: number | undefined, digits: number): string => (v === undefined || !Number.isFinite(v) ? '–' : v.toFixed(digits));
/** `a ÷ b` as `1.23×`, or `–` when either is missing, not finite, or b is 0 (exported for tests). */
export const ratio = (a: number | undefined, b: number | undefined): string =>
  a === undefined || b === undefined || !Number.isFinite(a) || !Number.isFinite(b) || b === 0 ? '–' : `${formatRatio(a / b)}×`;
/** Two decimals, or two significant digits below 0.1 (0.0085×, not 0.01×). */
export const formatRatio = (r: number): string => (r > 0 && r < 0.1 ? r.toPrecision(2) : r.toFixed(2));
/** A rate with a k/M/G suffix and three significant digits: `1.23 M`, `456 k`, `12.0`. */
export function formatCount(n: number | undefined): string {
  if (n === undefined || !Number.isFinite(n)) return '–';
  const [value, suffix] = n >= 1e9 ? [n / 1e9, ' G'] : n >= 1e6 ? [n / 1e6, ' M'] : n >= 1e3 ? [n / 1e3, ' k'] : [n, ''];
  return `${value >= 100 ? value.toFixed(0) : value >= 10 ? value.toFixed(1) : value.toFixed(2)}${suffix}`;
}
const mib = (bytes: number | undefined, digits = 0) => (bytes === undefined ? '–' : num(bytes / 2 ** 20, digits));
const markdownRow = (cells: readonly string[]) => `| ${cells.join(' | ')} |`;
const markdownHead = (cells: readonly string[]) => [markdownRow(cells), `|${cells.map((_, i) => (i === 0 ? '---' : '---:')).join('|')}|`];

/** One subject's throughput figures and their ratios (exported for tests). */
export interface ThroughputRow {
  label: string;
  kind: string;
  status: SubjectResult['status'];
  /** Gbit/s, TCP one stream and parallel streams; UDP Gbit/s of payload and datagrams/s. */
  tcp1?: number;
  tcpParallel?: number;
  parallelRetransmits?: number;
  udpGbps?: number;
  udpPps?: number;
  /** The UDP figure is the sender's limit, not the path's. */
  udpSenderLimited: boolean;
  /** Each figure ÷ wireguard-go's and ÷ the raw link's (undefined when either is missing). */
  vsWireguardGo: { tcp1?: number; tcpParallel?: number; udp?: number };
  vsRaw: { tcp1?: number; tcpParallel?: number; udp?: number };
}

const divide = (a: number | undefined, b: number | undefined): number | undefined =>
  a === undefined || b === undefined || !Number.isFinite(a) || !Number.isFinite(b) || b === 0 ? undefined : a / b;

/**
 * The subject every ratio is taken against: upstream's newest wireguard-go when it ran, else
 * Debian's (an older build without the offloads), else none.
 */
export function referenceSubject<T extends { id: string; kind: string; summary?: unknown }>(subjects: readonly T[]): T | undefined {
  return subjects.find((s) => s.id === 'wireguard-go-modern' && s.summary)
    ?? subjects.find((s) => s.kind === 'wireguard-go' && s.summary);
}

/** The throughput rows of every subject, with ratios against wireguard-go and the raw link. */
export function throughputRows(results: BenchResults): ThroughputRow[] {
  const figures = (s: SubjectResult) => ({
    tcp1: s.summary?.gbps,
    tcpParallel: s.summary?.parallelGbps,
    udp: s.summary?.udpMbps === undefined ? undefined : s.summary.udpMbps / 1000,
  });
  const wg = referenceSubject(results.subjects);
  const raw = results.subjects.find((s) => s.kind === 'raw' && s.summary);
  const wgFigures = wg ? figures(wg) : undefined;
  const rawFigures = raw ? figures(raw) : undefined;
  return results.subjects.map((s) => {
    const f = figures(s);
    const against = (ref: ReturnType<typeof figures> | undefined) => ({
      tcp1: divide(f.tcp1, ref?.tcp1), tcpParallel: divide(f.tcpParallel, ref?.tcpParallel), udp: divide(f.udp, ref?.udp),
    });
    return {
      label: s.label, kind: s.kind, status: s.status,
      tcp1: f.tcp1, tcpParallel: f.tcpParallel, parallelRetransmits: s.summary?.parallelRetransmits,
      udpGbps: f.udp, udpPps: s.summary?.udpPps, udpSenderLimited: s.summary?.udpStoppedBy === 'sender-limited',
      vsWireguardGo: s.kind === 'raw' ? {} : against(wgFigures),
      vsRaw: against(rawFigures),
    };
  });
}

const shownRatio = (r: number | undefined) => (r === undefined ? '–' : `${formatRatio(r)}×`);

/** The throughput table: TCP one stream, TCP parallel streams, UDP, each with its ratios. */
export function renderThroughputTable(results: BenchResults): string[] {
  const o = results.meta.options;
  const streams = o.streams ?? 4;
  const rows = throughputRows(results);
  if (!rows.some((r) => r.tcpParallel !== undefined || r.udpGbps !== undefined)) return [];
  const lines: string[] = [];
  lines.push('### Throughput: TCP 1 stream, TCP ' + streams + ' streams, UDP', '');
  const udpText = o.udp === false ? 'UDP not measured' :
    `UDP: ${o.udpSize ?? 1200}-byte datagrams, the highest rate with under 1 % loss (doubling, then bisecting; probes of ${o.udpProbeSeconds ?? '?'} s, at most ${o.udpProbes ?? '?'}), received payload rate`;
  lines.push(`TCP: median of ${o.runs} run${o.runs === 1 ? '' : 's'} of ${o.duration} s, receiver-side goodput; ${o.parallel === false ? `${streams}-stream TCP not measured` : `${streams} streams with iperf3 -P ${streams}`}. ${udpText}. Ratios: each figure divided by ${referenceSubject(results.subjects)?.label ?? 'wireguard-go'}'s and by the raw veth link's.`, '');
  lines.push(...markdownHead([
    'subject', 'TCP 1 Gbit/s', `TCP ${streams} Gbit/s`, `TCP ${streams} retransmits`, 'UDP Mbit/s', 'UDP kpps',
    'TCP 1 ÷ wg-go', `TCP ${streams} ÷ wg-go`, 'UDP ÷ wg-go', 'TCP 1 ÷ raw', `TCP ${streams} ÷ raw`, 'UDP ÷ raw',
  ]));
  for (const r of rows) {
    if (r.tcp1 === undefined && r.tcpParallel === undefined && r.udpGbps === undefined) {
      lines.push(markdownRow([r.label, r.status, ...Array<string>(10).fill('')]));
      continue;
    }
    lines.push(markdownRow([
      r.label, num(r.tcp1, 2), num(r.tcpParallel, 2), num(r.parallelRetransmits, 0),
      r.udpGbps === undefined ? '–' : `${r.udpSenderLimited ? '≥ ' : ''}${num(r.udpGbps * 1000, 0)}`,
      r.udpPps === undefined ? '–' : num(r.udpPps / 1000, 1),
      shownRatio(r.vsWireguardGo.tcp1), shownRatio(r.vsWireguardGo.tcpParallel), shownRatio(r.vsWireguardGo.udp),
      shownRatio(r.vsRaw.tcp1), shownRatio(r.vsRaw.tcpParallel), shownRatio(r.vsRaw.udp),
    ]));
  }
  if (rows.some((r) => r.udpSenderLimited)) lines.push('', '≥: iperf3\'s UDP sender could not send faster, so the path\'s limit is higher (the raw link, usually).');
  if (rows.some((r) => r.kind === 'raw' && r.udpGbps !== undefined)) {
    lines.push('', 'On the raw link the UDP figure is what iperf3 itself manages on these cores (one sender thread, and a receiving socket with the default buffer that overflows whenever the receiver is descheduled), not the veth\'s capacity; the UDP ÷ raw ratios compare against that.');
  }
  const probeNotes = results.subjects.filter((s) => s.udp).map((s) => {
    const u = s.udp!;
    const passed = u.passingBps !== undefined ? `passed at ${formatCount(u.passingBps)}bit/s` : 'no rate passed';
    const range = u.failingBps !== undefined ? `${passed}, failed at ${formatCount(u.failingBps)}bit/s` : passed;
    return `${s.label}: ${u.probes.length} probe${u.probes.length === 1 ? '' : 's'}, ${range} (stopped: ${u.stoppedBy})`;
  });
  if (probeNotes.length > 0) lines.push('', `UDP search: ${probeNotes.join('; ')}.`);
  lines.push('');
  return lines;
}

/** The microbenchmark tables (empty when none ran). */
export function renderMicroTables(results: BenchResults): string[] {
  const micro = results.micro;
  if (!micro || (micro.runtimes.length === 0 && micro.failures.length === 0)) return [];
  const lines: string[] = ['### Microbenchmarks (one core, child process per runtime)', ''];
  const runtimes = micro.runtimes;
  if (runtimes.length > 0) {
    const sizes = [...new Set(runtimes.flatMap((r) => r.aead.map((a) => a.size)))].sort((a, b) => a - b);
    const providers = [...new Set(runtimes.flatMap((r) => [...r.aead.map((a) => a.provider), ...Object.keys(r.aeadErrors)]))];
    lines.push('ChaCha20-Poly1305 seal, MB/s of plaintext, one packet per call / 64 packets per call (Aead.sealSlots, as the crypto workers seal a batch); open in the JSON; * = the provider the runtime selects.', '');
    lines.push(...markdownHead(['provider', ...runtimes.flatMap((r) => sizes.map((size) => `${r.runtime} ${size} B`))]));
    for (const provider of providers) {
      const cells = runtimes.flatMap((r) => sizes.map((size) => {
        const f = r.aead.find((a) => a.provider === provider && a.size === size);
        if (f) return `${num(f.sealMBps, 0)}${f.batchSealMBps === undefined ? '' : ` / ${num(f.batchSealMBps, 0)}`}${r.selected.aead === provider ? '*' : ''}`;
        return r.aeadErrors[provider] ? 'failed' : 'n/a';
      }));
      lines.push(markdownRow([provider, ...cells]));
    }
    lines.push('');
    lines.push(...markdownHead(['runtime', 'handshakes/s (initiation + response + confirmation, both sides on one core)', 'heap per peer, bytes', 'X25519 provider']));
    for (const r of runtimes) {
      lines.push(markdownRow([
        r.version, r.handshakes ? num(r.handshakes.perSecond, 0) : (r.errors.handshakes ? 'failed' : '–'),
        r.peerMemory ? `${num(r.peerMemory.heapBytesPerPeer, 0)} (${r.peerMemory.peers} peers)` : (r.errors['peer memory'] ? 'failed' : '–'),
        r.selected.dh ?? '?',
      ]));
    }
    lines.push('');
    const tables = [...new Map(runtimes.flatMap((r) => r.allowedIps.map((a) => [`${a.family}/${a.prefixes}`, a] as const))).values()];
    if (tables.length > 0) {
      lines.push('Allowed-IPs lookups per second (lookupPacketDestination; half the destinations inside a prefix):', '');
      lines.push(...markdownHead(['table', ...runtimes.map((r) => r.runtime)]));
      for (const t of tables) {
        lines.push(markdownRow([
          `IPv${t.family}, ${t.prefixes.toLocaleString('en-US')} prefix${t.prefixes === 1 ? '' : 'es'}`,
          ...runtimes.map((r) => formatCount(r.allowedIps.find((a) => a.family === t.family && a.prefixes === t.prefixes)?.lookupsPerSecond)),
        ]));
      }
      lines.push('');
    }
    const errors = runtimes.flatMap((r) => [...Object.entries(r.errors), ...Object.entries(r.aeadErrors)].map(([what, why]) => `${r.runtime} ${what}: ${why}`));
    if (errors.length > 0) lines.push(`Failed parts: ${errors.join('; ')}.`, '');
  }
  for (const f of micro.failures) lines.push(`**microbenchmarks under ${f.runtime} failed**: ${f.error.split('\n')[0]}`, '');
  return lines;
}

/** The scale run's table (empty when it did not run). */
export function renderScaleTable(results: BenchResults): string[] {
  const scale = results.scale;
  if (!scale) return results.scaleError ? ['### Scale run', '', `**failed**: ${results.scaleError.split('\n')[0]}`, ''] : [];
  const n = scale.peers;
  const h = scale.handshakes;
  const seconds = (ms: number | undefined) => (ms === undefined || !Number.isFinite(ms) ? '–' : `${(ms / 1000).toFixed(2)} s`);
  const lines: string[] = [`### Scale run: one daemon, ${n.toLocaleString('en-US')} peers`, ''];
  lines.push(`${scale.daemon.replace(/ \(pid \d+\)/, '')} with default crypto threads in B, configured through its control socket; ${h ? `${h.sources.toLocaleString('en-US')} simulated peers in A (one WireGuardCore, key and source address each) initiating ${h.rate > 0 ? `at ${h.rate}/s` : 'all at once'}` : 'no handshakes'}.`, '');
  lines.push(...markdownHead(['figure', 'value']));
  const row = (k: string, v: string) => lines.push(markdownRow([k, v]));
  row('daemon RSS idle → with peers → after handshakes (peak)', `${mib(scale.rss.idleBytes)} → ${mib(scale.rss.withPeersBytes)} → ${mib(scale.rss.afterHandshakesBytes)} MiB (${mib(scale.rss.peakBytes)} MiB)`);
  row('daemon RSS per configured peer', `${num(scale.rssPerPeerBytes / 1024, 1)} KiB`);
  row(`set=1 adding ${n} peers`, `${num(scale.setMs, 0)} ms`);
  row(`get=1 with ${n} peers, median (max) of ${scale.getIdle.samples}`, `${num(scale.getIdle.medianMs, 1)} ms (${num(scale.getIdle.maxMs, 1)} ms), ${num(scale.getIdle.bytes / 1024, 0)} KiB`);
  if (scale.getAfter) row('get=1 after the handshakes, median (max)', `${num(scale.getAfter.medianMs, 1)} ms (${num(scale.getAfter.maxMs, 1)} ms), ${num(scale.getAfter.bytes / 1024, 0)} KiB`);
  if (h) {
    row('handshakes completed (simulated side)', `${h.completed} of ${h.peers}${h.timedOut ? ' (timed out)' : ''}`);
    row('all handshakes done (simulated side): last, median, p90', `${seconds(h.allDoneMs)}, ${seconds(h.p50Ms)}, ${seconds(h.p90Ms)}`);
    row('daemon showed every peer with a handshake (get=1)', h.daemonConfirmed === n ? seconds(h.daemonConfirmedMs) : `${h.daemonConfirmed} of ${n}`);
    row('completed on the first initiation / cookie replies / initiations sent', `${h.firstRound} / ${h.cookieRepliesReceived} / ${h.initiationsSent}`);
    row('daemon CPU during the handshakes', `${num(h.daemonCpuSeconds, 2)} s (${num((h.daemonCpuSeconds * 1000) / Math.max(1, h.completed), 2)} ms per handshake)`);
  }
  lines.push('');
  if (h && h.cookieRepliesReceived > 0) {
    lines.push('Above 256 handshake messages a second the daemon is "under load" and answers initiations without a valid cookie with a cookie reply; those peers retry after the 5 s RekeyTimeout, so the completion time shows the protocol\'s back-off more than the daemon\'s speed (compare `--scale-rate 200`).', '');
  }
  if (scale.notes.length > 0) lines.push(`Notes: ${scale.notes.join('; ')}.`, '');
  return lines;
}

/**
 * Where each tunnel's CPU goes in the one-stream runs: user space against the kernel, and the busiest
 * single thread. A busiest thread near 100 % of a core is a serial limit (the hand-offs of a
 * pipeline wait on it); a machine whose cores are all busy is limited by the CPU per GB instead.
 */
export function renderCpuTable(results: BenchResults): string[] {
  const measured = results.subjects.filter((s) => s.kind !== 'raw' && s.summary?.userCpuSecondsPerGB !== undefined);
  if (measured.length === 0) return [];
  const reference = referenceSubject(results.subjects)?.summary;
  const lines: string[] = [];
  lines.push('### Where the tunnel CPU goes', '');
  lines.push('One-stream TCP runs, both tunnel processes, threads that lived through each run (from /proc/PID/task/TID/stat): ' +
    'CPU seconds per 10⁹ payload bytes in user space and in the kernel (system calls; softirq work the kernel does for them is not charged to the process), ' +
    'and the busiest single thread as a percent of one core over the run (median of the runs).', '');
  lines.push(...markdownHead(['subject', 'user s/GB', 'kernel s/GB', 'busiest thread %', 'user ÷ wg-go', 'kernel ÷ wg-go']));
  for (const s of measured) {
    const m = s.summary!;
    lines.push(markdownRow([
      s.label, num(m.userCpuSecondsPerGB, 2), num(m.kernelCpuSecondsPerGB, 2), num(m.busiestThreadPercent, 0),
      ratio(m.userCpuSecondsPerGB, reference?.userCpuSecondsPerGB), ratio(m.kernelCpuSecondsPerGB, reference?.kernelCpuSecondsPerGB),
    ]));
  }
  lines.push('');
  return lines;
}

/**
 * Start-up time and idle cost per subject (bench/suite/startup.ts): one daemon started alone,
 * timed to its control socket's first answer, then its RSS idle; ratios against wireguard-go.
 */
export function renderStartupTable(results: BenchResults): string[] {
  const measured = results.subjects.filter((s) => s.summary?.startupMs !== undefined);
  if (measured.length === 0) return [];
  const reference = referenceSubject(results.subjects)?.summary;
  const o = results.meta.options;
  const lines: string[] = [];
  lines.push('### Start-up and idle cost', '');
  lines.push(`One daemon started alone in a namespace (\`-f\`, unconfigured), ${o.startups ?? '?'} time${o.startups === 1 ? '' : 's'}: ` +
    'ready = from the spawn to the first complete answer of its control socket to `get=1` (polled every 5 ms; what `wg` and wg-quick wait for); ' +
    `idle RSS = its VmRSS ${(o.startupIdleMs ?? 2000) / 1000} s later, with its thread count; ` +
    `idle CPU and wake-ups = over the ${IDLE_CPU_WINDOW_MS / 1000} s after that, every thread's schedstat (CPU time, and the times a thread ran). Medians of the starts.`, '');
  lines.push(...markdownHead(['subject', 'ready ms', 'min–max', 'idle RSS MiB', 'threads', 'idle CPU ms/s', 'idle wake-ups/s', 'ready ÷ wg-go', 'idle RSS ÷ wg-go']));
  for (const s of measured) {
    const m = s.summary!;
    lines.push(markdownRow([
      s.label, num(m.startupMs, 0), `${num(m.startupMsMin, 0)}–${num(m.startupMsMax, 0)}`, mib(m.idleRssBytes, 1), num(m.idleThreads, 0),
      num(m.idleCpuMsPerSecond, 2), num(m.idleRunsPerSecond, 1),
      ratio(m.startupMs, reference?.startupMs), ratio(m.idleRssBytes, reference?.idleRssBytes),
    ]));
  }
  lines.push('');
  return lines;
}

/** The Markdown report: a header with the conditions, the table, and notes. */
export function renderMarkdown(results: BenchResults): string {
  const { meta, subjects } = results;
  const o = meta.options;
  const raw = subjects.find((s) => s.kind === 'raw' && s.summary)?.summary;
  const reference = referenceSubject(subjects);
  const wgGo = reference?.summary;
  const reverse = o.reverse;

  const lines: string[] = [];
  lines.push(`## roamguard bench — ${meta.started.slice(0, 16).replace('T', ' ')} UTC, ${meta.host}`, '');
  lines.push(`\`${meta.command}\` · Linux ${meta.kernel} · ${meta.cores} × ${meta.cpu} · node ${meta.versions.node} · bun ${meta.versions.bun} · wireguard-go ${meta.versions['wireguard-go-modern'] ?? 'not found'} and Debian's ${meta.versions['wireguard-go']} · ${meta.versions.iperf3}`, '');
  if (meta.foreignLoadBefore > 0.1) {
    lines.push(`⚠ **Busy machine**: before the start other processes used ${(meta.foreignLoadBefore * 100).toFixed(0)} % of a core (load average ${meta.loadAverage.join(' ')}); these figures are not comparable with a quiet run.`, '');
  }
  lines.push(`iperf3 TCP, one stream, A→B${reverse ? ' (and B→A)' : ''}, ${o.duration} s after ${o.omit} s warm-up, median of ${o.runs} run${o.runs === 1 ? '' : 's'}${o.prime > 0 ? ` (each tunnel primed by an unrecorded ${o.prime} s transfer)` : ''}; idle ping: ${o.runs > 1 ? `${o.runs} series of ` : ''}${o.pings} echoes ${o.pingInterval * 1000} ms apart${o.runs > 1 ? ', median of all,' : ''} taken after every subject's block in ${o.runs > 1 ? 'rounds over all subjects' : 'one round over all subjects'}, each series on a tunnel started afresh${o.prime > 0 ? ` and primed by ${o.prime} s of TCP` : ''}${(o.pingWarmup ?? 0) > 0 ? `, after ${o.pingWarmup} warm-up echoes (their median: RTT fresh)` : ''}; ${meta.topology}. Took ${Math.round(meta.elapsedSeconds)} s.`, '');

  lines.push(reference
    ? `Ratios "÷ wireguard-go" are against **${reference.label}**, measured in this run.`
    : 'No wireguard-go ran: no ratios against it.', '');
  const head = ['subject', 'Gbit/s', 'min–max'];
  if (reverse) head.push('B→A Gbit/s');
  head.push('retransmits', 'RTT median ms', 'RTT p99 ms', 'RTT ÷ wireguard-go', 'RTT fresh ms', 'TCP RTT loaded ms', 'tunnel CPU %', 'CPU s/GB', 'peak RSS MiB', 'Gbit/s ÷ wireguard-go', 'CPU/GB ÷ wireguard-go', 'Gbit/s ÷ raw link');
  lines.push(`| ${head.join(' | ')} |`);
  lines.push(`|${head.map((_, i) => (i === 0 ? '---' : '---:')).join('|')}|`);
  for (const s of subjects) {
    const m = s.summary;
    if (!m) {
      lines.push(`| ${s.label} | ${s.status} |${' |'.repeat(head.length - 2)}`);
      continue;
    }
    const busy = m.foreignCpuLoad > 0.1 ? ' ⚠' : '';
    const row = [s.label + busy, num(m.gbps, 2), `${num(m.gbpsMin, 2)}–${num(m.gbpsMax, 2)}`];
    if (reverse) row.push(num(m.reverseGbps, 2));
    row.push(
      num(m.retransmits, 0),
      num(m.rttMedianMs, 3),
      num(m.rttP99Ms, 3),
      s.kind === 'raw' ? '–' : ratio(m.rttMedianMs, wgGo?.rttMedianMs),
      num(m.rttFreshMedianMs, 3),
      num(m.loadedRttMs, 2),
      num(m.cpuPercent, 0),
      num(m.cpuSecondsPerGB, 2),
      m.peakRssBytes === undefined ? '–' : num(m.peakRssBytes / 2 ** 20, 0),
      s.kind === 'raw' ? '–' : ratio(m.gbps, wgGo?.gbps),
      s.kind === 'raw' ? '–' : ratio(m.cpuSecondsPerGB, wgGo?.cpuSecondsPerGB),
      ratio(m.gbps, raw?.gbps),
    );
    lines.push(`| ${row.join(' | ')} |`);
  }
  lines.push('');
  lines.push('Gbit/s: receiver-side goodput, median of the runs. retransmits: TCP retransmissions counted by the sender, median per run. ' +
    'RTT: ping through the idle tunnel; RTT fresh: the warm-up echoes before each series, right after a fresh start and the prime (a data thread the prime did not reach is then still being optimized). TCP RTT loaded: the sender\'s smoothed RTT during the transfer (iperf3 mean_rtt), median of the runs. ' +
    'tunnel CPU %: CPU time of both tunnel processes (all threads, from /proc/PID/stat) over the wall time of the runs, 100 % = one core. ' +
    'CPU s/GB: the same CPU seconds per 10⁹ payload bytes (warm-up included on both sides of the division). ' +
    'peak RSS: VmHWM of the larger of the two tunnel processes. iperf3 itself runs on the same cores.');

  const notes: string[] = [];
  for (const s of subjects) {
    const facts: string[] = [];
    if (s.status !== 'ok' && s.note) facts.push(`**${s.status}**: ${s.note.split('\n')[0]}`);
    if (s.summary && s.summary.foreignCpuLoad > 0.1) {
      const byProcess = new Map<string, number>();
      for (const t of s.runs.flatMap((r) => r.foreignTop)) byProcess.set(t.process, (byProcess.get(t.process) ?? 0) + t.seconds);
      const top = [...byProcess].sort((a, b) => b[1] - a[1]).slice(0, 2).map(([p, sec]) => `${p} ${sec.toFixed(1)} s`).join(', ');
      facts.push(`⚠ other processes used ${(s.summary.foreignCpuLoad * 100).toFixed(0)} % of a core during the runs (${top})`);
    }
    // Today's daemon has a data thread per TUN queue; a baseline from before it had a crypto pool.
    const threads = s.info['TUN queues'] !== undefined ? `TUN queues ${s.info['TUN queues']} (a data thread each)`
      : s.info['crypto threads'] !== undefined ? `crypto threads ${s.info['crypto threads']}` : undefined;
    if (threads !== undefined || s.info.crypto) facts.push(`${threads ?? 'threads unknown'} (${s.info.crypto ?? 'providers unknown'})`);
    if (s.primeGbps !== undefined) facts.push(`cold-start priming transfer ${s.primeGbps.toFixed(2)} Gbit/s`);
    if (s.ping && s.ping.received < s.ping.sent) facts.push(`${s.ping.sent - s.ping.received} of ${s.ping.sent} pings lost`);
    if (s.ping && s.ping.rttsMs.length > 0) facts.push(`ping max ${Math.max(...s.ping.rttsMs).toFixed(2)} ms`);
    if (s.queues) {
      const kb = (b: number) => `${Math.round(b / 1024)}`;
      const parts = Object.entries(s.queues).filter(([, q]) => q.max > 0).map(([where, q]) => `${where} ${kb(q.median)}/${kb(q.max)} KiB`);
      const rb = Object.entries(s.udpReceiveBuffer ?? {}).map(([side, b]) => `${side} ${kb(b)} KiB`).join(', ');
      facts.push(`queues under load (median/max): ${parts.length > 0 ? parts.join(', ') : 'all empty'}; UDP receive buffers ${rb}`);
    }
    const drops = dropSummary(s.counters);
    if (drops) facts.push(`kernel drops during the runs: ${drops}`);
    if (facts.length > 0) notes.push(`- ${s.label}: ${facts.join('; ')}`);
  }
  if (notes.length > 0) lines.push('', ...notes);
  const extra = [...renderThroughputTable(results), ...renderCpuTable(results), ...renderStartupTable(results), ...renderMicroTables(results), ...renderScaleTable(results)];
  if (extra.length > 0) lines.push('', ...(extra[extra.length - 1] === '' ? extra.slice(0, -1) : extra));
  return `${lines.join('\n')}\n`;
}

/** Non-zero drop and error counters, e.g. `udp B RcvbufErrors 1234, tun B tx_dropped 5`. */
function dropSummary(counters: Record<string, Record<string, number>>): string {
  const parts: string[] = [];
  for (const [where, values] of Object.entries(counters)) {
    for (const [name, value] of Object.entries(values)) {
      const interesting = where.startsWith('udp') ? /Errors$/.test(name) : /dropped|errors/.test(name);
      if (interesting && value > 0) parts.push(`${where} ${name} ${value}`);
    }
  }
  return parts.join(', ');
}

/** `2025-01-31T142501Z-host`: the result files' base name. */
export function resultBaseName(results: BenchResults): string {
  const stamp = results.meta.started.replace(/[-:]/g, '').replace(/\.\d+Z$/, 'Z');
  const date = `${stamp.slice(0, 4)}-${stamp.slice(4, 6)}-${stamp.slice(6, 8)}${stamp.slice(8)}`;
  const host = results.meta.host.replace(/[^A-Za-z0-9_.-]/g, '_') || 'host';
  return `${date}-${host}`;
}

/** Writes `<base>.json`, `<base>.md` and (when given) `<base>.svg` into `dir` (created if missing); returns the paths. */
export function saveResults(results: BenchResults, markdown: string, dir: string, svg?: string): { json: string; markdown: string; svg?: string } {
  mkdirSync(dir, { recursive: true });
  const base = join(dir, resultBaseName(results));
  const paths: { json: string; markdown: string; svg?: string } = { json: `${base}.json`, markdown: `${base}.md` };
  writeFileSync(paths.json, `${JSON.stringify(results, null, 2)}\n`);
  writeFileSync(paths.markdown, markdown);
  if (svg !== undefined) {
    paths.svg = `${base}.svg`;
    writeFileSync(paths.svg, svg);
  }
  return paths;
}

