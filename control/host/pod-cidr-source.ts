/**
 * Where this node's pod CIDRs come from, chosen per family:
 *
 *   none   the family has no pods on this node
 *   spec   the Node object: `spec.podCIDRs` (dual-stack clusters), else `spec.podCIDR`
 *          (allocated by kube-controller-manager's --allocate-node-cidrs)
 *   file   a file, one CIDR per line; `#` starts a comment, blank lines are ignored. Meant for
 *          clusters without podCIDR allocation (e.g. provider-routed IPv6 prefixes), and watched,
 *          so an edit takes effect without restarting the agent.
 *
 * Bad entries never stop the agent: they are returned as errors (to be logged) and skipped,
 * because one typo in a hand-edited file must not take the node's pod network down.
 */
import { watch, type FSWatcher } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { dirname } from 'node:path';
import { formatPrefix } from '../../dataplane/net/ip.ts';
import { canonicalPrefixes, parseCidr, prefixFamily } from './cidrs.ts';

export type PodCidrSourceKind = 'none' | 'spec' | 'file';
export const POD_CIDR_SOURCE_KINDS: readonly PodCidrSourceKind[] = ['none', 'spec', 'file'];

/** Checks a configured source name (e.g. from an environment variable). */
export function parsePodCidrSourceKind(value: string, what = 'pod CIDR source'): PodCidrSourceKind {
  const v = typeof value === 'string' ? value.trim().toLowerCase() : value;
  if (!POD_CIDR_SOURCE_KINDS.includes(v as PodCidrSourceKind)) {
    throw new Error(`${what} must be one of ${POD_CIDR_SOURCE_KINDS.join(', ')}, got ${JSON.stringify(value)}`);
  }
  return v as PodCidrSourceKind;
}

/** What a source yielded: canonical, de-duplicated CIDRs, and each entry that was skipped and why. */
export interface PodCidrList {
  cidrs: string[];
  errors: string[];
}

/** The part of a Kubernetes Node this needs (a V1Node fits). */
export interface NodeWithPodCidrs {
  metadata?: { name?: string | null } | null;
  spec?: { podCIDR?: string | null; podCIDRs?: readonly string[] | null } | null;
}

function keepFamily(entries: Array<{ text: string; where: string }>, family: 4 | 6 | undefined): PodCidrList {
  const errors: string[] = [];
  const prefixes = [];
  for (const { text, where } of entries) {
    try {
      const p = parseCidr(text);
      if (family === undefined || prefixFamily(p) === family) prefixes.push(p);
    } catch (err) {
      errors.push(`${where}: ${(err as Error).message}`);
    }
  }
  return { cidrs: canonicalPrefixes(prefixes).map(formatPrefix), errors };
}

/**
 * The Node's pod CIDRs of one family (or both when `family` is undefined), canonical:
 * `spec.podCIDRs` when it is non-empty, else `spec.podCIDR`; empty when the node has none yet
 * (allocation may follow). The API server validates these fields, so an invalid entry means
 * something is badly wrong and is an error rather than a skipped line.
 */
export function podCidrsFromSpec(node: NodeWithPodCidrs, family?: 4 | 6): string[] {
  if (!node || typeof node !== 'object') throw new Error('podCidrsFromSpec needs a Node object');
  const name = node.metadata?.name ?? '(unnamed node)';
  const spec = node.spec ?? {};
  let entries: Array<{ text: string; where: string }> = [];
  if (Array.isArray(spec.podCIDRs) && spec.podCIDRs.length > 0) {
    entries = spec.podCIDRs.map((text, i) => ({ text: String(text), where: `node ${name} spec.podCIDRs[${i}]` }));
  } else if (typeof spec.podCIDR === 'string' && spec.podCIDR !== '') {
    entries = [{ text: spec.podCIDR, where: `node ${name} spec.podCIDR` }];
  }
  const list = keepFamily(entries, family);
  if (list.errors.length > 0) throw new Error(`bad pod CIDRs in the Node object:\n  ${list.errors.join('\n  ')}`);
  return list.cidrs;
}

/**
 * Parses pod CIDR file text: one CIDR per line, `#` to end of line is a comment, blank lines are
 * ignored. Lines that are not a CIDR become errors ("cidrs.txt line 3: …"). `family` keeps only
 * that family; undefined keeps both.
 */
export function parsePodCidrFile(text: string, family?: 4 | 6, sourceName = 'pod CIDR file'): PodCidrList {
  if (typeof text !== 'string') throw new Error('parsePodCidrFile needs the file text');
  const entries: Array<{ text: string; where: string }> = [];
  text.split(/\r?\n/).forEach((raw, i) => {
    const hash = raw.indexOf('#');
    const line = (hash >= 0 ? raw.slice(0, hash) : raw).trim();
    if (line !== '') entries.push({ text: line, where: `${sourceName} line ${i + 1}` });
  });
  return keepFamily(entries, family);
}

/** Reads and parses a pod CIDR file; a file that cannot be read is an error (with the path). */
export async function readPodCidrFile(path: string, family?: 4 | 6): Promise<PodCidrList> {
  if (typeof path !== 'string' || path === '') throw new Error('the pod CIDR file path is empty');
  let text: string;
  try {
    text = await readFile(path, 'utf8');
  } catch (err) {
    throw new Error(`cannot read pod CIDR file ${path}: ${(err as Error).message}`);
  }
  return parsePodCidrFile(text, family, path);
}

export interface PodCidrSources {
  ipv4: PodCidrSourceKind;
  ipv6: PodCidrSourceKind;
  /** Needed when either family uses `file`. */
  filePath?: string;
}

