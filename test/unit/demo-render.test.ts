/** The demo's screen: path classification and the rendered tables and matrix. */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { classifyPath, renderDemo, type DemoSnapshot } from '../../lab/demo.ts';

const nat = new Set(['203.0.113.10']);

describe('demo rendering', () => {
  test('paths: LAN address of a NAT\'d peer, a NAT mapping, a public address, none', () => {
    assert.equal(classifyPath('192.168.1.12:51822', '192.168.1.12', nat, false), 'LAN');
    assert.equal(classifyPath('203.0.113.10:51821', '192.168.1.11', nat, false), 'NAT');
    assert.equal(classifyPath('203.0.113.1:51820', '203.0.113.1', nat, true), 'public');
    assert.equal(classifyPath('(none)', '203.0.113.1', nat, true), 'none');
    assert.equal(classifyPath('[2001:db8::1]:51820', '2001:db8::1', nat, true), 'public');
  });

  const snapshot = (v6ok: boolean): DemoSnapshot => ({
    nodes: [
      { name: 'c1', site: 'internet', address: '203.0.113.1', publicAddress: '203.0.113.1', pod: { ipv4: '10.244.1.2', ipv6: 'fd00:244:1::2' } },
      { name: 'o1', site: 'office', address: '192.168.1.11', publicAddress: '203.0.113.10', pod: { ipv4: '10.244.3.2', ipv6: 'fd00:244:3::2' } },
    ],
    peers: [
      { from: 'c1', to: 'o1', endpoint: '203.0.113.10:51821', path: 'NAT', handshakeAgeS: 12, rxBytes: 2048, txBytes: 100 },
      { from: 'o1', to: 'c1', endpoint: '203.0.113.1:51820', path: 'public', handshakeAgeS: undefined, rxBytes: 0, txBytes: 0 },
      { from: 'o1', to: 'k1', endpoint: '203.0.113.1:51900', path: 'relay', via: 'c1', handshakeAgeS: 4, rxBytes: 0, txBytes: 0 },
    ],
    matrix: { c1: { o1: [true, v6ok] }, o1: { c1: [true, true] } },
    allGreen: v6ok,
    takenAt: new Date('2026-11-30T08:00:00Z'),
  });

  test('nodes, peers and the matrix are all on the screen; the verdict follows the matrix', () => {
    const text = renderDemo(snapshot(true));
    assert.match(text, /^roamguard demo — 2 nodes, 2 sites, at 08:00:00/);
    assert.match(text, /o1 +office +192\.168\.1\.11 +203\.0\.113\.10 +10\.244\.3\.2 +fd00:244:3::2/);
    assert.match(text, /c1 +o1 +203\.0\.113\.10:51821 +NAT +12s ago +2\.0 KiB +100 B/);
    assert.match(text, /o1 +c1 +203\.0\.113\.1:51820 +public +never/);
    assert.match(text, /o1 +k1 +203\.0\.113\.1:51900 +relay via c1 +4s ago/);
    assert.match(text, /all pods reach all pods over IPv4 and IPv6/);
    assert.doesNotMatch(text, /✗/);
    const bad = renderDemo(snapshot(false));
    assert.match(bad, /c1 +-   +✓  ✗/);
    assert.match(bad, /some pods cannot reach each other/);
  });

  test('colour only when asked', () => {
    assert.doesNotMatch(renderDemo(snapshot(true)), /\x1b\[/);
    assert.match(renderDemo(snapshot(true), true), /\x1b\[32m/);
  });
});
