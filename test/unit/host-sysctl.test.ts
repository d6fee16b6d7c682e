/** Forwarding sysctls: written only when off, through the host's /proc/sys/net when it is mounted. */
import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { enableForwarding, FORWARDING_PATHS, forwardingPaths } from '../../control/host/sysctl.ts';

const dir = mkdtempSync(join(tmpdir(), 'rg-sysctl-'));
after(() => rmSync(dir, { recursive: true, force: true }));

describe('forwarding sysctls', () => {
  test('the host\'s /proc/sys/net mount is used when present, /proc/sys/net otherwise', () => {
    assert.deepEqual(forwardingPaths(join(dir, 'absent')), FORWARDING_PATHS);
    const mounted = join(dir, 'host-proc-sys-net');
    mkdirSync(mounted);
    assert.deepEqual(forwardingPaths(mounted), { ipv4: join(mounted, 'ipv4/ip_forward'), ipv6: join(mounted, 'ipv6/conf/all/forwarding') });
  });

  test('writes 1 only for the families asked for and only where it is off', async () => {
    const paths = { ipv4: join(dir, 'ip_forward'), ipv6: join(dir, 'forwarding') };
    writeFileSync(paths.ipv4, '0\n');
    writeFileSync(paths.ipv6, '0\n');
    assert.deepEqual(await enableForwarding({ ipv4: true, ipv6: false }, paths), ['ipv4']);
    assert.equal(readFileSync(paths.ipv4, 'utf8'), '1\n');
    assert.equal(readFileSync(paths.ipv6, 'utf8'), '0\n');
    assert.deepEqual(await enableForwarding({ ipv4: true, ipv6: true }, paths), ['ipv6']);
  });
});
