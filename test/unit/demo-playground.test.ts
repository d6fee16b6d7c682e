/** The playground's pure parts: fault commands, recovery records, rates and the page's fragments. */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { FAULTS, faultHelp, faultLabel, faultLine, parseFaultLine } from '../../lab/demo-faults.ts';
import { describeRecord, newRecord, observe, recordState, type FaultRecord } from '../../lab/demo-recovery.ts';
import { cellsDown, renderDemo, withRates, type DemoSnapshot } from '../../lab/demo.ts';
import { cellClass, escapeHtml, pairKind, renderFaultButtons, renderLive, renderMatrix, renderShell } from '../../lab/demo-page.ts';

const targets = { routers: ['office', 'home'], nodes: ['c1', 'o1', 'h1'], sites: ['internet', 'office', 'home'] };

describe('fault commands', () => {
  test('each command parses with its target; the line form round-trips', () => {
    assert.deepEqual(parseFaultLine('r office', targets), { command: { kind: 'restart-router', target: 'office' } });
    assert.deepEqual(parseFaultLine('  f   home ', targets), { command: { kind: 'flush-router', target: 'home' } });
    assert.deepEqual(parseFaultLine('k o1', targets), { command: { kind: 'kill-dataplane', target: 'o1' } });
    assert.deepEqual(parseFaultLine('a c1', targets), { command: { kind: 'restart-agent', target: 'c1' } });
    assert.deepEqual(parseFaultLine('n office', targets), { command: { kind: 'add-node', target: 'office' } });
    assert.deepEqual(parseFaultLine('x h1', targets), { command: { kind: 'remove-node', target: 'h1' } });
    assert.deepEqual(parseFaultLine('c home 10', targets), { command: { kind: 'cut-site', target: 'home', seconds: 10 } });
    assert.deepEqual(parseFaultLine('restart-router home', targets), { command: { kind: 'restart-router', target: 'home' } });
    for (const line of ['r office', 'c internet 5', 'x o1']) {
      const parsed = parseFaultLine(line, targets);
      assert.ok('command' in parsed);
      assert.equal(faultLine(parsed.command), line);
    }
    assert.equal(FAULTS.length, 7);
  });

  test('help, quit, empty; bad input names the problem and the usage', () => {
    assert.deepEqual(parseFaultLine('h', targets), { help: true });
    assert.deepEqual(parseFaultLine('?', targets), { help: true });
    assert.deepEqual(parseFaultLine('q', targets), { quit: true });
    assert.deepEqual(parseFaultLine('   ', targets), { empty: true });
    const error = (line: string) => { const p = parseFaultLine(line, targets); assert.ok('error' in p, line); return p.error; };
    assert.match(error('z'), /unknown command "z"/);
    assert.match(error('r'), /usage: r ROUTER/);
    assert.match(error('r internet'), /no router "internet" \(office, home\); usage: r ROUTER/);
    assert.match(error('k o9'), /no node "o9"/);
    assert.match(error('c home'), /usage: c SITE SECONDS/);
    assert.match(error('c home 0'), /SECONDS must be a whole number from 1 to 600/);
    assert.match(error('c home 2.5'), /SECONDS/);
    assert.match(error('c mars 5'), /no site "mars"/);
    assert.match(error('x o1 o2'), /usage: x NODE/);
  });

  test('labels and the on-screen help', () => {
    assert.equal(faultLabel({ kind: 'restart-router', target: 'office' }), 'restart office router');
    assert.equal(faultLabel({ kind: 'cut-site', target: 'home', seconds: 10 }), 'cut home off for 10 s');
    const help = faultHelp(targets).join('\n');
    for (const f of FAULTS) assert.match(help, new RegExp(`^  ${f.key} ${f.args}`, 'm'));
    assert.match(help, /e\.g\. r office/);
  });
});

