/**
 * The high-rate handshake flood of robustness-flood.test.ts (issue 12, item 2): 50 000 and more
 * valid-mac1 initiations per second from 100 IPv4 source addresses at one victim, run the same
 * way against roamguard and against wireguard-go-modern (the reference), with a legitimate peer
 * coming up during the flood and an established peer sending throughout.
 *
 *   V: the victim (192.0.2.1 towards B, 198.51.100.1 towards C), listen port 51820, inner 10.77.0.1
 *   B: the flooder (flooder.c, 100 addresses 192.0.2.100-199) and the established peer E
 *      (wireguard-go-modern, inner 10.77.0.2), in session with V before the flood
 *   C: the legitimate peer L (wireguard-go-modern, inner 10.77.0.3), configured with V only once
 *      the flood is on; its time to a working tunnel is the time from its first ping to the first
 *      answered one
 *
 * The flooder sends precomputed initiations: for each source 64 different messages (random
 * sender index, ephemeral and body, a correct mac1 for V's key, a random non-zero mac2), resent
 * round-robin, blasted with sendmmsg from one connected socket per address. mac1 covers only the
 * message bytes, so a resent message stays valid; its random mac2 is what an attacker who read
 * the code would send (an all-zero mac2 is cheaper to refuse).
 */
import { execFileSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { memoryStatus } from '../../bench/suite/procfs.ts';
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import { LABEL_MAC1 } from '../../dataplane/noise/cookie.ts';
import { waitFor, type Namespace, type NsProcess, type Scope } from './netns.ts';
import { daemonStats, dropsDelta, udpReceiveQueueDrops } from './robustness-helpers.ts';
import {
  hasWireGuardGoModern, REPO_ROOT, startContinuousPing, UserspaceWg, waitForExit, type PingTrace,
} from './userspace-wg.ts';
import { generateKeyPair, keyBytes, type WgDaemon } from './wireguard-go.ts';
import { createPair } from './netns.ts';

const FLOODER_SOURCE = join(REPO_ROOT, 'test/system/flooder.c');
const MESSAGES_PER_SOURCE = 64;
export const FLOOD_SOURCES = 100;
const VICTIM_PORT = 51820;

/** Compiles flooder.c into `dir` (gcc, -O2); returns the binary's path. */
export function buildFlooder(dir: string): string {
  const out = join(dir, 'flooder');
  execFileSync('gcc', ['-O2', '-Wall', '-Werror', '-o', out, FLOODER_SOURCE], { stdio: ['ignore', 'pipe', 'pipe'] });
  return out;
}

/** MESSAGES_PER_SOURCE initiations per source, as flooder.c reads them. */
async function floodMessages(victimPublicKey: Uint8Array, sources: number): Promise<Uint8Array> {
  const crypto = await selectCrypto();
  const mac1Key = crypto.hash(LABEL_MAC1, victimPublicKey);
  const all = new Uint8Array(sources * MESSAGES_PER_SOURCE * 148);
  for (let i = 0; i < sources * MESSAGES_PER_SOURCE; i++) {
    const m = all.subarray(i * 148, (i + 1) * 148);
    m.set(crypto.randomBytes(148));
    m[0] = 1; m[1] = 0; m[2] = 0; m[3] = 0;
    m.set(crypto.mac(mac1Key, m.subarray(0, 116)), 116);
    m[132] |= 1; // a non-zero mac2
  }
  return all;
}

export interface FlooderResult {
  sent: number;
  seconds: number;
  rate: number;
  sendErrors: number;
  cookieReplies: number;
  responses: number;
  otherReplies: number;
  sources: number;
}

export type Subject = 'roamguard-node' | 'wireguard-go-modern';

export interface FloodReport {
  subject: Subject;
  flood: FlooderResult;
  /** Seconds from the legitimate peer's first ping to the first one answered (undefined: never). */
  legitimateSeconds: number | undefined;
  legitimatePings: PingTrace;
  /** The established peer's ping during the flood. */
  existingPings: PingTrace;
  /** Datagrams the kernel dropped from the victim's full socket queue (RcvbufErrors in V). */
  kernelDrops: number;
  /** roamguard: the inbound drop counters that moved during the flood. */
  counted?: Record<string, number>;
  rssBefore: number;
  rssAfter: number;
  /** A second, slow flood (20/s) after the calm-down: what came back. */
  after: FlooderResult;
  /** roamguard: the drop counters of that second flood. */
  afterCounted?: Record<string, number>;
  victim: WgDaemon;
  legitimate: WgDaemon;
}

const INNER_V = '10.77.0.1';
const INNER_E = '10.77.0.2';
const INNER_L = '10.77.0.3';

/**
 * One flood against `subject` in fresh namespaces (everything registered in `scope`): returns
 * the figures; asserts nothing.
 */
export async function runFlood(scope: Scope, subject: Subject, flooderBinary: string, options: { rate: number; seconds: number; victimEnv?: Record<string, string> }): Promise<FloodReport> {
  const topo = await createPair(scope);
  const v = topo.a;
  const b = topo.b;
  const c = await scope.namespace();
  await scope.veth(v, c, { ipv4: ['198.51.100.1/24', '198.51.100.2/24'] });
  const sources = Array.from({ length: FLOOD_SOURCES }, (_, i) => `192.0.2.${100 + i}`);
  for (const address of sources) await b.ip(['addr', 'add', `${address}/24`, 'dev', topo.linkB.ifname]);

  const [keysV, keysE, keysL] = await Promise.all([generateKeyPair(), generateKeyPair(), generateKeyPair()]);
  const victim: WgDaemon = subject === 'roamguard-node'
    ? await UserspaceWg.start(scope, v, { implementation: 'roamguard-node', startTimeoutMs: 60_000, env: options.victimEnv })
    : await UserspaceWg.start(scope, v, { implementation: 'wireguard-go-modern', env: options.victimEnv });
  // The peers are the newest wireguard-go where it is beside the checkout, else Debian's.
  const peerImplementation = hasWireGuardGoModern() ? 'wireguard-go-modern' : 'wireguard-go';
  const existing = await UserspaceWg.start(scope, b, { implementation: peerImplementation });
  const legitimate = await UserspaceWg.start(scope, c, { implementation: peerImplementation });
  await victim.configure({
    privateKey: keysV.privateKey,
    listenPort: VICTIM_PORT,
    peers: [
      { publicKey: keysE.publicKey, allowedIps: [`${INNER_E}/32`] },
      { publicKey: keysL.publicKey, allowedIps: [`${INNER_L}/32`] },
    ],
  });
  await existing.configure({
    privateKey: keysE.privateKey, listenPort: 51821,
    peers: [{ publicKey: keysV.publicKey, endpoint: `${topo.linkA.ipv4}:${VICTIM_PORT}`, allowedIps: [`${INNER_V}/32`] }],
  });
  await legitimate.configure({ privateKey: keysL.privateKey, listenPort: 51822 });
  for (const [daemon, inner] of [[victim, INNER_V], [existing, INNER_E], [legitimate, INNER_L]] as const) {
    await daemon.addAddress(`${inner}/24`);
    await daemon.up();
  }
  // The established peer: a session before the flood.
  await waitFor(async () => (await b.exec('ping', ['-n', '-c', '1', '-W', '1', INNER_V], { allowFailure: true })).code === 0,
    30_000, { description: 'the established peer to reach the victim' });

  const messagesFile = join(scope.tempDir('roamguard-flood-'), 'messages.bin');
  writeFileSync(messagesFile, await floodMessages(keyBytes(keysV.publicKey), sources.length));

  const pid = victim.process.pid;
  const isRoamguard = subject === 'roamguard-node';
  const statsBefore = isRoamguard ? await daemonStats(victim as UserspaceWg) : undefined;
  const kernelBefore = await udpReceiveQueueDrops(v);
  const rssBefore = memoryStatus(pid).rssBytes;

  const flooder = startFlooder(scope, b, flooderBinary, topo.linkA.ipv4, options.rate, options.seconds, messagesFile, sources);
  const existingPings = startContinuousPing(scope, b, INNER_V, { durationS: options.seconds - 1, intervalS: 0.2 });
  // The legitimate peer comes up once the flood is on.
  await new Promise((r) => setTimeout(r, 1500));
  await legitimate.configure({ peers: [{ publicKey: keysV.publicKey, endpoint: '198.51.100.1:51820', allowedIps: [`${INNER_V}/32`] }] });
  const legitimateStart = Date.now() / 1000;
  const legitimatePings = startContinuousPing(scope, c, INNER_V, { durationS: Math.max(3, Math.floor(options.seconds - 2.5)), intervalS: 0.1 });
  const flood = await flooderResult(flooder, options.seconds);
  const [lp, ep] = await Promise.all([legitimatePings, existingPings]);
  const rssAfter = memoryStatus(pid).rssBytes;
  const kernelDrops = (await udpReceiveQueueDrops(v)) - kernelBefore;
  const statsAfter = isRoamguard ? await daemonStats(victim as UserspaceWg) : undefined;
  const counted = statsBefore && statsAfter ? dropsDelta(statsBefore, statsAfter, { inboundOnly: true }) : undefined;

  // Load mode must end a second after the flood: after three seconds, a slow flood of the same
  // messages (20/s) is answered without cookies.
  await new Promise((r) => setTimeout(r, 3000));
  const calmBefore = isRoamguard ? await daemonStats(victim as UserspaceWg) : undefined;
  const after = await flooderResult(startFlooder(scope, b, flooderBinary, topo.linkA.ipv4, 20, 1, messagesFile, sources), 1);
  const afterCounted = calmBefore ? dropsDelta(calmBefore, await daemonStats(victim as UserspaceWg), { inboundOnly: true }) : undefined;

  const first = lp.replies[0];
  return {
    subject, flood, legitimateSeconds: first ? first.at - legitimateStart : undefined, legitimatePings: lp, existingPings: ep,
    kernelDrops, counted, rssBefore, rssAfter, after, afterCounted, victim, legitimate,
  };
}

function startFlooder(scope: Scope, ns: Namespace, binary: string, dst: string, rate: number, seconds: number, file: string, sources: string[]): NsProcess {
  return scope.spawn(ns, binary, [dst, String(VICTIM_PORT), String(rate), String(seconds), file, ...sources], { label: `flooder in ${ns.name}` });
}

async function flooderResult(proc: NsProcess, seconds: number): Promise<FlooderResult> {
  const exit = await waitForExit(proc, (seconds + 20) * 1000, 'the end of its flood');
  const line = proc.stdout.trim().split('\n').pop() ?? '';
  if (exit.code !== 0 || !line.startsWith('{')) throw new Error(`the flooder failed\n${proc.describe()}`);
  return JSON.parse(line) as FlooderResult;
}

export function describeReport(r: FloodReport): string {
  const mib = (n: number) => (n / 1048576).toFixed(1);
  const answered = r.flood.sent > 0 ? (100 * r.flood.cookieReplies / r.flood.sent).toFixed(1) : '0';
  const existingAnswered = `${r.existingPings.replies.length}/${r.existingPings.transmitted}`;
  return `${r.subject}: flood ${r.flood.sent} initiations in ${r.flood.seconds.toFixed(1)} s = ${r.flood.rate}/s from ${r.flood.sources} sources; `
    + `legitimate peer's first ping answered after ${r.legitimateSeconds === undefined ? 'never' : `${r.legitimateSeconds.toFixed(2)} s`}; `
    + `cookie replies ${r.flood.cookieReplies} (${answered} % of the flood), responses ${r.flood.responses}; `
    + `counted drops ${r.counted ? JSON.stringify(r.counted) : 'n/a (no counters)'}; kernel drops (RcvbufErrors) ${r.kernelDrops}; `
    + `established peer's pings answered ${existingAnswered}; RSS ${mib(r.rssBefore)} -> ${mib(r.rssAfter)} MiB; `
    + `after the flood (20/s): cookie replies ${r.after.cookieReplies} of ${r.after.sent}${r.afterCounted ? `, drops ${JSON.stringify(r.afterCounted)}` : ''}`;
}
