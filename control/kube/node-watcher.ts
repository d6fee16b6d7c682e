/**
 * The agent's view of the cluster's Node objects: client-node's list-then-watch informer
 * (`ListWatch`, what `makeInformer` returns) kept running.
 *
 * In client-node 1.4.0 the informer stops for good on any error other than 410 Gone — a failed
 * list, a refused or reset watch — and must be started again; it also applies no timeout to a
 * watch or a list. This wrapper:
 *
 * - restarts it after each error with exponential backoff (1 s doubling to 30 s, with jitter;
 *   injectable for tests). The informer keeps its resourceVersion, so a restart re-watches from
 *   where it was; if that is too old the server answers 410 and the informer relists, and the
 *   relist reports deletions that happened while it was disconnected;
 * - fails static: while the API server is unreachable the last known Nodes stay in `list()`, so
 *   the mesh keeps its peers (dropping them would cut pod traffic because of a control-plane
 *   outage);
 * - asks the server to end each watch after 5–10 minutes (`timeoutSeconds`, as client-go does)
 *   and aborts a watch that outlives that by 30 s (a silently dead connection), and gives up on
 *   a list after `listTimeoutMs`;
 * - hands out every Node in one shape: watch events arrive as raw JSON in 1.4.0 while lists are
 *   deserialized, so watch objects go through the same deserializer (`V1Node`, Dates included),
 *   cut down to what the agent reads (`slimNode`: no `managedFields`, no `status.images`);
 * - reports `state` for metrics and a 'sync' change after every (re)list has been applied.
 *
 * The informer is built with `new ListWatch(...)`, exactly what `makeInformer` does, but with a
 * `Watch` subclass that tells this class when a list has been applied and a watch opens, and that
 * silences watches and lists belonging to a run that `stop()` has ended.
 */
import {
  CoreV1Api, KubeConfig, ListWatch, loadYaml, Watch,
  type V1Node, type V1NodeList,
} from './kube-client.ts';
import type { AgentLogger } from '../log.ts';
import { RequestTimeoutError, withSignal, withTimeout } from './request-signal.ts';

export type NodeWatcherState = 'starting' | 'synced' | 'error' | 'stopped';

export type NodeChange =
  | { type: 'add' | 'update' | 'delete'; node: V1Node }
  /** A list was applied (first sync or relist): `nodes` is the whole current set. */
  | { type: 'sync'; nodes: V1Node[] };

export type NodeChangeListener = (change: NodeChange) => void;

export interface BackoffOptions {
  /** First delay after an error (default 1000 ms). */
  initialMs?: number;
  /** Upper bound (default 30000 ms). */
  maxMs?: number;
  /** Growth per consecutive failure (default 2). */
  factor?: number;
  /** Each delay is scaled by a random factor in [1 - jitter, 1 + jitter] (default 0.2). */
  jitter?: number;
  random?: () => number;
}

export interface NodeWatcherOptions {
  labelSelector?: string;
  backoff?: BackoffOptions;
  /**
   * A list that takes longer is aborted and counts as an error (default 60000 ms). The first list
   * gets FIRST_LIST_TIMEOUT_MS (or this, if smaller), and each list after one that timed out twice
   * as long, up to this: a list that got no answer is retried in seconds, and a cluster whose lists
   * are just slow still gets the time it needs.
   */
  listTimeoutMs?: number;
  /** The first list's timeout (default FIRST_LIST_TIMEOUT_MS); for tests. */
  firstListTimeoutMs?: number;
  /** Server-side watch timeout; default a random 300–599 s per watch, so agents spread out. */
  watchTimeoutSeconds?: number;
  onChange?: NodeChangeListener;
  onState?: (state: NodeWatcherState, error?: Error) => void;
  log?: AgentLogger;
}

/**
 * How long the first list may take. A list that got no answer at all (seen in the lab: the request
 * reached the API server, no answer came back, the cause is not established) then costs seconds
 * instead of the full list timeout; a list of 5 000 Nodes takes 1-3 s here.
 */
export const FIRST_LIST_TIMEOUT_MS = 10_000;

/** Thrown into the informer for lists of a run that has been stopped; never reported. */
class StaleRunError extends Error {
  constructor() {
    super('node watcher was stopped');
    this.name = 'StaleRunError';
  }
}

