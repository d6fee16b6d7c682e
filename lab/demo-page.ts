/**
 * The demo's live page: plain HTML and SVG rendered here (pure, unit-tested), sent to the browser
 * over server-sent events by lab/demo-web.ts; the page's small script only swaps the fragments
 * in and posts the fault buttons' commands. No build step, nothing from elsewhere.
 *
 * The map: one box per site (the internet in the middle, each NAT router's LAN around it), a
 * node circle with its pod below it, and one curve per pair of nodes that are peers, drawn by
 * path kind (public, NAT mapping, LAN; "relay" is in the legend for when relays exist) and
 * labelled with the youngest handshake and the current throughput of the pair.
 */
import { FAULTS, faultLine, type FaultTargets } from './demo-faults.ts';
import { describeRecord, recordState, type FaultRecord } from './demo-recovery.ts';
import { formatAge, formatBytes, formatRate, type DemoSnapshot, type PathKind } from './demo.ts';

export interface PageView {
  snapshot?: DemoSnapshot;
  records: readonly FaultRecord[];
  targets: FaultTargets;
  /** The last answer to a command. */
  message: string;
  /** What to tell the reader about kubectl (the export line). */
  kubectl?: string;
}

export function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]!);
}

type DrawnKind = PathKind;
const KIND_STYLE: Record<DrawnKind, { color: string; dash: string; label: string }> = {
  public: { color: '#1f6feb', dash: '', label: 'public address' },
  NAT: { color: '#d97706', dash: '8 4', label: 'NAT mapping' },
  LAN: { color: '#16a34a', dash: '', label: 'LAN' },
  relay: { color: '#9333ea', dash: '2 4', label: 'relay' },
  none: { color: '#9ca3af', dash: '1 5', label: 'no endpoint' },
};

/** The kind a pair is drawn as: a relay on either side wins, then a NAT mapping, then LAN, then public. */
export function pairKind(kinds: readonly PathKind[]): PathKind {
  for (const k of ['relay', 'NAT', 'LAN', 'public'] as const) if (kinds.includes(k)) return k;
  return 'none';
}

const WIDTH = 960;
const SITE_TOP = 40;
const NODE_GAP = 110;

interface Placed { name: string; x: number; y: number }

/** Sites left to right with the internet in the middle; nodes stacked in their site. */
export function layout(s: DemoSnapshot): { sites: Array<{ name: string; x: number; width: number; router?: string }>; nodes: Map<string, Placed>; height: number } {
  const routerSites = (s.routers ?? []).map((r) => r.lan);
  const others = [...new Set(s.nodes.map((n) => n.site))].filter((site) => !routerSites.includes(site));
  const half = Math.ceil(routerSites.length / 2);
  const order = [...routerSites.slice(0, half), ...others, ...routerSites.slice(half)];
  if ((s.apiOnlyNodes ?? []).length > 0) order.push('(API only)');
  const width = (WIDTH - 20) / Math.max(1, order.length);
  const nodes = new Map<string, Placed>();
  let rows = 1;
  const sites = order.map((name, i) => {
    const x = 10 + i * width;
    const members = name === '(API only)' ? s.apiOnlyNodes ?? [] : s.nodes.filter((n) => n.site === name).map((n) => n.name);
    rows = Math.max(rows, members.length);
    members.forEach((m, j) => nodes.set(m, { name: m, x: x + width / 2, y: SITE_TOP + 80 + j * NODE_GAP }));
    const router = s.routers?.find((r) => r.lan === name);
    return { name, x, width: width - 10, router: router && `${router.name} NAT ${router.publicAddress}` };
  });
  return { sites, nodes, height: SITE_TOP + 60 + rows * NODE_GAP };
}

