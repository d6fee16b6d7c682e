/**
 * The data plane's settings (dataplane/settings.ts): defaults, every variable's accepted values,
 * one-line errors naming the variable, the README's table, that no other data plane module reads
 * the environment, and that `roamguard wg` stops on a bad value with that one line.
 */
import { spawnSync } from 'node:child_process';
import { readFileSync, readdirSync } from 'node:fs';
import { join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { DATAPLANE_SETTINGS, dataplaneSettingsTable, defaultDataplaneSettings, loadDataplaneSettings } from '../../dataplane/settings.ts';
import { SettingError } from '../../dataplane/setting-spec.ts';
import { settingErrorFor, testRefusedWithOneLine } from '../helpers/setting-cases.ts';
import { SettingError as AgentSettingError } from '../../control/config/settings.ts';

const ROOT = fileURLToPath(new URL('../../', import.meta.url));

const errorLoad = (env: Record<string, string>) => loadDataplaneSettings(env);
const errorFor = (env: Record<string, string>): SettingError => settingErrorFor(errorLoad, env);

/** Every .ts file under dir (recursively), not the compiled .js beside it. */
function typescriptFiles(dir: string): string[] {
  const out: string[] = [];
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) out.push(...typescriptFiles(path));
    else if (entry.name.endsWith('.ts') && !entry.name.endsWith('.d.ts')) out.push(path);
  }
  return out;
}

describe('data plane settings', () => {
  test('defaults: offloads on, no forcing, protocol timers', () => {
    assert.deepEqual(defaultDataplaneSettings(), {
      udpOffload: true, tunOffload: true, crypto: undefined, libsodium: '', testTimings: undefined,
    });
  });

  test('values are read and normalised', () => {
    const s = loadDataplaneSettings({
      ROAMGUARD_UDP_OFFLOAD: '0', ROAMGUARD_TUN_OFFLOAD: 'off',
      ROAMGUARD_CRYPTO: 'Portable', ROAMGUARD_LIBSODIUM: '/opt/lib/libsodium.so',
      ROAMGUARD_TEST_TIMINGS: '{"rekeyAfterTime":2000,"rejectAfterTime":3000}',
    });
    assert.deepEqual(s, {
      udpOffload: false, tunOffload: false,
      crypto: 'portable', libsodium: '/opt/lib/libsodium.so', testTimings: { rekeyAfterTime: 2000, rejectAfterTime: 3000 },
    });
    assert.equal(loadDataplaneSettings({ ROAMGUARD_CRYPTO: 'auto' }).crypto, undefined);
    assert.equal(loadDataplaneSettings({ ROAMGUARD_TUN_OFFLOAD: ' ' }).tunOffload, true, 'blank: the default');
  });

  const bad: Array<[string, string, RegExp]> = [
    ['ROAMGUARD_UDP_OFFLOAD', 'maybe', /true\/false/],
    ['ROAMGUARD_TUN_OFFLOAD', '2', /true\/false/],
    ['ROAMGUARD_CRYPTO', 'openssl', /expected one of auto, openssl-ffi, libsodium-ffi, node:crypto, sodium-wasm, portable$/],
    ['ROAMGUARD_LIBSODIUM', 'lib\0sodium', /a file path or library name/],
    ['ROAMGUARD_TEST_TIMINGS', '{"rekeyAfterTime":-1}', /a JSON object of positive millisecond values/],
  ];
  testRefusedWithOneLine(errorLoad, bad);

  test('the retired switches of removed fallbacks accept only the path that is left', () => {
    assert.deepEqual(loadDataplaneSettings({ ROAMGUARD_UDP: 'ffi', ROAMGUARD_POOL: 'ring', ROAMGUARD_TUN_READER: 'worker' }), defaultDataplaneSettings());
    for (const [name, value, accepted] of [
      ['ROAMGUARD_UDP', 'dgram', 'ffi or unset (the node:dgram bind was removed)'],
      ['ROAMGUARD_POOL', 'piscina', 'ring or unset (the piscina pool was removed)'],
      ['ROAMGUARD_TUN_READER', 'event-loop', 'worker or unset (the event-loop TUN reader was removed)'],
    ]) {
      assert.equal(errorFor({ [name]: value }).message, `${name}=${JSON.stringify(value)} is not valid: expected ${accepted}`);
    }
  });

  test('ROAMGUARD_TEST_TIMINGS refuses unknown timers and what is not an object', () => {
    for (const value of ['{"rekeyAfter":1}', '[1]', 'fast', '{"rekeyTimeout":"5"}']) {
      assert.equal(errorFor({ ROAMGUARD_TEST_TIMINGS: value }).variable, 'ROAMGUARD_TEST_TIMINGS', value);
    }
  });

  test('every setting has a bad-value case above and a row in the table', () => {
    const covered = new Set(bad.map(([name]) => name));
    for (const name of Object.keys(DATAPLANE_SETTINGS)) assert.ok(covered.has(name), `no bad-value test for ${name}`);
    const table = dataplaneSettingsTable();
    for (const name of Object.keys(DATAPLANE_SETTINGS)) assert.match(table, new RegExp(`\\| \`${name}\` \\|`));
  });

  test('the data plane and the agent share one SettingError', () => {
    assert.equal(SettingError, AgentSettingError);
  });

  test('the README lists the data plane settings exactly as the table says', () => {
    const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
    assert.ok(readme.includes(`\n${dataplaneSettingsTable()}\n`), 'README.md: the table under "The daemon" differs from dataplaneSettingsTable() (dataplane/settings.ts): copy it from `roamguard wg --help`');
  });

  test('no module under dataplane/ but settings.ts reads the environment', () => {
    const readers = typescriptFiles(join(ROOT, 'dataplane'))
      .filter((file) => relative(ROOT, file) !== join('dataplane', 'settings.ts'))
      .filter((file) => readFileSync(file, 'utf8').includes('process.env'))
      .map((file) => relative(ROOT, file));
    assert.deepEqual(readers, [], 'these read process.env: add the setting to dataplane/settings.ts and pass it down as an option');
  });

  test('roamguard wg with a bad value exits non-zero with one line on stderr naming the variable and the allowed values', { timeout: 120_000 }, () => {
    const env: NodeJS.ProcessEnv = { ...process.env, ROAMGUARD_RUNTIME: 'node', ROAMGUARD_UDP: 'foo' };
    delete env.LOG_LEVEL;
    const run = spawnSync(join(ROOT, 'bin/roamguard'), ['wg', '--foreground', 'rgbadsetting0'], { env, encoding: 'utf8', timeout: 60_000 });
    assert.notEqual(run.status, 0, `exit status ${run.status}`);
    assert.equal(run.stderr, 'roamguard wg: ROAMGUARD_UDP="foo" is not valid: expected ffi or unset (the node:dgram bind was removed)\n');
    assert.equal(run.stdout, '');
  });
});
