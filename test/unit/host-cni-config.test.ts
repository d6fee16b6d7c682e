/**
 * The CNI conflist: its exact shape per family mix, input checks, the plugin binaries it names
 * existing in Debian's containernetworking-plugins, and the atomic, change-only write.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { renderConflist, writeConflistAtomically } from '../../control/host/cni-config.ts';
import { conflistPluginTypes, findMissingPlugins } from '../../control/host/cni-exec.ts';

describe('renderConflist', () => {
  test('dual-stack: ptp with mtu, host-local with one range set per family, portmap', () => {
    const text = renderConflist({ name: 'roamguard', mtu: 1380, podCidrs: ['fd00:10:244:1::/64', '10.244.1.0/24'] });
    assert.ok(text.endsWith('}\n'));
    assert.deepEqual(JSON.parse(text), {
      cniVersion: '1.0.0',
      name: 'roamguard',
      plugins: [
        {
          type: 'ptp',
          mtu: 1380,
          ipam: {
            type: 'host-local',
            dataDir: '/run/cni-ipam-state',
            ranges: [
              [{ subnet: '10.244.1.0/24', gateway: '10.244.1.1' }],
              [{ subnet: 'fd00:10:244:1::/64', gateway: 'fd00:10:244:1::1' }],
            ],
            routes: [{ dst: '0.0.0.0/0' }, { dst: '::/0' }],
          },
        },
        { type: 'portmap', capabilities: { portMappings: true } },
      ],
    });
  });

  test('single family: only that family\'s range set and default route', () => {
    const v4 = JSON.parse(renderConflist({ name: 'n', mtu: 1420, podCidrs: ['10.244.1.0/24'] }));
    assert.deepEqual(v4.plugins[0].ipam.ranges, [[{ subnet: '10.244.1.0/24', gateway: '10.244.1.1' }]]);
    assert.deepEqual(v4.plugins[0].ipam.routes, [{ dst: '0.0.0.0/0' }]);
    const v6 = JSON.parse(renderConflist({ name: 'n', mtu: 1420, podCidrs: ['2001:db8:1::/64'] }));
    assert.deepEqual(v6.plugins[0].ipam.ranges, [[{ subnet: '2001:db8:1::/64', gateway: '2001:db8:1::1' }]]);
    assert.deepEqual(v6.plugins[0].ipam.routes, [{ dst: '::/0' }]);
  });

  test('two CIDRs of one family share one range set, so a pod still gets one address per family', () => {
    const c = JSON.parse(renderConflist({ name: 'n', mtu: 1420, podCidrs: ['10.244.9.0/24', '10.244.1.0/24', 'fd00::/64'] }));
    assert.deepEqual(c.plugins[0].ipam.ranges, [
      [{ subnet: '10.244.1.0/24', gateway: '10.244.1.1' }, { subnet: '10.244.9.0/24', gateway: '10.244.9.1' }],
      [{ subnet: 'fd00::/64', gateway: 'fd00::1' }],
    ]);
  });

  test('options: dataDir and cniVersion 0.4.0; output independent of input order', () => {
    const c = JSON.parse(renderConflist({ name: 'n', mtu: 1420, podCidrs: ['10.244.1.0/24'], dataDir: '/tmp/ipam', cniVersion: '0.4.0' }));
    assert.equal(c.cniVersion, '0.4.0');
    assert.equal(c.plugins[0].ipam.dataDir, '/tmp/ipam');
    assert.equal(
      renderConflist({ name: 'n', mtu: 1420, podCidrs: ['fd00::/64', '10.244.1.0/24', '10.244.1.0/24'] }),
      renderConflist({ name: 'n', mtu: 1420, podCidrs: ['10.244.1.0/24', 'FD00::/64'] }),
    );
  });

  test('bad input is refused with the reason', () => {
    const ok = { name: 'roamguard', mtu: 1420, podCidrs: ['10.244.1.0/24'] };
    assert.throws(() => renderConflist({ ...ok, podCidrs: [] }), /at least one pod CIDR/);
    assert.throws(() => renderConflist({ ...ok, podCidrs: ['10.244.0.0/16', '10.244.1.0/24'] }), /10\.244\.0\.0\/16 and 10\.244\.1\.0\/24 overlap/);
    assert.throws(() => renderConflist({ ...ok, podCidrs: ['10.244.1.1/24'] }), /host bits/);
    assert.throws(() => renderConflist({ ...ok, podCidrs: ['10.244.1.0/31'] }), /too small for pods/);
    assert.throws(() => renderConflist({ ...ok, mtu: 1000, podCidrs: ['fd00::/64'] }), /mtu must be an integer 1280\.\.65535 \(IPv6 needs 1280\)/);
    assert.throws(() => renderConflist({ ...ok, mtu: 500 }), /mtu must be an integer 576\.\.65535/);
    assert.throws(() => renderConflist({ ...ok, mtu: 1420.5 }), /mtu must be an integer/);
    assert.throws(() => renderConflist({ ...ok, name: '-x' }), /bad CNI network name/);
    assert.throws(() => renderConflist({ ...ok, name: 'a b' }), /bad CNI network name/);
    assert.throws(() => renderConflist({ ...ok, dataDir: 'relative' }), /dataDir must be an absolute path/);
    assert.throws(() => renderConflist({ ...ok, cniVersion: '0.3.1' as never }), /cniVersion must be one of 0\.4\.0, 1\.0\.0/);
  });

  test('every plugin it names exists in Debian\'s /usr/lib/cni', async () => {
    const text = renderConflist({ name: 'n', mtu: 1420, podCidrs: ['10.244.1.0/24'] });
    assert.deepEqual(conflistPluginTypes(text), ['ptp', 'host-local', 'portmap']);
    assert.deepEqual(await findMissingPlugins(text, ['/usr/lib/cni']), []);
    const empty = mkdtempSync(join(tmpdir(), 'rg-cni-empty-'));
    try {
      assert.deepEqual(await findMissingPlugins(text, [empty]), ['ptp', 'host-local', 'portmap']);
    } finally {
      rmSync(empty, { recursive: true, force: true });
    }
  });
});

describe('writeConflistAtomically', () => {
  const withDir = async (fn: (dir: string) => Promise<void>) => {
    const dir = mkdtempSync(join(tmpdir(), 'rg-cni-write-'));
    try {
      await fn(dir);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  };

  test('writes, then skips an unchanged write, then replaces by rename; mode 0644 under a strict umask', () => withDir(async (dir) => {
    const path = join(dir, '10-roamguard.conflist');
    const first = renderConflist({ name: 'n', mtu: 1420, podCidrs: ['10.244.1.0/24'] });
    const second = renderConflist({ name: 'n', mtu: 1420, podCidrs: ['10.244.2.0/24'] });
    const oldUmask = process.umask(0o077);
    try {
      assert.equal(await writeConflistAtomically(path, first), true);
    } finally {
      process.umask(oldUmask);
    }
    assert.equal(readFileSync(path, 'utf8'), first);
    const before = statSync(path);
    assert.equal(before.mode & 0o777, 0o644);

    assert.equal(await writeConflistAtomically(path, first), false, 'unchanged content is not rewritten');
    const same = statSync(path);
    assert.equal(same.ino, before.ino);
    assert.equal(same.mtimeMs, before.mtimeMs);

    assert.equal(await writeConflistAtomically(path, second), true);
    const after = statSync(path);
    assert.notEqual(after.ino, before.ino, 'replaced by a rename, not rewritten in place');
    assert.equal(after.mode & 0o777, 0o644);
    assert.equal(readFileSync(path, 'utf8'), second);
    assert.deepEqual(readdirSync(dir), ['10-roamguard.conflist'], 'no temp files left');
  }));

  test('replaces a file with other content (e.g. an older version) and fails clearly where it cannot write', () => withDir(async (dir) => {
    const path = join(dir, '10-roamguard.conflist');
    writeFileSync(path, '{"old": true}\n', { mode: 0o600 });
    assert.equal(await writeConflistAtomically(path, '{"new": true}\n'), true);
    assert.equal(statSync(path).mode & 0o777, 0o644);
    assert.equal(await writeConflistAtomically(join(dir, 'missing', 'x.conflist'), '{}\n'), true, 'a missing directory is created');
    assert.equal(readFileSync(join(dir, 'missing', 'x.conflist'), 'utf8'), '{}\n');
    rmSync(join(dir, 'missing'), { recursive: true });
    await assert.rejects(writeConflistAtomically(join(path, 'x.conflist'), '{}\n'), /cannot (read|write) .*10-roamguard\.conflist\/x\.conflist: ENOTDIR/);
    await assert.rejects(writeConflistAtomically('relative.conflist', '{}\n'), /must be absolute/);
    await assert.rejects(writeConflistAtomically(path, ''), /needs the conflist text/);
    assert.deepEqual(readdirSync(dir), ['10-roamguard.conflist']);
  }));
});
