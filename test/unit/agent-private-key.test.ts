/** The node's key file: created 0600 once, then only read; bad files are errors, never replaced. */
import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { chmodSync, closeSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { KeyFileError, loadOrCreatePrivateKey } from '../../control/identity/private-key.ts';
import { clampPrivateKey, keyToBase64 } from '../../dataplane/noise/keys.ts';

const dir = mkdtempSync(join(tmpdir(), 'rg-key-'));
after(() => rmSync(dir, { recursive: true, force: true }));

describe('private key file', () => {
  test('created on first start with mode 0600 (directories made), then read back unchanged', () => {
    const path = join(dir, 'a', 'b', 'private.key');
    const first = loadOrCreatePrivateKey(path);
    assert.equal(first.created, true);
    assert.equal(statSync(path).mode & 0o777, 0o600);
    assert.equal(readFileSync(path, 'utf8'), `${keyToBase64(first.privateKey)}\n`);
    assert.equal(first.privateKey[0] & 7, 0, 'clamped');
    const second = loadOrCreatePrivateKey(path);
    assert.equal(second.created, false);
    assert.deepEqual(second.privateKey, first.privateKey);
  });

  test('loose permissions are refused, and the file is left as it was', () => {
    const path = join(dir, 'loose.key');
    loadOrCreatePrivateKey(path);
    const before = readFileSync(path, 'utf8');
    chmodSync(path, 0o644);
    assert.throws(() => loadOrCreatePrivateKey(path), (err: Error) => err instanceof KeyFileError && /mode 0644.*chmod 600/.test(err.message));
    assert.equal(readFileSync(path, 'utf8'), before);
  });

  test('a file without a key is refused without echoing its content', () => {
    const path = join(dir, 'garbage.key');
    writeFileSync(path, 'secret-looking-text\n', { mode: 0o600 });
    assert.throws(() => loadOrCreatePrivateKey(path), (err: Error) => err instanceof KeyFileError && /does not hold a base64 WireGuard key/.test(err.message) && !err.message.includes('secret-looking'));
    assert.equal(readFileSync(path, 'utf8'), 'secret-looking-text\n');
  });

  test('a directory where the key should be is refused', () => {
    const path = join(dir, 'a');
    assert.throws(() => loadOrCreatePrivateKey(path), /not a regular file/);
  });
  test('a crash between creating the temporary file and renaming it does not block later starts', () => {
    // In a container the agent is PID 1 on every start: a temporary named after the PID and opened
    // exclusively, left by a crash, used to make every later start fail with EEXIST.
    const sub = join(dir, 'crashed');
    mkdirSync(sub, { mode: 0o700 });
    const path = join(sub, 'private.key');
    for (const pid of [process.pid, 1]) closeSync(openSync(`${path}.tmp-${pid}`, 'wx', 0o600));
    const first = loadOrCreatePrivateKey(path);
    assert.equal(first.created, true);
    assert.equal(readFileSync(path, 'utf8'), `${keyToBase64(first.privateKey)}\n`);
    assert.deepEqual(loadOrCreatePrivateKey(path).privateKey, first.privateKey);
    // Nothing of this start's own is left behind.
    assert.deepEqual(readdirSync(sub).filter((n) => n !== 'private.key' && !/^private\.key\.tmp-\d+$/.test(n)), []);
  });

  test('a key another process created meanwhile is kept, never replaced by ours', () => {
    const sub = join(dir, 'race');
    mkdirSync(sub, { mode: 0o700 });
    const path = join(sub, 'private.key');
    const theirs = clampPrivateKey(new Uint8Array(32).fill(7));
    const ours = clampPrivateKey(new Uint8Array(32).fill(9));
    // generate() runs after the existence check: the other start wins the race there.
    const loaded = loadOrCreatePrivateKey(path, () => {
      writeFileSync(path, `${keyToBase64(theirs)}\n`, { mode: 0o600 });
      return ours;
    });
    assert.ok(ours.every((b) => b === 0), 'our unused key is zeroed');
    assert.equal(loaded.created, false);
    assert.deepEqual(loaded.privateKey, theirs);
    assert.equal(readFileSync(path, 'utf8'), `${keyToBase64(theirs)}\n`);
    assert.deepEqual(readdirSync(sub), ['private.key'], 'our temporary file removed');
  });
});
