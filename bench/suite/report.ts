/** The Markdown table of a run, and the result files (JSON with every figure, Markdown next to it). */
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { BenchResults } from './results.ts';

const num = (v: number | undefined, digits: number): string => (v === undefined || !Number.isFinite(v) ? '–' : v.toFixed(digits));
const ratio = (a: number | undefined, b: number | undefined): string =>
  a === undefined || b === undefined || !Number.isFinite(a) || !Number.isFinite(b) || b === 0 ? '–' : `${formatRatio(a / b)}×`;
/** Two decimals, or two significant digits below 0.1 (0.0085×, not 0.01×). */
const formatRatio = (r: number): string => (r > 0 && r < 0.1 ? r.toPrecision(2) : r.toFixed(2));

/** The Markdown report: a header with the conditions, the table, and notes. */
export function renderMarkdown(results: BenchResults): string {
  const { meta, subjects } = results;
  const o = meta.options;
  const raw = subjects.find((s) => s.kind === 'raw' && s.summary)?.summary;
  const wgGo = subjects.find((s) => s.kind === 'wireguard-go' && s.summary)?.summary;
  const reverse = o.reverse;

  const lines: string[] = [];
  lines.push(`## roamguard bench — ${meta.started.slice(0, 16).replace('T', ' ')} UTC, ${meta.host}`, '');
  lines.push(`\`${meta.command}\` · Linux ${meta.kernel} · ${meta.cores} × ${meta.cpu} · node ${meta.versions.node} · bun ${meta.versions.bun} · wireguard-go ${meta.versions['wireguard-go']} · ${meta.versions.iperf3}`, '');
  if (meta.foreignLoadBefore > 0.1) {
    lines.push(`⚠ **Busy machine**: before the start other processes used ${(meta.foreignLoadBefore * 100).toFixed(0)} % of a core (load average ${meta.loadAverage.join(' ')}); these figures are not comparable with a quiet run.`, '');
  }
  lines.push(`iperf3 TCP, one stream, A→B${reverse ? ' (and B→A)' : ''}, ${o.duration} s after ${o.omit} s warm-up, median of ${o.runs} run${o.runs === 1 ? '' : 's'}${o.prime > 0 ? ` (each tunnel primed by an unrecorded ${o.prime} s transfer)` : ''}; ping: ${o.pings} echoes ${o.pingInterval * 1000} ms apart, idle tunnel; ${meta.topology}. Took ${Math.round(meta.elapsedSeconds)} s.`, '');

  const head = ['subject', 'Gbit/s', 'min–max'];
  if (reverse) head.push('B→A Gbit/s');
  head.push('retransmits', 'RTT median ms', 'RTT p99 ms', 'TCP RTT loaded ms', 'tunnel CPU %', 'CPU s/GB', 'peak RSS MiB', 'Gbit/s ÷ wireguard-go', 'CPU/GB ÷ wireguard-go', 'Gbit/s ÷ raw link');
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
    'RTT: ping through the idle tunnel; TCP RTT loaded: the sender\'s smoothed RTT during the transfer (iperf3 mean_rtt), median of the runs. ' +
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
    if (s.info['crypto threads'] !== undefined || s.info.crypto) facts.push(`crypto threads ${s.info['crypto threads'] ?? '?'} (${s.info.crypto ?? 'providers unknown'})`);
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

/** Writes `<base>.json` and `<base>.md` into `dir` (created if missing); returns both paths. */
export function saveResults(results: BenchResults, markdown: string, dir: string): { json: string; markdown: string } {
  mkdirSync(dir, { recursive: true });
  const base = join(dir, resultBaseName(results));
  const paths = { json: `${base}.json`, markdown: `${base}.md` };
  writeFileSync(paths.json, `${JSON.stringify(results, null, 2)}\n`);
  writeFileSync(paths.markdown, markdown);
  return paths;
}

