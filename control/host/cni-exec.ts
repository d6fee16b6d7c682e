/**
 * Runs a CNI network configuration list the way a container runtime (libcni) does, so tests can
 * give a namespace a pod interface with exactly the conflist the agent writes, and the agent can
 * check that the plugin binaries its conflist names exist.
 *
 * A conflist is not fed to a plugin as it is. For each plugin in order (ADD) or reverse order
 * (DEL) the runtime builds one plugin config: the plugin's own object plus the list's `name` and
 * `cniVersion`, the previous plugin's result as `prevResult` (on DEL: the cached ADD result, for
 * every plugin), and a `runtimeConfig` holding those capability arguments the plugin declares in
 * its `capabilities`. The plugin binary named by `type` is looked up in the plugin directories
 * and run with CNI_COMMAND, CNI_CONTAINERID, CNI_NETNS, CNI_IFNAME, CNI_ARGS and CNI_PATH in the
 * environment and the config on stdin; it answers with a result (or an error object) on stdout.
 *
 * Plugins act on the network namespace they are started in as "the host" (ptp puts its host veth
 * end and its routes there), so the runner decides which namespace plays the node.
 */
import { access, constants as fsConstants, stat } from 'node:fs/promises';
import { join } from 'node:path';
import { systemRunner, type CommandRunner } from './runner.ts';

export const DEFAULT_CNI_PLUGIN_DIRS: readonly string[] = ['/opt/cni/bin', '/usr/lib/cni'];

/** A plugin result (CNI spec "Success" object); kept as parsed JSON. */
export type CniResult = Record<string, unknown>;

export interface CniInvocation {
  /** The runtime's container id (any stable id; host-local records leases under it). */
  containerId: string;
  /** Path of the pod's network namespace, e.g. /var/run/netns/NAME. */
  netns: string;
  /** Interface name inside the pod, e.g. eth0. */
  ifname: string;
  /** Directories searched for plugin binaries, in order. Default /opt/cni/bin, /usr/lib/cni. */
  pluginDirs?: readonly string[];
  /** CNI_ARGS key/value pairs (e.g. K8S_POD_NAMESPACE). IgnoreUnknown=1 is always added. */
  cniArgs?: Readonly<Record<string, string>>;
  /** Capability arguments, e.g. {portMappings: [{hostPort: 8080, containerPort: 80, protocol: 'tcp'}]}. */
  capabilityArgs?: Readonly<Record<string, unknown>>;
  /** Where plugins run (they treat that network namespace as the host). Default: this host. */
  runner?: CommandRunner;
  /** Per plugin call. Default 30 000 ms. */
  timeoutMs?: number;
}

interface Conflist {
  cniVersion: string;
  name: string;
  plugins: Array<Record<string, unknown> & { type: string }>;
}

/** A plugin that reported failure (its CNI error code and message are kept). */
export class CniPluginError extends Error {
  constructor(message: string, readonly plugin: string, readonly cniCode: number | undefined) {
    super(message);
    this.name = 'CniPluginError';
  }
}

/** Parses and checks a conflist (text or object): cniVersion, name and a non-empty typed plugin list. */
export function parseConflist(conflist: string | object): Conflist {
  let value: unknown = conflist;
  if (typeof conflist === 'string') {
    try {
      value = JSON.parse(conflist);
    } catch (err) {
      throw new Error(`the conflist is not JSON: ${(err as Error).message}`);
    }
  }
  const c = value as Partial<Conflist> | null;
  if (!c || typeof c !== 'object') throw new Error('the conflist must be a JSON object');
  if (typeof c.cniVersion !== 'string' || c.cniVersion === '') throw new Error('the conflist has no cniVersion');
  if (typeof c.name !== 'string' || c.name === '') throw new Error('the conflist has no name');
  if (!Array.isArray(c.plugins) || c.plugins.length === 0) throw new Error('the conflist has no plugins');
  c.plugins.forEach((p, i) => {
    if (!p || typeof p !== 'object' || typeof p.type !== 'string' || !/^[A-Za-z0-9_.-]+$/.test(p.type)) {
      throw new Error(`conflist plugin [${i}] has no valid "type"`);
    }
  });
  return c as Conflist;
}

/** The plugin binaries a conflist needs: its plugins' types and their IPAM types, de-duplicated. */
export function conflistPluginTypes(conflist: string | object): string[] {
  const types: string[] = [];
  for (const p of parseConflist(conflist).plugins) {
    types.push(p.type);
    const ipam = p.ipam as { type?: unknown } | undefined;
    if (ipam && typeof ipam.type === 'string') types.push(ipam.type);
  }
  return types.filter((t, i) => types.indexOf(t) === i);
}

async function findPlugin(type: string, dirs: readonly string[]): Promise<string | undefined> {
  for (const dir of dirs) {
    const candidate = join(dir, type);
    try {
      await access(candidate, fsConstants.X_OK);
      if ((await stat(candidate)).isFile()) return candidate;
    } catch { /* not in this directory */ }
  }
  return undefined;
}

/** Plugin types (see {@link conflistPluginTypes}) with no executable in any of `pluginDirs`. */
export async function findMissingPlugins(conflist: string | object, pluginDirs: readonly string[] = DEFAULT_CNI_PLUGIN_DIRS): Promise<string[]> {
  const missing: string[] = [];
  for (const type of conflistPluginTypes(conflist)) if (!(await findPlugin(type, pluginDirs))) missing.push(type);
  return missing;
}