/** The SVG map of sites, nodes, pods and peer paths. */
export function renderMap(s: DemoSnapshot): string {
  const { sites, nodes, height } = layout(s);
  const out: string[] = [];
  out.push(`<svg id="map" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 ${WIDTH} ${height}" width="${WIDTH}" height="${height}" role="img" aria-label="sites, nodes and peer paths">`);
  for (const site of sites) {
    out.push(`<g class="site" data-site="${escapeHtml(site.name)}"><rect x="${site.x}" y="${SITE_TOP}" width="${site.width}" height="${height - SITE_TOP - 10}" rx="10" fill="${site.router ? '#fff7ed' : '#eff6ff'}" stroke="#cbd5e1"/>`);
    out.push(`<text x="${site.x + 10}" y="${SITE_TOP + 20}" font-weight="bold">${escapeHtml(site.name)}</text>`);
    if (site.router) out.push(`<text x="${site.x + 10}" y="${SITE_TOP + 36}" font-size="11" fill="#92400e">${escapeHtml(site.router)}</text>`);
    out.push('</g>');
  }
  // One curve per pair of peers, whatever direction reported it.
  const pairs = new Map<string, { a: string; b: string; kinds: PathKind[]; age?: number; rate: number; endpoints: string[] }>();
  for (const p of s.peers) {
    if (!nodes.has(p.from) || !nodes.has(p.to)) continue;
    const [a, b] = [p.from, p.to].sort();
    const key = `${a} ${b}`;
    const pair = pairs.get(key) ?? { a, b, kinds: [], rate: 0, endpoints: [] };
    pair.kinds.push(p.path);
    if (p.handshakeAgeS !== undefined) pair.age = Math.min(pair.age ?? Infinity, p.handshakeAgeS);
    pair.rate += (p.rxRate ?? 0) + (p.txRate ?? 0);
    pair.endpoints.push(`${p.from} → ${p.to} at ${p.endpoint || '(none)'} (${p.path === 'relay' ? `relay via ${p.via ?? '?'}` : p.path})`);
    pairs.set(key, pair);
  }
  let i = 0;
  for (const pair of pairs.values()) {
    const from = nodes.get(pair.a)!, to = nodes.get(pair.b)!;
    const kind = pairKind(pair.kinds);
    const style = KIND_STYLE[kind];
    const bend = ((i++ % 5) - 2) * 18 + (from.x === to.x ? 60 : 0);
    const mx = (from.x + to.x) / 2, my = (from.y + to.y) / 2;
    const dx = to.x - from.x, dy = to.y - from.y, len = Math.hypot(dx, dy) || 1;
    const cx = mx - (dy / len) * bend, cy = my + (dx / len) * bend;
    const label = `${formatAge(pair.age)} · ${formatBytes(Math.round(pair.rate))}/s`;
    out.push(`<g class="path" data-kind="${kind}" data-pair="${escapeHtml(`${pair.a}-${pair.b}`)}"><title>${escapeHtml(pair.endpoints.join('\n'))}</title>`);
    out.push(`<path d="M${from.x},${from.y} Q${cx.toFixed(1)},${cy.toFixed(1)} ${to.x},${to.y}" fill="none" stroke="${style.color}" stroke-width="2.5"${style.dash ? ` stroke-dasharray="${style.dash}"` : ''}/>`);
    out.push(`<text x="${((mx + cx) / 2).toFixed(1)}" y="${((my + cy) / 2).toFixed(1)}" font-size="10" fill="${style.color}" text-anchor="middle" class="path-label">${escapeHtml(label)}</text></g>`);
  }
  for (const placed of nodes.values()) {
    const node = s.nodes.find((n) => n.name === placed.name);
    out.push(`<g class="node" data-node="${escapeHtml(placed.name)}">`);
    out.push(`<circle cx="${placed.x}" cy="${placed.y}" r="20" fill="${node ? '#0f172a' : '#64748b'}"/>`);
    out.push(`<text x="${placed.x}" y="${placed.y + 5}" fill="white" text-anchor="middle" font-weight="bold">${escapeHtml(placed.name)}</text>`);
    if (node) {
      out.push(`<text x="${placed.x}" y="${placed.y + 34}" font-size="10" text-anchor="middle">${escapeHtml(node.address)}</text>`);
      out.push(`<g class="pod" data-pod="${escapeHtml(node.name)}"><rect x="${placed.x - 52}" y="${placed.y + 40}" width="104" height="30" rx="4" fill="#e0e7ff" stroke="#6366f1"/>`);
      out.push(`<text x="${placed.x}" y="${placed.y + 52}" font-size="9" text-anchor="middle">pod ${escapeHtml(node.pod.ipv4)}</text>`);
      out.push(`<text x="${placed.x}" y="${placed.y + 64}" font-size="9" text-anchor="middle">${escapeHtml(node.pod.ipv6)}</text></g>`);
    } else {
      out.push(`<text x="${placed.x}" y="${placed.y + 34}" font-size="10" text-anchor="middle">Node object only</text>`);
    }
    out.push('</g>');
  }
  out.push('</svg>');
  return out.join('');
}

