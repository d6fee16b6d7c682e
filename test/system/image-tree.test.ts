/**
 * The container image's file tree, built by scripts/build-image-tree.sh exactly as the
 * Dockerfile's build stage does (no docker engine runs here), then used the way the image is:
 *
 * - the tree holds the production dependencies only (plus Bun's package for the Bun image), the
 *   four CNI plugins, and no tests;
 * - `roamguard agent --help` runs from it under Node.js and (Bun tree) under Bun, and
 *   `roamguard --help` loads every command; both runtimes run the compiled JavaScript;
 * - the bundled CNI plugins install into an empty plugin directory and run;
 * - the data plane runs from it: `roamguard wg -f IFNAME` in a namespace, configured with `wg`.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { installCniPlugins, REQUIRED_CNI_PLUGINS } from '../../control/host/cni-install.ts';
import { SETTINGS } from '../../control/config/settings.ts';
import { run, Scope, uniqueName, waitFor, WG_SOCKET_DIR } from './netns.ts';
import { REPO_ROOT, requireDaemonPrerequisites } from './userspace-wg.ts';
import { generateKeyPair } from './wireguard-go.ts';

const scope = new Scope();
let base: string;
let nodeApp: string;
let bunApp: string;

before(async () => {
  await requireDaemonPrerequisites(['roamguard-node']);
  base = mkdtempSync(join(tmpdir(), 'roamguard-image-'));
  scope.defer('remove the image trees', () => rmSync(base, { recursive: true, force: true }));
  const build = (runtime: string) => run('bash', [join(REPO_ROOT, 'scripts/build-image-tree.sh'), '--runtime', runtime, join(base, runtime)], { timeoutMs: 120_000 });
  await Promise.all([build('node'), build('bun')]);
  nodeApp = join(base, 'node', 'opt/roamguard');
  bunApp = join(base, 'bun', 'opt/roamguard');
});
after(async () => { await scope.cleanup(); });

describe('the image tree (scripts/build-image-tree.sh)', { timeout: 180_000 }, () => {
  test('contents: sources, production dependencies, CNI plugins, entry links; no tests, no dev tools', () => {
    for (const dir of ['bin', 'dataplane', 'control', 'node_modules', 'cni/bin']) assert.ok(existsSync(join(nodeApp, dir)), dir);
    for (const dep of ['tsx', 'prom-client', 'pino', 'koffi', '@kubernetes/client-node']) assert.ok(existsSync(join(nodeApp, 'node_modules', dep, 'package.json')), `${dep} is there`);
    for (const dev of ['typescript', 'bun', 'kubernetes-models', 'yaml']) assert.ok(!existsSync(join(nodeApp, 'node_modules', dev)), `${dev} is not`);
    assert.ok(existsSync(join(bunApp, 'node_modules/bun/package.json')), 'the Bun tree keeps Bun');
    assert.deepEqual(readdirSync(join(nodeApp, 'cni/bin')).sort(), [...REQUIRED_CNI_PLUGINS].sort());
    for (const p of REQUIRED_CNI_PLUGINS) assert.equal(statSync(join(nodeApp, 'cni/bin', p)).mode & 0o111, 0o111, `${p} is executable`);
    const tests = run('find', [nodeApp, '-path', `${nodeApp}/node_modules`, '-prune', '-o', '-name', '*.test.ts', '-print']);
    return tests.then((r) => assert.equal(r.stdout.trim(), '', 'no test files'));
  });

  test('`roamguard agent --help` and the other commands run from the tree, under Node.js and Bun', async () => {
    const env = { PATH: process.env.PATH ?? '/usr/bin:/bin' };
    for (const [app, runtime] of [[nodeApp, 'node'], [bunApp, 'bun']] as const) {
      const agentHelp = await run(join(app, 'bin/roamguard'), ['--runtime', runtime, 'agent', '--help'], { env, cwd: '/', timeoutMs: 30_000 });
      assert.match(agentHelp.stdout, /^usage: roamguard agent \[--cleanup\]/);
      for (const name of Object.keys(SETTINGS)) assert.ok(agentHelp.stdout.includes(`| \`${name}\` |`), `${runtime}: ${name} in the help`);
    }
    // The tree runs the JavaScript compiled by build-image-tree.sh, on both runtimes.
    for (const [app, runtime] of [[nodeApp, 'node'], [bunApp, 'bun']] as const) {
      const version = await run(join(app, 'bin/roamguard'), ['--runtime', runtime, '--version'], { env, cwd: '/', timeoutMs: 30_000 });
      assert.match(version.stdout, /^roamguard \S+ \(compiled JavaScript\)$/m, `${runtime}: ${version.stdout}`);
    }
    // Every command loads from the tree (the help reads each one's summary).
    const help = await run(join(nodeApp, 'bin/roamguard'), ['--help'], { env, cwd: '/', timeoutMs: 30_000 });
    for (const command of ['wg', 'agent', 'status', 'genkey', 'bench']) assert.match(help.stdout, new RegExp(`^  ${command} `, 'm'), `${command} listed`);
  });

  test('the bundled CNI plugins install into an empty host directory and run', async () => {
    const target = mkdtempSync(join(base, 'host-cni-'));
    const result = await installCniPlugins({ sourceDir: join(nodeApp, 'cni/bin'), targetDir: target });
    assert.deepEqual(result.installed.sort(), [...REQUIRED_CNI_PLUGINS].sort());
    const version = await run(join(target, 'ptp'), [], { env: { CNI_COMMAND: 'VERSION' }, input: '{"cniVersion":"1.0.0"}' });
    assert.ok((JSON.parse(version.stdout).supportedVersions as string[]).includes('1.0.0'), version.stdout);
  });

  test('the data plane runs from the tree: `roamguard wg -f` in a namespace, configured with wg', async () => {
    const ns = await scope.namespace();
    const ifname = uniqueName('rgi');
    const socket = join(WG_SOCKET_DIR, `${ifname}.sock`);
    scope.removeFileAtCleanup(socket);
    const daemon = scope.spawn(ns, join(nodeApp, 'bin/roamguard'), ['wg', '-f', '--threads', '1', ifname], {
      env: { PATH: process.env.PATH ?? '/usr/bin:/bin', LOG_LEVEL: 'error' }, cwd: '/', label: `image-tree daemon ${ifname}`,
    });
    await waitFor(() => !daemon.running || existsSync(socket), 30_000, { description: 'the daemon\'s control socket' });
    assert.ok(daemon.running, daemon.describe());
    const own = await generateKeyPair();
    const peer = await generateKeyPair();
    const keyFile = join(base, 'private.key');
    writeFileSync(keyFile, `${own.privateKey}\n`, { mode: 0o600 });
    await ns.exec('wg', ['set', ifname, 'private-key', keyFile, 'listen-port', '51820', 'peer', peer.publicKey, 'allowed-ips', '10.9.0.2/32', 'endpoint', '192.0.2.2:51820']);
    await ns.ip(['link', 'set', ifname, 'up']);
    const dump = (await ns.exec('wg', ['show', ifname, 'dump'])).stdout.trim().split('\n').map((l) => l.split('\t'));
    assert.deepEqual([dump[0][1], dump[0][2]], [own.publicKey, '51820']);
    assert.deepEqual([dump[1][0], dump[1][2], dump[1][3]], [peer.publicKey, '192.0.2.2:51820', '10.9.0.2/32']);
    await daemon.stop();
  });
});
