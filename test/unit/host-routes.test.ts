/**
 * Route and address reconciling against a small in-memory stand-in for `ip` (it answers the
 * listing commands from its state and applies changes), so the tests see both the commands run and
 * that a second pass finds nothing to do. The real kernel is exercised in
 * test/system/host-firewall.test.ts.
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import {
  configureTunnelInterface, gatewayAddressesFor, parseGlobalAddresses, parseRouteDestinations,
  parseJsonArrays, reconcileAddresses, reconcileRoutes, removeRoutes, setLinkMtuUp, summarizeWanted,
  DEFAULT_ROUTE_PROTOCOL, EXACT_LOOKUP_LIMIT,
  type AppliedRoutes, type RouteReport, type WantedRoute,
} from '../../control/host/routes.ts';
import { parseCidrList, summarizePrefixes } from '../../control/host/cidrs.ts';
import { formatPrefix } from '../../dataplane/net/ip.ts';
import type { CommandRunner } from '../../control/host/runner.ts';
import { prng } from '../helpers/prng.ts';

interface Route { dst: string; dev: string; proto: string; mtu?: number }

/** Just enough of `ip` for routes.ts; every command is recorded as one string. */
function fakeIp(initial: { routes?: Route[]; addresses?: string[] } = {}) {
  const routes: Route[] = [...(initial.routes ?? [])];
  const addresses: string[] = [...(initial.addresses ?? [])];
  const log: string[] = [];
  const ok = (stdout = '') => ({ command: '', code: 0, signal: null, stdout, stderr: '' });
  const runner: CommandRunner = async (cmd, args, options) => {
    assert.equal(cmd, 'ip');
    const a = [...args];
    log.push(a.join(' '));
    if (a.includes('-batch')) {
      // `ip [-j] -4 [-force] -batch -`: each line of the input is one command (logged as `< line`)
      // run with the options before -batch; the first failure ends the batch unless -force, and
      // any failure makes the exit code 1. What the commands print is printed one after another.
      assert.deepEqual(a.slice(-2), ['-batch', '-']);
      const prefix = a.slice(0, -2).filter((x) => x !== '-force');
      let stdout = '';
      let stderr = '';
      for (const [i, line] of (options?.input ?? '').split('\n').filter(Boolean).entries()) {
        log.push(`< ${line}`);
        const result = await apply([...prefix, ...line.split(' ')]);
        stdout += result.stdout;
        if (result.code !== 0) {
          stderr += `${result.stderr}Command failed -:${i + 1}\n`;
          if (!a.includes('-force')) break;
        }
      }
      return { command: `ip ${a.join(' ')}`, code: stderr ? 1 : 0, signal: null, stdout, stderr };
    }
    return apply(a);
  };
  const apply = async (a: string[]) => {
    if (a[0] === '-j' && a[2] === 'route' && a[3] === 'show' && a[4] === 'exact') {
      assert.deepEqual(a.slice(6), ['table', 'main']);
      const shown = routes.filter((r) => r.dst === a[5]);
      // Like some iproute2 versions: nothing at all (not "[]") when nothing matches.
      return ok(shown.length === 0 ? '' : JSON.stringify(shown.map((r) => ({ dst: r.dst.replace(/\/(32|128)$/, ''), dev: r.dev, protocol: r.proto, scope: 'link', flags: [] }))));
    }
    if (a[0] === '-j' && a[2] === 'route' && a[3] === 'show' && a[4] === 'table') {
      const family = a[1] === '-6' ? 6 : 4;
      const shown = routes.filter((r) => (r.dst.includes(':') ? 6 : 4) === family);
      return ok(JSON.stringify(shown.map((r) => ({ dst: r.dst.replace(/\/(32|128)$/, ''), dev: r.dev, protocol: r.proto, scope: 'link', flags: [] }))));
    }
    if (a[0] === '-j' && a[2] === 'route' && a[3] === 'show') {
      const family = a[1] === '-6' ? 6 : 4;
      const [, , , , , dev, , proto] = a;
      const shown = routes.filter((r) => r.dev === dev && r.proto === proto && (r.dst.includes(':') ? 6 : 4) === family);
      // The kernel prints host routes without their /32 or /128.
      return ok(JSON.stringify(shown.map((r) => ({ dst: r.dst.replace(/\/(32|128)$/, ''), scope: 'link', flags: [], ...(r.mtu ? { metrics: [{ mtu: r.mtu }] } : {}) }))));
    }
    if (a[1] === 'route' && a[2] === 'change') {
      const [, , , dst, , dev, , proto, mtuWord, mtu] = a;
      const route = routes.find((r) => r.dst === dst && r.dev === dev && r.proto === proto);
      assert.ok(route, `changing a route that is not ours: ${a.join(' ')}`);
      // Like the kernel: the new route replaces the old, so a metric not given is gone.
      route.mtu = mtuWord === 'mtu' ? Number(mtu) : undefined;
      return ok();
    }
    if (a[1] === 'route' && a[2] === 'replace') throw new Error(`route replace takes over routes that are not ours: ${a.join(' ')}`);
    if (a[1] === 'route' && a[2] === 'add') {
      const [, , , dst, , dev, , proto] = a;
      // The kernel refuses a second route to the same destination (same table, metric, tos).
      if (routes.some((r) => r.dst === dst)) return { command: `ip ${a.join(' ')}`, code: 2, signal: null, stdout: '', stderr: 'RTNETLINK answers: File exists\n' };
      routes.push({ dst, dev, proto, ...(a[8] === 'mtu' ? { mtu: Number(a[9]) } : {}) });
      return ok();
    }
    if (a[1] === 'route' && a[2] === 'del') {
      const i = routes.findIndex((r) => r.dst === a[3] && r.dev === a[5] && r.proto === a[7]);
      assert.ok(i >= 0, `deleting a route that is not there: ${a.join(' ')}`);
      routes.splice(i, 1);
      return ok();
    }
    if (a[0] === '-j' && a[1] === 'addr') {
      const info = addresses.map((x) => {
        const [local, len] = x.split('/');
        return { family: local.includes(':') ? 'inet6' : 'inet', local, prefixlen: Number(len), scope: 'global' };
      });
      info.push({ family: 'inet6', local: 'fe80::1', prefixlen: 64, scope: 'link' });
      return ok(JSON.stringify([{ ifname: a[4], addr_info: info }]));
    }
    if (a[0] === 'addr' && a[1] === 'add') { addresses.push(a[2]); return ok(); }
    if (a[0] === 'addr' && a[1] === 'del') { addresses.splice(addresses.indexOf(a[2]), 1); return ok(); }
    if (a[0] === 'link') return ok();
    throw new Error(`fake ip does not know: ${a.join(' ')}`);
  };
  return { runner, routes, addresses, log };
}