function toError(err: unknown): Error {
  if (err instanceof Error) return err;
  const status = err as { statusCode?: unknown; code?: unknown; message?: unknown } | null;
  if (status && typeof status === 'object') {
    // A Status object (ERROR watch event) or similar.
    return new Error(`${String(status.message ?? 'Kubernetes API error')}${status.code !== undefined ? ` (code ${String(status.code)})` : ''}`);
  }
  return new Error(String(err));
}

/** The parts of a Node the agent reads; everything else is dropped from the cache. */
const KEPT = {
  metadata: new Set(['name', 'uid', 'resourceVersion', 'creationTimestamp', 'labels', 'annotations']),
  spec: new Set(['podCIDR', 'podCIDRs']),
  status: new Set(['addresses']),
} as const;

function keepOnly(object: object | undefined, kept: ReadonlySet<string>): void {
  if (!object) return;
  for (const key of Object.keys(object)) if (!kept.has(key)) delete (object as Record<string, unknown>)[key];
}

/**
 * A Node cut down, in place, to what the agent reads: name, version, creation time, labels and
 * annotations, pod CIDRs, addresses. A real Node's bytes are mostly `managedFields` and
 * `status.images` (every image on the node), and at 5 000 Nodes the cache holds every one.
 */
function slimNode(node: V1Node): V1Node {
  keepOnly(node.metadata, KEPT.metadata);
  keepOnly(node.spec, KEPT.spec);
  keepOnly(node.status, KEPT.status);
  return node;
}

/**
 * A watch event's raw Node as `listNode()` hands out its items (Dates included). The package
 * index exports its deserializer only behind `loadYaml` (JSON is YAML), which picks the model from
 * apiVersion and kind: set for it when the event's object lacks them, and removed again.
 */
function deserializeNode(raw: V1Node): V1Node {
  const { managedFields: _dropped, ...metadata } = raw.metadata ?? {};
  const node = loadYaml<V1Node>(JSON.stringify({ ...raw, apiVersion: 'v1', kind: 'Node', metadata }));
  if (raw.apiVersion === undefined) delete node.apiVersion;
  if (raw.kind === undefined) delete node.kind;
  return slimNode(node);
}

interface OpenWatch { cancel(): void }

interface WatchHooks {
  isCurrent(run: number): boolean;
  currentRun(): number;
  /** The informer is about to watch: a list it made (if any) has been applied. */
  watchStarting(run: number): void;
  /** The server answered 200 and the stream is open; `watch.cancel()` ends it without a report. */
  watchOpened(run: number, watch: OpenWatch): void;
  watchClosed(watch: OpenWatch): void;
  watchTimeoutSeconds(): number;
}

const OBJECT_EVENTS = new Set(['ADDED', 'MODIFIED', 'DELETED']);

class GuardedWatch extends Watch {
  readonly #hooks: WatchHooks;

  constructor(kc: KubeConfig, hooks: WatchHooks) {
    super(kc);
    this.#hooks = hooks;
  }

  override async watch(
    path: string,
    queryParams: Record<string, string | number | boolean | undefined>,
    callback: (phase: string, apiObj: unknown, watchObj?: unknown) => void,
    done: (err: unknown) => void,
  ): Promise<AbortController> {
    const hooks = this.#hooks;
    const run = hooks.currentRun();
    // A chain of a stopped run (its list finished after stop()): open nothing.
    if (!hooks.isCurrent(run)) return new AbortController();
    hooks.watchStarting(run);

    const timeoutSeconds = hooks.watchTimeoutSeconds();
    let finished = false;
    let deadline: NodeJS.Timeout | undefined;
    let controller: AbortController | undefined;
    const handle: OpenWatch = {
      cancel: () => {
        finished = true;
        if (deadline) clearTimeout(deadline);
        controller?.abort();
      },
    };
    const onDone = (err: unknown) => {
      if (finished) return;
      finished = true;
      if (deadline) clearTimeout(deadline);
      hooks.watchClosed(handle);
      // After stop() the informer has moved on; its doneHandler would only abort or relist.
      if (hooks.isCurrent(run)) done(err);
    };
    const onEvent = (phase: string, object: unknown, raw?: unknown) => {
      if (!hooks.isCurrent(run) || finished) return;
      const normalized = OBJECT_EVENTS.has(phase) && object !== null && typeof object === 'object'
        ? deserializeNode(object as V1Node)
        : object;
      callback(phase, normalized, raw);
    };

    try {
      controller = await super.watch(path, { ...queryParams, timeoutSeconds }, onEvent, onDone);
    } catch (err) {
      // Building the request failed (credentials, CA file...). The informer calls watch() from
      // callbacks that nobody awaits, so a rejection here would be unhandled: report it as done.
      onDone(err);
      return new AbortController();
    }
    if (finished) return controller;
    if (!hooks.isCurrent(run)) {
      finished = true;
      controller.abort();
      return controller;
    }
    hooks.watchOpened(run, handle);
    const opened = controller;
    deadline = setTimeout(() => {
      opened.abort();
      onDone(new Error(`watch of ${path} still open ${timeoutSeconds + 30} s after its ${timeoutSeconds} s timeout; connection presumed dead`));
    }, (timeoutSeconds + 30) * 1000);
    return controller;
  }
}

