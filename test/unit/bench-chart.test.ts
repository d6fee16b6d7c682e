/**
 * The SVG throughput chart (bench/suite/chart.ts): well-formed XML, bars proportional to their
 * values on one axis, the off-scale reference bar clipped and labelled, text escaped.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import {
  LAYOUT, chooseAxisMax, escapeXml, formatValue, niceCeiling, renderBarChartSvg, throughputChart, type BarChart,
} from '../../bench/suite/chart.ts';
import { sampleResults } from './bench-fixtures.ts';

interface Element { name: string; attrs: Record<string, string>; children: Element[]; text: string }

/**
 * A strict little XML parser for what the chart writes: one prolog, elements with quoted
 * attributes, text with the five predefined entities (and numeric ones). Throws on anything
 * malformed (unbalanced or crossed tags, bare `&` or `<`, duplicate or unquoted attributes).
 */
function parseXml(xml: string): Element {
  let at = 0;
  const fail = (why: string): never => { throw new Error(`XML error at ${at}: ${why}: ${JSON.stringify(xml.slice(at, at + 40))}`); };
  const checkText = (t: string) => {
    if (t.includes('<')) fail('bare <');
    for (const m of t.matchAll(/&/g)) {
      if (!/^&(amp|lt|gt|quot|apos|#\d+|#x[0-9a-fA-F]+);/.test(t.slice(m.index!))) fail('bare &');
    }
  };
  if (xml.startsWith('<?xml')) {
    const end = xml.indexOf('?>');
    if (end < 0) fail('unterminated prolog');
    at = end + 2;
  }
  const root: Element = { name: '#document', attrs: {}, children: [], text: '' };
  const stack: Element[] = [root];
  while (at < xml.length) {
    const lt = xml.indexOf('<', at);
    const text = lt < 0 ? xml.slice(at) : xml.slice(at, lt);
    checkText(text);
    stack[stack.length - 1].text += text;
    if (lt < 0) break;
    at = lt;
    const gt = xml.indexOf('>', at);
    if (gt < 0) fail('unterminated tag');
    const tag = xml.slice(at + 1, gt);
    if (tag.startsWith('/')) {
      const name = tag.slice(1).trim();
      const open = stack.pop();
      if (!open || open.name !== name) fail(`closing </${name}> does not match <${open?.name}>`);
    } else {
      const selfClosing = tag.endsWith('/');
      const body = selfClosing ? tag.slice(0, -1) : tag;
      const m = /^([A-Za-z_][\w:.-]*)/.exec(body);
      if (!m) fail('bad element name');
      const el: Element = { name: m![1], attrs: {}, children: [], text: '' };
      let rest = body.slice(m![1].length);
      const attr = /^\s+([A-Za-z_][\w:.-]*)="([^"<]*)"/;
      for (let a = attr.exec(rest); a; a = attr.exec(rest)) {
        if (a[1] in el.attrs) fail(`duplicate attribute ${a[1]}`);
        checkText(a[2]);
        el.attrs[a[1]] = a[2];
        rest = rest.slice(a[0].length);
      }
      if (rest.trim() !== '') fail(`malformed attributes ${JSON.stringify(rest)}`);
      stack[stack.length - 1].children.push(el);
      if (!selfClosing) stack.push(el);
    }
    at = gt + 1;
  }
  if (stack.length !== 1) fail(`unclosed <${stack[stack.length - 1].name}>`);
  if (root.children.length !== 1) fail('not exactly one root element');
  return root.children[0];
}

function all(el: Element, name: string): Element[] {
  return [...(el.name === name ? [el] : []), ...el.children.flatMap((c) => all(c, name))];
}
const texts = (svg: Element) => all(svg, 'text').map((t) => t.text);
const unescape = (s: string) => s.replace(/&lt;/g, '<').replace(/&gt;/g, '>').replace(/&quot;/g, '"').replace(/&apos;/g, "'").replace(/&amp;/g, '&');

