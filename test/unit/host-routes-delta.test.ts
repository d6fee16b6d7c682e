/**
 * Incremental route reconciling (`reconcileRoutes` with `applied`) against the real kernel, in a
 * namespace of its own: a seeded random sequence of wanted route sets, each applied with what the
 * previous pass left, and after every step the routes the kernel really has (listed with `ip`) are
 * exactly the summarized wish. A route that is not ours to a wanted destination is reported as a
 * conflict every time and never touched.
 *
 * The device is one end of a veth pair: the dummy link type is a kernel module that not every
 * machine (or container) has, veth is everywhere `ip netns` is. Needs root and iproute2, like the
 * system tests; it lives here because it is quick (a few seconds) and needs no other package.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { requireRoot, Scope, type Namespace } from '../system/netns.ts';
import { reconcileRoutes, DEFAULT_ROUTE_PROTOCOL, EXACT_LOOKUP_LIMIT, type AppliedRoutes, type WantedRoute } from '../../control/host/routes.ts';
import { parseCidrList, summarizePrefixes } from '../../control/host/cidrs.ts';
import { formatPrefix } from '../../dataplane/net/ip.ts';
import { netnsRunner, type CommandRunner } from '../../control/host/runner.ts';
import { prng } from '../helpers/prng.ts';

const DEVICE = 'rgd0';
const P = String(DEFAULT_ROUTE_PROTOCOL);
/** Someone else's route (proto static, on our device) to a destination we want in every step. */
const TAKEN = '10.250.0.5/32';

type Pairs = Array<[string, number | undefined]>;

const sortPairs = (pairs: Pairs) => pairs.sort(([a], [b]) => a.localeCompare(b));

/** The wish summarized the plain way (cidrs.ts, each MTU on its own), as sorted pairs per family. */
function expected(wanted: ReadonlyMap<string, number | undefined>, leaveOut: string): { v4: Pairs; v6: Pairs } {
  const byMtu = new Map<number | undefined, string[]>();
  for (const [dst, mtu] of wanted) {
    if (!byMtu.has(mtu)) byMtu.set(mtu, []);
    byMtu.get(mtu)!.push(dst);
  }
  const out: { v4: Pairs; v6: Pairs } = { v4: [], v6: [] };
  for (const [mtu, list] of byMtu) {
    for (const p of summarizePrefixes(parseCidrList(list))) {
      const dst = formatPrefix(p);
      if (dst !== leaveOut) (p.address.length === 4 ? out.v4 : out.v6).push([dst, mtu]);
    }
  }
  return { v4: sortPairs(out.v4), v6: sortPairs(out.v6) };
}

/** Our routes as the kernel has them, canonical, as sorted pairs per family. */
async function kernelRoutes(ns: Namespace): Promise<{ v4: Pairs; v6: Pairs }> {
  const list = async (family: 4 | 6): Promise<Pairs> => {
    const out = await ns.ip(['-j', `-${family}`, 'route', 'show', 'dev', DEVICE, 'proto', P]);
    const routes = JSON.parse(out.stdout.trim() || '[]') as Array<{ dst: string; metrics?: Array<{ mtu?: number }> }>;
    return sortPairs(routes.map((r) => [
      formatPrefix(parseCidrList([r.dst.includes('/') ? r.dst : `${r.dst}/${family === 4 ? 32 : 128}`])[0]),
      r.metrics?.find((m) => m.mtu !== undefined)?.mtu,
    ]));
  };
  return { v4: await list(4), v6: await list(6) };
}

const appliedPairs = (applied: AppliedRoutes) => ({ v4: sortPairs([...applied.v4]), v6: sortPairs([...applied.v6]) });

