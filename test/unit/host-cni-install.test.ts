/**
 * Installing the bundled CNI plugins into the host's plugin directory (control/host/cni-install.ts):
 * only missing ones, atomically and executable, never replacing a host's own; a checkout without
 * bundled plugins installs nothing and says so.
 */
import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { BUNDLED_CNI_BIN_DIR, REQUIRED_CNI_PLUGINS, installCniPlugins } from '../../control/host/cni-install.ts';

const base = mkdtempSync(join(tmpdir(), 'rg-cni-install-'));
after(() => rmSync(base, { recursive: true, force: true }));

function bundle(name: string, plugins: readonly string[]): string {
  const dir = join(base, name);
  mkdirSync(dir, { recursive: true });
  for (const p of plugins) {
    writeFileSync(join(dir, p), `#!/bin/sh\necho bundled ${p}\n`);
    chmodSync(join(dir, p), 0o644); // the copy must end executable whatever the source mode
  }
  return dir;
}

describe('CNI plugin install', () => {
  test('copies the missing plugins executable into a new directory; leaves no temporary files', async () => {
    const source = bundle('src1', REQUIRED_CNI_PLUGINS);
    const target = join(base, 'host1', 'opt', 'cni', 'bin');
    const result = await installCniPlugins({ sourceDir: source, targetDir: target });
    assert.deepEqual(result.installed, ['loopback', 'host-local', 'ptp', 'portmap']);
    assert.deepEqual([result.present, result.unavailable, result.bundled], [[], [], true]);
    assert.deepEqual(readdirSync(target).sort(), ['host-local', 'loopback', 'portmap', 'ptp']);
    for (const p of REQUIRED_CNI_PLUGINS) {
      assert.equal(statSync(join(target, p)).mode & 0o777, 0o755, p);
      assert.equal(readFileSync(join(target, p), 'utf8'), `#!/bin/sh\necho bundled ${p}\n`);
    }
    const again = await installCniPlugins({ sourceDir: source, targetDir: target });
    assert.deepEqual([again.installed, again.present.length], [[], 4], 'a second run changes nothing');
  });

  test('plugins the host already has are kept as they are', async () => {
    const source = bundle('src2', REQUIRED_CNI_PLUGINS);
    const target = join(base, 'host2');
    mkdirSync(target);
    writeFileSync(join(target, 'ptp'), 'host ptp');
    chmodSync(join(target, 'ptp'), 0o700);
    const result = await installCniPlugins({ sourceDir: source, targetDir: target });
    assert.deepEqual(result.present, ['ptp']);
    assert.deepEqual(result.installed, ['loopback', 'host-local', 'portmap']);
    assert.equal(readFileSync(join(target, 'ptp'), 'utf8'), 'host ptp');
    assert.equal(statSync(join(target, 'ptp')).mode & 0o777, 0o700);
  });

  test('without bundled plugins (a checkout) nothing is installed and nothing is created', async () => {
    const target = join(base, 'host3', 'bin');
    const result = await installCniPlugins({ sourceDir: join(base, 'no-such-dir'), targetDir: target });
    assert.equal(result.bundled, false);
    assert.deepEqual(result.installed, []);
    assert.deepEqual(result.unavailable, [...REQUIRED_CNI_PLUGINS]);
    assert.equal(existsSync(target), false);
    assert.match(BUNDLED_CNI_BIN_DIR, /\/cni\/bin$/);
  });

  test('a partly bundled set reports what is still missing; bad plugin names are refused', async () => {
    const source = bundle('src4', ['ptp']);
    const result = await installCniPlugins({ sourceDir: source, targetDir: join(base, 'host4') });
    assert.deepEqual(result.installed, ['ptp']);
    assert.deepEqual(result.unavailable, ['loopback', 'host-local', 'portmap']);
    await assert.rejects(installCniPlugins({ sourceDir: source, targetDir: join(base, 'host5'), plugins: ['../evil'] }), /not a plugin name/);
  });
});
