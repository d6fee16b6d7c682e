/**
 * What both settings tables promise of a bad value (dataplane/settings.ts and
 * control/config/settings.ts, through dataplane/setting-spec.ts): a SettingError naming the
 * variable, on one line that starts with NAME="value" is not valid: expected ...
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SettingError } from '../../dataplane/setting-spec.ts';

/** The SettingError that `load` throws for `env`; fails the test when it throws none. */
export function settingErrorFor(load: (env: Record<string, string>) => unknown, env: Record<string, string>): SettingError {
  try {
    load(env);
  } catch (err) {
    assert.ok(err instanceof SettingError, `expected a SettingError, got ${String(err)}`);
    return err;
  }
  assert.fail(`expected ${JSON.stringify(env)} to be rejected`);
}

/** One test per [variable, bad value, what the message must say is accepted]. */
export function testRefusedWithOneLine(load: (env: Record<string, string>) => unknown, cases: ReadonlyArray<readonly [string, string, RegExp]>): void {
  for (const [name, value, accepted] of cases) {
    test(`${name}=${JSON.stringify(value)} is refused with one line naming it`, () => {
      const err = settingErrorFor(load, { [name]: value });
      assert.equal(err.variable, name);
      assert.ok(err.message.startsWith(`${name}=${JSON.stringify(value)} is not valid: expected `), err.message);
      assert.match(err.message, accepted);
      assert.ok(!err.message.includes('\n'), 'one line');
    });
  }
}