export class NodeWatcher {
  readonly #informer: ListWatch<V1Node>;
  readonly #core: CoreV1Api;
  readonly #labelSelector: string | undefined;
  readonly #log: AgentLogger | undefined;
  readonly #onState: ((state: NodeWatcherState, error?: Error) => void) | undefined;
  readonly #listTimeoutMs: number;
  readonly #watchTimeoutSeconds: number | undefined;
  readonly #backoff: Required<BackoffOptions>;
  readonly #listeners = new Set<NodeChangeListener>();

  /** Bumped by start() and stop(): callbacks of an older run are ignored. */
  #run = 0;
  #running = false;
  #state: NodeWatcherState = 'stopped';
  #synced = false;
  #lastError: Error | undefined;
  #restarts = 0;
  #failures = 0;
  #retryTimer: NodeJS.Timeout | undefined;
  #listedRun: number | undefined;
  readonly #listAborts = new Set<AbortController>();
  /** The timeout of the next list: grows after lists that timed out, back to the first after one that did not. */
  #nextListTimeoutMs = 0;
  readonly #firstListTimeout: number;
  readonly #openWatches = new Set<OpenWatch>();
  readonly #syncWaiters = new Set<{ resolve: () => void; reject: (err: Error) => void; timer?: NodeJS.Timeout }>();