const P = String(DEFAULT_ROUTE_PROTOCOL);

/** A report without `applied`: what the call changed. */
function changes({ applied: _applied, ...rest }: RouteReport) {
  return rest;
}

/** `applied` as plain sorted pairs per family, to compare with the fake's routes. */
function appliedPairs(applied: AppliedRoutes) {
  const pairs = (m: ReadonlyMap<string, number | undefined>) => [...m].sort(([a], [b]) => a.localeCompare(b));
  return { v4: pairs(applied.v4), v6: pairs(applied.v6) };
}

/** Our routes (rg0, our protocol) in the fake, as {@link appliedPairs} shows `applied`. */
function ownPairs(routes: readonly Route[], device = 'rg0') {
  const ours = routes.filter((r) => r.dev === device && r.proto === P).map((r) => [r.dst, r.mtu] as [string, number | undefined]);
  const sorted = (list: Array<[string, number | undefined]>) => list.sort(([a], [b]) => a.localeCompare(b));
  return { v4: sorted(ours.filter(([d]) => !d.includes(':'))), v6: sorted(ours.filter(([d]) => d.includes(':'))) };
}

describe('reconcileRoutes', () => {
  test('routes carry their MTU: added with it, changed in place, cleared; only equal MTUs are summarized', async () => {
    const ip = fakeIp();
    const first = await reconcileRoutes({
      device: 'rg0', runner: ip.runner,
      cidrs: [{ dst: '10.244.2.0/24', mtu: 1216 }, '10.244.3.0/24', { dst: 'fd00:10:244:2::/64', mtu: 1216 }, '10.244.2.1/32'],
    });
    assert.deepEqual(changes(first), { added: ['10.244.2.0/24', '10.244.2.1/32', '10.244.3.0/24', 'fd00:10:244:2::/64'], removed: [], changed: [], conflicts: [] });
    assert.ok(ip.log.includes(`< route add 10.244.2.0/24 dev rg0 proto ${P} mtu 1216`), ip.log.join('\n'));
    assert.ok(ip.log.includes(`< route add fd00:10:244:2::/64 dev rg0 proto ${P} mtu 1216`));
    assert.ok(ip.log.includes(`< route add 10.244.3.0/24 dev rg0 proto ${P}`));
    // The same wish again: nothing to do.
    const again = ['10.244.3.0/24', { dst: '10.244.2.0/24', mtu: 1216 }, '10.244.2.1/32', { dst: 'fd00:10:244:2::/64', mtu: 1216 }];
    assert.deepEqual(changes(await reconcileRoutes({ device: 'rg0', runner: ip.runner, cidrs: again })), { added: [], removed: [], changed: [], conflicts: [] });
    // The path grew back: the MTU goes (in place, no delete), and now the two /24 merge into a /23 and the /32 is covered.
    const grown = await reconcileRoutes({ device: 'rg0', runner: ip.runner, cidrs: ['10.244.2.0/24', '10.244.3.0/24', '10.244.2.1/32', { dst: 'fd00:10:244:2::/64', mtu: 1300 }] });
    assert.deepEqual(changes(grown), { added: ['10.244.2.0/23'], removed: ['10.244.2.0/24', '10.244.2.1/32', '10.244.3.0/24'], changed: ['fd00:10:244:2::/64'], conflicts: [] });
    assert.deepEqual(ip.routes.map((r) => [r.dst, r.mtu]).sort(), [['10.244.2.0/23', undefined], ['fd00:10:244:2::/64', 1300]]);
    await assert.rejects(reconcileRoutes({ device: 'rg0', runner: ip.runner, cidrs: [{ dst: '10.244.9.0/24', mtu: 100 }] }), /route MTU must be an integer 576\.\.65535, got 100/);
  });

  test('adds missing, removes extra (ours only), per family; a second pass does nothing', async () => {
    const ip = fakeIp({
      routes: [
        { dst: '10.244.9.0/24', dev: 'rg0', proto: P }, // stale: ours, no longer wanted
        { dst: '10.244.2.0/24', dev: 'rg0', proto: P }, // wanted, present
        { dst: '192.168.7.0/24', dev: 'rg0', proto: 'static' }, // an admin's: never touched
        { dst: '10.244.3.0/24', dev: 'eth0', proto: P }, // another device: never touched
      ],
    });
    const report = await reconcileRoutes({
      device: 'rg0', runner: ip.runner,
      cidrs: ['10.244.2.0/24', '10.244.4.0/25', '10.244.4.128/25', 'fd00:10:244:2::/64', '10.244.5.7/32'],
    });
    assert.deepEqual(changes(report), { added: ['10.244.4.0/24', '10.244.5.7/32', 'fd00:10:244:2::/64'], removed: ['10.244.9.0/24'], changed: [], conflicts: [] });
    assert.deepEqual(ip.log, [
      // Per family: our routes, one batch of exact lookups in the main table (the conflict
      // check), one batch of adds, one of deletes.
      `-j -4 route show dev rg0 proto ${P}`,
      '-j -4 -batch -',
      '< route show exact 10.244.4.0/24 table main',
      '< route show exact 10.244.5.7/32 table main',
      '-4 -force -batch -',
      `< route add 10.244.4.0/24 dev rg0 proto ${P}`,
      `< route add 10.244.5.7/32 dev rg0 proto ${P}`,
      '-4 -batch -',
      `< route del 10.244.9.0/24 dev rg0 proto ${P}`,
      `-j -6 route show dev rg0 proto ${P}`,
      '-j -6 -batch -',
      '< route show exact fd00:10:244:2::/64 table main',
      '-6 -force -batch -',
      `< route add fd00:10:244:2::/64 dev rg0 proto ${P}`,
    ]);
    assert.ok(ip.routes.some((r) => r.dst === '192.168.7.0/24'));
    assert.ok(ip.routes.some((r) => r.dst === '10.244.3.0/24' && r.dev === 'eth0'));

    ip.log.length = 0;
    assert.deepEqual(changes(await reconcileRoutes({ device: 'rg0', runner: ip.runner, cidrs: ['10.244.5.7/32', 'fd00:10:244:2::/64', '10.244.4.0/24', '10.244.2.0/24'] })), { added: [], removed: [], changed: [], conflicts: [] });
    assert.equal(ip.log.length, 2, 'only the two listings');

    assert.deepEqual(changes(await removeRoutes({ device: 'rg0', runner: ip.runner })), {
      added: [], removed: ['10.244.2.0/24', '10.244.4.0/24', '10.244.5.7/32', 'fd00:10:244:2::/64'], changed: [], conflicts: [],
    });
    assert.deepEqual(ip.routes.map((r) => r.dst).sort(), ['10.244.3.0/24', '192.168.7.0/24']);
  });

  test('a custom protocol number is used for listing and changes', async () => {
    const ip = fakeIp();
    await reconcileRoutes({ device: 'rg0', runner: ip.runner, cidrs: ['10.1.0.0/16'], protocol: 200 });
    const changes = ip.log.filter((l) => !l.includes(' table main') && !l.endsWith('-batch -'));
    assert.ok(changes.some((l) => l.startsWith('< route add')), ip.log.join('\n'));
    assert.ok(changes.every((l) => l.endsWith('proto 200')), ip.log.join('\n'));
  });

  test('a destination that already has a route that is not ours is a conflict: reported, nothing changed', async () => {
    const kernel = { dst: '192.168.1.0/24', dev: 'eth0', proto: 'kernel' };
    const admin = { dst: 'fd00:10:244:2::/64', dev: 'eth0', proto: 'static' };
    const otherDevice = { dst: '10.244.3.0/24', dev: 'rg9', proto: P };
    const ip = fakeIp({ routes: [kernel, admin, otherDevice] });
    const report = await reconcileRoutes({ device: 'rg0', runner: ip.runner, cidrs: ['192.168.1.0/24', '10.244.3.0/24', '10.244.4.0/24', 'fd00:10:244:2::/64'] });
    assert.deepEqual(report.added, ['10.244.4.0/24'], 'the free destination is still routed');
    assert.deepEqual(report.conflicts, [
      { dst: '10.244.3.0/24', existing: `dev rg9 proto ${P}` },
      { dst: '192.168.1.0/24', existing: 'dev eth0 proto kernel' },
      { dst: 'fd00:10:244:2::/64', existing: 'dev eth0 proto static' },
    ]);
    assert.deepEqual(ip.routes, [kernel, admin, otherDevice, { dst: '10.244.4.0/24', dev: 'rg0', proto: P }], 'the others\' routes are untouched');
    assert.ok(!ip.log.some((l) => / route (add|replace|del) (192\.168\.1|fd00:10:244:2|10\.244\.3)/.test(l)), ip.log.join('\n'));
  });

  test('the conflict check: exact lookups in one batch up to EXACT_LOOKUP_LIMIT adds, one listing of the main table beyond', async () => {
    const slash24 = (i: number) => `10.${(i * 2) >> 8}.${(i * 2) & 255}.0/24`; // never siblings: no merging
    const foreign = (i: number) => ({ dst: slash24(i), dev: 'eth0', proto: 'static' });
    for (const count of [EXACT_LOOKUP_LIMIT, EXACT_LOOKUP_LIMIT + 1]) {
      const ip = fakeIp({ routes: [foreign(3), foreign(count - 1)] });
      const cidrs = Array.from({ length: count }, (_, i) => slash24(i));
      const report = await reconcileRoutes({ device: 'rg0', runner: ip.runner, cidrs });
      assert.deepEqual(report.conflicts, [{ dst: slash24(3), existing: 'dev eth0 proto static' }, { dst: slash24(count - 1), existing: 'dev eth0 proto static' }], `${count} adds`);
      assert.equal(report.added.length, count - 2);
      const commands = ip.log.filter((l) => !l.startsWith('< '));
      const check = count > EXACT_LOOKUP_LIMIT ? '-j -4 route show table main' : '-j -4 -batch -';
      assert.deepEqual(commands, [`-j -4 route show dev rg0 proto ${P}`, check, '-4 -force -batch -', `-j -6 route show dev rg0 proto ${P}`], `${count} adds`);
      assert.equal(ip.log.filter((l) => l.startsWith('< route show exact ')).length, count > EXACT_LOOKUP_LIMIT ? 0 : count);
    }
  });

  test('a route that appears between the listing and the add is a conflict too (the kernel says EEXIST)', async () => {
    const ip = fakeIp();
    // Someone else's route to 10.244.4.0/24 appears after the listing, just before the batch runs.
    const racing: typeof ip.runner = async (cmd, args, options) => {
      if (args.includes('-batch') && options?.input?.includes('route add 10.244.4.0/24 ')) ip.routes.push({ dst: '10.244.4.0/24', dev: 'eth0', proto: 'static' });
      return ip.runner(cmd, args, options);
    };
    const report = await reconcileRoutes({ device: 'rg0', runner: racing, cidrs: ['10.244.4.0/24', '10.244.6.0/24'] });
    assert.deepEqual(changes(report), { added: ['10.244.6.0/24'], removed: [], changed: [], conflicts: [{ dst: '10.244.4.0/24', existing: 'a route created meanwhile' }] }, 'the rest of the batch still lands');
    assert.deepEqual(ip.routes.filter((r) => r.dst === '10.244.4.0/24'), [{ dst: '10.244.4.0/24', dev: 'eth0', proto: 'static' }], 'the other route is left as it is');
  });

  test('a batch that fails for another reason than EEXIST is an error naming the command', async () => {
    const ip = fakeIp();
    const broken: typeof ip.runner = async (cmd, args, options) => (args.includes('-force')
      ? { command: `ip ${args.join(' ')}`, code: 1, signal: null, stdout: '', stderr: 'Error: Nexthop device is not up.\nCommand failed -:1\n' }
      : ip.runner(cmd, args, options));
    await assert.rejects(reconcileRoutes({ device: 'rg0', runner: broken, cidrs: ['10.244.4.0/24'] }), /cannot add routes through rg0: ip -4 -force -batch - exited 1: Error: Nexthop device is not up/);
  });

  test('bad input is refused before anything runs', async () => {
    const ip = fakeIp();
    await assert.rejects(reconcileRoutes({ device: 'rg0', runner: ip.runner, cidrs: ['0.0.0.0/0'] }), /refusing to route 0\.0\.0\.0\/0 through rg0/);
    await assert.rejects(reconcileRoutes({ device: 'rg0', runner: ip.runner, cidrs: ['10.0.0.1/8'] }), /host bits/);
    await assert.rejects(reconcileRoutes({ device: 'rg0 dev eth0', runner: ip.runner, cidrs: [] }), /bad interface name/);
    await assert.rejects(reconcileRoutes({ device: 'rg0', runner: ip.runner, cidrs: [], protocol: 2 }), /route protocol must be an integer 5\.\.255/);
    assert.deepEqual(ip.log, []);
  });

  test('`ip -j -batch` output: arrays one after another, empty results printed or not, strings skipped over', () => {
    assert.deepEqual(parseJsonArrays('[{"dst":"10.0.0.0/24","dev":"a]["}]\n[]\n\n[{"dst":"10.0.1.0/24"},{"dst":"x\\"]"}]\n', 'x'), [
      { dst: '10.0.0.0/24', dev: 'a][' }, { dst: '10.0.1.0/24' }, { dst: 'x"]' },
    ]);
    assert.deepEqual(parseJsonArrays('', 'x'), []);
    assert.throws(() => parseJsonArrays('[{"dst":1}', 'lookups'), /cannot parse lookups: it ends inside an array/);
    assert.throws(() => parseJsonArrays('[] oops []', 'lookups'), /cannot parse lookups: unexpected "o" at offset 3 between arrays/);
    assert.throws(() => parseJsonArrays('{"dst":1}', 'lookups'), /cannot parse lookups: expected a JSON array/);
    assert.throws(() => parseJsonArrays('[]]', 'lookups'), /unbalanced "\]" at offset 2/);
  });

  test('route listings: host routes get their length, non-address entries are skipped', () => {
    assert.deepEqual(parseRouteDestinations(JSON.stringify([
      { dst: '10.9.0.0/24' }, { dst: '10.9.1.5' }, { dst: 'fd00:9::5' }, { dst: 'default' }, { type: 'unreachable' },
    ])), ['10.9.0.0/24', '10.9.1.5/32', 'fd00:9::5/128']);
    assert.deepEqual(parseRouteDestinations(''), []);
    assert.throws(() => parseRouteDestinations('{"dst":1}'), /expected a JSON array/);
  });
});

