/**
 * The demo's `key-rotation` scenario (`roamguard demo --once --scenario key-rotation`): once every
 * pod reaches every pod, each node's key is rotated in turn with the real command
 * (`roamguard rotate-key`, run in the node's namespace with its agent's settings) while its pod
 * pings every other node's pod at 50 pings/s. Reported per rotation and peer: the pings lost and
 * the longest silence (which also counts replies that came late: pings queued while the handshake
 * ran, and scheduling pauses on a busy machine). The scenario passes when every peer switched to
 * the new key and no peer lost more than one second of pings in any rotation.
 */
import type { Namespace } from './netns.ts';
import { parsePingOutput } from './probe.ts';
import { ROAMGUARD, type Pod, type World, type WorldNode } from './world.ts';

const PING_INTERVAL_S = 0.02;
const PING_SECONDS = 8;
/** Rotation starts this long after the pings, so the trace shows traffic before and after it. */
const LEAD_MS = 1500;
const MAX_LOST_MS = 1000;

export interface RotationResult {
  node: string;
  from: string;
  to: string;
  switchedInS?: number;
  error?: string;
  peers: Array<{ peer: string; transmitted: number; lost: number; longestSilenceMs: number; switched: boolean }>;
}

interface Trace { transmitted: number; lost: number; longestSilenceMs: number }

async function pingTrace(ns: Namespace, dst: string): Promise<Trace> {
  const result = await ns.exec('ping', ['-n', '-D', '-i', String(PING_INTERVAL_S), '-w', String(PING_SECONDS), dst], { allowFailure: true, timeoutMs: (PING_SECONDS + 15) * 1000 });
  const stats = parsePingOutput(result.stdout);
  const times = [...result.stdout.matchAll(/^\[(\d+\.\d+)\] \d+ bytes from/gm)].map((m) => Number(m[1]));
  let longest = times.length === 0 ? PING_SECONDS : 0;
  for (let i = 1; i < times.length; i++) longest = Math.max(longest, times[i] - times[i - 1]);
  return { transmitted: stats.transmitted, lost: stats.transmitted - stats.received, longestSilenceMs: Math.round(longest * 1000) };
}

/** Rotates `node`'s key under 50 pings/s from its pod to every other pod. */
export async function rotateUnderPing(world: World, pods: ReadonlyMap<string, Pod>, node: WorldNode): Promise<RotationResult> {
  const from = world.publicKeyOf(node) ?? '';
  const src = pods.get(node.name)!;
  const others = world.nodes.filter((n) => n !== node);
  const traces = others.map((other) => pingTrace(src.ns, pods.get(other.name)!.ipv4));
  await new Promise((r) => setTimeout(r, LEAD_MS));
  const rotated = await node.ns.exec(ROAMGUARD, ['rotate-key', '--wait', '30'], { env: { ...process.env, ...node.env }, allowFailure: true, timeoutMs: 90_000 });
  const results = await Promise.all(traces);
  const to = world.publicKeyOf(node) ?? '';
  const peers = await Promise.all(others.map(async (other, i) => {
    const view = await world.wgPeers(other).catch(() => new Map());
    return { peer: other.name, ...results[i], switched: to !== from && view.has(to) && !view.has(from) };
  }));
  const switchedIn = /switched to it after ([\d.]+) s/.exec(rotated.stdout);
  return {
    node: node.name, from, to, peers,
    switchedInS: switchedIn ? Number(switchedIn[1]) : undefined,
    error: rotated.code === 0 ? undefined : (rotated.stderr || rotated.stdout).trim().split('\n').at(-1),
  };
}

export function rotationPassed(r: RotationResult): boolean {
  return r.error === undefined && r.peers.every((p) => p.switched && p.lost * PING_INTERVAL_S * 1000 <= MAX_LOST_MS);
}

/** The scenario's report (pure, for the demo's output). */
export function renderRotations(results: readonly RotationResult[]): string {
  const rows = [['node', 'key before → after', 'peer', 'pings lost', 'lost time', 'longest silence', 'peer switched']];
  for (const r of results) {
    for (const [i, p] of r.peers.entries()) {
      rows.push([i === 0 ? r.node : '', i === 0 ? `${r.from.slice(0, 8)} → ${r.to.slice(0, 8)}` : '', p.peer,
        `${p.lost} of ${p.transmitted}`, `${Math.round(p.lost * PING_INTERVAL_S * 1000)} ms`, `${p.longestSilenceMs} ms`, p.switched ? 'yes' : 'NO']);
    }
    if (r.error) rows.push(['', `rotate-key failed: ${r.error}`, '', '', '', '', '']);
  }
  const widths = rows[0].map((_, c) => Math.max(...rows.map((row) => row[c].length)));
  const lines = rows.map((row) => row.map((cell, c) => cell.padEnd(widths[c])).join('  ').trimEnd());
  const worst = Math.max(0, ...results.flatMap((r) => r.peers.map((p) => p.lost)));
  const ok = results.every(rotationPassed);
  return [
    `KEY ROTATION (each node's key rotated once with roamguard rotate-key, its pod pinging every other pod at ${1 / PING_INTERVAL_S}/s)`,
    ...lines,
    '',
    ok ? `every node's key rotated and every peer switched; at most ${worst} pings (${Math.round(worst * PING_INTERVAL_S * 1000)} ms) lost per peer and rotation`
      : `a rotation lost more than ${MAX_LOST_MS} ms of pings or a peer did not switch (see above)`,
  ].join('\n');
}

/** The scenario: every node rotated once, in turn. */
export async function runKeyRotationScenario(world: World, pods: ReadonlyMap<string, Pod>, step: (what: string) => void): Promise<{ ok: boolean; report: string }> {
  const results: RotationResult[] = [];
  for (const node of world.nodes) {
    step(`rotating ${node.name}'s key under 50 pings/s to every other pod`);
    const r = await rotateUnderPing(world, pods, node);
    results.push(r);
    step(`${node.name}: ${r.from.slice(0, 8)} → ${r.to.slice(0, 8)}, pings lost per peer: ${r.peers.map((p) => `${p.peer} ${p.lost}`).join(', ')}`);
  }
  return { ok: results.every(rotationPassed), report: renderRotations(results) };
}