function checkInvocation(inv: CniInvocation): void {
  if (!inv || typeof inv !== 'object') throw new Error('a CNI invocation needs {containerId, netns, ifname}');
  if (typeof inv.containerId !== 'string' || !/^[A-Za-z0-9][A-Za-z0-9_.-]*$/.test(inv.containerId)) {
    throw new Error(`bad CNI containerId ${JSON.stringify(inv.containerId)}: letters, digits, "_", "." and "-" only`);
  }
  if (typeof inv.netns !== 'string' || !inv.netns.startsWith('/')) {
    throw new Error(`CNI netns must be the absolute path of a network namespace, got ${JSON.stringify(inv.netns)}`);
  }
  if (typeof inv.ifname !== 'string' || !/^[A-Za-z0-9_.-]{1,15}$/.test(inv.ifname)) {
    throw new Error(`bad CNI ifname ${JSON.stringify(inv.ifname)}: at most 15 characters`);
  }
  for (const [k, v] of Object.entries(inv.cniArgs ?? {})) {
    if (!/^[A-Za-z0-9_]+$/.test(k) || /[;=]/.test(v)) throw new Error(`bad CNI_ARGS entry ${JSON.stringify(k)}=${JSON.stringify(v)}`);
  }
}

/** One plugin's config as libcni builds it. */
function pluginConfig(list: Conflist, plugin: Conflist['plugins'][number], prevResult: CniResult | undefined, capabilityArgs: Readonly<Record<string, unknown>>): string {
  const config: Record<string, unknown> = { ...plugin, name: list.name, cniVersion: list.cniVersion };
  if (prevResult !== undefined) config.prevResult = prevResult;
  const capabilities = (plugin.capabilities ?? {}) as Record<string, unknown>;
  const runtimeConfig: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(capabilityArgs)) if (capabilities[key] === true) runtimeConfig[key] = value;
  if (Object.keys(runtimeConfig).length > 0) config.runtimeConfig = runtimeConfig;
  return JSON.stringify(config);
}

async function execPlugin(command: 'ADD' | 'DEL', list: Conflist, index: number, prevResult: CniResult | undefined, inv: CniInvocation): Promise<CniResult | undefined> {
  const plugin = list.plugins[index];
  const dirs = inv.pluginDirs ?? DEFAULT_CNI_PLUGIN_DIRS;
  const binary = await findPlugin(plugin.type, dirs);
  if (!binary) throw new CniPluginError(`CNI plugin "${plugin.type}" not found in ${dirs.join(', ')}`, plugin.type, undefined);
  const cniArgs = ['IgnoreUnknown=1', ...Object.entries(inv.cniArgs ?? {}).map(([k, v]) => `${k}=${v}`)].join(';');
  const runner = inv.runner ?? systemRunner;
  const result = await runner(binary, [], {
    input: pluginConfig(list, plugin, prevResult, inv.capabilityArgs ?? {}),
    timeoutMs: inv.timeoutMs ?? 30_000,
    env: {
      CNI_COMMAND: command,
      CNI_CONTAINERID: inv.containerId,
      CNI_NETNS: inv.netns,
      CNI_IFNAME: inv.ifname,
      CNI_ARGS: cniArgs,
      CNI_PATH: dirs.join(':'),
    },
  });
  let output: unknown;
  try {
    output = result.stdout.trim() === '' ? undefined : JSON.parse(result.stdout);
  } catch {
    output = undefined;
  }
  if (result.code !== 0 || result.signal !== null) {
    const err = output as { code?: number; msg?: string; details?: string } | undefined;
    const reason = err?.msg ? `${err.msg}${err.details ? ` (${err.details})` : ''}` : (result.stderr.trim() || result.stdout.trim() || `exit code ${result.code}`);
    throw new CniPluginError(`CNI ${command} of plugin "${plugin.type}" (network ${list.name}, container ${inv.containerId}) failed: ${reason}`, plugin.type, err?.code);
  }
  if (command === 'ADD' && (output === undefined || typeof output !== 'object')) {
    throw new CniPluginError(`CNI ADD of plugin "${plugin.type}" printed no result: ${JSON.stringify(result.stdout.slice(0, 200))}`, plugin.type, undefined);
  }
  return output as CniResult | undefined;
}

/**
 * CNI ADD of the whole list: each plugin in order, chaining results. Returns the final result
 * (keep it for {@link cniDel}). If a plugin fails, the plugins already added are deleted again
 * (as a runtime's teardown would) before the error is thrown.
 */
export async function cniAdd(conflist: string | object, inv: CniInvocation): Promise<CniResult> {
  const list = parseConflist(conflist);
  checkInvocation(inv);
  let prev: CniResult | undefined;
  for (let i = 0; i < list.plugins.length; i++) {
    try {
      prev = await execPlugin('ADD', list, i, prev, inv);
    } catch (err) {
      await cniDel(list, { ...inv, prevResult: prev }).catch(() => { /* the ADD error is the one to report */ });
      throw err;
    }
  }
  return prev!;
}

/**
 * CNI DEL of the whole list, plugins in reverse order, each given `prevResult` (the ADD result)
 * when known. Every plugin is asked even if one fails (DEL must release what it can); the errors
 * are thrown together afterwards.
 */
export async function cniDel(conflist: string | object, inv: CniInvocation & { prevResult?: CniResult }): Promise<void> {
  const list = parseConflist(conflist);
  checkInvocation(inv);
  const errors: string[] = [];
  for (let i = list.plugins.length - 1; i >= 0; i--) {
    try {
      await execPlugin('DEL', list, i, inv.prevResult, inv);
    } catch (err) {
      errors.push((err as Error).message);
    }
  }
  if (errors.length > 0) throw new Error(`CNI DEL incomplete:\n  ${errors.join('\n  ')}`);
}
