/**
 * The node's WireGuard identity: a private key in a file on the host (base64, as `wg genkey`
 * writes it, mode 0600). Created on first start; after that it changes only by a deliberate
 * rotation (`roamguard rotate-key`, `KEY_ROTATION_INTERVAL`), which replaces the whole file
 * atomically (`replacePrivateKeyFile`) and which the running agent then follows. Nothing else
 * writes it: a new key silently replacing an existing one would cut this node off until every
 * peer relearns it.
 *
 * Refused with a clear error (never "fixed" by generating a new key): a file that exists but
 * cannot be read, does not hold a key, or is readable by group/others.
 */
import { randomBytes } from 'node:crypto';
import { closeSync, constants, fchmodSync, fsyncSync, linkSync, mkdirSync, openSync, readFileSync, renameSync, statSync, unlinkSync, writeSync } from 'node:fs';
import { basename, dirname, join } from 'node:path';
import { generatePrivateKey, keyFromBase64, keyToBase64 } from '../../dataplane/noise/keys.ts';

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

export function loadOrCreatePrivateKey(path: string, generate: () => Uint8Array = () => generatePrivateKey({ randomBytes: (n) => randomBytes(n) })): LoadedKey {
  let mode: number | undefined;
  try {
    mode = statSync(path).mode;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw new KeyFileError(`private key ${path}: ${(err as Error).message}`);
  }
  if (mode === undefined) {
    const key = generate();
    if (createKeyFile(path, key)) return { privateKey: key, created: true };
    // Another start created the file meanwhile: that key is this node's, read below; ours is
    // never used.
    key.fill(0);
    mode = statSync(path).mode;
  }
  return { privateKey: checkedKeyFile(path, mode), created: false };
}

/**
 * Reads an existing key file with the same checks as start-up (regular file, not readable by
 * group or others, a base64 key). Throws a KeyFileError, which never echoes the file's content.
 */
export function readPrivateKeyFile(path: string): Uint8Array {
  let mode: number;
  try {
    mode = statSync(path).mode;
  } catch (err) {
    throw new KeyFileError(`private key ${path}: ${(err as Error).message}`);
  }
  return checkedKeyFile(path, mode);
}

/** When the key in the file was written (its modification time, ms): a rotation's age survives restarts. */
export function privateKeyFileWrittenAtMs(path: string): number {
  return statSync(path).mtimeMs;
}

function checkedKeyFile(path: string, mode: number): Uint8Array {
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
    return keyFromBase64(text);
  } catch {
    // The message must not echo the file's content: it may be a (mangled) secret.
    throw new KeyFileError(`private key ${path} does not hold a base64 WireGuard key (44 characters ending in "=")`);
  }
}

/**
 * A rotation: replaces the key file with `key` so that a reader (or a crash, or a power loss) sees
 * either the whole old file or the whole new one, never a mix and never a missing file — written
 * under a fresh random name (0600 whatever the umask, fsynced), renamed over `path`, then the
 * directory fsynced. Unlike first creation this must replace, so it is rename(2), not link(2).
 */
export function replacePrivateKeyFile(path: string, key: Uint8Array): void {
  const dir = dirname(path);
  const tmp = join(dir, `.${basename(path)}.tmp-${randomBytes(8).toString('hex')}`);
  try {
    writeTemporary(tmp, key);
    renameSync(tmp, path);
  } catch (err) {
    try { unlinkSync(tmp); } catch { /* never created, or renamed */ }
    throw new KeyFileError(`private key ${path} cannot be replaced: ${(err as Error).message}`);
  }
  syncDirectory(dir);
}

function writeTemporary(tmp: string, key: Uint8Array): void {
  const fd = openSync(tmp, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW, 0o600);
  try {
    fchmodSync(fd, 0o600); // whatever the umask
    writeSync(fd, `${keyToBase64(key)}\n`);
    fsyncSync(fd);
  } finally {
    closeSync(fd);
  }
}

function syncDirectory(dir: string): void {
  const dirFd = openSync(dir, constants.O_RDONLY | constants.O_DIRECTORY);
  try {
    fsyncSync(dirFd);
  } finally {
    closeSync(dirFd);
  }
}

/**
 * Writes the key under a fresh random name in the key's directory, fsyncs it, then hard-links it
 * to `path` and fsyncs the directory. link(2), unlike rename(2), fails when `path` exists, so a key
 * another start created meanwhile is never replaced (returns false: read that one). The
 * temporary name is random, never reused: a crash at any point leaves at worst an unused 0600
 * file that no later start trips over (a name derived from the PID did: in a container the agent
 * is PID 1 on every start). Our temporary name is removed on every path out.
 */
function createKeyFile(path: string, key: Uint8Array): boolean {
  const dir = dirname(path);
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const tmp = join(dir, `.${basename(path)}.tmp-${randomBytes(8).toString('hex')}`);
  try {
    writeTemporary(tmp, key);
    try {
      linkSync(tmp, path);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'EEXIST') return false;
      throw err;
    }
  } catch (err) {
    throw new KeyFileError(`private key ${path} cannot be created: ${(err as Error).message}`);
  } finally {
    try {
      unlinkSync(tmp);
    } catch {
      // Never created, or already gone: nothing to remove.
    }
  }
  // The new directory entry itself must survive a power loss, or the node gets a new key on the
  // next start after all.
  syncDirectory(dir);
  return true;
}
