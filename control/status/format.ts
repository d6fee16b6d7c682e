/**
 * `roamguard status` output: a table for people, JSON for scripts.
 *
 *   interface roamguard0 · node node-1 · key xTIBA5rb · port 51820 · 2 peers
 *   NODE    KEY       ENDPOINT                    ALLOWED IPS                  HANDSHAKE  TRANSFER                STATE
 *   node-2  Hd0E9dqc  10.77.0.2:51820             10.77.0.2/32,10.244.2.0/24   12s ago    rx 1.20 MiB, tx 3.00 KiB connected
 *   node-3  uQ2x1lTo  203.0.113.9:40012 (roamed)  10.244.3.0/24                never      rx 0 B, tx 592 B        handshaking
 *   node-4  Zk3v0QaP  203.0.113.1:51900 (relay via node-1)  10.244.4.0/24     3s ago     rx 9.00 KiB, tx 9.00 KiB connected
 */
import { formatAge, formatBytes } from './peer-state.ts';
import type { StatusReport } from './status.ts';

const HEADERS = ['NODE', 'KEY', 'ENDPOINT', 'ALLOWED IPS', 'HANDSHAKE', 'TRANSFER', 'STATE'] as const;

/** Rows of cells, aligned in columns two spaces apart (the last column is not padded). */
export function alignColumns(rows: readonly (readonly string[])[]): string[] {
  const widths: number[] = [];
  for (const row of rows) row.forEach((cell, i) => { widths[i] = Math.max(widths[i] ?? 0, cell.length); });
  return rows.map((row) => row.map((cell, i) => (i === row.length - 1 ? cell : cell.padEnd(widths[i]))).join('  ').trimEnd());
}

export function formatStatusTable(report: StatusReport, nowWallMs: number): string {
  const head = [
    `interface ${report.interface}`,
    report.node ? `node ${report.node}` : undefined,
    report.publicKey ? `key ${report.publicKey.slice(0, 8)}` : 'no private key',
    report.listenPort > 0 ? `port ${report.listenPort}` : 'not listening',
    `${report.peers.length} peer${report.peers.length === 1 ? '' : 's'}`,
  ].filter(Boolean).join(' · ');
  // PATH MTU only when the routes could be read (roamguard status on the node, as root).
  const mtus = report.tunnelMtu !== undefined;
  const rows: string[][] = [mtus ? [...HEADERS.slice(0, 4), 'PATH MTU', ...HEADERS.slice(4)] : [...HEADERS]];
  for (const p of report.peers) {
    const endpoint = p.endpoint === null ? '(none)' : p.relayVia ? `${p.endpoint} (relay via ${p.relayVia})` : p.roamed ? `${p.endpoint} (roamed)` : p.endpoint;
    rows.push([
      p.node,
      p.key,
      endpoint,
      p.allowedIps.length > 0 ? p.allowedIps.join(',') : '(none)',
      ...(mtus ? [p.pathMtu === undefined ? '-' : p.pathMtu < report.tunnelMtu! ? `${p.pathMtu} (path)` : String(p.pathMtu)] : []),
      p.state === 'not configured' ? '-' : formatAge(p.lastHandshakeWallMs, nowWallMs),
      p.state === 'not configured' ? '-' : `rx ${formatBytes(p.rxBytes)}, tx ${formatBytes(p.txBytes)}`,
      p.state,
    ]);
  }
  const lines = [head, ...alignColumns(rows)];
  if (report.peers.length === 0) lines.push('(no peers)');
  const roamed = report.peers.filter((p) => p.roamed);
  if (roamed.length > 0) {
    lines.push('', 'roamed: the data plane learned the endpoint from the peer\'s packets (NAT); the agent\'s endpoints:');
    for (const p of roamed) lines.push(`  ${p.node} ${p.key}: ${p.expectedEndpoint} (${p.expectedSource})`);
  }
  for (const r of report.rejected) lines.push(`rejected node ${r.node}: ${r.reason}`);
  const drops = Object.entries(report.drops);
  if (drops.length > 0) lines.push(`dropped packets: ${drops.map(([reason, n]) => `${reason} ${n}`).join(', ')}`);
  if (!report.api.reachable) lines.push(`node names unavailable: cannot read Nodes from the API server${report.api.error ? ` (${report.api.error})` : ''}`);
  return `${lines.join('\n')}\n`;
}

/** The report as JSON (stable field names; times as wall-clock ms and ISO text). */
export function formatStatusJson(report: StatusReport): string {
  return `${JSON.stringify({
    ...report,
    peers: report.peers.map((p) => ({
      ...p,
      lastHandshake: p.lastHandshakeWallMs > 0 ? new Date(p.lastHandshakeWallMs).toISOString() : null,
    })),
  }, null, 2)}\n`;
}