describe('throughput chart SVG', () => {
  const results = sampleResults();
  const svgText = renderBarChartSvg(throughputChart(results));
  const svg = parseXml(svgText);
  const bars = all(svg, 'rect').filter((r) => r.attrs['data-value'] !== undefined);

  test('is well-formed XML with an svg root and a size', () => {
    assert.equal(svg.name, 'svg');
    assert.equal(svg.attrs.xmlns, 'http://www.w3.org/2000/svg');
    assert.ok(Number(svg.attrs.width) > 0 && Number(svg.attrs.height) > 0);
    assert.ok(all(svg, 'title').length >= 1);
  });

  test('one bar per subject and series that has a value; missing values say so', () => {
    // raw, node, bun, wireguard-go × 3 series; the failed subject has no figures and no group.
    assert.equal(bars.length, 12);
    assert.deepEqual([...new Set(bars.map((b) => b.attrs['data-series']))], ['TCP 1 stream', 'TCP 4 streams', 'UDP 1200 B']);
    const partial = renderBarChartSvg({ ...throughputChart(results), groups: [{ label: 'x', values: [1, undefined, 2] }] });
    assert.ok(texts(parseXml(partial)).some((t) => t.includes('not measured')));
  });

  test('bars are proportional to their values; the off-scale raw link is clipped at the axis end', () => {
    const plotWidth = LAYOUT.width - LAYOUT.left - LAYOUT.right;
    const scaled = bars.filter((b) => b.attrs['data-clipped'] !== 'true');
    const clipped = bars.filter((b) => b.attrs['data-clipped'] === 'true');
    assert.ok(scaled.length >= 9);
    // width = value / axisMax × plotWidth (rounded to 0.1 px), with the axis at 0.5 Gbit/s here.
    const axisMax = 0.5;
    for (const b of scaled) {
      const expected = (Number(b.attrs['data-value']) / axisMax) * plotWidth;
      assert.ok(Math.abs(Number(b.attrs.width) - expected) <= 0.051, `${b.attrs['data-series']} ${b.attrs['data-value']}: width ${b.attrs.width}, expected ${expected}`);
    }
    // The raw link (15, 12 Gbit/s and 0.9 Gbit/s UDP) against tunnels ≤ 0.3: TCP bars clipped.
    assert.deepEqual(clipped.map((b) => Number(b.attrs['data-value'])).sort((a, b) => a - b), [0.9, 12, 15]);
    for (const b of clipped) assert.equal(Number(b.attrs.width), plotWidth);
    assert.ok(texts(svg).some((t) => t.includes('15.0 (off scale)')));
    // The bigger value has the longer bar.
    const byValue = [...scaled].sort((a, b) => Number(a.attrs['data-value']) - Number(b.attrs['data-value']));
    for (let i = 1; i < byValue.length; i++) assert.ok(Number(byValue[i].attrs.width) >= Number(byValue[i - 1].attrs.width));
  });

  test('has axis labels, tick labels, a legend and printed values', () => {
    const t = texts(svg);
    assert.ok(t.includes('throughput, Gbit/s (receiver side)'));
    assert.ok(t.includes('subject'));
    // Tunnels reach 0.3 Gbit/s: the axis runs to 0.5 in five ticks.
    for (const tick of ['0', '0.1', '0.2', '0.3', '0.4', '0.5']) assert.ok(t.includes(tick), `tick label ${tick}: ${t.join(' | ')}`);
    for (const label of ['raw veth link', 'roamguard node', 'roamguard bun', 'wireguard-go', 'TCP 1 stream', 'TCP 4 streams']) assert.ok(t.includes(label), label);
    assert.ok(t.includes('0.200') && t.includes('0.180'), 'values printed at the bars');
    assert.ok(t.includes('≥ 0.900 (off scale)'), 'a sender-limited UDP figure is a lower bound');
  });

  test('text is escaped', () => {
    assert.ok(svgText.includes('vm &amp; &lt;test&gt;'));
    const chart: BarChart = {
      title: 'a < b & "c"', valueAxisLabel: "it's", categoryAxisLabel: '<x>', series: [{ name: 'A&B', color: '#000' }],
      groups: [{ label: '</svg>', values: [1] }],
    };
    const parsed = parseXml(renderBarChartSvg(chart));
    assert.ok(texts(parsed).map(unescape).includes('</svg>'));
    assert.equal(escapeXml(`<&>"'`), '&lt;&amp;&gt;&quot;&apos;');
  });

  test('the axis covers every bar when the reference is not far above the others', () => {
    const chart: BarChart = {
      title: 't', valueAxisLabel: 'v', categoryAxisLabel: 'c', series: [{ name: 's', color: '#123456' }],
      groups: [{ label: 'raw', values: [1.5], reference: true }, { label: 'a', values: [1] }, { label: 'b', values: [0.5] }],
    };
    const b = all(parseXml(renderBarChartSvg(chart)), 'rect').filter((r) => r.attrs['data-value'] !== undefined);
    assert.equal(b.filter((r) => r.attrs['data-clipped']).length, 0);
    const [raw, a, half] = b.map((r) => Number(r.attrs.width));
    assert.ok(Math.abs(raw / a - 1.5) < 0.01 && Math.abs(a / half - 2) < 0.01);
  });
});

describe('chart scale helpers', () => {
  test('niceCeiling picks 1, 2, 2.5 or 5 × 10^k', () => {
    assert.equal(niceCeiling(0.31), 0.5);
    assert.equal(niceCeiling(0.21), 0.25);
    assert.equal(niceCeiling(1), 1);
    assert.equal(niceCeiling(1.01), 2);
    assert.equal(niceCeiling(16), 20);
    assert.equal(niceCeiling(0), 1);
  });

  test('chooseAxisMax: from the non-reference groups, with headroom', () => {
    assert.equal(chooseAxisMax([{ label: 'raw', values: [15], reference: true }, { label: 'a', values: [0.3, 0.28] }]), 0.5);
    assert.equal(chooseAxisMax([{ label: 'raw', values: [15], reference: true }]), 20);
    assert.equal(chooseAxisMax([{ label: 'a', values: [undefined] }]), 1);
  });

  test('formatValue keeps three significant digits', () => {
    assert.equal(formatValue(0.3123), '0.312');
    assert.equal(formatValue(15.04), '15.0');
    assert.equal(formatValue(123.4), '123');
    assert.equal(formatValue(0), '0');
  });
});