describe('recovery records', () => {
  const sample = (startedAt: number, finishedAt: number, down: number) => ({ startedAt, finishedAt, down, allGreen: down === 0 });

  test('worst cells down and the time to the first all-green snapshot begun after the fault was applied', () => {
    let records = [newRecord(1, 'restart office router', 1000)];
    records = observe(records, sample(0, 900, 0)); // ended before the fault: ignored
    assert.equal(records[0].worstDown, 0);
    records = observe(records, sample(800, 2000, 0)); // began before it was applied: not a recovery
    assert.equal(recordState(records[0]), 'applying');
    records[0] = { ...records[0], appliedAt: 3000 };
    records = observe(records, sample(2500, 4000, 0)); // began before appliedAt
    assert.equal(records[0].recoveredAfterS, undefined);
    records = observe(records, sample(4000, 6000, 6));
    records = observe(records, sample(6000, 8000, 2));
    assert.equal(recordState(records[0]), 'recovering');
    assert.match(describeRecord(records[0]), /restart office router: done, waiting for an all-green matrix \(6 cells down at worst so far\)/);
    records = observe(records, sample(8000, 11_500, 0));
    assert.equal(records[0].recoveredAfterS, 10.5);
    assert.equal(records[0].worstDown, 6);
    assert.match(describeRecord(records[0]), /^\d\d:\d\d:\d\d restart office router: 6 cells down at worst; recovered in 10\.5 s$/);
    const after = observe(records, sample(12_000, 13_000, 9));
    assert.equal(after[0].worstDown, 6, 'a recovered record is closed');
  });

  test('a failed fault says why; one that broke nothing says so', () => {
    const failed = { ...newRecord(2, 'kill o1\'s data plane', 0), error: 'o1 has no data plane running' };
    assert.equal(recordState(failed), 'failed');
    assert.match(describeRecord(failed), /could not be done: o1 has no data plane running/);
    let records: FaultRecord[] = [{ ...newRecord(3, 'restart c1\'s agent', 0), appliedAt: 100 }];
    records = observe(records, sample(200, 1200, 0));
    assert.match(describeRecord(records[0]), /no pod pair lost; recovered in 1\.2 s/);
  });
});

const snapshot = (o1ok: [boolean, boolean]): DemoSnapshot => ({
  nodes: [
    { name: 'c1', site: 'internet', address: '203.0.113.1', publicAddress: '203.0.113.1', pod: { ipv4: '10.244.1.2', ipv6: 'fd00:244:1::2' } },
    { name: 'o1', site: 'office', address: '192.168.1.11', publicAddress: '203.0.113.10', pod: { ipv4: '10.244.3.2', ipv6: 'fd00:244:3::2' } },
    { name: 'o2', site: 'office', address: '192.168.1.12', publicAddress: '203.0.113.10', pod: { ipv4: '10.244.4.2', ipv6: 'fd00:244:4::2' } },
  ],
  peers: [
    { from: 'c1', to: 'o1', endpoint: '203.0.113.10:51821', path: 'NAT', handshakeAgeS: 12, rxBytes: 2048, txBytes: 100 },
    { from: 'o1', to: 'c1', endpoint: '203.0.113.1:51820', path: 'public', handshakeAgeS: 3, rxBytes: 0, txBytes: 0 },
    { from: 'o1', to: 'o2', endpoint: '192.168.1.12:51822', path: 'LAN', handshakeAgeS: 5, rxBytes: 0, txBytes: 0 },
    { from: 'c1', to: '?AbCdEfGh', endpoint: '', path: 'none', rxBytes: 0, txBytes: 0 },
  ],
  matrix: { c1: { o1: o1ok, o2: [true, true] }, o1: { c1: [true, true], o2: [true, true] }, o2: { c1: [true, true], o1: [true, true] } },
  allGreen: o1ok[0] && o1ok[1],
  takenAt: new Date('2026-11-30T08:00:00Z'),
  routers: [{ name: 'office', publicAddress: '203.0.113.10', lan: 'office' }],
  apiOnlyNodes: ['x1'],
});

