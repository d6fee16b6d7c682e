/**
 * The SVG bar chart of the throughput figures, written by hand (no dependency): one group of
 * horizontal bars per subject (TCP one stream, TCP parallel streams, UDP), on one linear axis in
 * Gbit/s with ticks, grid lines, axis labels and each bar's value printed at its end.
 *
 * The raw veth link is usually tens of times faster than any tunnel; drawn to scale it would
 * flatten every tunnel bar. So the axis is chosen for the other subjects, and a reference bar that
 * does not fit is clipped at the axis end, marked with a break and still labelled with its value.
 */
import type { BenchResults } from './results.ts';
import { throughputRows } from './report.ts';

export interface BarSeries {
  name: string;
  color: string;
}

export interface BarGroup {
  label: string;
  /** One value per series; undefined = not measured. */
  values: Array<number | undefined>;
  /** A reference group (the raw link): may be clipped instead of setting the scale. */
  reference?: boolean;
  /** Per series: the value is a lower bound (printed with ≥). */
  lowerBound?: boolean[];
}

export interface BarChart {
  title: string;
  subtitle?: string;
  /** Label of the value axis (with its unit). */
  valueAxisLabel: string;
  /** Label of the category axis. */
  categoryAxisLabel: string;
  series: BarSeries[];
  groups: BarGroup[];
}

/** The smallest of 1, 2, 2.5, 5 × 10^k that is ≥ x (x > 0); 1 for x ≤ 0 or not finite. */
export function niceCeiling(x: number): number {
  if (!(x > 0) || !Number.isFinite(x)) return 1;
  const power = 10 ** Math.floor(Math.log10(x));
  for (const step of [1, 2, 2.5, 5, 10]) {
    const candidate = step * power;
    if (candidate >= x * (1 - 1e-12)) return candidate;
  }
  return 10 * power;
}

/**
 * The axis maximum: a nice ceiling of the largest non-reference value (5 % headroom). Reference
 * values are included when they are at most twice that, else they will be clipped. Falls back to
 * all values when only reference groups have any.
 */
export function chooseAxisMax(groups: readonly BarGroup[]): number {
  const values = (gs: readonly BarGroup[]) => gs.flatMap((g) => g.values).filter((v): v is number => v !== undefined && Number.isFinite(v) && v > 0);
  const main = values(groups.filter((g) => !g.reference));
  const reference = values(groups.filter((g) => g.reference));
  if (main.length === 0) return niceCeiling(Math.max(0, ...reference) * 1.05);
  const mainMax = Math.max(...main);
  const refMax = reference.length > 0 ? Math.max(...reference) : 0;
  return niceCeiling((refMax <= 2 * mainMax ? Math.max(mainMax, refMax) : mainMax) * 1.05);
}

/** Text content and attribute values, escaped for XML. */
export function escapeXml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&apos;' })[c]!);
}

/** Three significant digits, at most three decimals: 0.312, 1.23, 15.7, 123. */
export function formatValue(v: number): string {
  if (v === 0) return '0';
  const digits = Math.min(3, Math.max(0, 2 - Math.floor(Math.log10(Math.abs(v)))));
  return v.toFixed(digits);
}

const r1 = (x: number) => Math.round(x * 10) / 10;

/** The layout used by renderBarChartSvg (exported for tests). */
export const LAYOUT = { width: 880, left: 230, right: 130, top: 92, barHeight: 14, barGap: 3, groupGap: 16, bottom: 70 };

