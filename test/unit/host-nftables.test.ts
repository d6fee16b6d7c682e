/**
 * The nftables ruleset: its layout, the two Wigglenet flaws it must not have (masquerade without a
 * family or source match), the filter's single narrow drop, and a real `nft -c` check of every
 * combination of options (the kernel validates without changing anything; the suite runs as root).
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import {
  applyRuleset, checkRuleset, removeTable, renderRuleset, type RulesetOptions,
} from '../../control/host/nftables.ts';
import type { CommandOptions, CommandResult, CommandRunner } from '../../control/host/runner.ts';

const CLUSTER = { v4: ['10.244.0.0/24', '10.244.2.0/24', '10.244.3.0/24'], v6: ['fd00:10:244::/64', 'fd00:10:244:2::/64'] };
const LOCAL = { v4: ['10.244.1.0/24'], v6: ['fd00:10:244:1::/64'] };

function options(overrides: Partial<RulesetOptions> = {}): RulesetOptions {
  return {
    masquerade: { ipv4: true, ipv6: true },
    filter: { ipv4: true, ipv6: true },
    clusterPodCidrs: CLUSTER,
    localPodCidrs: LOCAL,
    ...overrides,
  };
}

interface Parsed {
  preamble: string[];
  sets: Map<string, string[]>;
  chains: Map<string, string[]>;
}

/** Splits rendered text into the lines before the table body, sets and chains (rules in order). */
function parse(text: string): Parsed {
  const lines = text.split('\n').map((l) => l.trim()).filter((l) => l !== '' && !l.startsWith('#'));
  const start = lines.findIndex((l) => /^table inet \S+ \{$/.test(l));
  assert.ok(start >= 0, `no table definition in:\n${text}`);
  const parsed: Parsed = { preamble: lines.slice(0, start), sets: new Map(), chains: new Map() };
  let current: string[] | undefined;
  for (const line of lines.slice(start + 1)) {
    const open = /^(set|chain) (\S+) \{$/.exec(line);
    if (open) {
      current = [];
      (open[1] === 'set' ? parsed.sets : parsed.chains).set(open[2], current);
    } else if (line === '}') {
      current = undefined;
    } else {
      assert.ok(current, `line outside a set or chain: ${line}`);
      current.push(line);
    }
  }
  return parsed;
}

const rules = (p: Parsed, chain: string) => (p.chains.get(chain) ?? []).filter((r) => !r.startsWith('type '));

function recordingRunner(answer: Partial<CommandResult> = {}) {
  const calls: Array<{ cmd: string; args: readonly string[]; options?: CommandOptions }> = [];
  const runner: CommandRunner = async (cmd, args, opts) => {
    calls.push({ cmd, args, options: opts });
    return { command: [cmd, ...args].join(' '), code: 0, signal: null, stdout: '', stderr: '', ...answer };
  };
  return { calls, runner };
}

describe('renderRuleset: layout', () => {
  test('one table, replaced in one transaction that also works on a first run', () => {
    const text = renderRuleset(options({ tableName: 'rgtest' }));
    const p = parse(text);
    assert.deepEqual(p.preamble, ['table inet rgtest {}', 'delete table inet rgtest']);
    assert.equal(text.match(/^table /gm)?.length, 2, 'the empty create and the definition');
    assert.equal(text.match(/^delete /gm)?.length, 1);
    assert.match(renderRuleset(options()), /^table inet roamguard \{\}$/m, 'default table name');
  });

  test('sets: the union of all pod CIDRs, summarized, local ones included; interval flags', () => {
    const p = parse(renderRuleset(options()));
    assert.deepEqual(p.sets.get('pod-cidrs-v4'), ['type ipv4_addr', 'flags interval', 'elements = { 10.244.0.0/22 }']);
    assert.deepEqual(p.sets.get('pod-cidrs-v6'), ['type ipv6_addr', 'flags interval', 'elements = { fd00:10:244::/63, fd00:10:244:2::/64 }']);
    assert.deepEqual(p.sets.get('local-pod-cidrs-v4'), ['type ipv4_addr', 'flags interval', 'elements = { 10.244.1.0/24 }']);
    assert.deepEqual(p.sets.get('local-pod-cidrs-v6'), ['type ipv6_addr', 'flags interval', 'elements = { fd00:10:244:1::/64 }']);
  });

  test('empty sets have no elements line (an empty `elements = { }` is a syntax error)', () => {
    const p = parse(renderRuleset(options({ clusterPodCidrs: { v4: [], v6: [] }, localPodCidrs: { v4: [], v6: [] } })));
    for (const name of ['pod-cidrs-v4', 'pod-cidrs-v6', 'local-pod-cidrs-v4', 'local-pod-cidrs-v6']) {
      assert.equal(p.sets.get(name)?.length, 2, name);
    }
  });

  test('same input in another order renders the same bytes', () => {
    const a = renderRuleset(options());
    const b = renderRuleset(options({
      clusterPodCidrs: { v4: [...CLUSTER.v4].reverse(), v6: [...CLUSTER.v6].reverse() },
      localPodCidrs: { v4: LOCAL.v4, v6: ['FD00:10:244:1:0::/64'] },
    }));
    assert.equal(a, b);
  });
});

describe('renderRuleset: masquerade', () => {
  const masqueradeRules = (text: string) => rules(parse(text), 'postrouting').filter((r) => /\bmasquerade\b/.test(r.replace(/comment ".*"$/, '')));

  test('both families: one rule each, gated by family, pod source, non-pod and non-local destination', () => {
    const text = renderRuleset(options());
    assert.deepEqual(masqueradeRules(text), [
      'meta nfproto ipv4 ip saddr @pod-cidrs-v4 ip daddr != @pod-cidrs-v4 fib daddr type != local masquerade comment "pods leaving the pod network"',
      'meta nfproto ipv6 ip6 saddr @pod-cidrs-v6 ip6 daddr != @pod-cidrs-v6 fib daddr type != local masquerade comment "pods leaving the pod network"',
    ]);
    const chain = parse(text).chains.get('postrouting')!;
    assert.equal(chain[0], 'type nat hook postrouting priority srcnat; policy accept;');
  });

  test('IPv4 only: no IPv6 masquerade rule at all (Wigglenet flaw 2)', () => {
    const found = masqueradeRules(renderRuleset(options({ masquerade: { ipv4: true, ipv6: false } })));
    assert.equal(found.length, 1);
    assert.match(found[0], /^meta nfproto ipv4 ip saddr @pod-cidrs-v4 /);
    assert.ok(found.every((r) => !/ip6|ipv6/.test(r)));
  });

  test('IPv6 only: no IPv4 masquerade rule at all', () => {
    const found = masqueradeRules(renderRuleset(options({ masquerade: { ipv4: false, ipv6: true } })));
    assert.equal(found.length, 1);
    assert.match(found[0], /^meta nfproto ipv6 ip6 saddr @pod-cidrs-v6 /);
    assert.ok(found.every((r) => !/\bip saddr|ipv4/.test(r)));
  });

  test('every masquerade rule matches a family and a pod source (Wigglenet flaw 1)', () => {
    for (const masquerade of [{ ipv4: true, ipv6: true }, { ipv4: true, ipv6: false }, { ipv4: false, ipv6: true }]) {
      for (const r of masqueradeRules(renderRuleset(options({ masquerade })))) {
        assert.match(r, /^meta nfproto (ipv4 ip|ipv6 ip6) saddr @pod-cidrs-v[46] /, r);
      }
    }
  });

  test('kube-proxy-marked and host-originated packets return before any masquerade', () => {
    const chain = rules(parse(renderRuleset(options())), 'postrouting');
    assert.match(chain[0], /^meta mark & 0x00004000 == 0x00004000 return\b/);
    assert.match(chain[1], /^fib saddr type local return\b/);
    assert.equal(chain.length, 4);
    const custom = rules(parse(renderRuleset(options({ kubeProxyMasqueradeMark: 0x8000 }))), 'postrouting');
    assert.match(custom[0], /^meta mark & 0x00008000 == 0x00008000 return\b/);
  });

  test('no family masquerades: no nat chain at all', () => {
    const text = renderRuleset(options({ masquerade: { ipv4: false, ipv6: false } }));
    assert.equal(parse(text).chains.has('postrouting'), false);
    assert.doesNotMatch(text, /masquerade|hook postrouting/);
  });
});

describe('renderRuleset: filter', () => {
  test('policy accept, and the only drop is NEW to a local pod, after the dnat accept', () => {
    const p = parse(renderRuleset(options()));
    const chain = p.chains.get('forward')!;
    assert.equal(chain[0], 'type filter hook forward priority filter; policy accept;');
    const fwd = rules(p, 'forward');
    const drops = fwd.filter((r) => / drop\b/.test(r));
    assert.deepEqual(drops.map((r) => r.replace(/ comment ".*"$/, '')), [
      'meta nfproto ipv4 ip daddr @local-pod-cidrs-v4 ct state new drop',
      'meta nfproto ipv6 ip6 daddr @local-pod-cidrs-v6 ct state new drop',
    ]);
    for (const [family, addr] of [['ipv4', 'ip'], ['ipv6', 'ip6']] as const) {
      const mine = fwd.filter((r) => r.startsWith(`meta nfproto ${family} `)).map((r) => r.replace(/ comment ".*"$/, '').replace(`meta nfproto ${family} `, ''));
      const expected = [
        'ct state established,related accept',
        ...(family === 'ipv6' ? ['meta l4proto ipv6-icmp accept'] : []),
        `${addr} saddr @pod-cidrs-v${family.slice(-1)} accept`,
        `${addr} daddr @pod-cidrs-v${family.slice(-1)} ct state != new accept`,
        `${addr} daddr @local-pod-cidrs-v${family.slice(-1)} ct status dnat accept`,
        `${addr} daddr @local-pod-cidrs-v${family.slice(-1)} ct state new drop`,
      ];
      assert.deepEqual(mine, expected, family);
    }
    assert.ok(fwd.every((r) => r.startsWith('meta nfproto ')), 'every filter rule is family-gated');
  });

  test('IPv4-only filter leaves IPv6 alone, and the other way round', () => {
    const v4 = rules(parse(renderRuleset(options({ filter: { ipv4: true, ipv6: false } }))), 'forward');
    assert.ok(v4.length > 0 && v4.every((r) => r.startsWith('meta nfproto ipv4 ')));
    const v6 = rules(parse(renderRuleset(options({ filter: { ipv4: false, ipv6: true } }))), 'forward');
    assert.ok(v6.length > 0 && v6.every((r) => r.startsWith('meta nfproto ipv6 ')));
  });

  test('no family filters: no forward chain at all; never a drop policy', () => {
    const text = renderRuleset(options({ filter: { ipv4: false, ipv6: false } }));
    assert.equal(parse(text).chains.has('forward'), false);
    assert.doesNotMatch(text, /\bdrop\b/);
    for (const filter of [{ ipv4: true, ipv6: true }, { ipv4: true, ipv6: false }]) {
      assert.doesNotMatch(renderRuleset(options({ filter })), /policy drop/);
    }
  });
});

describe('renderRuleset: input checks', () => {
  test('a CIDR of the wrong family, a bad CIDR, a bad table name or switch is refused', () => {
    assert.throws(() => renderRuleset(options({ clusterPodCidrs: { v4: ['fd00::/64'], v6: [] } })), /clusterPodCidrs\.v4 may hold only IPv4 CIDRs, got fd00::\/64/);
    assert.throws(() => renderRuleset(options({ localPodCidrs: { v4: [], v6: ['10.0.0.0/8'] } })), /localPodCidrs\.v6 may hold only IPv6/);
    assert.throws(() => renderRuleset(options({ clusterPodCidrs: { v4: ['10.0.0.1/8'], v6: [] } })), /host bits/);
    assert.throws(() => renderRuleset(options({ tableName: 'rg; flush ruleset' })), /bad nftables table name/);
    assert.throws(() => renderRuleset(options({ tableName: '' })), /bad nftables table name/);
    assert.throws(() => renderRuleset(options({ masquerade: { ipv4: true } as never })), /masquerade must be \{ipv4: boolean, ipv6: boolean\}/);
    assert.throws(() => renderRuleset(options({ filter: { ipv4: 'yes', ipv6: false } as never })), /filter must be/);
    assert.throws(() => renderRuleset(options({ kubeProxyMasqueradeMark: 0 })), /non-zero 32-bit mark/);
    assert.throws(() => renderRuleset(options({ clusterPodCidrs: undefined as never })), /clusterPodCidrs and localPodCidrs are required/);
  });
});

describe('renderRuleset: MSS clamping into the tunnel', () => {
  test('only with a tunnel: SYNs leaving through it get the route\'s MTU as MSS, before the filter, never a drop', () => {
    assert.equal(parse(renderRuleset(options())).chains.get('mss'), undefined);
    const p = parse(renderRuleset(options({ clampMssTo: 'roamguard0' })));
    const mss = p.chains.get('mss')!;
    assert.equal(mss[0], 'type filter hook forward priority mangle; policy accept;');
    assert.deepEqual(rules(p, 'mss').map((r) => r.replace(/ comment ".*"$/, '')), ['oifname "roamguard0" tcp flags & (syn | rst) == syn tcp option maxseg size set rt mtu']);
    assert.throws(() => renderRuleset(options({ clampMssTo: 'rg0"; drop' })), /bad interface name/);
  });
});

describe('nft -c accepts every rendered ruleset (real nft, kernel check, nothing changed)', () => {
  const bools = [false, true];
  for (const m4 of bools) for (const m6 of bools) for (const f4 of bools) for (const f6 of bools) {
    test(`masquerade v4=${m4} v6=${m6}, filter v4=${f4} v6=${f6}`, async () => {
      for (const sets of [{ c: CLUSTER, l: LOCAL }, { c: { v4: [], v6: [] }, l: { v4: [], v6: [] } }]) {
        const text = renderRuleset({
          tableName: 'rgunitcheck', masquerade: { ipv4: m4, ipv6: m6 }, filter: { ipv4: f4, ipv6: f6 },
          clusterPodCidrs: sets.c, localPodCidrs: sets.l, clampMssTo: f4 ? 'rg-unit0' : undefined,
        });
        await checkRuleset(text);
      }
    });
  }

  test('the check is real: overlapping interval elements (what summarizing prevents) are rejected', async () => {
    const broken = renderRuleset(options({ tableName: 'rgunitcheck' }))
      .replace('elements = { 10.244.0.0/22 }', 'elements = { 10.244.0.0/22, 10.244.1.0/24 }');
    assert.notEqual(broken, renderRuleset(options({ tableName: 'rgunitcheck' })));
    await assert.rejects(checkRuleset(broken), /cannot validate the nftables ruleset: nft -c -f - failed/);
  });
});

describe('applyRuleset and removeTable: the commands they run', () => {
  test('apply feeds the whole ruleset to one `nft -f -`', async () => {
    const { calls, runner } = recordingRunner();
    const text = renderRuleset(options());
    await applyRuleset(text, runner);
    assert.equal(calls.length, 1);
    assert.equal(calls[0].cmd, 'nft');
    assert.deepEqual(calls[0].args, ['-f', '-']);
    assert.equal(calls[0].options?.input, text);
  });

  test('remove uses create-then-delete, so removing a missing table succeeds', async () => {
    const { calls, runner } = recordingRunner();
    await removeTable('rgtest', runner);
    assert.deepEqual(calls[0].args, ['-f', '-']);
    assert.equal(calls[0].options?.input, 'table inet rgtest {}\ndelete table inet rgtest\n');
    await assert.rejects(removeTable('bad name', runner), /bad nftables table name/);
  });

  test('a failing nft is an error naming the purpose and nft\'s message', async () => {
    const { runner } = recordingRunner({ code: 1, stderr: 'Error: Could not process rule: Operation not permitted' });
    await assert.rejects(applyRuleset(renderRuleset(options()), runner), (err: Error) => {
      assert.match(err.message, /^cannot apply the nftables ruleset: nft -f - failed \(exit code 1\):/);
      assert.match(err.message, /Operation not permitted/);
      return true;
    });
    await assert.rejects(applyRuleset('', runner), /needs the ruleset text/);
  });
});