describe('reconcileRoutes with applied, in a namespace', () => {
  const scope = new Scope();
  let ns: Namespace;
  let runner: CommandRunner;
  const commands: string[] = [];

  before(async () => {
    await requireRoot();
    ns = await scope.namespace();
    await ns.ip(['link', 'add', DEVICE, 'type', 'veth', 'peer', 'name', `${DEVICE}p`]);
    await ns.ip(['link', 'set', DEVICE, 'up']);
    await ns.ip(['link', 'set', `${DEVICE}p`, 'up']);
    await ns.ip(['route', 'add', TAKEN, 'dev', DEVICE, 'proto', 'static']);
    const inside = netnsRunner(ns.name);
    runner = (cmd, args, options) => {
      commands.push(args.join(' '));
      return inside(cmd, args, options);
    };
  });

  after(async () => {
    await scope.cleanup();
  });

  test('a seeded random sequence of wanted sets, applied carried along: the kernel always has the summarized wish', async () => {
    const random = prng(20261204);
    const wanted = new Map<string, number | undefined>([[TAKEN, undefined]]);
    let applied: AppliedRoutes | undefined;
    const seen = { added: 0, removed: 0, changed: 0, merged: 0, fullPasses: 0 };
    for (let step = 0; step < 100; step++) {
      // Nodes come and go (adjacent /24s, so routes merge and split), a few IPv6 pod CIDRs and
      // host routes, and now and then a path MTU on a route.
      for (let k = 1 + Math.floor(random() * 4); k > 0; k--) {
        const pick = random();
        const dst = pick < 0.1 ? `fd00:10:244:${Math.floor(random() * 8)}::/64`
          : pick < 0.2 ? `10.251.0.${Math.floor(random() * 8)}/32`
            : `10.244.${Math.floor(random() * 48)}.0/24`;
        if (wanted.has(dst) && random() < 0.6) wanted.delete(dst);
        else wanted.set(dst, random() < 0.15 ? 1280 + Math.floor(random() * 2) * 100 : undefined);
      }
      wanted.set(TAKEN, undefined);
      // Like the agent: now and then a full pass, which lists (and would repair) what is there.
      const full = step === 0 || step % 25 === 0;
      const cidrs: Array<string | WantedRoute> = [...wanted].map(([dst, mtu]) => (mtu === undefined ? dst : { dst, mtu }));
      commands.length = 0;
      const report = await reconcileRoutes({ device: DEVICE, runner, cidrs, applied: full ? undefined : applied });
      applied = report.applied;

      const want = expected(wanted, TAKEN);
      assert.deepEqual(await kernelRoutes(ns), want, `step ${step}: the kernel has the summarized wish`);
      assert.deepEqual(appliedPairs(applied), want, `step ${step}: applied is what the kernel has`);
      assert.deepEqual(report.conflicts, [{ dst: TAKEN, existing: 'dev rgd0 proto static' }], `step ${step}`);
      const listingsOfOurs = commands.filter((c) => c.startsWith(`-j -4 route show dev ${DEVICE}`) || c.startsWith(`-j -6 route show dev ${DEVICE}`));
      assert.equal(listingsOfOurs.length, full ? 2 : 0, `step ${step}: ${commands.join(' | ')}`);
      if (!full) assert.ok(!commands.some((c) => c.includes('route show table main')), `step ${step}: ${commands.join(' | ')}`);
      assert.ok(commands.length <= 10, `step ${step}: a bounded number of commands: ${commands.join(' | ')}`);

      seen.added += report.added.length;
      seen.removed += report.removed.length;
      seen.changed += report.changed.length;
      seen.merged += want.v4.filter(([dst]) => /\/(1\d|2[0-3])$/.test(dst)).length;
      if (full) seen.fullPasses++;
    }
    assert.ok(seen.added > 0 && seen.removed > 0 && seen.changed > 0 && seen.merged > 0, `every kind of change happened: ${JSON.stringify(seen)}`);

    const foreign = JSON.parse((await ns.ip(['-j', 'route', 'show', 'exact', TAKEN, 'table', 'main'])).stdout);
    assert.deepEqual(foreign.map((r: { dst: string; dev: string; protocol: string }) => [r.dst, r.dev, r.protocol]), [['10.250.0.5', DEVICE, 'static']], 'the foreign route is untouched');
  });

  test('many adds at once check against one listing of the main table, with applied as well', async () => {
    const before = (await kernelRoutes(ns)).v4.length;
    const many = Array.from({ length: EXACT_LOOKUP_LIMIT + 8 }, (_, i) => `10.252.${i * 2}.0/24`);
    let report = await reconcileRoutes({ device: DEVICE, runner, cidrs: [TAKEN] });
    commands.length = 0;
    report = await reconcileRoutes({ device: DEVICE, runner, cidrs: [TAKEN, ...many], applied: report.applied });
    assert.equal(report.added.length, many.length);
    assert.deepEqual(commands, ['-j -4 route show table main', '-4 -force -batch -']);
    assert.deepEqual((await kernelRoutes(ns)).v4.map(([dst]) => dst), [...many].sort((a, b) => a.localeCompare(b)));
    assert.ok(before > 0, 'the sequence left routes behind for the first call to remove');
  });
});