export function renderBarChartSvg(chart: BarChart): string {
  const { width, left, right, top, barHeight, barGap, groupGap, bottom } = LAYOUT;
  const plotWidth = width - left - right;
  const nSeries = chart.series.length;
  const groupHeight = nSeries * (barHeight + barGap) - barGap;
  const plotHeight = chart.groups.length * (groupHeight + groupGap) + groupGap;
  const height = top + plotHeight + bottom;
  const axisMax = chooseAxisMax(chart.groups);
  const x = (v: number) => left + (Math.min(v, axisMax) / axisMax) * plotWidth;
  const out: string[] = [];
  const text = (attrs: string, content: string) => out.push(`<text ${attrs}>${escapeXml(content)}</text>`);

  out.push(`<?xml version="1.0" encoding="UTF-8"?>`);
  out.push(`<svg xmlns="http://www.w3.org/2000/svg" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" font-family="DejaVu Sans, Helvetica, Arial, sans-serif" font-size="12">`);
  out.push(`<title>${escapeXml(chart.title)}</title>`);
  if (chart.subtitle) out.push(`<desc>${escapeXml(chart.subtitle)}</desc>`);
  out.push(`<rect x="0" y="0" width="${width}" height="${height}" fill="#ffffff"/>`);
  text(`x="${width / 2}" y="24" text-anchor="middle" font-size="16" font-weight="bold"`, chart.title);
  if (chart.subtitle) text(`x="${width / 2}" y="44" text-anchor="middle" font-size="11" fill="#555555"`, chart.subtitle);

  // Legend.
  let lx = left;
  for (const s of chart.series) {
    out.push(`<rect x="${lx}" y="58" width="12" height="12" fill="${escapeXml(s.color)}"/>`);
    text(`x="${lx + 17}" y="68.5"`, s.name);
    lx += 24 + s.name.length * 7.2;
  }

  // Grid, ticks and tick labels.
  const ticks = 5;
  out.push(`<g stroke="#dddddd" stroke-width="1">`);
  for (let i = 0; i <= ticks; i++) {
    const tx = r1(left + (i / ticks) * plotWidth);
    out.push(`<line x1="${tx}" y1="${top}" x2="${tx}" y2="${top + plotHeight}"/>`);
  }
  out.push(`</g>`);
  for (let i = 0; i <= ticks; i++) {
    const tx = r1(left + (i / ticks) * plotWidth);
    out.push(`<line x1="${tx}" y1="${top + plotHeight}" x2="${tx}" y2="${top + plotHeight + 5}" stroke="#333333"/>`);
    text(`x="${tx}" y="${top + plotHeight + 19}" text-anchor="middle"`, String(Number(((axisMax * i) / ticks).toPrecision(3))));
  }
  // Axes and their labels.
  out.push(`<line x1="${left}" y1="${top}" x2="${left}" y2="${top + plotHeight}" stroke="#333333"/>`);
  out.push(`<line x1="${left}" y1="${top + plotHeight}" x2="${left + plotWidth}" y2="${top + plotHeight}" stroke="#333333"/>`);
  text(`x="${r1(left + plotWidth / 2)}" y="${top + plotHeight + 40}" text-anchor="middle" font-weight="bold"`, chart.valueAxisLabel);
  const cy = r1(top + plotHeight / 2);
  text(`x="16" y="${cy}" text-anchor="middle" font-weight="bold" transform="rotate(-90 16 ${cy})"`, chart.categoryAxisLabel);

  // Bars.
  let clippedAny = false;
  chart.groups.forEach((g, gi) => {
    const gy = top + groupGap + gi * (groupHeight + groupGap);
    text(`x="${left - 8}" y="${r1(gy + groupHeight / 2 + 4)}" text-anchor="end"`, g.label);
    chart.series.forEach((s, si) => {
      const y = gy + si * (barHeight + barGap);
      const v = g.values[si];
      if (v === undefined || !Number.isFinite(v)) {
        text(`x="${left + 4}" y="${y + barHeight - 3}" font-size="10" fill="#888888"`, `${s.name}: not measured`);
        return;
      }
      const clipped = v > axisMax;
      clippedAny ||= clipped;
      const w = r1(Math.max(0, x(v) - left));
      out.push(`<rect x="${left}" y="${y}" width="${w}" height="${barHeight}" fill="${escapeXml(s.color)}" data-series="${escapeXml(s.name)}" data-value="${v}"${clipped ? ' data-clipped="true"' : ''}><title>${escapeXml(`${g.label}, ${s.name}: ${formatValue(v)}`)}</title></rect>`);
      if (clipped) {
        // A break mark: two white slashes near the end of the bar.
        const bx = left + w - 18;
        out.push(`<path d="M${bx} ${y + barHeight + 1} l6 ${-barHeight - 2} M${bx + 6} ${y + barHeight + 1} l6 ${-barHeight - 2}" stroke="#ffffff" stroke-width="3"/>`);
      }
      const label = `${g.lowerBound?.[si] ? '≥ ' : ''}${formatValue(v)}${clipped ? ' (off scale)' : ''}`;
      text(`x="${r1(left + w + 4)}" y="${y + barHeight - 3}" font-size="11"`, label);
    });
  });
  if (clippedAny) {
    text(`x="${left}" y="${top + plotHeight + 60}" font-size="10" fill="#555555"`, 'Bars with a break run off the scale (drawn to the axis end); their values are printed.');
  }
  out.push('</svg>');
  return `${out.join('\n')}\n`;
}

/** The throughput chart of a run: per subject TCP one stream, TCP parallel streams, UDP (Gbit/s). */
export function throughputChart(results: BenchResults): BarChart {
  const o = results.meta.options;
  const streams = o.streams ?? 4;
  const rows = throughputRows(results).filter((r) => r.tcp1 !== undefined || r.tcpParallel !== undefined || r.udpGbps !== undefined);
  return {
    title: 'roamguard bench: throughput per subject',
    subtitle: `${results.meta.started.slice(0, 16).replace('T', ' ')} UTC, ${results.meta.host}, ${results.meta.cores} cores; iperf3 A→B through each tunnel over one veth pair; UDP ${o.udpSize ?? 1200} B datagrams, highest rate with < 1 % loss`,
    valueAxisLabel: 'throughput, Gbit/s (receiver side)',
    categoryAxisLabel: 'subject',
    series: [
      { name: 'TCP 1 stream', color: '#4e79a7' },
      { name: `TCP ${streams} streams`, color: '#f28e2b' },
      { name: `UDP ${o.udpSize ?? 1200} B`, color: '#59a14f' },
    ],
    groups: rows.map((r) => ({
      label: r.label,
      values: [r.tcp1, r.tcpParallel, r.udpGbps],
      reference: r.kind === 'raw',
      lowerBound: [false, false, r.udpSenderLimited],
    })),
  };
}