describe('reconcileRoutes with the routes the previous call applied', () => {
  const slash24 = (i: number) => `10.${(i * 2) >> 8}.${(i * 2) & 255}.0/24`; // never siblings: no merging

  test('a pass adding one route and removing one runs no listing of ours and no listing of the main table', async () => {
    const base = Array.from({ length: 200 }, (_, i) => slash24(i));
    const ip = fakeIp({ routes: [{ dst: '10.99.0.0/24', dev: 'eth0', proto: 'kernel' }] });
    const first = await reconcileRoutes({ device: 'rg0', runner: ip.runner, cidrs: [...base, 'fd00:10:244:2::/64'] });
    assert.equal(first.added.length, 201);
    assert.deepEqual(appliedPairs(first.applied), ownPairs(ip.routes));

    const next = [...base.slice(1), slash24(500), 'fd00:10:244:2::/64'];
    ip.log.length = 0;
    const delta = await reconcileRoutes({ device: 'rg0', runner: ip.runner, cidrs: next, applied: first.applied });
    assert.deepEqual(changes(delta), { added: [slash24(500)], removed: [slash24(0)], changed: [], conflicts: [] });
    assert.deepEqual(ip.log, [
      '-j -4 -batch -',
      `< route show exact ${slash24(500)} table main`,
      '-4 -force -batch -',
      `< route add ${slash24(500)} dev rg0 proto ${P}`,
      '-4 -batch -',
      `< route del ${slash24(0)} dev rg0 proto ${P}`,
    ], 'nothing for IPv6, where nothing changed');
    assert.deepEqual(appliedPairs(delta.applied), ownPairs(ip.routes));
    assert.equal(delta.applied.v6, first.applied.v6, 'an unchanged family keeps its map');
    assert.deepEqual(appliedPairs(first.applied).v4.length, 200, 'the caller\'s applied is not changed');

    // The same change without `applied`: today's pass, listing ours in both families.
    ip.log.length = 0;
    const full = await reconcileRoutes({ device: 'rg0', runner: ip.runner, cidrs: [...base, 'fd00:10:244:2::/64'] });
    assert.deepEqual(changes(full), { added: [slash24(0)], removed: [slash24(500)], changed: [], conflicts: [] });
    assert.deepEqual(ip.log.filter((l) => !l.startsWith('< ')), [
      `-j -4 route show dev rg0 proto ${P}`, '-j -4 -batch -', '-4 -force -batch -', '-4 -batch -', `-j -6 route show dev rg0 proto ${P}`,
    ]);

    // Nothing changed: nothing runs at all.
    ip.log.length = 0;
    const idle = await reconcileRoutes({ device: 'rg0', runner: ip.runner, cidrs: [...base, 'fd00:10:244:2::/64'], applied: full.applied });
    assert.deepEqual(changes(idle), { added: [], removed: [], changed: [], conflicts: [] });
    assert.deepEqual(ip.log, []);
  });

  test('with applied: MTU changes in place, conflicts are left alone, a route that appeared meanwhile is listed', async () => {
    const ip = fakeIp({ routes: [{ dst: '10.244.7.0/24', dev: 'eth0', proto: 'static' }] });
    const first = await reconcileRoutes({ device: 'rg0', runner: ip.runner, cidrs: ['10.244.2.0/24', { dst: 'fd00:10:244:2::/64', mtu: 1300 }] });
    ip.log.length = 0;
    const retuned = await reconcileRoutes({ device: 'rg0', runner: ip.runner, cidrs: [{ dst: '10.244.2.0/24', mtu: 1280 }, 'fd00:10:244:2::/64', '10.244.7.0/24'], applied: first.applied });
    assert.deepEqual(changes(retuned), {
      added: [], removed: [], changed: ['10.244.2.0/24', 'fd00:10:244:2::/64'], conflicts: [{ dst: '10.244.7.0/24', existing: 'dev eth0 proto static' }],
    });
    assert.deepEqual(ip.log.filter((l) => !l.startsWith('< ')), ['-4 -batch -', '-j -4 -batch -', '-6 -batch -']);
    assert.deepEqual(appliedPairs(retuned.applied), ownPairs(ip.routes));
    assert.deepEqual(ip.routes.find((r) => r.dst === '10.244.7.0/24'), { dst: '10.244.7.0/24', dev: 'eth0', proto: 'static' });

    // Someone else's route appears after the lookup: the add fails with EEXIST, ours are listed.
    const racing: typeof ip.runner = async (cmd, args, options) => {
      if (args.includes('-force') && options?.input?.includes('route add 10.244.4.0/24 ')) ip.routes.push({ dst: '10.244.4.0/24', dev: 'eth0', proto: 'static' });
      return ip.runner(cmd, args, options);
    };
    ip.log.length = 0;
    const raced = await reconcileRoutes({ device: 'rg0', runner: racing, cidrs: [{ dst: '10.244.2.0/24', mtu: 1280 }, 'fd00:10:244:2::/64', '10.244.4.0/24', '10.244.6.0/24'], applied: retuned.applied });
    assert.deepEqual(changes(raced), { added: ['10.244.6.0/24'], removed: [], changed: [], conflicts: [{ dst: '10.244.4.0/24', existing: 'a route created meanwhile' }] });
    assert.ok(ip.log.includes(`-j -4 route show dev rg0 proto ${P}`), 'which adds failed, only a listing tells');
    assert.deepEqual(appliedPairs(raced.applied), ownPairs(ip.routes));
  });

  test('an applied that is not a previous report\'s for this device and protocol is refused before anything runs', async () => {
    const ip = fakeIp();
    const { applied } = await reconcileRoutes({ device: 'rg0', runner: ip.runner, cidrs: ['10.244.2.0/24'] });
    ip.log.length = 0;
    await assert.rejects(reconcileRoutes({ device: 'rg1', runner: ip.runner, cidrs: [], applied }), /applied routes are those of device rg0 protocol 147, not of rg1 protocol 147/);
    await assert.rejects(reconcileRoutes({ device: 'rg0', runner: ip.runner, cidrs: [], applied, protocol: 200 }), /not of rg0 protocol 200/);
    await assert.rejects(reconcileRoutes({ device: 'rg0', runner: ip.runner, cidrs: [], applied: { device: 'rg0', protocol: 147, v4: {}, v6: {} } as unknown as AppliedRoutes }), /applied must be the `applied` of a previous reconcileRoutes report/);
    assert.deepEqual(ip.log, []);
  });

  test('a random sequence of wanted sets, applied carried along: the fake\'s routes are always the summarized wish', async () => {
    const random = prng(4711);
    const neighbour = (i: number) => `10.244.${i}.0/24`; // adjacent: routes merge and split
    const taken = '10.250.0.5/32'; // someone else's, and never merged into anything
    const ip = fakeIp({ routes: [{ dst: taken, dev: 'eth0', proto: 'static' }] });
    let wanted = new Map<string, number | undefined>();
    let applied: AppliedRoutes | undefined;
    const seen = { added: 0, removed: 0, changed: 0, conflicts: 0, merged: 0 };
    for (let step = 0; step < 150; step++) {
      // A few Nodes come and go, some routes get a path MTU.
      for (let k = Math.floor(random() * 6); k > 0; k--) {
        const pick = random();
        const dst = pick < 0.1 ? `fd00:10:244:${Math.floor(random() * 16).toString(16)}::/64` : pick < 0.15 ? taken : neighbour(Math.floor(random() * 32));
        if (wanted.has(dst) && random() < 0.6) wanted.delete(dst);
        else wanted.set(dst, random() < 0.2 ? 1280 : undefined);
      }
      if (step % 50 === 49) wanted = new Map(); // everything gone, then back
      const cidrs = [...wanted].map(([dst, mtu]) => (mtu === undefined ? dst : { dst, mtu }));
      ip.log.length = 0;
      const report = await reconcileRoutes({ device: 'rg0', runner: ip.runner, cidrs, applied });
      if (applied) assert.ok(!ip.log.some((l) => l.startsWith('-j -4 route show') || l.startsWith('-j -6 route show')), `step ${step}: ${ip.log.join('\n')}`);
      applied = report.applied;
      const expect = summarizeWanted(cidrs);
      for (const key of ['added', 'removed', 'changed', 'conflicts'] as const) seen[key] += report[key].length;
      seen.merged += expect.v4.filter((r) => !r.dst.endsWith('/24')).length;
      const conflicted = new Set(report.conflicts.map((c) => c.dst));
      assert.deepEqual([...conflicted], wanted.has(taken) ? [taken] : [], `step ${step}`);
      const wish = (list: WantedRoute[]) => list.filter((r) => !conflicted.has(r.dst)).map((r) => [r.dst, r.mtu] as [string, number | undefined]).sort(([a], [b]) => a.localeCompare(b));
      assert.deepEqual(ownPairs(ip.routes), { v4: wish(expect.v4), v6: wish(expect.v6) }, `step ${step}`);
      assert.deepEqual(appliedPairs(applied), ownPairs(ip.routes), `step ${step}`);
    }
    assert.deepEqual(ip.routes.filter((r) => r.dev === 'eth0'), [{ dst: taken, dev: 'eth0', proto: 'static' }], 'the foreign route is untouched');
    assert.ok(Object.values(seen).every((n) => n > 0), `the sequence exercised every kind of change: ${JSON.stringify(seen)}`);
  });
});

