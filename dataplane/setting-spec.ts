/**
 * One setting read from the environment: its default, its one-line documentation and how a value
 * is parsed and checked. Shared by the node agent's table (control/config/settings.ts) and the
 * data plane's (dataplane/settings.ts), so that both refuse a bad value the same way: a
 * SettingError whose message is one line naming the variable, the value and what is accepted.
 * (It lives under dataplane/ because the control plane already depends on the data plane, never
 * the other way round.)
 */

export class SettingError extends Error {
  constructor(readonly variable: string, readonly value: string, accepted: string) {
    super(`${variable}=${JSON.stringify(value)} is not valid: expected ${accepted}`);
    this.name = 'SettingError';
  }
}

export type Env = Readonly<Record<string, string | undefined>>;

export interface Spec<T> {
  default: string;
  /** For the README and the manifest. */
  doc: string;
  parse(value: string, name: string): T;
}

export function fail(name: string, value: string, accepted: string): never {
  throw new SettingError(name, value, accepted);
}

const TRUE = new Set(['1', 'true', 'yes', 'on']);
const FALSE = new Set(['0', 'false', 'no', 'off', '']);

export function bool(defaultValue: boolean, doc: string): Spec<boolean> {
  return {
    default: String(defaultValue), doc,
    parse(value, name) {
      const v = value.trim().toLowerCase();
      if (TRUE.has(v)) return true;
      if (FALSE.has(v)) return false;
      return fail(name, value, 'true/false (or 1/0, yes/no, on/off)');
    },
  };
}

export function integer(defaultValue: number, min: number, max: number, doc: string): Spec<number> {
  return {
    default: String(defaultValue), doc,
    parse(value, name) {
      if (!/^\d{1,10}$/.test(value.trim())) fail(name, value, `an integer from ${min} to ${max}`);
      const n = Number(value.trim());
      if (n < min || n > max) fail(name, value, `an integer from ${min} to ${max}`);
      return n;
    },
  };
}

export function oneOf<T extends string>(defaultValue: T, choices: readonly T[], doc: string): Spec<T> {
  return {
    default: defaultValue, doc,
    parse(value, name) {
      const v = value.trim().toLowerCase() as T;
      if (!choices.includes(v)) fail(name, value, `one of ${choices.join(', ')}`);
      return v;
    },
  };
}

export function text(defaultValue: string, doc: string, check?: { test: (v: string) => boolean; accepted: string }): Spec<string> {
  return {
    default: defaultValue, doc,
    parse(value, name) {
      const v = value.trim();
      if (check && !check.test(v)) fail(name, value, check.accepted);
      return v;
    },
  };
}

/** The value of `name` in `env` through its spec: unset and empty (or blank) values take the default. */
export function readSetting<T>(env: Env, name: string, spec: Spec<T>): T {
  const raw = env[name];
  return spec.parse(raw === undefined || raw.trim() === '' ? spec.default : raw, name);
}

/** A table of settings as Markdown rows (README, --help): variable, default, meaning. */
export function markdownTable(specs: Readonly<Record<string, Spec<unknown>>>): string {
  const rows = ['| variable | default | meaning |', '|---|---|---|'];
  for (const [name, spec] of Object.entries(specs)) rows.push(`| \`${name}\` | ${spec.default === '' ? '(empty)' : `\`${spec.default}\``} | ${spec.doc} |`);
  return rows.join('\n');
}
