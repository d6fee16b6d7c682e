/**
 * Writing this node's annotations and reading one Node.
 *
 * The agent publishes its facts with a JSON merge patch (RFC 7386) on `metadata.annotations`
 * only: the patch names just our keys, so annotations and fields other controllers own are left
 * alone, a key set to `null` is deleted, and no resourceVersion is sent, so the apiserver applies
 * it to whatever version is current (no read-modify-write race with the kubelet, which updates
 * Node status every few seconds). A full update (PUT) would overwrite the kubelet's changes.
 *
 * Conflicts, throttling, apiserver errors (5xx), network failures and requests unanswered for
 * 10 s are retried a few times with a growing delay; anything else (not found, forbidden,
 * invalid) is final.
 */
import { ApiException, CoreV1Api, KubeConfig, PatchStrategy, setHeaderOptions, type V1Node } from './kube-client.ts';
import { withSignal, withTimeout } from './request-signal.ts';

export interface RetryOptions {
  /** Tries in all, the first included (default 4). */
  attempts?: number;
  /** Delay before the second try; doubles each time up to maxDelayMs (defaults 200 and 3000). */
  initialDelayMs?: number;
  maxDelayMs?: number;
  /** Each try waits this long for an answer (default 10 000): a request on a dead connection never ends by itself. */
  requestTimeoutMs?: number;
  /** For tests. */
  sleep?: (ms: number) => Promise<void>;
}

const REQUEST_TIMEOUT_MS = 10_000;

/** A Kubernetes request that failed for good; `statusCode` is the HTTP status if there was one. */
export class NodeApiError extends Error {
  readonly statusCode: number | undefined;
  readonly attempts: number;
  constructor(message: string, statusCode: number | undefined, attempts: number, cause: unknown) {
    super(message, { cause });
    this.name = 'NodeApiError';
    this.statusCode = statusCode;
    this.attempts = attempts;
  }
}

const RETRYABLE_STATUS = new Set([409, 429, 500, 502, 503, 504]);

// Annotation keys as kube-apiserver validates them: optional DNS-subdomain prefix, then a name.
const KEY_NAME = /^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$/;
const KEY_PREFIX = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const MAX_ANNOTATIONS_BYTES = 256 * 1024;

export function checkAnnotationKey(key: string): void {
  const slash = key.indexOf('/');
  const prefix = slash < 0 ? undefined : key.slice(0, slash);
  const name = slash < 0 ? key : key.slice(slash + 1);
  if (prefix !== undefined && (prefix.length > 253 || !KEY_PREFIX.test(prefix))) {
    throw new Error(`annotation key ${JSON.stringify(key)}: the prefix must be a lowercase DNS subdomain`);
  }
  if (name.length > 63 || !KEY_NAME.test(name)) {
    throw new Error(`annotation key ${JSON.stringify(key)}: the name must be 1-63 letters, digits, "-", "_" or ".", starting and ending with a letter or digit`);
  }
}

function coreApi(client: KubeConfig | CoreV1Api): CoreV1Api {
  if (client instanceof KubeConfig) return client.makeApiClient(CoreV1Api);
  if (client instanceof CoreV1Api) return client;
  throw new TypeError('expected a KubeConfig or a CoreV1Api');
}

function checkNodeName(name: unknown): asserts name is string {
  if (typeof name !== 'string' || name === '') throw new TypeError(`node name must be a non-empty string, got ${JSON.stringify(name)}`);
}

/** The HTTP status of a failed client-node call, if the server answered. */
export function statusCodeOf(err: unknown): number | undefined {
  if (err instanceof ApiException) return err.code;
  const code = (err as { statusCode?: unknown } | null)?.statusCode;
  return typeof code === 'number' ? code : undefined;
}

/**
 * Worth another try: the statuses above, or a network error (node-fetch and Bun put a string
 * `code` such as ECONNREFUSED, ECONNRESET or ConnectionRefused on those). Errors without a code
 * are programming errors and are not retried.
 */