export function renderLegend(): string {
  return `<div class="legend">${(['public', 'NAT', 'LAN', 'relay'] as const).map((k) => {
    const st = KIND_STYLE[k];
    return `<span><svg width="40" height="10"><line x1="0" y1="5" x2="40" y2="5" stroke="${st.color}" stroke-width="3"${st.dash ? ` stroke-dasharray="${st.dash}"` : ''}/></svg> ${escapeHtml(st.label)}</span>`;
  }).join(' ')}</div>`;
}

/** ok: both families; partial: one (amber); down: none (red). */
export function cellClass([v4, v6]: [boolean, boolean]): 'ok' | 'partial' | 'down' {
  return v4 && v6 ? 'ok' : v4 || v6 ? 'partial' : 'down';
}

export function renderMatrix(s: DemoSnapshot): string {
  const names = s.nodes.map((n) => n.name);
  const head = `<tr><th>from \\ to</th>${names.map((n) => `<th>${escapeHtml(n)}</th>`).join('')}</tr>`;
  const rows = names.map((from) => `<tr><th>${escapeHtml(from)}</th>${names.map((to) => {
    if (from === to) return '<td class="self">–</td>';
    const cell = s.matrix[from]?.[to] ?? [false, false];
    const mark = (ok: boolean) => (ok ? '✓' : '✗');
    return `<td class="cell ${cellClass(cell)}" data-from="${escapeHtml(from)}" data-to="${escapeHtml(to)}" title="IPv4 ${mark(cell[0])} IPv6 ${mark(cell[1])}">${mark(cell[0])}${mark(cell[1])}</td>`;
  }).join('')}</tr>`).join('');
  return `<table id="matrix" data-all-green="${s.allGreen}">${head}${rows}</table>`;
}

export function renderPeers(s: DemoSnapshot): string {
  const rows = s.peers.map((p) => `<tr data-from="${escapeHtml(p.from)}" data-to="${escapeHtml(p.to)}"><td>${escapeHtml(p.from)}</td><td>${escapeHtml(p.to)}</td><td>${escapeHtml(p.endpoint || '(none)')}</td><td class="kind-${p.path}">${escapeHtml(p.path === 'relay' ? `relay via ${p.via ?? '?'}` : p.path)}</td><td>${escapeHtml(formatAge(p.handshakeAgeS))}</td><td>${escapeHtml(formatRate(p.rxRate))}</td><td>${escapeHtml(formatRate(p.txRate))}</td></tr>`).join('');
  return `<table id="peers"><tr><th>from</th><th>to</th><th>endpoint</th><th>path</th><th>last handshake</th><th>in</th><th>out</th></tr>${rows}</table>`;
}

export function renderRecords(records: readonly FaultRecord[]): string {
  if (records.length === 0) return '<p id="records" class="quiet">No fault yet: press a button.</p>';
  return `<ul id="records">${[...records].reverse().map((r) => `<li class="record ${recordState(r)}" data-record="${r.id}">${escapeHtml(describeRecord(r))}</li>`).join('')}</ul>`;
}

/** The live part of the page (replaced on every snapshot). */
export function renderLive(view: PageView): string {
  const s = view.snapshot;
  if (!s) return '<p id="verdict" class="quiet">Building the world and starting the agents…</p>';
  const verdict = s.allGreen ? '<p id="verdict" class="green">All pods reach all pods over IPv4 and IPv6.</p>' : '<p id="verdict" class="red">Some pods cannot reach each other.</p>';
  return [
    `<p class="quiet">${s.nodes.length} nodes, ${new Set(s.nodes.map((n) => n.site)).size} sites · updated ${s.takenAt.toISOString().slice(11, 19)} UTC</p>`,
    verdict,
    renderMap(s),
    renderLegend(),
    '<div class="row"><div><h2>Reachability (pod → pod, IPv4 IPv6)</h2>', renderMatrix(s), '</div>',
    '<div><h2>Faults and recovery</h2>', renderRecords(view.records), view.message ? `<p id="message">${escapeHtml(view.message)}</p>` : '', '</div></div>',
    '<h2>Peers (what each data plane reports)</h2>', renderPeers(s),
  ].join('');
}

