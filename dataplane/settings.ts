/**
 * The data plane's settings: the switches of the data path and the test-only timers, read from
 * the environment once, when `roamguard wg` starts, and validated all at once before anything
 * opens. A wrong value stops the daemon with one line naming the variable, the value and what is
 * accepted (a SettingError, shared with the agent's settings in control/config/settings.ts).
 *
 * Every other module of the data plane gets what it needs from here as explicit options
 * (openTun, FfiUdpBind, selectCrypto, Device; worker threads through workerData): this is the only
 * file under dataplane/ that reads the environment (test/unit/dataplane-settings.test.ts checks).
 * The README's table of these variables is written from DATAPLANE_SETTINGS (same test).
 */
import { TIMING_NAMES, type Timings } from './constants.ts';
import { PROVIDER_NAMES, type ProviderName, type SelectOptions } from './crypto/select.ts';
import { bool, fail, markdownTable, oneOf, readSetting, text, type Env, type Spec } from './setting-spec.ts';

export interface DataplaneSettings {
  /**
   * UDP GSO/GRO (the bind falls back by itself when the kernel refuses them). Off only to force
   * the path a kernel without them takes: test/system/daemon-runtimes.test.ts does.
   */
  udpOffload: boolean;
  /**
   * IFF_VNET_HDR with TSO on the TUN (the device falls back by itself when the kernel refuses
   * them). Off only to force the path a kernel without them takes, as udpOffload.
   */
  tunOffload: boolean;
  /** A crypto provider forced for every group it offers; undefined = the measured order (auto). */
  crypto: ProviderName | undefined;
  /** An explicit libsodium to load before the usual names; empty = only the usual names. */
  libsodium: string;
  /** Shortened protocol timers (tests only); undefined = the protocol's. */
  testTimings: Partial<Timings> | undefined;
}

/** `auto` or a provider of crypto/select.ts. */
function cryptoProvider(doc: string): Spec<ProviderName | undefined> {
  const choices = oneOf<'auto' | ProviderName>('auto', ['auto', ...PROVIDER_NAMES], doc);
  return {
    default: 'auto', doc,
    parse(value, name) {
      const chosen = choices.parse(value, name);
      return chosen === 'auto' ? undefined : chosen;
    },
  };
}

/** A JSON object of positive millisecond values for protocol timers, or empty. */
function timerOverrides(doc: string): Spec<Partial<Timings> | undefined> {
  const accepted = `a JSON object of positive millisecond values for some of ${TIMING_NAMES.join(', ')}, e.g. {"rekeyAfterTime":2000}`;
  return {
    default: '', doc,
    parse(value, name) {
      if (value.trim() === '') return undefined;
      let parsed: unknown;
      try { parsed = JSON.parse(value); } catch { return fail(name, value, accepted); }
      if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed)) return fail(name, value, accepted);
      const out: Partial<Timings> = {};
      for (const [key, v] of Object.entries(parsed)) {
        if (!(TIMING_NAMES as readonly string[]).includes(key) || typeof v !== 'number' || !(v > 0)) fail(name, value, accepted);
        out[key as keyof Timings] = v;
      }
      return out;
    },
  };
}

/** Every setting: environment variable → how to read it. The order is the documentation order. */
export const DATAPLANE_SETTINGS = {
  ROAMGUARD_UDP_OFFLOAD: bool(true, 'UDP GSO/GRO on the sockets; false forces the path of a kernel without them (tests), which the daemon otherwise takes by itself where the kernel refuses them'),
  ROAMGUARD_TUN_OFFLOAD: bool(true, 'open the TUN with IFF_VNET_HDR and TSO (TCP super-packets of up to 64 KiB, split into MTU-sized packets; written segments of one flow coalesced); false forces the path of a kernel without them (tests), which the daemon otherwise takes by itself where the kernel refuses them'),
  ROAMGUARD_CRYPTO: cryptoProvider('force one crypto provider for every primitive group it offers (portable for the rest); auto = the fastest self-tested one per group'),
  ROAMGUARD_LIBSODIUM: text('', 'libsodium to load (a path or library name) before the usual names, for unusual installs',
    { test: (v) => !v.includes('\0'), accepted: 'a file path or library name' }),
  ROAMGUARD_TEST_TIMINGS: timerOverrides('tests only: shortened protocol timers, JSON in milliseconds, e.g. {"rekeyAfterTime":2000}; the daemon logs a warning when set'),
} as const;

type SettingName = keyof typeof DATAPLANE_SETTINGS;

/**
 * Switches that chose between the product's path and a fallback kept for comparison, removed with
 * the fallbacks: variable → the only value left. Set to anything else they stop the daemon, so a
 * deployment that asked for a fallback notices instead of silently running without it.
 */
const RETIRED: Readonly<Record<string, { only: string; why: string }>> = {
  ROAMGUARD_UDP: { only: 'ffi', why: 'the node:dgram bind was removed' },
  ROAMGUARD_POOL: { only: 'ring', why: 'the piscina pool was removed' },
  ROAMGUARD_TUN_READER: { only: 'worker', why: 'the event-loop TUN reader was removed' },
};

/** Reads and validates every data plane setting; throws a SettingError for the first bad value, naming it. */
export function loadDataplaneSettings(env: Env = process.env): DataplaneSettings {
  const get = <N extends SettingName>(name: N): ReturnType<(typeof DATAPLANE_SETTINGS)[N]['parse']> =>
    readSetting(env, name, DATAPLANE_SETTINGS[name] as Spec<unknown>) as ReturnType<(typeof DATAPLANE_SETTINGS)[N]['parse']>;
  for (const [name, { only, why }] of Object.entries(RETIRED)) {
    const value = env[name];
    if (value !== undefined && value.trim() !== '' && value.trim().toLowerCase() !== only) fail(name, value, `${only} or unset (${why})`);
  }
  return {
    udpOffload: get('ROAMGUARD_UDP_OFFLOAD'),
    tunOffload: get('ROAMGUARD_TUN_OFFLOAD'),
    crypto: get('ROAMGUARD_CRYPTO'),
    libsodium: get('ROAMGUARD_LIBSODIUM'),
    testTimings: get('ROAMGUARD_TEST_TIMINGS'),
  };
}

/** The defaults, as a daemon started without any of these variables has them (tests, benches). */
export function defaultDataplaneSettings(): DataplaneSettings {
  return loadDataplaneSettings({});
}

/** What selectCrypto (main thread and crypto workers alike) is given for these settings. */
export function cryptoSelection(settings: DataplaneSettings): Pick<SelectOptions, 'only' | 'libsodium'> {
  return { only: settings.crypto, libsodium: settings.libsodium || undefined };
}

/** The settings documentation as Markdown table rows (README, `roamguard wg --help`). */
export function dataplaneSettingsTable(): string {
  return markdownTable(DATAPLANE_SETTINGS);
}