describe('summarizeWanted', () => {
  /** The plain way: each MTU's CIDRs through cidrs.ts, split by family afterwards. */
  function oracle(cidrs: ReadonlyArray<string | WantedRoute>) {
    const byMtu = new Map<number | undefined, string[]>();
    for (const c of cidrs) {
      const r = typeof c === 'string' ? { dst: c } : c;
      if (!byMtu.has(r.mtu)) byMtu.set(r.mtu, []);
      byMtu.get(r.mtu)!.push(r.dst);
    }
    const out: { v4: WantedRoute[]; v6: WantedRoute[] } = { v4: [], v6: [] };
    for (const [mtu, list] of byMtu) {
      for (const p of summarizePrefixes(parseCidrList(list))) (p.address.length === 4 ? out.v4 : out.v6).push(mtu === undefined ? { dst: formatPrefix(p) } : { dst: formatPrefix(p), mtu });
    }
    return out;
  }

  test('the IPv4 fast path summarizes exactly like cidrs.ts (random sets dense enough to overlap and merge)', () => {
    const random = prng(20261204);
    for (let round = 0; round < 300; round++) {
      const cidrs: Array<string | WantedRoute> = [];
      const count = 1 + Math.floor(random() * 60);
      // A space of 16..2048 addresses from 10.0.0.0, prefixes at least 2 bits longer than it:
      // duplicates, covered prefixes and siblings (merged, sometimes repeatedly) are common.
      const spanBits = 4 + Math.floor(random() * 8);
      for (let i = 0; i < count; i++) {
        const bits = 32 - Math.floor(random() * (spanBits - 1));
        const address = 10 * 2 ** 24 + Math.floor(random() * 2 ** spanBits);
        const masked = address - (address % 2 ** (32 - bits));
        const dst = `${masked >>> 24}.${(masked >>> 16) & 255}.${(masked >>> 8) & 255}.${masked & 255}/${bits}`;
        const mtu = random() < 0.3 ? 1280 + Math.floor(random() * 2) * 100 : undefined;
        cidrs.push(random() < 0.1 ? `fd00:${Math.floor(random() * 4)}::/${32 + Math.floor(random() * 2) * 32}` : mtu === undefined ? dst : { dst, mtu });
      }
      assert.deepEqual(summarizeWanted(cidrs), oracle(cidrs), JSON.stringify(cidrs));
    }
  });

  test('odd but valid spellings take the strict parser; bad entries are all named at once', () => {
    assert.deepEqual(summarizeWanted([' 10.0.0.0/25', '10.0.0.128/25', '0.0.0.0/1', '128.0.0.0/1']), { v4: [{ dst: '0.0.0.0/0' }], v6: [] });
    assert.throws(() => summarizeWanted(['10.0.0.1/24', '10.0.0.0/24', 'fd00::1/64']), (err: Error) => /\[0\] .*host bits/.test(err.message) && /\[2\] .*host bits/.test(err.message));
    assert.throws(() => summarizeWanted([null as unknown as string]), /route CIDRs\[0\] must be a CIDR string or \{ dst, mtu \}, got null/);
    assert.throws(() => summarizeWanted('10.0.0.0/8' as unknown as string[]), /must be an array/);
  });

  test('10 000 separate /24s: none merged, in canonical order', () => {
    // Their time is the agent's at 5 000 Nodes (`roamguard bench --agent-scale`, the pass's
    // "routes" step), not a unit test's: about 5 ms here, where the generic path took about 35.
    const cidrs = Array.from({ length: 10_000 }, (_, i) => `10.${(i * 4) >> 8}.${(i * 4) & 255}.0/24`);
    const out = summarizeWanted([...cidrs].reverse());
    assert.deepEqual(out.v4.map((r) => r.dst), cidrs);
    assert.deepEqual(out.v6, []);
  });
});

