/**
 * Installs the standard CNI plugins the conflist needs (ptp, host-local, portmap, and loopback,
 * which container runtimes call for every pod's `lo`) into the host's plugin directory when they
 * are missing. The container image carries them in /opt/roamguard/cni/bin (built by
 * scripts/build-image-tree.sh from Debian's containernetworking-plugins); the DaemonSet mounts
 * the host's /opt/cni/bin at the same path.
 *
 * - Only missing plugins are installed: a host (or another CNI) that ships its own keeps them,
 *   so an upgrade of roamguard never swaps plugins a node already relies on.
 * - Each copy is atomic: written to a temporary name in the target directory, made 0755, then
 *   renamed, so the runtime never executes a half-written binary; two agents racing both end
 *   with a complete file.
 * - Outside the image (a checkout: no bundled directory) nothing is installed and nothing fails:
 *   the result says so, and the agent logs it once.
 */
import { randomBytes } from 'node:crypto';
import { copyFile, chmod, lstat, mkdir, readdir, rename, unlink } from 'node:fs/promises';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

/** Where the image keeps its plugins: `<roamguard>/cni/bin` next to bin/, dataplane/, control/. */
export const BUNDLED_CNI_BIN_DIR = resolve(dirname(fileURLToPath(import.meta.url)), '../../cni/bin');
/** The host's plugin directory (mounted from the host at the same path). */
export const HOST_CNI_BIN_DIR = '/opt/cni/bin';
/** What the conflist (control/host/cni-config.ts) and the runtime need. */
export const REQUIRED_CNI_PLUGINS: readonly string[] = ['loopback', 'host-local', 'ptp', 'portmap'];

export interface CniInstallOptions {
  /** Default BUNDLED_CNI_BIN_DIR. */
  sourceDir?: string;
  /** Default HOST_CNI_BIN_DIR. */
  targetDir?: string;
  plugins?: readonly string[];
}

export interface CniInstallResult {
  sourceDir: string;
  targetDir: string;
  /** False when there is no bundled plugin directory (not running from the image). */
  bundled: boolean;
  /** Copied now. */
  installed: string[];
  /** Present in the target already (left alone). */
  present: string[];
  /** Missing in the target and not bundled either: pods will fail until someone installs them. */
  unavailable: string[];
}

function code(err: unknown): string | undefined {
  return (err as NodeJS.ErrnoException | null)?.code;
}

async function exists(path: string): Promise<boolean> {
  try {
    await lstat(path);
    return true;
  } catch (err) {
    if (code(err) === 'ENOENT') return false;
    throw err;
  }
}

export async function installCniPlugins(options: CniInstallOptions = {}): Promise<CniInstallResult> {
  const sourceDir = options.sourceDir ?? BUNDLED_CNI_BIN_DIR;
  const targetDir = options.targetDir ?? HOST_CNI_BIN_DIR;
  const plugins = options.plugins ?? REQUIRED_CNI_PLUGINS;
  for (const name of plugins) {
    if (!/^[A-Za-z0-9][A-Za-z0-9._-]*$/.test(name)) throw new Error(`not a plugin name: ${JSON.stringify(name)}`);
  }
  let bundledNames: Set<string>;
  try {
    bundledNames = new Set(await readdir(sourceDir));
  } catch (err) {
    if (code(err) !== 'ENOENT') throw new Error(`cannot read the bundled CNI plugins in ${sourceDir}: ${(err as Error).message}`);
    bundledNames = new Set();
  }
  const result: CniInstallResult = { sourceDir, targetDir, bundled: bundledNames.size > 0, installed: [], present: [], unavailable: [] };
  for (const name of plugins) {
    const target = join(targetDir, name);
    if (await exists(target)) {
      result.present.push(name);
      continue;
    }
    if (!bundledNames.has(name)) {
      result.unavailable.push(name);
      continue;
    }
    await mkdir(targetDir, { recursive: true, mode: 0o755 });
    const temp = join(targetDir, `.${name}.roamguard-${process.pid}-${randomBytes(4).toString('hex')}`);
    try {
      await copyFile(join(sourceDir, name), temp);
      await chmod(temp, 0o755);
      await rename(temp, target);
    } catch (err) {
      await unlink(temp).catch(() => {});
      throw new Error(`cannot install CNI plugin ${name} into ${targetDir}: ${(err as Error).message}`);
    }
    result.installed.push(name);
  }
  return result;
}