export function isTransient(err: unknown): boolean {
  const status = statusCodeOf(err);
  if (status !== undefined) return RETRYABLE_STATUS.has(status);
  return typeof (err as { code?: unknown } | null)?.code === 'string';
}

function describe(err: unknown): string {
  const status = statusCodeOf(err);
  if (err instanceof ApiException) {
    const body = err.body as { message?: unknown } | string | undefined;
    let message: unknown = typeof body === 'object' && body !== null ? body.message : undefined;
    if (message === undefined && typeof body === 'string') {
      try { message = (JSON.parse(body) as { message?: unknown }).message; } catch { message = body.slice(0, 200); }
    }
    return `HTTP ${status}${message ? `: ${String(message)}` : ''}`;
  }
  return (err as Error)?.message ?? String(err);
}

async function withRetries<T>(what: string, options: RetryOptions, call: (signal: AbortSignal) => Promise<T>): Promise<T> {
  const attempts = options.attempts ?? 4;
  const initial = options.initialDelayMs ?? 200;
  const max = options.maxDelayMs ?? 3000;
  if (!Number.isInteger(attempts) || attempts < 1) throw new RangeError(`attempts must be a positive integer, got ${attempts}`);
  if (!(initial >= 0) || !(max >= initial)) throw new RangeError(`bad retry delays: initialDelayMs ${initial}, maxDelayMs ${max}`);
  const sleep = options.sleep ?? ((ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms)));
  for (let attempt = 1; ; attempt++) {
    try {
      return await withTimeout(options.requestTimeoutMs ?? REQUEST_TIMEOUT_MS, call);
    } catch (err) {
      if (attempt >= attempts || !isTransient(err)) {
        const tries = attempt === 1 ? '' : ` (after ${attempt} attempts)`;
        throw new NodeApiError(`${what} failed${tries}: ${describe(err)}`, statusCodeOf(err), attempt, err);
      }
      await sleep(Math.min(max, initial * 2 ** (attempt - 1)));
    }
  }
}

/**
 * Sets (string) or deletes (null) the given annotations on Node `nodeName` with a JSON merge
 * patch, leaving every other annotation and field as it is. Returns the patched Node.
 */
export async function patchNodeAnnotations(
  client: KubeConfig | CoreV1Api,
  nodeName: string,
  annotations: Record<string, string | null>,
  options: RetryOptions = {},
): Promise<V1Node> {
  checkNodeName(nodeName);
  if (annotations === null || typeof annotations !== 'object' || Array.isArray(annotations)) {
    throw new TypeError('annotations must be an object of key -> string (set) or null (delete)');
  }
  const entries = Object.entries(annotations);
  if (entries.length === 0) throw new RangeError(`patchNodeAnnotations(${nodeName}): no annotations given (skip the call when nothing changed)`);
  let bytes = 0;
  for (const [key, value] of entries) {
    checkAnnotationKey(key);
    if (value !== null && typeof value !== 'string') throw new TypeError(`annotation ${key}: value must be a string or null, got ${typeof value}`);
    bytes += key.length + (value?.length ?? 0);
  }
  if (bytes > MAX_ANNOTATIONS_BYTES) throw new RangeError(`annotations total ${bytes} bytes, more than the apiserver's ${MAX_ANNOTATIONS_BYTES}`);

  const core = coreApi(client);
  const body = { metadata: { annotations } };
  // The generated client would send application/json-patch+json; the header option overrides it.
  const mergePatch = setHeaderOptions('Content-Type', PatchStrategy.MergePatch);
  return withRetries(`patching annotations of node ${JSON.stringify(nodeName)}`, options,
    (signal) => core.patchNode({ name: nodeName, body }, withSignal(signal, mergePatch)));
}

/** Reads one Node (retried like the patch). A missing node is a NodeApiError with statusCode 404. */
export async function readNode(client: KubeConfig | CoreV1Api, name: string, options: RetryOptions = {}): Promise<V1Node> {
  checkNodeName(name);
  const core = coreApi(client);
  return withRetries(`reading node ${JSON.stringify(name)}`, options, (signal) => core.readNode({ name }, withSignal(signal)));
}