  constructor(kubeConfig: KubeConfig, options: NodeWatcherOptions = {}) {
    if (!(kubeConfig instanceof KubeConfig)) throw new TypeError('NodeWatcher: the first argument must be a KubeConfig');
    if (options === null || typeof options !== 'object') throw new TypeError('NodeWatcher: options must be an object');
    const { labelSelector, listTimeoutMs = 60_000, watchTimeoutSeconds } = options;
    if (labelSelector !== undefined && typeof labelSelector !== 'string') throw new TypeError('NodeWatcher: labelSelector must be a string');
    if (!Number.isFinite(listTimeoutMs) || listTimeoutMs <= 0) throw new RangeError(`NodeWatcher: listTimeoutMs must be > 0, got ${listTimeoutMs}`);
    if (watchTimeoutSeconds !== undefined && (!Number.isInteger(watchTimeoutSeconds) || watchTimeoutSeconds < 1)) {
      throw new RangeError(`NodeWatcher: watchTimeoutSeconds must be a positive integer, got ${watchTimeoutSeconds}`);
    }
    const b = options.backoff ?? {};
    this.#backoff = {
      initialMs: b.initialMs ?? 1000, maxMs: b.maxMs ?? 30_000, factor: b.factor ?? 2,
      jitter: b.jitter ?? 0.2, random: b.random ?? Math.random,
    };
    const { initialMs, maxMs, factor, jitter } = this.#backoff;
    if (!(initialMs > 0) || !(maxMs >= initialMs) || !(factor >= 1) || !(jitter >= 0 && jitter < 1)) {
      throw new RangeError(`NodeWatcher: bad backoff (initialMs ${initialMs}, maxMs ${maxMs}, factor ${factor}, jitter ${jitter})`);
    }
    this.#labelSelector = labelSelector || undefined;
    this.#listTimeoutMs = listTimeoutMs;
    this.#firstListTimeout = options.firstListTimeoutMs ?? FIRST_LIST_TIMEOUT_MS;
    if (!(this.#firstListTimeout > 0)) throw new RangeError(`NodeWatcher: firstListTimeoutMs must be > 0, got ${this.#firstListTimeout}`);
    this.#nextListTimeoutMs = this.#firstListTimeoutMs();
    this.#watchTimeoutSeconds = watchTimeoutSeconds;
    this.#log = options.log;
    this.#onState = options.onState;
    if (options.onChange) this.#listeners.add(options.onChange);

    this.#core = kubeConfig.makeApiClient(CoreV1Api);
    const watch = new GuardedWatch(kubeConfig, {
      isCurrent: (run) => this.#running && run === this.#run,
      currentRun: () => this.#run,
      watchStarting: (run) => this.#onWatchStarting(run),
      watchOpened: (run, handle) => this.#onWatchOpened(run, handle),
      watchClosed: (handle) => this.#openWatches.delete(handle),
      watchTimeoutSeconds: () => this.#watchTimeoutSeconds ?? 300 + Math.floor(Math.random() * 300),
    });
    this.#informer = new ListWatch<V1Node>('/api/v1/nodes', watch, () => this.#list(), false, this.#labelSelector);
    this.#informer.on('add', (node) => this.#emit({ type: 'add', node }));
    this.#informer.on('update', (node) => this.#emit({ type: 'update', node }));
    this.#informer.on('delete', (node) => this.#emit({ type: 'delete', node }));
    this.#informer.on('error', (err) => this.#onError(err));
  }

  get state(): NodeWatcherState { return this.#state; }
  /** True once a list has been applied (stays true: the cache is kept across outages). */
  get synced(): boolean { return this.#synced; }
  get lastError(): Error | undefined { return this.#lastError; }
  /** Restarts after errors since construction (for metrics). */
  get restarts(): number { return this.#restarts; }

  /** The current Node objects (the last known ones while the API server is unreachable). */
  list(): V1Node[] { return [...this.#informer.list()]; }

  get(name: string): V1Node | undefined { return this.#informer.get(name); }

  /** Adds a listener for changes; returns a function that removes it. */
  onChange(listener: NodeChangeListener): () => void {
    if (typeof listener !== 'function') throw new TypeError('onChange: listener must be a function');
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  /**
   * Starts listing and watching. Resolves once the first attempt is over: then `state` is
   * 'synced' (Nodes listed, watch open) or 'error' (a retry is scheduled). Never rejects for
   * API errors: those are retried for as long as the watcher runs.
   */
  async start(): Promise<void> {
    if (this.#running) throw new Error('NodeWatcher: already started');
    this.#running = true;
    this.#run += 1;
    this.#failures = 0;
    this.#setState('starting');
    await this.#startInformer();
  }

  /** Stops watching and cancels retries, lists and watches; the last list stays available. */
  async stop(): Promise<void> {
    if (!this.#running) return;
    this.#running = false;
    this.#run += 1;
    if (this.#retryTimer) clearTimeout(this.#retryTimer);
    this.#retryTimer = undefined;
    for (const abort of this.#listAborts) abort.abort();
    for (const watch of this.#openWatches) watch.cancel();
    this.#openWatches.clear();
    await this.#informer.stop();
    this.#setState('stopped');
    for (const waiter of this.#syncWaiters) {
      if (waiter.timer) clearTimeout(waiter.timer);
      waiter.reject(new Error('NodeWatcher stopped before the first sync'));
    }
    this.#syncWaiters.clear();
  }

  /** Resolves once a list has been applied; rejects after `timeoutMs` or on stop(). */
  waitForSync(timeoutMs?: number): Promise<void> {
    if (this.#synced) return Promise.resolve();
    if (!this.#running) return Promise.reject(new Error('NodeWatcher is not started'));
    if (timeoutMs !== undefined && !(timeoutMs > 0)) return Promise.reject(new RangeError(`waitForSync: timeoutMs must be > 0, got ${timeoutMs}`));
    return new Promise((resolve, reject) => {
      const waiter: { resolve: () => void; reject: (err: Error) => void; timer?: NodeJS.Timeout } = { resolve, reject };
      if (timeoutMs !== undefined) {
        waiter.timer = setTimeout(() => {
          this.#syncWaiters.delete(waiter);
          const why = this.#lastError ? ` (last error: ${this.#lastError.message})` : '';
          reject(new Error(`Nodes not listed within ${timeoutMs} ms${why}`));
        }, timeoutMs);
      }
      this.#syncWaiters.add(waiter);
    });
  }

  // ---- internals ----

  #startInformer(): Promise<void> {
    const run = this.#run;
    return this.#informer.start().catch((err: unknown) => {
      if (this.#running && run === this.#run) this.#onError(err);
    });
  }

  #firstListTimeoutMs(): number {
    return Math.min(this.#firstListTimeout, this.#listTimeoutMs);
  }

  async #list(): Promise<V1NodeList> {
    const run = this.#run;
    // The request's own controller, which stop() aborts. withTimeout's signal aborts it too: one
    // controller can be passed to the request, where AbortSignal.any would need Node 20.3.
    const request = new AbortController();
    this.#listAborts.add(request);
    const timeoutMs = this.#nextListTimeoutMs;
    try {
      const param = this.#labelSelector ? { labelSelector: this.#labelSelector } : {};
      const list = await withTimeout(timeoutMs, (timeout) => {
        timeout.addEventListener('abort', () => request.abort(), { once: true });
        return this.#core.listNode(param, withSignal(request.signal));
      });
      if (!this.#running || run !== this.#run) throw new StaleRunError();
      for (const node of list.items) slimNode(node);
      this.#listedRun = run;
      this.#nextListTimeoutMs = this.#firstListTimeoutMs();
      return list;
    } catch (err) {
      if (!this.#running || run !== this.#run) throw new StaleRunError();
      if (err instanceof RequestTimeoutError) {
        this.#nextListTimeoutMs = Math.min(this.#listTimeoutMs, 2 * timeoutMs);
        throw new Error(`listing Nodes timed out after ${timeoutMs} ms`);
      }
      throw err;
    } finally {
      this.#listAborts.delete(request);
    }
  }

  #onWatchStarting(run: number): void {
    if (this.#listedRun !== run) return;
    this.#listedRun = undefined;
    this.#synced = true;
    this.#emit({ type: 'sync', nodes: this.list() });
    for (const waiter of this.#syncWaiters) {
      if (waiter.timer) clearTimeout(waiter.timer);
      waiter.resolve();
    }
    this.#syncWaiters.clear();
  }

  #onWatchOpened(run: number, watch: OpenWatch): void {
    if (!this.#running || run !== this.#run) return;
    this.#openWatches.add(watch);
    if (this.#failures > 0) this.#log?.info('Kubernetes API reachable again: watching Nodes', { failures: this.#failures });
    this.#failures = 0;
    this.#setState('synced');
  }

  #onError(err: unknown): void {
    if (err instanceof StaleRunError || !this.#running) return;
    const error = toError(err);
    this.#lastError = error;
    this.#setState('error', error);
    if (this.#retryTimer) return; // one restart is already scheduled
    const { initialMs, maxMs, factor, jitter, random } = this.#backoff;
    const base = Math.min(maxMs, initialMs * factor ** this.#failures);
    const delay = Math.round(Math.min(maxMs, base * (1 - jitter + 2 * jitter * random())));
    this.#failures += 1;
    this.#log?.warn('Kubernetes Node watch failed; keeping the last known Nodes and retrying', {
      error: error.message, retryInMs: delay, failures: this.#failures, nodes: this.#informer.list().length,
    });
    const run = this.#run;
    this.#retryTimer = setTimeout(() => {
      this.#retryTimer = undefined;
      if (!this.#running || run !== this.#run) return;
      this.#restarts += 1;
      void this.#startInformer();
    }, delay);
  }

  #emit(change: NodeChange): void {
    if (change.type !== 'sync' && !(this.#running)) return;
    for (const listener of this.#listeners) {
      try {
        listener(change);
      } catch (err) {
        // A listener's bug must not stop the informer mid-list.
        this.#log?.error('Node change listener threw', { error: toError(err).message, change: change.type });
      }
    }
  }

  #setState(state: NodeWatcherState, error?: Error): void {
    if (state === this.#state && state !== 'error') return;
    this.#state = state;
    try {
      this.#onState?.(state, error);
    } catch (err) {
      this.#log?.error('Node watcher state listener threw', { error: toError(err).message });
    }
  }
}