describe('rates and the terminal screen', () => {
  test('bytes per second from the previous snapshot; a counter reset has no rate', () => {
    const before = snapshot([true, true]);
    const after: DemoSnapshot = { ...before, takenAt: new Date(before.takenAt.getTime() + 2000), peers: before.peers.map((p) => (p.from === 'c1' && p.to === 'o1' ? { ...p, rxBytes: 4096, txBytes: 50 } : p)) };
    const rated = withRates(after, before);
    const p = rated.peers.find((x) => x.from === 'c1' && x.to === 'o1')!;
    assert.equal(p.rxRate, 1024);
    assert.equal(p.txRate, undefined);
    assert.equal(withRates(before, undefined).peers[0].rxRate, undefined);
    assert.match(renderDemo(rated), /c1 +o1 +203\.0\.113\.10:51821 +NAT +12s ago +4\.0 KiB +50 B +1\.0 KiB\/s -/);
  });

  test('cells down count both families; extras follow the verdict; Node objects without a demo node are named', () => {
    assert.equal(cellsDown(snapshot([false, true])), 1);
    assert.equal(cellsDown(snapshot([false, false])), 2);
    const text = renderDemo(snapshot([true, true]), false, { after: ['FAULT LOG', '  something'] });
    assert.match(text, /all pods reach all pods over IPv4 and IPv6\n\nFAULT LOG\n  something$/);
    assert.match(text, /Node objects without a demo node \(made with kubectl\?\): x1/);
  });
});

describe('the page', () => {
  test('matrix cells: green, amber, red, with the pair on each cell', () => {
    assert.equal(cellClass([true, true]), 'ok');
    assert.equal(cellClass([true, false]), 'partial');
    assert.equal(cellClass([false, false]), 'down');
    const html = renderMatrix(snapshot([true, false]));
    assert.match(html, /<table id="matrix" data-all-green="false">/);
    assert.match(html, /<td class="cell partial" data-from="c1" data-to="o1" title="IPv4 ✓ IPv6 ✗">✓✗<\/td>/);
    assert.equal((html.match(/class="cell ok"/g) ?? []).length, 5);
  });

  test('the map draws every node with its pod, each pair once by kind, and Node objects without a node', () => {
    const html = renderLive({ snapshot: snapshot([true, true]), records: [], targets, message: '' });
    for (const n of ['c1', 'o1', 'o2']) {
      assert.match(html, new RegExp(`<g class="node" data-node="${n}">`));
      assert.match(html, new RegExp(`<g class="pod" data-pod="${n}">`));
    }
    assert.match(html, /<g class="node" data-node="x1">.*Node object only/);
    assert.match(html, /<g class="path" data-kind="NAT" data-pair="c1-o1">/, 'NAT on one side wins');
    assert.match(html, /<g class="path" data-kind="LAN" data-pair="o1-o2">/);
    assert.equal((html.match(/data-pair="c1-o1"/g) ?? []).length, 1);
    assert.match(html, /3s ago · 0 B\/s/);
    assert.match(html, /stroke-dasharray="2 4"\/><\/svg> relay<\/span>/, 'the legend has relays');
    assert.match(html, /<text[^>]*>office NAT 203\.0\.113\.10<\/text>/);
    assert.match(html, /id="verdict" class="green"/);
    assert.equal(pairKind(['public', 'LAN']), 'LAN');
    assert.equal(pairKind(['NAT', 'relay']), 'relay', 'a pair through a relay is drawn as one');
    assert.equal(pairKind([]), 'none');
  });

  test('buttons for every fault and target; the shell has no outside resources', () => {
    const html = renderFaultButtons(targets);
    assert.match(html, /<button type="button" data-fault="r office">restart office router<\/button>/);
    assert.match(html, /<button type="button" data-fault="c internet 0">cut internet off<\/button>/);
    assert.match(html, /data-fault="x h1">remove h1</);
    assert.equal((html.match(/<button/g) ?? []).length, 2 + 2 + 3 + 3 + 2 + 3 + 3);
    const shell = renderShell('export KUBECONFIG=/tmp/x/kubeconfig');
    assert.doesNotMatch(shell, /https?:\/\//, 'nothing fetched from elsewhere');
    assert.match(shell, /new EventSource\('\/events'\)/);
    assert.match(shell, /<code id="kubectl">export KUBECONFIG=\/tmp\/x\/kubeconfig<\/code>/);
    assert.equal(escapeHtml('<a href="x">&\'</a>'), '&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;');
  });
});
