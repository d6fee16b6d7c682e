/**
 * planRulesetUpdate: the three kinds of update, merges that turn one added CIDR into deletes and
 * an add (deletes first), the caller's contract (keep `applied` only after success, forget it after
 * a failure), and a random model run through real nft: after every step the kernel's sets must
 * hold exactly what a whole-table renderRuleset would have put there.
 */
import { after, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { parseCidr } from '../../control/host/cidrs.ts';
import { applyRuleset, removeTable, renderRuleset, SET_NAMES, type RulesetOptions } from '../../control/host/nftables.ts';
import { planRulesetUpdate, type AppliedRuleset, type RulesetSetKey } from '../../control/host/nftables-update.ts';
import { runChecked, systemRunner } from '../../control/host/runner.ts';
import { formatPrefix } from '../../dataplane/net/ip.ts';
import { prng } from '../helpers/prng.ts';

const SET_KEYS: RulesetSetKey[] = ['clusterV4', 'clusterV6', 'localV4', 'localV6'];

function options(cluster: { v4?: string[]; v6?: string[] } = {}, overrides: Partial<RulesetOptions> = {}): RulesetOptions {
  return {
    tableName: 'rgplan',
    masquerade: { ipv4: true, ipv6: true },
    filter: { ipv4: true, ipv6: false },
    clusterPodCidrs: { v4: cluster.v4 ?? [], v6: cluster.v6 ?? [] },
    localPodCidrs: { v4: ['10.244.1.0/24'], v6: ['fd00:10:244:1::/64'] },
    ...overrides,
  };
}

/** The elements renderRuleset writes into one set, in its order. */
function renderedElements(text: string, set: string): string[] {
  const lines = text.split('\n');
  const start = lines.findIndex((l) => l.trim() === `set ${set} {`);
  assert.ok(start >= 0, `no set ${set} in the rendered table`);
  for (let i = start + 1; lines[i].trim() !== '}'; i++) {
    const m = /^elements = \{ (.*) \}$/.exec(lines[i].trim());
    if (m) return m[1].split(', ');
  }
  return [];
}

/** The applied sets must be what a whole table rendered from the same options holds. */
function assertMatchesRender(applied: AppliedRuleset, next: RulesetOptions, why: string): void {
  const text = renderRuleset(next);
  for (const key of SET_KEYS) assert.deepEqual(applied.sets[key], renderedElements(text, SET_NAMES[key]), `${why}: ${key}`);
}

/** Applies a first table (kind 'table'), then plans `next` against it. */
function planFrom(first: RulesetOptions, next: RulesetOptions) {
  const start = planRulesetUpdate(undefined, first, { full: false });
  assert.equal(start.kind, 'table');
  return planRulesetUpdate(start.applied, next, { full: false });
}

describe('planRulesetUpdate: the three kinds', () => {
  test('no applied table: the whole table, exactly renderRuleset\'s text', () => {
    const next = options({ v4: ['10.244.0.0/24', '10.244.3.0/24'], v6: ['fd00:10:244::/64'] });
    const plan = planRulesetUpdate(undefined, next, { full: false });
    assert.equal(plan.kind, 'table');
    assert.equal(plan.script, renderRuleset(next));
    assertMatchesRender(plan.applied, next, 'first table');
  });

  test('full: the whole table even when nothing changed', () => {
    const next = options({ v4: ['10.244.0.0/24'] });
    const plan = planRulesetUpdate(planRulesetUpdate(undefined, next, { full: false }).applied, next, { full: true });
    assert.equal(plan.kind, 'table');
    assert.equal(plan.script, renderRuleset(next));
  });

  test('any option but the sets changed: the whole table', () => {
    const first = options({ v4: ['10.244.0.0/24'] });
    const changes: Array<[string, Partial<RulesetOptions>]> = [
      ['table name', { tableName: 'rgother' }],
      ['masquerade', { masquerade: { ipv4: true, ipv6: false } }],
      ['filter', { filter: { ipv4: true, ipv6: true } }],
      ['MSS clamping', { clampMssTo: 'rg0' }],
      ['kube-proxy mark', { kubeProxyMasqueradeMark: 0x8000 }],
    ];
    for (const [what, change] of changes) {
      const next = { ...first, ...change };
      const plan = planFrom(first, next);
      assert.equal(plan.kind, 'table', what);
      assert.equal(plan.script, renderRuleset(next), what);
    }
  });

  test('the same sets, however the lists are written: nothing to do', () => {
    const first = options({ v4: ['10.244.0.0/24', '10.244.4.0/24'], v6: ['fd00:10:244::/64'] });
    for (const cluster of [
      { v4: ['10.244.0.0/24', '10.244.4.0/24'], v6: ['fd00:10:244::/64'] },
      { v4: ['10.244.4.0/24', '10.244.0.0/24', '10.244.0.0/24'], v6: ['FD00:10:244:0::/64'] },
      // Covered by what is there already: the summarized set does not change.
      { v4: ['10.244.0.0/24', '10.244.0.128/25', '10.244.4.0/24'], v6: ['fd00:10:244::/64', 'fd00:10:244:1::/64'] },
    ]) {
      const plan = planFrom(first, options(cluster));
      assert.equal(plan.kind, 'none', JSON.stringify(cluster));
      assert.equal(plan.script, undefined);
      assertMatchesRender(plan.applied, options(cluster), 'none');
    }
  });

  test('one CIDR added and one removed: only those elements, in one script', () => {
    const plan = planFrom(options({ v4: ['10.244.4.0/24', '10.244.8.0/24'] }), options({ v4: ['10.244.8.0/24', '10.244.12.0/24'] }));
    assert.equal(plan.kind, 'elements');
    assert.equal(plan.script, [
      'delete element inet rgplan pod-cidrs-v4 { 10.244.4.0/24 }',
      'add element inet rgplan pod-cidrs-v4 { 10.244.12.0/24 }',
      '',
    ].join('\n'));
    assertMatchesRender(plan.applied, options({ v4: ['10.244.8.0/24', '10.244.12.0/24'] }), 'elements');
  });

  test('only additions (or only removals): no empty element line', () => {
    const add = planFrom(options({ v6: [] }), options({ v6: ['fd00:10:244:8::/64'] }));
    assert.equal(add.script, 'add element inet rgplan pod-cidrs-v6 { fd00:10:244:8::/64 }\n');
    const remove = planFrom(options({ v6: ['fd00:10:244:8::/64'] }), options({ v6: [] }));
    assert.equal(remove.script, 'delete element inet rgplan pod-cidrs-v6 { fd00:10:244:8::/64 }\n');
  });
});

describe('planRulesetUpdate at scale', () => {
  test('10 000 CIDRs, one Node gone and one new: a two-line script, and the same sets as a whole table', () => {
    // Every other /24, so nothing merges and the set really holds 10 000 elements.
    const at = (i: number) => `${10 + (i >> 15)}.${(i >> 7) & 255}.${(i << 1) & 255}.0/24`;
    const list = (from: number) => Array.from({ length: 10_000 }, (_, k) => at(from + k));
    const local = { localPodCidrs: { v4: ['10.200.0.0/24'], v6: [] } };
    const first = planRulesetUpdate(undefined, options({ v4: list(0) }, local), { full: false });
    const next = options({ v4: list(1) }, local);
    const plan = planRulesetUpdate(first.applied, next, { full: false });
    assert.equal(plan.script, `delete element inet rgplan pod-cidrs-v4 { ${at(0)} }\nadd element inet rgplan pod-cidrs-v4 { ${at(10_000)} }\n`);
    assert.equal(plan.applied.sets.clusterV4.length, 10_001);
    assertMatchesRender(plan.applied, next, 'slid by one');
  });
});

describe('planRulesetUpdate: summarizing, merges and order', () => {
  test('a new /24 next to existing ones: their elements are deleted and the merged range added', () => {
    // The set holds the local 10.244.1.0/24 and 10.244.2.0/23; 10.244.0.0/24 completes 10.244.0.0/22.
    const plan = planFrom(options({ v4: ['10.244.2.0/24', '10.244.3.0/24'] }), options({ v4: ['10.244.0.0/24', '10.244.2.0/24', '10.244.3.0/24'] }));
    assert.equal(plan.kind, 'elements');
    assert.equal(plan.script, [
      'delete element inet rgplan pod-cidrs-v4 { 10.244.1.0/24, 10.244.2.0/23 }',
      'add element inet rgplan pod-cidrs-v4 { 10.244.0.0/22 }',
      '',
    ].join('\n'));
  });

  test('removing one half of a merged range splits it again', () => {
    const plan = planFrom(options({ v4: ['10.244.0.0/24', '10.244.2.0/23'] }), options({ v4: ['10.244.0.0/24'] }));
    assert.equal(plan.script, [
      'delete element inet rgplan pod-cidrs-v4 { 10.244.0.0/22 }',
      'add element inet rgplan pod-cidrs-v4 { 10.244.0.0/23 }',
      '',
    ].join('\n'));
  });

  test('every delete of every set comes before any add', () => {
    const first = options({ v4: ['10.244.2.0/24'], v6: ['fd00:10:244:8::/64'] });
    const next = options({ v4: ['10.244.0.0/24'], v6: ['fd00:10:244:9::/64'] }, { localPodCidrs: { v4: ['10.244.7.0/24'], v6: ['fd00:10:244:1::/64'] } });
    const plan = planFrom(first, next);
    const verbs = plan.script!.trimEnd().split('\n').map((l) => l.split(' ')[0]);
    assert.ok(verbs.includes('delete') && verbs.includes('add'));
    assert.equal(verbs.lastIndexOf('delete') < verbs.indexOf('add'), true, plan.script);
    assert.match(plan.script!, /^delete element inet rgplan local-pod-cidrs-v4 \{ 10\.244\.1\.0\/24 \}$/m);
    assert.match(plan.script!, /^add element inet rgplan local-pod-cidrs-v4 \{ 10\.244\.7\.0\/24 \}$/m);
    assertMatchesRender(plan.applied, next, 'local and cluster changed');
  });

  test('this node\'s CIDRs stay in the cluster set when no other Node lists them', () => {
    const plan = planFrom(options({ v4: ['10.244.1.0/24', '10.244.4.0/24'] }), options({ v4: ['10.244.4.0/24'] }));
    assert.equal(plan.kind, 'none');
    assert.deepEqual(plan.applied.sets.clusterV4, ['10.244.1.0/24', '10.244.4.0/24']);
  });
});

describe('planRulesetUpdate: purity and input checks', () => {
  test('applied is never changed, and later changes to the caller\'s arrays do not leak into it', () => {
    const v4 = ['10.244.4.0/24', '10.244.8.0/24'];
    const first = planRulesetUpdate(undefined, options({ v4 }), { full: false }).applied;
    const snapshot = structuredClone({ sets: first.sets, shapeKey: first.shapeKey });
    v4.push('10.244.12.0/24'); // the caller reuses its array
    const second = planRulesetUpdate(first, options({ v4 }), { full: false });
    assert.equal(second.kind, 'elements');
    assert.deepEqual({ sets: first.sets, shapeKey: first.shapeKey }, snapshot);
    // Planning again from the same applied gives the same answer.
    assert.deepEqual(planRulesetUpdate(first, options({ v4 }), { full: false }).script, second.script);
  });

  test('planning from an applied gives the same sets as planning from nothing', () => {
    const random = prng(11);
    let applied: AppliedRuleset | undefined;
    for (let step = 0; step < 200; step++) {
      const next = options(randomCluster(random));
      const plan = planRulesetUpdate(applied, next, { full: false });
      assert.deepEqual(plan.applied.sets, planRulesetUpdate(undefined, next, { full: false }).applied.sets, `step ${step}`);
      assertMatchesRender(plan.applied, next, `step ${step}`);
      applied = plan.applied;
    }
  });

  test('bad arguments: descriptive errors, the same as renderRuleset\'s for bad options', () => {
    const good = options({ v4: ['10.244.0.0/24'] });
    const applied = planRulesetUpdate(undefined, good, { full: false }).applied;
    assert.throws(() => planRulesetUpdate(applied, good, undefined as never), /planRulesetUpdate needs options \{full: boolean\}/);
    assert.throws(() => planRulesetUpdate(applied, good, { full: 'yes' } as never), /needs options \{full: boolean\}/);
    assert.throws(() => planRulesetUpdate({ shapeKey: 'x' } as never, good, { full: false }), /applied must be undefined or the `applied` of an earlier planRulesetUpdate/);
    assert.throws(() => planRulesetUpdate(applied, undefined as never, { full: false }), /planRulesetUpdate needs an options object/);
    for (const from of [undefined, applied]) {
      for (const bad of [
        options({ v4: ['10.244.0.0/24', '10.244.1.5/24'] }),
        options({ v4: ['10.244.0.0/24', 'fd00::/64'] }),
        options({ v4: 'nope' as never }),
        options({}, { localPodCidrs: undefined as never }),
        options({}, { tableName: 'bad name' }),
        options({}, { clampMssTo: 'rg0"; drop' }),
      ]) {
        let expected = '';
        try { renderRuleset(bad); } catch (err) { expected = (err as Error).message; }
        assert.notEqual(expected, '', 'renderRuleset refuses it too');
        assert.throws(() => planRulesetUpdate(from, bad, { full: false }), (err: Error) => err.message === expected);
      }
    }
  });
});

/** A random cluster from a small universe, so inputs overlap and neighbours merge often. */
function randomCluster(random: () => number): { v4: string[]; v6: string[] } {
  const pick = <T>(xs: readonly T[]) => xs.filter(() => random() < 0.4);
  return { v4: pick(V4_UNIVERSE), v6: pick(V6_UNIVERSE) };
}

// 10.244.0.0/21 in /24s, a few /23s and /25s over them, and one outside range.
const V4_UNIVERSE = [
  ...Array.from({ length: 8 }, (_, i) => `10.244.${i}.0/24`),
  '10.244.2.0/23', '10.244.6.0/23', '10.244.3.0/25', '10.244.3.128/25', '10.96.0.0/16',
];
const V6_UNIVERSE = [
  ...Array.from({ length: 8 }, (_, i) => `fd00:10:244:${i}::/64`),
  'fd00:10:244:4::/63', 'fd00:10:244:5::/65', 'fd00:10:245::/48',
];

/** Changes a few entries of the previous cluster (a Node came or went), or now and then all of them. */
function stepCluster(random: () => number, previous: { v4: string[]; v6: string[] }): { v4: string[]; v6: string[] } {
  if (random() < 0.05) return randomCluster(random);
  const toggle = (list: string[], universe: readonly string[]) => {
    const out = new Set(list);
    const flips = 1 + Math.floor(random() * 3);
    for (let i = 0; i < flips; i++) {
      const cidr = universe[Math.floor(random() * universe.length)];
      if (!out.delete(cidr)) out.add(cidr);
    }
    return [...out];
  };
  return random() < 0.7 ? { v4: toggle(previous.v4, V4_UNIVERSE), v6: previous.v6 } : { v4: toggle(previous.v4, V4_UNIVERSE), v6: toggle(previous.v6, V6_UNIVERSE) };
}

/** nft's JSON element (a prefix, a single address, never a range for our sets) as canonical CIDR text. */
function elementText(element: unknown, family: 4 | 6): string {
  if (typeof element === 'string') return formatPrefix(parseCidr(`${element}/${family === 4 ? 32 : 128}`));
  const prefix = (element as { prefix?: { addr: string; len: number } }).prefix;
  assert.ok(prefix, `unexpected set element ${JSON.stringify(element)}`);
  return formatPrefix(parseCidr(`${prefix.addr}/${prefix.len}`));
}

/** All four sets of the table as nft lists them (one `nft -j list table` for all). */
async function kernelSets(table: string): Promise<Record<RulesetSetKey, string[]>> {
  const { stdout } = await runChecked(systemRunner, 'list the test table', 'nft', ['-j', 'list', 'table', 'inet', table]);
  const sets = new Map<string, unknown[]>();
  for (const item of (JSON.parse(stdout) as { nftables: Array<{ set?: { name: string; elem?: unknown[] } }> }).nftables) {
    if (item.set) sets.set(item.set.name, item.set.elem ?? []);
  }
  const read = (key: RulesetSetKey) => {
    const elements = sets.get(SET_NAMES[key]);
    assert.ok(elements, `set ${SET_NAMES[key]} is missing from table ${table}`);
    return elements.map((e) => elementText(e, key.endsWith('V4') ? 4 : 6)).sort();
  };
  return { clusterV4: read('clusterV4'), clusterV6: read('clusterV6'), localV4: read('localV4'), localV6: read('localV6') };
}

/** What a whole table rendered from `next` would hold, in the same (sorted text) form. */
function renderedSets(next: RulesetOptions): Record<RulesetSetKey, string[]> {
  const text = renderRuleset(next);
  const read = (key: RulesetSetKey) => renderedElements(text, SET_NAMES[key]).sort();
  return { clusterV4: read('clusterV4'), clusterV6: read('clusterV6'), localV4: read('localV4'), localV6: read('localV6') };
}

describe('planRulesetUpdate through real nft (host netns, table of its own)', () => {
  const table = `rgupd${process.pid}`;
  after(() => removeTable(table));

  test('a random sequence of cluster CIDR sets: after every step the kernel holds what a whole table would', async () => {
    const random = prng(20251205);
    const kinds = { none: 0, elements: 0, table: 0 };
    let mergesSeen = 0;
    let applied: AppliedRuleset | undefined;
    let cluster = randomCluster(random);
    let local = { v4: ['10.244.1.0/24'], v6: ['fd00:10:244:1::/64'] };
    let masquerade = { ipv4: true, ipv6: true };
    try {
      for (let step = 0; step < 250; step++) {
        cluster = stepCluster(random, cluster);
        if (random() < 0.05) local = { v4: random() < 0.8 ? [V4_UNIVERSE[Math.floor(random() * 8)]] : [], v6: local.v6 };
        if (random() < 0.02) masquerade = { ipv4: !masquerade.ipv4, ipv6: true };
        const next = options(cluster, { tableName: table, masquerade, localPodCidrs: local });
        const plan = planRulesetUpdate(applied, next, { full: random() < 0.03 });
        kinds[plan.kind]++;
        if (plan.kind === 'elements' && /^delete /m.test(plan.script!) && /^add /m.test(plan.script!)) mergesSeen++;
        if (plan.script) await applyRuleset(plan.script);
        applied = plan.applied;
        assert.deepEqual(await kernelSets(table), renderedSets(next), `step ${step} (${plan.kind}):\n${plan.script ?? ''}`);
      }
    } finally {
      await removeTable(table);
    }
    // The run exercised every kind, and element scripts that delete and add in one transaction.
    assert.ok(kinds.none > 0 && kinds.elements > 100 && kinds.table > 3, JSON.stringify(kinds));
    assert.ok(mergesSeen > 20, `only ${mergesSeen} element scripts both deleted and added`);
  });

  test('a failed element script: the caller forgets applied, and the whole table repairs what someone else changed', async () => {
    try {
      const first = options({ v4: ['10.244.4.0/24'] }, { tableName: table });
      const start = planRulesetUpdate(undefined, first, { full: false });
      await applyRuleset(start.script!);
      // Someone removes our element behind the agent's back.
      await runChecked(systemRunner, 'delete an element', 'nft', ['delete', 'element', 'inet', table, SET_NAMES.clusterV4, '{ 10.244.4.0/24 }']);
      const next = options({ v4: ['10.244.8.0/24'] }, { tableName: table });
      const plan = planRulesetUpdate(start.applied, next, { full: false });
      assert.equal(plan.kind, 'elements');
      await assert.rejects(applyRuleset(plan.script!), /element does not exist|No such file or directory/);
      const retry = planRulesetUpdate(undefined, next, { full: false });
      assert.equal(retry.kind, 'table');
      await applyRuleset(retry.script!);
      assert.deepEqual(await kernelSets(table), renderedSets(next));
    } finally {
      await removeTable(table);
    }
  });
});