/** The fault buttons (replaced only when the set of targets changes). */
export function renderFaultButtons(targets: FaultTargets): string {
  const button = (line: string, text: string) => `<button type="button" data-fault="${escapeHtml(line)}">${escapeHtml(text)}</button>`;
  const groups: string[] = [];
  for (const spec of FAULTS) {
    const list = spec.args === 'ROUTER' ? targets.routers : spec.args === 'NODE' ? targets.nodes : targets.sites;
    const text = (t: string) => {
      switch (spec.kind) {
        case 'restart-router': return `restart ${t} router`;
        case 'flush-router': return `flush ${t} conntrack`;
        case 'kill-dataplane': return `kill ${t} data plane`;
        case 'restart-agent': return `restart ${t} agent`;
        case 'add-node': return `add node behind ${t}`;
        case 'remove-node': return `remove ${t}`;
        case 'cut-site': return `cut ${t} off`;
      }
    };
    groups.push(`<div class="faults" title="${escapeHtml(spec.summary)}"><span>${escapeHtml(spec.summary)}</span> ${list.map((t) => button(faultLine({ kind: spec.kind, target: t, ...(spec.args === 'SITE SECONDS' ? { seconds: 0 } : {}) }), text(t))).join(' ')}</div>`);
  }
  return groups.join('');
}

const STYLE = `body{font:14px system-ui,sans-serif;margin:16px;color:#0f172a}h1{font-size:20px;margin:0 0 4px}h2{font-size:15px;margin:16px 0 6px}
.quiet{color:#64748b}.green{color:#15803d;font-weight:bold}.red{color:#b91c1c;font-weight:bold}
table{border-collapse:collapse}td,th{border:1px solid #e2e8f0;padding:3px 7px;text-align:left;font-size:12px}
td.cell{text-align:center;font-weight:bold;min-width:36px}td.ok{background:#bbf7d0}td.partial{background:#fde68a}td.down{background:#fecaca}td.self{color:#94a3b8;text-align:center}
.kind-NAT{color:#d97706}.kind-LAN{color:#16a34a}.kind-public{color:#1f6feb}.row{display:flex;gap:32px;flex-wrap:wrap}
.legend span{margin-right:14px;font-size:12px}.faults{margin:3px 0}.faults span{display:inline-block;width:380px;font-size:12px;color:#475569}
button{margin:1px;font-size:12px}li.recovered{color:#15803d}li.recovering,li.applying{color:#b45309}li.failed{color:#b91c1c}code{background:#f1f5f9;padding:1px 4px}`;

/**
 * The page itself. The script keeps the SSE connection (the browser reconnects by itself),
 * swaps the fragments in, and posts a button's command as JSON (a page elsewhere cannot, see
 * lab/demo-web.ts).
 */
export function renderShell(kubectl: string | undefined): string {
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>roamguard demo</title><style>${STYLE}</style></head>
<body>
<h1>roamguard demo</h1>
${kubectl ? `<p>kubectl: <code id="kubectl">${escapeHtml(kubectl)}</code></p>` : ''}
<div id="live"><p class="quiet">connecting…</p></div>
<h2>Break something</h2>
<p class="quiet">Cut-off time: <input id="cut-seconds" type="number" min="1" max="600" value="15" style="width:4em"> s</p>
<div id="fault-buttons"></div>
<script>
const live = document.getElementById('live'), buttons = document.getElementById('fault-buttons');
const events = new EventSource('/events');
events.addEventListener('live', (e) => { live.innerHTML = JSON.parse(e.data); });
events.addEventListener('buttons', (e) => { const html = JSON.parse(e.data); if (buttons.innerHTML !== html) buttons.innerHTML = html; });
buttons.addEventListener('click', async (e) => {
  const b = e.target.closest('button[data-fault]');
  if (!b) return;
  let line = b.dataset.fault;
  if (/ 0$/.test(line)) line = line.replace(/ 0$/, ' ' + (document.getElementById('cut-seconds').value || '15'));
  const r = await fetch('/faults', { method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ command: line }) });
  const answer = await r.json().catch(() => ({ message: 'no answer' }));
  b.dataset.answer = answer.message;
});
</script>
</body></html>
`;
}
