/**
 * Key rotation: the key file is the identity this node wants, and the agent follows it.
 *
 * `roamguard rotate-key` and `KEY_ROTATION_INTERVAL` only ever replace the key file (atomically,
 * 0600: control/identity/private-key.ts), so the new key is persisted before anything uses it.
 * On its next pass the agent sees a file key that differs from the one in use and switches in
 * this order:
 *
 *   1. publish the new public key on this Node (the `roamguard.io/public-key` annotation);
 *   2. give the data plane the new private key — which ends its sessions, as in wireguard-go and
 *      the kernel — and make it send a handshake to every peer at once (`kickRequest`);
 *   3. wipe the old private key.
 *
 * Every peer's agent sees the new key through its Node watch and replaces the peer in one UAPI
 * transaction (a peer is its public key: the old one is removed, the new one added with the same
 * allowed IPs and the endpoint that worked, control/mesh/replaced-peer.ts). The new peer's
 * keepalive makes that side handshake at once too, so whichever side switches second completes
 * the handshake immediately; when both switch at the same moment, the two handshakes cross, and
 * the data plane completes them at once as well (Handshake.setAsideOwnInitiation). Traffic
 * pauses only for the time the watch event takes to reach the peers' agents (measured:
 * docs/robustness.md).
 *
 * Publishing comes first so that an API server that cannot be reached holds the whole switch back:
 * the node keeps talking with the old key meanwhile, and completes the rotation once the patch
 * goes through. An agent that restarts mid-rotation reads the new key from the file and converges
 * the same way (start-up gives the data plane the file's key and publishes it).
 */
import { randomBytes } from 'node:crypto';
import { watch, type FSWatcher } from 'node:fs';
import { basename, dirname } from 'node:path';
import { clampPrivateKey, constantTimeEqual, generatePrivateKey, keyToBase64 } from '../../dataplane/noise/keys.ts';
import type { UapiClient } from '../../dataplane/uapi/uapi-client.ts';
import type { SetRequest } from '../../dataplane/uapi/uapi-protocol.ts';
import { privateKeyFileWrittenAtMs, readPrivateKeyFile, replacePrivateKeyFile } from '../identity/private-key.ts';
import type { AgentLogger } from '../log.ts';

/** A fresh clamped private key (the data plane's generator, with node:crypto's randomness). */
export function newPrivateKey(): Uint8Array {
  return generatePrivateKey({ randomBytes: (n) => randomBytes(n) });
}

/** Whether the key written at `writtenAtMs` is due for rotation (`intervalS` 0 = never). */
export function rotationDue(writtenAtMs: number, nowMs: number, intervalS: number): boolean {
  return intervalS > 0 && nowMs - writtenAtMs >= intervalS * 1000;
}

/** What the key file says compared with the key in use. */
export type KeyFileState =
  | { kind: 'in-use' }
  | { kind: 'rotated'; privateKey: Uint8Array }
  | { kind: 'unreadable'; problem: string };

export function keyFileState(inUse: Uint8Array, read: () => Uint8Array): KeyFileState {
  let fileKey: Uint8Array;
  try {
    const raw = read();
    fileKey = clampPrivateKey(raw);
    raw.fill(0);
  } catch (err) {
    return { kind: 'unreadable', problem: (err as Error).message };
  }
  const current = clampPrivateKey(inUse);
  const same = constantTimeEqual(fileKey, current);
  current.fill(0);
  if (same) {
    fileKey.fill(0);
    return { kind: 'in-use' };
  }
  return { kind: 'rotated', privateKey: fileKey };
}

/**
 * A request that makes the data plane send a keepalive, hence a handshake initiation, to each of
 * these peers now: persistent keepalive set to 0 and back in two sections per peer. Both
 * roamguard and wireguard-go send one keepalive at the end of a section that turns keepalive on;
 * a peer with keepalive off gets it on (1 s) and off again.
 */
export function kickRequest(peers: ReadonlyArray<{ publicKey: Uint8Array; persistentKeepalive: number }>): SetRequest | undefined {
  if (peers.length === 0) return undefined;
  const section = (publicKey: Uint8Array, persistentKeepalive: number) => ({
    publicKey, remove: false, updateOnly: true, replaceAllowedIps: false, allowedIps: [], persistentKeepalive,
  });
  return {
    replacePeers: false,
    peers: peers.flatMap((p) => p.persistentKeepalive > 0
      ? [section(p.publicKey, 0), section(p.publicKey, p.persistentKeepalive)]
      : [section(p.publicKey, 1), section(p.publicKey, 0)]),
  };
}

/** Calls `onChange` soon after the key file is replaced (the agent also looks on every pass). */
export function watchKeyFile(path: string, onChange: () => void): { close(): void } {
  let watcher: FSWatcher | undefined;
  try {
    // The directory, not the file: a rename replaces the file's inode, which a file watch loses.
    watcher = watch(dirname(path), { persistent: false }, (_event, name) => {
      if (name === null || String(name) === basename(path)) onChange();
    });
    watcher.on('error', () => watcher?.close());
  } catch {
    // No inotify here: the passes every few seconds still pick the change up.
  }
  return { close: () => watcher?.close() };
}

