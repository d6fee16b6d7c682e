/**
 * The node's WireGuard identity: a private key in a file on the host (base64, as `wg genkey`
 * writes it, mode 0600). Created on first start; after that it is only ever read, because a new
 * key silently replacing an existing one would cut this node off until every peer relearns it.
 *
 * Refused with a clear error (never "fixed" by generating a new key): a file that exists but
 * cannot be read, does not hold a key, or is readable by group/others.
 */
import { randomBytes } from 'node:crypto';
import { chmodSync, closeSync, fsyncSync, mkdirSync, openSync, readFileSync, renameSync, statSync, writeSync } from 'node:fs';
import { dirname } from 'node:path';
import { clampPrivateKey, keyFromBase64, keyToBase64 } from '../../dataplane/noise/keys.ts';

export class KeyFileError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'KeyFileError';
  }
}

export interface LoadedKey {
  privateKey: Uint8Array;
  /** True when this start created the file. */
  created: boolean;
}

export function loadOrCreatePrivateKey(path: string, generate: () => Uint8Array = () => clampPrivateKey(randomBytes(32))): LoadedKey {
  let mode: number | undefined;
  try {
    mode = statSync(path).mode;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw new KeyFileError(`private key ${path}: ${(err as Error).message}`);
  }
  if (mode === undefined) {
    const key = generate();
    mkdirSync(dirname(path), { recursive: true, mode: 0o700 });
    // Written to a temporary name and renamed, so a crash never leaves a half-written key.
    const tmp = `${path}.tmp-${process.pid}`;
    const fd = openSync(tmp, 'wx', 0o600);
    try {
      writeSync(fd, `${keyToBase64(key)}\n`);
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
    chmodSync(tmp, 0o600);
    renameSync(tmp, path);
    return { privateKey: key, created: true };
  }
  if ((mode & 0o170000) !== 0o100000) throw new KeyFileError(`private key ${path} is not a regular file`);
  if ((mode & 0o077) !== 0) {
    throw new KeyFileError(`private key ${path} has mode ${(mode & 0o777).toString(8).padStart(4, '0')}; it must not be readable by group or others (chmod 600 ${path})`);
  }
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    throw new KeyFileError(`private key ${path} cannot be read: ${(err as Error).message}`);
  }
  try {
    return { privateKey: keyFromBase64(text), created: false };
  } catch {
    // The message must not echo the file's content: it may be a (mangled) secret.
    throw new KeyFileError(`private key ${path} does not hold a base64 WireGuard key (44 characters ending in "=")`);
  }
}
