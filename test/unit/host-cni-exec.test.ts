/**
 * Running a conflist as a runtime does, checked with a recording runner: per-plugin configs
 * (name, cniVersion, prevResult chaining, runtimeConfig only for declared capabilities), the CNI_*
 * environment, DEL in reverse with the cached result, and cleanup after a failed ADD.
 * (The real plugins run in test/system/host-firewall.test.ts.)
 */
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { cniAdd, cniDel, parseConflist } from '../../control/host/cni-exec.ts';
import { renderConflist } from '../../control/host/cni-config.ts';
import type { CommandOptions, CommandRunner } from '../../control/host/runner.ts';

const CONFLIST = renderConflist({ name: 'rgnet', mtu: 1400, podCidrs: ['10.244.1.0/24'], dataDir: '/tmp/rg-ipam' });
const INVOCATION = { containerId: 'c0ffee', netns: '/var/run/netns/pod', ifname: 'eth0', pluginDirs: ['/usr/lib/cni'] };

interface Call { binary: string; config: Record<string, unknown>; env: Record<string, string> }

function fakePlugins(fail?: { plugin: string; command: string }) {
  const calls: Call[] = [];
  const runner: CommandRunner = async (cmd, args, options?: CommandOptions) => {
    const config = JSON.parse(options?.input ?? '{}') as Record<string, unknown>;
    const env = { ...(options?.env ?? {}) } as Record<string, string>;
    calls.push({ binary: cmd, config, env });
    const type = String(config.type);
    if (fail && fail.plugin === type && fail.command === env.CNI_COMMAND) {
      return { command: cmd, code: 1, signal: null, stdout: JSON.stringify({ cniVersion: '1.0.0', code: 11, msg: 'no room', details: 'range full' }), stderr: '' };
    }
    const result = type === 'ptp'
      ? { cniVersion: '1.0.0', interfaces: [{ name: 'eth0' }], ips: [{ address: '10.244.1.2/24', gateway: '10.244.1.1', interface: 0 }] }
      : config.prevResult;
    return { command: cmd, code: 0, signal: null, stdout: env.CNI_COMMAND === 'ADD' ? JSON.stringify(result) : '', stderr: '' };
  };
  return { calls, runner };
}

describe('cniAdd / cniDel', () => {
  test('ADD runs each plugin in order with name, cniVersion and the previous result', async () => {
    const { calls, runner } = fakePlugins();
    const result = await cniAdd(CONFLIST, { ...INVOCATION, runner, cniArgs: { K8S_POD_NAME: 'web' } });
    assert.deepEqual(calls.map((c) => c.binary), ['/usr/lib/cni/ptp', '/usr/lib/cni/portmap']);
    const [ptp, portmap] = calls;
    assert.equal(ptp.config.name, 'rgnet');
    assert.equal(ptp.config.cniVersion, '1.0.0');
    assert.equal(ptp.config.mtu, 1400);
    assert.equal('prevResult' in ptp.config, false);
    assert.equal('runtimeConfig' in portmap.config, false, 'no capability args given');
    assert.deepEqual((portmap.config.prevResult as { ips: unknown[] }).ips, [{ address: '10.244.1.2/24', gateway: '10.244.1.1', interface: 0 }]);
    assert.deepEqual(ptp.env, {
      CNI_COMMAND: 'ADD', CNI_CONTAINERID: 'c0ffee', CNI_NETNS: '/var/run/netns/pod', CNI_IFNAME: 'eth0',
      CNI_ARGS: 'IgnoreUnknown=1;K8S_POD_NAME=web', CNI_PATH: '/usr/lib/cni',
    });
    assert.deepEqual((result as { ips: unknown[] }).ips, [{ address: '10.244.1.2/24', gateway: '10.244.1.1', interface: 0 }]);
  });

  test('capability args reach only plugins that declare the capability', async () => {
    const { calls, runner } = fakePlugins();
    const portMappings = [{ hostPort: 8080, containerPort: 80, protocol: 'tcp' }];
    await cniAdd(CONFLIST, { ...INVOCATION, runner, capabilityArgs: { portMappings, bandwidth: { ingressRate: 1 } } });
    assert.equal('runtimeConfig' in calls[0].config, false);
    assert.deepEqual(calls[1].config.runtimeConfig, { portMappings });
  });

  test('DEL runs in reverse order, each plugin given the cached ADD result', async () => {
    const { calls, runner } = fakePlugins();
    const prevResult = { cniVersion: '1.0.0', ips: [{ address: '10.244.1.2/24' }] };
    await cniDel(CONFLIST, { ...INVOCATION, runner, prevResult });
    assert.deepEqual(calls.map((c) => [c.binary, c.env.CNI_COMMAND]), [['/usr/lib/cni/portmap', 'DEL'], ['/usr/lib/cni/ptp', 'DEL']]);
    for (const c of calls) assert.deepEqual(c.config.prevResult, prevResult);
  });

  test('a failed ADD reports the plugin\'s CNI error and deletes what was added', async () => {
    const { calls, runner } = fakePlugins({ plugin: 'portmap', command: 'ADD' });
    await assert.rejects(cniAdd(CONFLIST, { ...INVOCATION, runner }), (err: Error & { cniCode?: number }) => {
      assert.match(err.message, /CNI ADD of plugin "portmap" \(network rgnet, container c0ffee\) failed: no room \(range full\)/);
      assert.equal(err.cniCode, 11);
      return true;
    });
    assert.deepEqual(calls.map((c) => `${c.env.CNI_COMMAND} ${c.config.type}`), ['ADD ptp', 'ADD portmap', 'DEL portmap', 'DEL ptp']);
  });

  test('DEL asks every plugin even when one fails, then reports', async () => {
    const { calls, runner } = fakePlugins({ plugin: 'portmap', command: 'DEL' });
    await assert.rejects(cniDel(CONFLIST, { ...INVOCATION, runner }), /CNI DEL incomplete:\n.*portmap/);
    assert.equal(calls.length, 2);
  });

  test('bad invocations and conflists are refused before anything runs', async () => {
    const { calls, runner } = fakePlugins();
    await assert.rejects(cniAdd(CONFLIST, { ...INVOCATION, runner, netns: 'pod' }), /absolute path of a network namespace/);
    await assert.rejects(cniAdd(CONFLIST, { ...INVOCATION, runner, ifname: 'averyverylongname0' }), /bad CNI ifname/);
    await assert.rejects(cniAdd(CONFLIST, { ...INVOCATION, runner, containerId: '' }), /bad CNI containerId/);
    await assert.rejects(cniAdd(CONFLIST, { ...INVOCATION, runner, cniArgs: { A: 'x;B=y' } }), /bad CNI_ARGS entry/);
    await assert.rejects(cniAdd(CONFLIST, { ...INVOCATION, runner, pluginDirs: ['/nonexistent'] }), /CNI plugin "ptp" not found in \/nonexistent/);
    assert.equal(calls.length, 0);
    assert.throws(() => parseConflist('{'), /not JSON/);
    assert.throws(() => parseConflist({ cniVersion: '1.0.0', name: 'x', plugins: [] }), /no plugins/);
    assert.throws(() => parseConflist({ cniVersion: '1.0.0', plugins: [{ type: 'ptp' }] }), /no name/);
    assert.throws(() => parseConflist({ cniVersion: '1.0.0', name: 'x', plugins: [{ type: '../ptp' }] }), /no valid "type"/);
  });
});