describe('tunnel addresses and link', () => {
  test('gateway addresses are network + 1 as host prefixes, one per local pod CIDR', () => {
    assert.deepEqual(gatewayAddressesFor(['fd00:10:244:1::/64', '10.244.1.0/25', '10.244.1.128/25']), [
      '10.244.1.1/32', '10.244.1.129/32', 'fd00:10:244:1::1/128',
    ]);
    assert.deepEqual(gatewayAddressesFor([]), []);
  });

  test('reconcileAddresses: adds before it removes, IPv6 with nodad, link-local untouched, idempotent', async () => {
    const ip = fakeIp({ addresses: ['10.244.9.1/32', '10.244.1.1/24'] });
    const report = await reconcileAddresses({ device: 'rg0', runner: ip.runner, addresses: ['10.244.1.1/32', 'fd00:10:244:1:0::1/128'] });
    assert.deepEqual(report, { added: ['10.244.1.1/32', 'fd00:10:244:1::1/128'], removed: ['10.244.9.1/32', '10.244.1.1/24'] });
    assert.deepEqual(ip.log, [
      '-j addr show dev rg0',
      'addr add 10.244.1.1/32 dev rg0',
      'addr add fd00:10:244:1::1/128 dev rg0 nodad',
      'addr del 10.244.9.1/32 dev rg0',
      'addr del 10.244.1.1/24 dev rg0',
    ]);
    ip.log.length = 0;
    assert.deepEqual(await reconcileAddresses({ device: 'rg0', runner: ip.runner, addresses: ['fd00:10:244:1::1/128', '10.244.1.1/32'] }), { added: [], removed: [] });
    await assert.rejects(reconcileAddresses({ device: 'rg0', runner: ip.runner, addresses: ['10.244.1.1'] }), /needs a prefix length/);
    await assert.rejects(reconcileAddresses({ device: 'rg0', runner: ip.runner, addresses: ['10.244.1.1/40'] }), /bad prefix length/);
  });

  test('configureTunnelInterface: mtu and up, then the gateway addresses', async () => {
    const ip = fakeIp();
    await configureTunnelInterface({ device: 'rg0', mtu: 1420, localPodCidrs: ['10.244.1.0/24'], runner: ip.runner });
    assert.deepEqual(ip.log, ['link set dev rg0 mtu 1420 up', '-j addr show dev rg0', 'addr add 10.244.1.1/32 dev rg0']);
    await assert.rejects(setLinkMtuUp({ device: 'rg0', mtu: 1279, runner: ip.runner }), /tunnel MTU must be an integer 1280\.\.65535/);
  });

  test('address listings: global scope only', () => {
    assert.deepEqual(parseGlobalAddresses(JSON.stringify([{ addr_info: [
      { family: 'inet', local: '10.0.0.1', prefixlen: 32, scope: 'global' },
      { family: 'inet6', local: 'fe80::1', prefixlen: 64, scope: 'link' },
      { family: 'inet', local: '127.0.0.1', prefixlen: 8, scope: 'host' },
      { family: 'inet6', local: 'FD00::1', prefixlen: 128, scope: 'global' },
    ] }])), ['10.0.0.1/32', 'fd00::1/128']);
  });
});