export interface ResolvedPodCidrs {
  v4: string[];
  v6: string[];
  errors: string[];
}

/**
 * This node's pod CIDRs per family from the configured sources. Whether zero CIDRs for a family
 * that is not `none` is fatal (or means "wait for allocation") is the caller's decision.
 */
export async function resolvePodCidrs(sources: PodCidrSources, node: NodeWithPodCidrs | undefined): Promise<ResolvedPodCidrs> {
  const kinds = { 4: parsePodCidrSourceKind(sources?.ipv4, 'ipv4 pod CIDR source'), 6: parsePodCidrSourceKind(sources?.ipv6, 'ipv6 pod CIDR source') } as const;
  if ((kinds[4] === 'file' || kinds[6] === 'file') && !sources.filePath) throw new Error('a file pod CIDR source needs filePath');
  if ((kinds[4] === 'spec' || kinds[6] === 'spec') && !node) throw new Error('a spec pod CIDR source needs the Node object');
  const out: ResolvedPodCidrs = { v4: [], v6: [], errors: [] };
  let fileCache: PodCidrList | undefined;
  for (const family of [4, 6] as const) {
    let list: PodCidrList;
    if (kinds[family] === 'none') continue;
    if (kinds[family] === 'spec') {
      list = { cidrs: podCidrsFromSpec(node!, family), errors: [] };
    } else {
      // Read once for both families, so they come from the same version of the file.
      fileCache ??= await readPodCidrFile(sources.filePath!);
      list = { cidrs: fileCache.cidrs.filter((c) => (family === 4) === !c.includes(':')), errors: fileCache.errors };
    }
    (family === 4 ? out.v4 : out.v6).push(...list.cidrs);
    for (const p of list.errors) if (!out.errors.includes(p)) out.errors.push(p);
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// watching the file

export interface PodCidrFileWatchOptions {
  /** Polling interval, the fallback for filesystems without inotify events. Default 5000 ms. */
  pollIntervalMs?: number;
  /** Quiet time after a change event before reading, so an editor's several writes count once. Default 100 ms. */
  debounceMs?: number;
  /** Called when the file cannot be read (once per distinct error); the last good content stays in force. */
  onError?: (error: Error) => void;
}

export interface PodCidrFileWatch {
  /** Stops watching; no callback runs after it returns. Idempotent. */
  close(): void;
}

/**
 * Calls `onChange` with the parsed file (both families) once the file has been read at start, and
 * again whenever its content changes. Watches the DIRECTORY, not the file: editors and config
 * tools replace a file by renaming a new one over it (and Kubernetes ConfigMap volumes swap a
 * symlinked directory), which a watch on the old inode would never report. Every directory event
 * triggers a (debounced) re-read, and content is compared, so unrelated events cost one read. A
 * timer polls as well, for filesystems that deliver no events; if the directory cannot be watched
 * (yet), polling alone continues and the watch is retried.
 */
export function watchPodCidrFile(path: string, onChange: (list: PodCidrList) => void, options: PodCidrFileWatchOptions = {}): PodCidrFileWatch {
  if (typeof path !== 'string' || path === '') throw new Error('the pod CIDR file path is empty');
  if (typeof onChange !== 'function') throw new Error('watchPodCidrFile needs an onChange callback');
  const pollMs = options.pollIntervalMs ?? 5000;
  const debounceMs = options.debounceMs ?? 100;
  if (!(pollMs >= 10)) throw new Error(`pollIntervalMs must be at least 10, got ${pollMs}`);
  if (!(debounceMs >= 0)) throw new Error(`debounceMs must be non-negative, got ${debounceMs}`);

  let closed = false;
  let lastText: string | undefined;
  let lastError: string | undefined;
  let watcher: FSWatcher | undefined;
  let debounce: ReturnType<typeof setTimeout> | undefined;
  let reading = false;
  let readAgain = false;

  const check = async (): Promise<void> => {
    // One read at a time; an event during a read schedules exactly one more.
    if (reading) { readAgain = true; return; }
    reading = true;
    try {
      do {
        readAgain = false;
        let text: string;
        try {
          text = await readFile(path, 'utf8');
        } catch (err) {
          const message = `cannot read pod CIDR file ${path}: ${(err as Error).message}`;
          if (!closed && message !== lastError) {
            lastError = message;
            options.onError?.(new Error(message));
          }
          continue;
        }
        lastError = undefined;
        if (closed || text === lastText) continue;
        lastText = text;
        onChange(parsePodCidrFile(text, undefined, path));
      } while (readAgain && !closed);
    } finally {
      reading = false;
    }
  };

  const schedule = () => {
    if (closed) return;
    if (debounce) clearTimeout(debounce);
    debounce = setTimeout(() => { debounce = undefined; void check(); }, debounceMs);
  };

  const startWatch = () => {
    if (closed || watcher) return;
    try {
      const w = watch(dirname(path), { persistent: true }, () => schedule());
      w.on('error', () => {
        // The directory went away (or the watch broke): fall back to polling, retry later.
        w.close();
        if (watcher === w) watcher = undefined;
      });
      watcher = w;
    } catch {
      watcher = undefined; // polling covers it until the directory exists
    }
  };

  const poll = setInterval(() => {
    startWatch();
    void check();
  }, pollMs);
  startWatch();
  void check();

  return {
    close() {
      if (closed) return;
      closed = true;
      clearInterval(poll);
      if (debounce) clearTimeout(debounce);
      watcher?.close();
      watcher = undefined;
    },
  };
}