/** What `followKeyFile` needs from the agent. */
export interface KeyFollowDeps {
  path: string;
  intervalS: number;
  /** The private key in use (the data plane's). */
  inUse: Uint8Array;
  publicKeyOf(privateKey: Uint8Array): Uint8Array;
  /** Publishes this node's annotations with this public key (base64); throws when the API server refuses or cannot be reached. */
  publish(publicKey: string): Promise<void>;
  dataplane: Pick<UapiClient, 'get' | 'set'>;
  log: AgentLogger;
  /** Problems already reported (each once while it lasts). */
  reported: Set<string>;
  /**
   * Told the public key of a rotation whose publish failed. A patch that timed out may still have
   * been applied, so the Node showing that key is no tampering to undo.
   */
  onPublishPending?: (publicKey: string | undefined) => void;
  nowMs?: number;
}

export interface KeySwitch {
  privateKey: Uint8Array;
  publicKey: string;
  previousPublicKey: string;
  ms: number;
}

/**
 * One look at the key file (every agent pass): writes a new key when KEY_ROTATION_INTERVAL says
 * so, and switches to a key a rotation wrote (publish, data plane, kick; see the file comment).
 * Resolves with the switch made, or undefined (nothing to do, or not possible yet: the current
 * key stays in use and the next pass tries again). Never rejects for what the file or the API
 * server does; a data plane that fails after the publish is left to the agent's pass, which
 * gives it the key it lacks.
 */
export async function followKeyFile(deps: KeyFollowDeps): Promise<KeySwitch | undefined> {
  const { path, log } = deps;
  const once = (id: string, report: () => void) => {
    if (deps.reported.has(id)) return;
    deps.reported.add(id);
    report();
  };
  const now = deps.nowMs ?? Date.now();
  let state = keyFileState(deps.inUse, () => readPrivateKeyFile(path));
  if (state.kind === 'in-use' && deps.intervalS > 0) {
    let writtenAt: number | undefined;
    try { writtenAt = privateKeyFileWrittenAtMs(path); } catch { /* reported as unreadable below, if it is */ }
    if (writtenAt !== undefined && rotationDue(writtenAt, now, deps.intervalS)) {
      const key = newPrivateKey();
      try {
        replacePrivateKeyFile(path, key);
        deps.reported.delete('interval-write');
        log.info('KEY_ROTATION_INTERVAL passed: wrote a new private key; switching to it', { path, intervalS: deps.intervalS });
        state = { kind: 'rotated', privateKey: key };
      } catch (err) {
        key.fill(0);
        once('interval-write', () => log.error('KEY_ROTATION_INTERVAL passed but the new key cannot be written; the current key stays in use', { path, error: (err as Error).message }));
      }
    }
  }
  if (state.kind === 'unreadable') {
    once(`unreadable\n${state.problem}`, () => log.error('the private key file cannot be used; the key in use stays until the file holds a valid key again', { path, error: state.problem }));
    return undefined;
  }
  for (const id of [...deps.reported]) if (id.startsWith('unreadable\n')) deps.reported.delete(id);
  if (state.kind === 'in-use') return undefined;

  const started = performance.now();
  const privateKey = state.privateKey;
  const publicKey = keyToBase64(deps.publicKeyOf(privateKey));
  const previousPublicKey = keyToBase64(deps.publicKeyOf(deps.inUse));
  try {
    await deps.publish(publicKey);
  } catch (err) {
    privateKey.fill(0);
    deps.onPublishPending?.(publicKey);
    once(`publish\n${publicKey}`, () => log.warn('the key file holds a rotated key, but it cannot be published yet; this node keeps its current key (and its traffic) until the API server takes it', {
      from: previousPublicKey.slice(0, 8), to: publicKey.slice(0, 8), error: (err as Error).message,
    }));
    return undefined;
  }
  deps.reported.delete(`publish\n${publicKey}`);
  deps.onPublishPending?.(undefined);
  try {
    await deps.dataplane.set({ privateKey, replacePeers: false, peers: [] });
    const kick = kickRequest((await deps.dataplane.get()).peers);
    if (kick) await deps.dataplane.set(kick);
  } catch (err) {
    log.warn('published the rotated key, but the data plane did not take it; the next pass gives it the key', { error: (err as Error).message });
  }
  const ms = Math.round(performance.now() - started);
  log.info('rotated this node\'s key: published, and the data plane switched; peers follow through their Node watch', {
    from: previousPublicKey.slice(0, 8), to: publicKey.slice(0, 8), ms,
  });
  return { privateKey, publicKey, previousPublicKey, ms };
}

/**
 * At start-up: the running data plane holds the key this Node publishes, and the file holds
 * another — a rotation written while the agent was down (or before it could publish). The agent
 * then starts with the running key and lets `followKeyFile` complete the rotation in its usual
 * order (publish, then switch), so a restart never cuts traffic ahead of the peers. When the
 * Node already publishes the file's key (the agent stopped between publishing and switching),
 * start-up switches at once: the peers are there already.
 */
export function rotationPendingAtStart(filePublicKey: string, dataplanePublicKey: string | undefined, publishedPublicKey: string | undefined): boolean {
  return dataplanePublicKey !== undefined && dataplanePublicKey === publishedPublicKey && dataplanePublicKey !== filePublicKey;
}
