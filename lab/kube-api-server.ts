/**
 * A small Kubernetes-API-compatible HTTP server for Node objects, for tests and the local demo
 * (not the agent's: it lives with the lab).
 *
 * It speaks just enough of kube-apiserver's wire protocol for @kubernetes/client-node (and
 * kubectl) to list, get, watch, create, replace, merge-patch and delete `/api/v1/nodes`:
 *
 * - every change bumps one cluster-wide resourceVersion, stored on the object and reported on
 *   lists, so a client can list, then watch "everything after RV N";
 * - a bounded event history serves those watches; a watch from an RV older than the history
 *   gets what kube-apiserver sends: HTTP 200, one `ERROR` event holding a 410 `Expired` Status,
 *   then the end of the stream (the client must relist);
 * - errors are `Status` objects with the code and reason the real server uses;
 * - a change that leaves an object as it was (a no-op patch) bumps nothing and sends no event.
 *
 * Fault injection for tests: `dropWatches()` (abrupt disconnects), `expireHistory()` (next watch
 * from an old RV gets 410), `setFailure()` (answer requests with an error status),
 * `setUnavailable()` (reset every connection, as if the API server were gone), `setLatency()`.
 * Every request is recorded (method, path, query, content type) so a test can tell a merge
 * patch from a full update.
 *
 * Identities and admission (optional): `tokens` maps bearer tokens to users (username, groups,
 * extra such as `authentication.kubernetes.io/node-name`, as a pod-bound service-account token
 * gives); once any token is known, a request without a known token is answered 401. `admission`
 * is asked about every create, update (PUT or PATCH, no-op ones included, as admission runs before
 * storage) and delete over HTTP with the request's user, the object and the old object; a denial
 * is answered 403 Forbidden or 422 Invalid with the policy's message, as kube-apiserver does for a
 * ValidatingAdmissionPolicy (lab/admission-policy.ts evaluates deploy/roamguard.yaml's). Without
 * tokens requests are anonymous; the programmatic API (createNode, updateNode...) is never
 * checked.
 *
 * For kubectl (test/unit/kubectl-lab-api.test.ts runs the machine's): discovery (`/api`, `/api/v1`,
 * `/apis`), Tables when the Accept header asks "as=Table" (lists, gets and watch events, so
 * `get nodes`, `-o wide` and `-w` print real columns; lab/kube-table.ts), the OpenAPI v3 sliver
 * that lets `create -f` leave field validation to this server (lab/kube-openapi.ts; unknown
 * top-level fields are refused under `fieldValidation=Strict`), and empty pod and event lists
 * for `describe node`.
 *
 * Not implemented: RBAC, namespaced resources, subresources (`/status`), JSON patch
 * and server-side apply (answered 415), strategic-merge list semantics (a strategic merge patch
 * is applied as a JSON merge patch, which is exact for maps such as metadata.annotations),
 * bookmarks, `limit`/`continue` paging (the whole list is returned, which the API allows).
 */
import http from 'node:http';
import https from 'node:https';
import type { AddressInfo, Socket } from 'node:net';
import { randomUUID } from 'node:crypto';
import { KubeConfig } from '@kubernetes/client-node';
import { OPENAPI_V3_ROOT, OPENAPI_V3_PATH, openApiV3CoreV1 } from './kube-openapi.ts';
import { nodeTable, parseIncludeObject, tableVersionAccepted, type IncludeObject, type TableGroupVersion } from './kube-table.ts';

export type JsonValue = string | number | boolean | null | JsonValue[] | { [key: string]: JsonValue };
export interface JsonObject { [key: string]: JsonValue }

export interface NodeMetadata {
  name: string;
  uid: string;
  resourceVersion: string;
  creationTimestamp: string;
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  [key: string]: JsonValue | undefined;
}

/** A Node as this server stores and sends it (plain JSON, wire format). */
export interface KubeNode {
  apiVersion: 'v1';
  kind: 'Node';
  metadata: NodeMetadata;
  spec?: JsonObject;
  status?: JsonObject;
}

/** What `createNode` accepts: uid, resourceVersion and creationTimestamp are assigned here. */
export interface NodeInput {
  apiVersion?: string;
  kind?: string;
  metadata: { name: string; labels?: Record<string, string>; annotations?: Record<string, string>; [key: string]: JsonValue | undefined };
  spec?: JsonObject;
  status?: JsonObject;
}

export type WatchEventType = 'ADDED' | 'MODIFIED' | 'DELETED';

/** A Kubernetes `Status` object, the body of every error response. */
export interface KubeStatus {
  kind: 'Status';
  apiVersion: 'v1';
  metadata: JsonObject;
  status: 'Success' | 'Failure';
  message?: string;
  reason?: string;
  details?: { name?: string; kind?: string; uid?: string; causes?: Array<{ reason?: string; message: string; field?: string }> };
  code: number;
}

export interface RecordedRequest {
  method: string;
  /** The URL path without the query. */
  path: string;
  query: Record<string, string>;
  /** The Content-Type header as sent, parameters included. */
  contentType?: string;
  watch: boolean;
}

export interface FailureSpec {
  /** HTTP status to answer with, 400..599. */
  status: number;
  /** How many requests fail (then the setting clears itself); all of them when absent. */
  count?: number;
  reason?: string;
  message?: string;
  /** Only requests this returns true for fail (and count); all when absent. */
  match?: (request: RecordedRequest) => boolean;
}

/** The authenticated user of a request, as kube-apiserver's admission sees it. */
export interface RequestUser {
  username: string;
  uid?: string;
  groups?: string[];
  extra?: Record<string, string[]>;
}

export interface AdmissionAttributes {
  operation: 'CREATE' | 'UPDATE' | 'DELETE';
  resource: 'nodes';
  name: string;
  userInfo: RequestUser;
  /** The object as it would be stored (null for DELETE). */
  object: KubeNode | null;
  /** The stored object (null for CREATE). */
  oldObject: KubeNode | null;
}

export type AdmissionAnswer =
  | { matched: false }
  | { matched: true; allowed: true }
  | { matched: true; allowed: false; reason: string; message: string };

export type AdmissionHook = (request: AdmissionAttributes) => AdmissionAnswer;

export const ANONYMOUS: RequestUser = { username: 'system:anonymous', groups: ['system:unauthenticated'] };

export interface KubeApiServerOptions {
  /**
   * Serve https:// with this key and certificate (PEM). kubectl sends no bearer token over plain
   * http://, and neither does the agent (control/kube/kube-config.ts refuses it).
   */
  tls?: { key: string; cert: string };
  /** Bearer tokens and the users they authenticate (see the file comment). */
  tokens?: Record<string, RequestUser>;
  /** Asked about every write over HTTP (see the file comment). */
  admission?: AdmissionHook;
  /** Default 127.0.0.1. */
  host?: string;
  /** Default 0 (any free port). */
  port?: number;
  /** Watch events kept for watches that resume from an older resourceVersion (default 1000). */
  historyLimit?: number;
  /** The resourceVersion of the empty store (default 1); the first change gets this + 1. */
  initialResourceVersion?: number;
}

/** Thrown by the programmatic API; carries the Status the HTTP API would answer with. */
export class KubeStatusError extends Error {
  readonly status: KubeStatus;
  constructor(status: KubeStatus) {
    super(status.message ?? status.reason ?? `status ${status.code}`);
    this.name = 'KubeStatusError';
    this.status = status;
  }
}

const REASONS: Record<number, string> = {
  400: 'BadRequest', 401: 'Unauthorized', 403: 'Forbidden', 404: 'NotFound', 405: 'MethodNotAllowed',
  409: 'Conflict', 410: 'Expired', 413: 'RequestEntityTooLarge', 415: 'UnsupportedMediaType', 422: 'Invalid',
  429: 'TooManyRequests', 500: 'InternalError', 503: 'ServiceUnavailable', 504: 'Timeout',
};

export function statusObject(code: number, message: string, reason = REASONS[code] ?? 'Unknown', details?: KubeStatus['details']): KubeStatus {
  const status: KubeStatus = { kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Failure', message, reason, code };
  if (details) status.details = details;
  return status;
}

function fail(code: number, message: string, reason?: string, details?: KubeStatus['details']): never {
  throw new KubeStatusError(statusObject(code, message, reason, details));
}

function isPlainObject(value: unknown): value is JsonObject {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

/**
 * RFC 7386 JSON merge patch: objects merge key by key, `null` deletes a key, anything else
 * (arrays included) replaces. Returns a new value; neither input is modified.
 */
export function applyMergePatch(target: JsonValue | undefined, patch: JsonValue): JsonValue {
  if (!isPlainObject(patch)) return structuredClone(patch);
  const result: JsonObject = isPlainObject(target) ? structuredClone(target) : {};
  for (const [key, value] of Object.entries(patch)) {
    if (value === null) delete result[key];
    else result[key] = applyMergePatch(result[key], value);
  }
  return result;
}

// RFC 1123 subdomain, as kube-apiserver validates Node names.
const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;

function checkNodeName(name: unknown): asserts name is string {
  if (typeof name !== 'string' || name === '') fail(422, 'Node is invalid: metadata.name: Required value: name is required', 'Invalid');
  if (name.length > 253 || !DNS_SUBDOMAIN.test(name)) {
    fail(422, `Node "${name}" is invalid: metadata.name: Invalid value: "${name}": a lowercase RFC 1123 subdomain is required`, 'Invalid', { name, kind: 'nodes' });
  }
}

function checkStringMap(value: unknown, what: string, name: string): void {
  if (value === undefined) return;
  if (!isPlainObject(value) || !Object.values(value).every((v) => typeof v === 'string')) {
    fail(422, `Node "${name}" is invalid: ${what}: Invalid value: must be a map of strings`, 'Invalid', { name, kind: 'nodes' });
  }
}

// ---- selectors -------------------------------------------------------------------------------

type Predicate = (node: KubeNode) => boolean;

/** Splits on commas outside parentheses (`a in (x,y),b` is two requirements). */
function splitRequirements(text: string): string[] {
  const parts: string[] = [];
  let depth = 0, start = 0;
  for (let i = 0; i < text.length; i++) {
    if (text[i] === '(') depth++;
    else if (text[i] === ')') depth--;
    else if (text[i] === ',' && depth === 0) { parts.push(text.slice(start, i)); start = i + 1; }
  }
  parts.push(text.slice(start));
  return parts.map((p) => p.trim()).filter((p) => p !== '');
}

/** Label selectors: `k`, `!k`, `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`. */
export function parseLabelSelector(text: string): Predicate {
  const tests: Array<(labels: Record<string, string>) => boolean> = [];
  for (const req of splitRequirements(text)) {
    let m: RegExpMatchArray | null;
    if ((m = req.match(/^([^\s!=(),]+)\s+(in|notin)\s+\(([^)]*)\)$/))) {
      const [, key, op, list] = m;
      const values = new Set(list.split(',').map((v) => v.trim()).filter((v) => v !== ''));
      tests.push(op === 'in' ? (l) => key in l && values.has(l[key]) : (l) => !(key in l) || !values.has(l[key]));
    } else if ((m = req.match(/^([^\s!=(),]+)\s*(==|=|!=)\s*([^\s!=(),]*)$/))) {
      const [, key, op, value] = m;
      tests.push(op === '!=' ? (l) => l[key] !== value : (l) => l[key] === value);
    } else if ((m = req.match(/^!\s*([^\s!=(),]+)$/))) {
      const key = m[1];
      tests.push((l) => !(key in l));
    } else if ((m = req.match(/^([^\s!=(),]+)$/))) {
      const key = m[1];
      tests.push((l) => key in l);
    } else {
      fail(400, `unable to parse requirement: ${JSON.stringify(req)} in label selector ${JSON.stringify(text)}`);
    }
  }
  return (node) => tests.every((t) => t(node.metadata.labels ?? {}));
}

/** Field selectors: only `metadata.name` (`=`, `==`, `!=`), the one field clients use on Nodes. */
export function parseFieldSelector(text: string): Predicate {
  const tests: Predicate[] = [];
  for (const req of splitRequirements(text)) {
    const m = req.match(/^([^\s!=]+)\s*(==|=|!=)\s*(.*)$/);
    if (!m) fail(400, `invalid field selector requirement: ${JSON.stringify(req)}`);
    const [, field, op, value] = m;
    if (field !== 'metadata.name') fail(400, `field label not supported: ${field}`);
    tests.push(op === '!=' ? (n) => n.metadata.name !== value : (n) => n.metadata.name === value);
  }
  return (node) => tests.every((t) => t(node));
}

// ---- kubeconfig helpers ----------------------------------------------------------------------

export interface KubeConfigOptions {
  clusters: Array<{ name: string; server: string; skipTLSVerify: boolean }>;
  users: Array<{ name: string; token?: string }>;
  contexts: Array<{ name: string; cluster: string; user: string }>;
  currentContext: string;
}

function checkServerUrl(url: string): void {
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    throw new Error(`not an API server URL: ${JSON.stringify(url)}`);
  }
  if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') throw new Error(`API server URL must be http:// or https://, got ${JSON.stringify(url)}`);
}

/**
 * Options for `KubeConfig.loadFromOptions` pointing at `url`, with no credentials or a bearer
 * token. client-node refuses plain http unless skipTLSVerify is set, so it is set (there is no
 * TLS). A token over http:// is for tests on loopback only: the agent refuses that combination.
 */
export function kubeConfigOptionsFor(url: string, token?: string): KubeConfigOptions {
  checkServerUrl(url);
  const name = 'roamguard-local';
  return {
    clusters: [{ name, server: url, skipTLSVerify: true }],
    users: [token === undefined ? { name } : { name, token }],
    contexts: [{ name, cluster: name, user: name }],
    currentContext: name,
  };
}

/** A kubeconfig file's text (YAML) pointing at `url`, for KUBECONFIG and kubectl. */
export function kubeConfigFor(url: string, token?: string): string {
  const { clusters: [cluster], contexts: [context] } = kubeConfigOptionsFor(url);
  return [
    'apiVersion: v1',
    'kind: Config',
    'clusters:',
    `- name: ${cluster.name}`,
    '  cluster:',
    `    server: ${JSON.stringify(cluster.server)}`,
    '    insecure-skip-tls-verify: true',
    'users:',
    `- name: ${context.user}`,
    token === undefined ? '  user: {}' : `  user:\n    token: ${JSON.stringify(token)}`,
    'contexts:',
    `- name: ${context.name}`,
    '  context:',
    `    cluster: ${context.cluster}`,
    `    user: ${context.user}`,
    `current-context: ${context.name}`,
    '',
  ].join('\n');
}

/** A `KubeConfig` object pointing at `url`. */
export function kubeConfigObjectFor(url: string, token?: string): KubeConfig {
  const kc = new KubeConfig();
  kc.loadFromOptions(kubeConfigOptionsFor(url, token));
  return kc;
}

// ---- the server ------------------------------------------------------------------------------

interface StoredEvent {
  rv: number;
  type: WatchEventType;
  object: KubeNode;
  /** The object before a MODIFIED event, to turn selector exits and entries into DELETED/ADDED. */
  previous?: KubeNode;
}

interface OpenWatch {
  req: http.IncomingMessage;
  res: http.ServerResponse;
  filter: Predicate;
  timer?: NodeJS.Timeout;
  /** kubectl's watches (`get -w`) want each event's object as a one-row Table. */
  table?: { version: TableGroupVersion; include: IncludeObject };
}

const MAX_BODY_BYTES = 3 * 1024 * 1024; // kube-apiserver's request size limit
const MAX_RECORDED_REQUESTS = 10_000;
const MERGE_PATCH = 'application/merge-patch+json';
const STRATEGIC_MERGE_PATCH = 'application/strategic-merge-patch+json';

export class KubeApiServer {
  readonly #host: string;
  readonly #requestedPort: number;
  readonly #historyLimit: number;
  #server: http.Server | undefined;
  #port = 0;
  #closed = false;

  readonly #nodes = new Map<string, KubeNode>();
  #rv: number;
  /** A watch may resume from any RV >= this; older ones get 410 Expired. */
  #oldestResumableRv: number;
  #history: StoredEvent[] = [];

  readonly #watches = new Set<OpenWatch>();
  readonly #sockets = new Set<Socket>();
  readonly #pendingTimers = new Set<NodeJS.Timeout>();
  readonly #requests: RecordedRequest[] = [];
  #failure: (FailureSpec & { remaining: number }) | undefined;
  #unavailable = false;
  #latencyMs = 0;
  readonly #tokens = new Map<string, RequestUser>();
  #admission: AdmissionHook | undefined;
  readonly #tls: { key: string; cert: string } | undefined;

  constructor(options: KubeApiServerOptions = {}) {
    const { host = '127.0.0.1', port = 0, historyLimit = 1000, initialResourceVersion = 1 } = options;
    for (const [token, user] of Object.entries(options.tokens ?? {})) this.addToken(token, user);
    this.#admission = options.admission;
    this.#tls = options.tls && { key: options.tls.key, cert: options.tls.cert };
    if (typeof host !== 'string' || host === '') throw new Error('KubeApiServer: host must be a non-empty string');
    if (!Number.isInteger(port) || port < 0 || port > 65535) throw new Error(`KubeApiServer: bad port ${port}`);
    if (!Number.isInteger(historyLimit) || historyLimit < 1) throw new Error(`KubeApiServer: historyLimit must be a positive integer, got ${historyLimit}`);
    if (!Number.isSafeInteger(initialResourceVersion) || initialResourceVersion < 1) {
      throw new Error(`KubeApiServer: initialResourceVersion must be a positive integer, got ${initialResourceVersion}`);
    }
    this.#host = host;
    this.#requestedPort = port;
    this.#historyLimit = historyLimit;
    this.#rv = initialResourceVersion;
    this.#oldestResumableRv = initialResourceVersion;
  }

  // ---- lifecycle ----

  async start(): Promise<void> {
    if (this.#server) throw new Error('KubeApiServer: already started');
    if (this.#closed) throw new Error('KubeApiServer: closed servers cannot be restarted');
    const onRequest = (req: http.IncomingMessage, res: http.ServerResponse) => this.#onRequest(req, res);
    const server: http.Server = this.#tls ? https.createServer(this.#tls, onRequest) : http.createServer(onRequest);
    server.on('connection', (socket: Socket) => {
      // "Unavailable" resets every new connection: clients see ECONNRESET, as with a dead server.
      if (this.#unavailable) { socket.destroy(); return; }
      this.#sockets.add(socket);
      socket.on('close', () => this.#sockets.delete(socket));
    });
    server.on('clientError', (_err, socket) => socket.destroy());
    this.#server = server;
    await new Promise<void>((resolve, reject) => {
      server.once('error', reject);
      server.listen(this.#requestedPort, this.#host, () => {
        server.off('error', reject);
        resolve();
      });
    });
    this.#port = (server.address() as AddressInfo).port;
  }

  /** Ends open watches cleanly, closes every connection and stops listening. */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    for (const timer of this.#pendingTimers) clearTimeout(timer);
    this.#pendingTimers.clear();
    for (const watch of [...this.#watches]) this.#endWatch(watch);
    const server = this.#server;
    if (!server) return;
    const closed = new Promise<void>((resolve) => server.close(() => resolve()));
    // Idle keep-alive connections would hold close() open; ended watches have flushed by now.
    for (const socket of this.#sockets) socket.end();
    const force = setTimeout(() => { for (const socket of this.#sockets) socket.destroy(); }, 200);
    await closed;
    clearTimeout(force);
  }

  get url(): string {
    if (!this.#server || this.#port === 0) throw new Error('KubeApiServer: not started');
    const host = this.#host.includes(':') ? `[${this.#host}]` : this.#host;
    return `${this.#tls ? 'https' : 'http'}://${host}:${this.#port}`;
  }

  get port(): number { return this.#port; }

  /** A KubeConfig pointing at this server. */
  kubeConfig(token?: string): KubeConfig { return kubeConfigObjectFor(this.url, token); }

  // ---- store (programmatic API) ----

  /** The current (cluster-wide) resourceVersion. */
  get resourceVersion(): string { return String(this.#rv); }

  createNode(input: NodeInput): KubeNode {
    if (!isPlainObject(input) || !isPlainObject(input.metadata)) fail(400, 'Node must be a JSON object with metadata');
    if (input.kind !== undefined && input.kind !== 'Node') fail(400, `expected kind Node, got ${JSON.stringify(input.kind)}`);
    if (input.apiVersion !== undefined && input.apiVersion !== 'v1') fail(400, `expected apiVersion v1, got ${JSON.stringify(input.apiVersion)}`);
    const name = input.metadata.name;
    checkNodeName(name);
    if (this.#nodes.has(name)) fail(409, `nodes "${name}" already exists`, 'AlreadyExists', { name, kind: 'nodes' });
    const node = structuredClone(input) as unknown as KubeNode;
    node.apiVersion = 'v1';
    node.kind = 'Node';
    node.metadata.uid = randomUUID();
    node.metadata.creationTimestamp = new Date().toISOString().replace(/\.\d{3}Z$/, 'Z');
    node.metadata.resourceVersion = '';
    this.#checkNode(node);
    return this.#commit('ADDED', node);
  }

  /**
   * Changes a node: `mutate` gets a copy to modify in place or to replace by returning a new
   * object. uid and creationTimestamp are kept; the name cannot change.
   */
  updateNode(name: string, mutate: (node: KubeNode) => KubeNode | void): KubeNode {
    if (typeof mutate !== 'function') throw new TypeError('updateNode: mutate must be a function');
    const current = this.#mustGet(name);
    const copy = structuredClone(current);
    const result = mutate(copy) ?? copy;
    return this.#replace(current, result);
  }

  deleteNode(name: string): KubeNode {
    const current = this.#mustGet(name);
    return this.#commit('DELETED', structuredClone(current), current);
  }

  getNode(name: string): KubeNode | undefined {
    const node = this.#nodes.get(name);
    return node && structuredClone(node);
  }

  listNodes(): KubeNode[] {
    return [...this.#nodes.keys()].sort().map((name) => structuredClone(this.#nodes.get(name)!));
  }

  // ---- identities and admission ----

  /** Makes `token` authenticate as `user`; from now on requests without a known token get 401. */
  addToken(token: string, user: RequestUser): void {
    if (typeof token !== 'string' || !/^[\x21-\x7e]+$/.test(token)) throw new Error('addToken: a token is a non-empty string of visible ASCII');
    if (typeof user?.username !== 'string' || user.username === '') throw new Error('addToken: the user needs a username');
    this.#tokens.set(token, structuredClone(user));
  }

  /** Sets (or, with undefined, removes) the admission hook. */
  setAdmission(hook: AdmissionHook | undefined): void {
    this.#admission = hook;
  }

  // ---- fault injection and inspection ----

  /** Requests received so far (oldest first). */
  get requests(): readonly RecordedRequest[] { return this.#requests.slice(); }

  clearRequests(): void { this.#requests.length = 0; }

  /** Number of watch streams open right now. */
  get openWatches(): number { return this.#watches.size; }

  /** Destroys every open watch connection without a clean end (clients see a reset). */
  dropWatches(): void {
    for (const watch of [...this.#watches]) {
      this.#watches.delete(watch);
      if (watch.timer) clearTimeout(watch.timer);
      watch.req.socket.destroy();
    }
  }

  /** Forgets the event history: the next watch from an RV older than now gets 410 Expired. */
  expireHistory(): void {
    this.#history = [];
    this.#oldestResumableRv = this.#rv;
  }

  /** Answers the next `count` requests (all while set, if no count) with an error Status. */
  setFailure(spec: FailureSpec | undefined): void {
    if (spec === undefined) { this.#failure = undefined; return; }
    if (!Number.isInteger(spec.status) || spec.status < 400 || spec.status > 599) throw new Error(`setFailure: status must be 400..599, got ${spec.status}`);
    if (spec.count !== undefined && (!Number.isInteger(spec.count) || spec.count < 1)) throw new Error(`setFailure: count must be a positive integer, got ${spec.count}`);
    this.#failure = { ...spec, remaining: spec.count ?? Infinity };
  }

  /**
   * While unavailable, every connection is reset as soon as it is accepted and the open ones
   * (watches and idle keep-alive connections) are destroyed now.
   */
  setUnavailable(unavailable: boolean): void {
    this.#unavailable = unavailable;
    if (!unavailable) return;
    for (const watch of this.#watches) if (watch.timer) clearTimeout(watch.timer);
    this.#watches.clear();
    for (const socket of this.#sockets) socket.destroy();
  }

  /** Delays every request's handling by `ms` milliseconds. */
  setLatency(ms: number): void {
    if (!Number.isFinite(ms) || ms < 0) throw new Error(`setLatency: expected milliseconds >= 0, got ${ms}`);
    this.#latencyMs = ms;
  }

  // ---- internals: store ----

  #mustGet(name: string): KubeNode {
    if (typeof name !== 'string') throw new TypeError('node name must be a string');
    const node = this.#nodes.get(name);
    if (!node) fail(404, `nodes "${name}" not found`, 'NotFound', { name, kind: 'nodes' });
    return node;
  }

  #checkNode(node: KubeNode): void {
    const name = node.metadata.name;
    checkStringMap(node.metadata.labels, 'metadata.labels', name);
    checkStringMap(node.metadata.annotations, 'metadata.annotations', name);
    if (node.spec !== undefined && !isPlainObject(node.spec)) fail(422, `Node "${name}" is invalid: spec must be an object`, 'Invalid');
    if (node.status !== undefined && !isPlainObject(node.status)) fail(422, `Node "${name}" is invalid: status must be an object`, 'Invalid');
  }

  /**
   * Replaces `current` with `next`, keeping the server-owned metadata; no-op changes commit
   * nothing. With `user` (an HTTP request) the change is admitted first.
   */
  #replace(current: KubeNode, next: unknown, user?: RequestUser): KubeNode {
    if (!isPlainObject(next) || !isPlainObject(next.metadata)) fail(400, 'Node must be a JSON object with metadata');
    const node = next as unknown as KubeNode;
    const name = current.metadata.name;
    if (node.metadata.name !== name) {
      fail(400, `the name of the object (${String(node.metadata.name)}) does not match the name on the URL (${name})`);
    }
    if (node.kind !== undefined && node.kind !== 'Node') fail(400, `expected kind Node, got ${JSON.stringify(node.kind)}`);
    node.apiVersion = 'v1';
    node.kind = 'Node';
    node.metadata.uid = current.metadata.uid;
    node.metadata.creationTimestamp = current.metadata.creationTimestamp;
    node.metadata.resourceVersion = current.metadata.resourceVersion;
    this.#checkNode(node);
    if (user) this.#admit({ operation: 'UPDATE', resource: 'nodes', name, userInfo: user, object: node, oldObject: current });
    if (JSON.stringify(node) === JSON.stringify(current)) return structuredClone(current);
    return this.#commit('MODIFIED', node, current);
  }

  /** createNode for an HTTP request: the object as it would be stored is admitted first. */
  #create(input: NodeInput, user: RequestUser): KubeNode {
    if (this.#admission && isPlainObject(input) && isPlainObject(input.metadata) && typeof input.metadata.name === 'string') {
      const object = structuredClone(input) as unknown as KubeNode;
      object.apiVersion = 'v1';
      object.kind = 'Node';
      this.#admit({ operation: 'CREATE', resource: 'nodes', name: input.metadata.name, userInfo: user, object, oldObject: null });
    }
    return this.createNode(input);
  }

  /** The user a request's bearer token names; anonymous while no token is configured. */
  #authenticate(req: http.IncomingMessage): RequestUser {
    if (this.#tokens.size === 0) return ANONYMOUS;
    const header = req.headers.authorization ?? '';
    const token = /^Bearer (\S+)$/i.exec(header)?.[1];
    const user = token === undefined ? undefined : this.#tokens.get(token);
    if (!user) fail(401, 'Unauthorized', 'Unauthorized');
    return structuredClone(user);
  }

  /** Refuses the request as kube-apiserver does when a validating admission policy denies it. */
  #admit(request: AdmissionAttributes): void {
    if (!this.#admission) return;
    // kube-apiserver's typed objects always carry spec and status (Go structs), so the policy's
    // expressions may rely on them; this store keeps whatever the test created.
    const typed = (node: KubeNode | null) => node && { ...structuredClone(node), spec: node.spec ?? {}, status: node.status ?? {} };
    const answer = this.#admission({ ...structuredClone(request), object: typed(request.object), oldObject: typed(request.oldObject) });
    if (!answer.matched || answer.allowed) return;
    const details = { name: request.name, kind: 'nodes' };
    if (answer.reason === 'Forbidden') fail(403, `nodes "${request.name}" is forbidden: ${answer.message}`, 'Forbidden', details);
    if (answer.reason === 'Unauthorized') fail(401, answer.message, 'Unauthorized', details);
    if (answer.reason === 'RequestEntityTooLarge') fail(413, answer.message, 'RequestEntityTooLarge', details);
    // As an Invalid error with one cause on no field: kubectl prints 'The nodes "x" is invalid: : …'.
    fail(422, `Node "${request.name}" is invalid: : ${answer.message}`, 'Invalid', { ...details, causes: [{ reason: 'FieldValueInvalid', message: answer.message, field: '' }] });
  }

  #commit(type: WatchEventType, node: KubeNode, previous?: KubeNode): KubeNode {
    this.#rv += 1;
    node.metadata.resourceVersion = String(this.#rv);
    if (type === 'DELETED') this.#nodes.delete(node.metadata.name);
    else this.#nodes.set(node.metadata.name, node);
    const event: StoredEvent = { rv: this.#rv, type, object: structuredClone(node) };
    if (type === 'MODIFIED' && previous) event.previous = structuredClone(previous);
    this.#history.push(event);
    while (this.#history.length > this.#historyLimit) this.#oldestResumableRv = this.#history.shift()!.rv;
    for (const watch of this.#watches) this.#send(watch, event);
    return structuredClone(node);
  }

  // ---- internals: HTTP ----

  #onRequest(req: http.IncomingMessage, res: http.ServerResponse): void {
    if (this.#unavailable) { req.socket.destroy(); return; }
    res.on('error', () => { /* the client went away; nothing to tell it */ });
    const url = new URL(req.url ?? '/', 'http://localhost');
    const query = Object.fromEntries(url.searchParams);
    const watch = query.watch === 'true' || query.watch === '1';
    const contentType = req.headers['content-type'];
    const record: RecordedRequest = { method: req.method ?? 'GET', path: url.pathname, query, watch };
    if (contentType !== undefined) record.contentType = contentType;
    this.#requests.push(record);
    // Bounded, so a long-running demo server does not grow without end.
    if (this.#requests.length > MAX_RECORDED_REQUESTS) this.#requests.splice(0, this.#requests.length - MAX_RECORDED_REQUESTS);
    const handle = () => {
      this.#handle(req, res, url, record).catch((err: unknown) => {
        if (err instanceof KubeStatusError) this.#sendJson(res, err.status.code, err.status);
        else this.#sendJson(res, 500, statusObject(500, `internal error: ${(err as Error)?.message ?? String(err)}`));
      });
    };
    if (this.#latencyMs > 0) {
      const timer = setTimeout(() => { this.#pendingTimers.delete(timer); handle(); }, this.#latencyMs);
      this.#pendingTimers.add(timer);
    } else {
      handle();
    }
  }

  async #handle(req: http.IncomingMessage, res: http.ServerResponse, url: URL, record: RecordedRequest): Promise<void> {
    const body = req.method === 'POST' || req.method === 'PUT' || req.method === 'PATCH' ? await readBody(req) : undefined;
    if (res.destroyed || this.#unavailable) { req.socket.destroy(); return; }

    const failure = this.#failure;
    if (failure && (!failure.match || failure.match(record))) {
      if (--failure.remaining <= 0) this.#failure = undefined;
      const status = statusObject(failure.status, failure.message ?? `injected failure (${failure.status})`, failure.reason);
      this.#sendJson(res, failure.status, status);
      return;
    }

    const path = url.pathname.replace(/\/+$/, '');
    if (path === '/healthz' || path === '/readyz' || path === '/livez') {
      res.writeHead(200, { 'Content-Type': 'text/plain; charset=utf-8' });
      res.end('ok');
      return;
    }
    if (path === '/version') {
      this.#sendJson(res, 200, { major: '1', minor: '34', gitVersion: 'v1.34.0-roamguard-fake', platform: 'linux/amd64' });
      return;
    }
    const user = this.#authenticate(req);
    const method = req.method ?? 'GET';
    if (path === '/api' || path === '/apis' || path === '/api/v1') return this.#sendJson(res, 200, discovery(path));
    // kubectl create/apply first checks here whether the server validates fields itself.
    if (path === OPENAPI_V3_ROOT) return this.#sendJson(res, 200, { paths: { 'api/v1': { serverRelativeURL: `${OPENAPI_V3_PATH}?hash=roamguard-lab-1` } } });
    if (path === OPENAPI_V3_PATH) return this.#sendJson(res, 200, openApiV3CoreV1());
    // kubectl describe node lists the node's pods and events: this server keeps neither.
    const empty = path.match(/^\/api\/v1(?:\/namespaces\/[^/]+)?\/(pods|events)$/);
    if (empty && method === 'GET' && !record.watch) {
      return this.#sendJson(res, 200, { kind: empty[1] === 'pods' ? 'PodList' : 'EventList', apiVersion: 'v1', metadata: { resourceVersion: this.resourceVersion }, items: [] });
    }
    const match = path.match(/^\/api\/v1\/nodes(?:\/([^/]+))?$/);
    if (!match) fail(404, 'the server could not find the requested resource', 'NotFound');
    const name = match[1] === undefined ? undefined : decodeURIComponent(match[1]);
    const table = this.#tableWanted(req, url);

    if (name === undefined) {
      if (method === 'GET' && record.watch) return this.#serveWatch(req, res, url, table);
      if (method === 'GET') {
        const list = this.#list(url);
        if (!table) return this.#sendJson(res, 200, list);
        return this.#sendJson(res, 200, nodeTable(list.items as unknown as KubeNode[], { ...table, resourceVersion: this.resourceVersion }));
      }
      if (method === 'POST') {
        const input = parseJson(body!);
        if (url.searchParams.get('fieldValidation') === 'Strict') checkKnownFields(input);
        return this.#sendJson(res, 201, this.#create(input as unknown as NodeInput, user));
      }
      fail(405, `method ${method} is not supported on the nodes collection`, 'MethodNotAllowed');
    }
    switch (method) {
      case 'GET': {
        const node = this.#mustGet(name);
        return this.#sendJson(res, 200, table ? nodeTable([node], { ...table, resourceVersion: node.metadata.resourceVersion }) : node);
      }
      case 'PUT': {
        const current = this.#mustGet(name);
        const next = parseJson(body!);
        this.#checkPrecondition(current, next);
        return this.#sendJson(res, 200, this.#replace(current, next, user));
      }
      case 'PATCH':
        return this.#sendJson(res, 200, this.#patch(name, record.contentType, body!, user));
      case 'DELETE': {
        this.#admit({ operation: 'DELETE', resource: 'nodes', name, userInfo: user, object: null, oldObject: this.#mustGet(name) });
        const deleted = this.deleteNode(name);
        return this.#sendJson(res, 200, {
          kind: 'Status', apiVersion: 'v1', metadata: {}, status: 'Success',
          details: { name, kind: 'nodes', uid: deleted.metadata.uid },
        });
      }
      default:
        fail(405, `method ${method} is not supported on nodes`, 'MethodNotAllowed');
    }
  }

  /** A Table answer when the Accept header asks for one (kubectl get's human-readable output). */
  #tableWanted(req: http.IncomingMessage, url: URL): OpenWatch['table'] {
    const version = tableVersionAccepted(req.headers.accept);
    if (!version) return undefined;
    try {
      return { version, include: parseIncludeObject(url.searchParams.get('includeObject')) };
    } catch (err) {
      fail(400, (err as Error).message, 'BadRequest');
    }
  }

  #filterFor(url: URL): Predicate {
    const labels = url.searchParams.get('labelSelector');
    const fields = url.searchParams.get('fieldSelector');
    const byLabel = labels ? parseLabelSelector(labels) : undefined;
    const byField = fields ? parseFieldSelector(fields) : undefined;
    return (node) => (!byLabel || byLabel(node)) && (!byField || byField(node));
  }

  #list(url: URL): JsonObject & { items: JsonValue[] } {
    const filter = this.#filterFor(url);
    return {
      kind: 'NodeList',
      apiVersion: 'v1',
      metadata: { resourceVersion: this.resourceVersion },
      items: this.listNodes().filter(filter) as unknown as JsonValue[],
    };
  }

  /** Optimistic concurrency: a resourceVersion in the body must be the current one. */
  #checkPrecondition(current: KubeNode, body: JsonValue): void {
    const rv = isPlainObject(body) && isPlainObject(body.metadata) ? body.metadata.resourceVersion : undefined;
    if (rv !== undefined && rv !== null && rv !== '' && rv !== current.metadata.resourceVersion) {
      fail(409, `Operation cannot be fulfilled on nodes "${current.metadata.name}": the object has been modified; please apply your changes to the latest version and try again`,
        'Conflict', { name: current.metadata.name, kind: 'nodes' });
    }
  }

  #patch(name: string, contentType: string | undefined, body: Buffer, user: RequestUser): KubeNode {
    const mediaType = (contentType ?? '').split(';')[0].trim().toLowerCase();
    if (mediaType !== MERGE_PATCH && mediaType !== STRATEGIC_MERGE_PATCH) {
      fail(415, `the body of the request was in an unknown format - accepted media types include: ${MERGE_PATCH}, ${STRATEGIC_MERGE_PATCH}`, 'UnsupportedMediaType');
    }
    const patch = parseJson(body);
    if (!isPlainObject(patch)) fail(400, 'a merge patch for a Node must be a JSON object');
    if (mediaType === STRATEGIC_MERGE_PATCH && JSON.stringify(patch).includes('"$')) {
      // Directives ($patch, $retainKeys, $setElementOrder...) would silently mean something else here.
      fail(400, 'strategic merge patch directives ($...) are not supported by this server');
    }
    const current = this.#mustGet(name);
    this.#checkPrecondition(current, patch);
    const merged = applyMergePatch(current as unknown as JsonObject, patch);
    return this.#replace(current, merged, user);
  }

  #serveWatch(req: http.IncomingMessage, res: http.ServerResponse, url: URL, table?: OpenWatch['table']): void {
    const filter = this.#filterFor(url);
    const rvText = url.searchParams.get('resourceVersion') ?? '';
    const timeoutText = url.searchParams.get('timeoutSeconds');
    if (rvText !== '' && !/^\d+$/.test(rvText)) fail(400, `resourceVersion: Invalid value: ${JSON.stringify(rvText)}: must be an integer`, 'BadRequest');
    if (timeoutText !== null && !/^\d+$/.test(timeoutText)) fail(400, `timeoutSeconds: Invalid value: ${JSON.stringify(timeoutText)}`, 'BadRequest');

    res.writeHead(200, { 'Content-Type': 'application/json', 'Cache-Control': 'no-cache, private' });
    res.flushHeaders();
    const watch: OpenWatch = { req, res, filter };
    if (table) watch.table = table;

    if (rvText === '' || rvText === '0') {
      // "Any version": start with the current state as synthetic ADDED events.
      for (const node of this.listNodes()) if (filter(node)) this.#write(watch, 'ADDED', node);
    } else {
      const since = Number(rvText);
      if (since < this.#oldestResumableRv) {
        const status = statusObject(410, `too old resource version: ${since} (${this.#oldestResumableRv})`, 'Expired');
        res.end(`${JSON.stringify({ type: 'ERROR', object: status })}\n`);
        return;
      }
      for (const event of this.#history) if (event.rv > since) this.#send(watch, event);
    }

    this.#watches.add(watch);
    res.on('close', () => {
      this.#watches.delete(watch);
      if (watch.timer) clearTimeout(watch.timer);
    });
    const timeout = timeoutText === null ? 0 : Number(timeoutText);
    if (timeout > 0) watch.timer = setTimeout(() => this.#endWatch(watch), timeout * 1000);
  }

  /** One stored event to one watch, translated for its selector. */
  #send(watch: OpenWatch, event: StoredEvent): void {
    const now = watch.filter(event.object);
    if (event.type !== 'MODIFIED') {
      if (now) this.#write(watch, event.type, event.object);
      return;
    }
    const before = event.previous ? watch.filter(event.previous) : true;
    if (now && before) this.#write(watch, 'MODIFIED', event.object);
    else if (now) this.#write(watch, 'ADDED', event.object);
    else if (before) this.#write(watch, 'DELETED', event.object);
  }

  #write(watch: OpenWatch, type: WatchEventType, object: KubeNode): void {
    if (watch.res.destroyed || watch.res.writableEnded) return;
    const sent = watch.table ? nodeTable([object], { ...watch.table, resourceVersion: object.metadata.resourceVersion }) : object;
    watch.res.write(`${JSON.stringify({ type, object: sent })}\n`);
  }

  #endWatch(watch: OpenWatch): void {
    this.#watches.delete(watch);
    if (watch.timer) clearTimeout(watch.timer);
    if (!watch.res.destroyed && !watch.res.writableEnded) watch.res.end();
  }

  #sendJson(res: http.ServerResponse, code: number, body: unknown): void {
    if (res.destroyed || res.writableEnded) return;
    if (res.headersSent) { res.end(); return; }
    const text = JSON.stringify(body);
    res.writeHead(code, { 'Content-Type': 'application/json', 'Content-Length': Buffer.byteLength(text) });
    res.end(text);
  }
}

/** Just enough discovery for kubectl to map "node"/"nodes" to /api/v1/nodes. */
function discovery(path: string): JsonObject {
  if (path === '/api') return { kind: 'APIVersions', versions: ['v1'], serverAddressByClientCIDRs: [] };
  if (path === '/apis') return { kind: 'APIGroupList', apiVersion: 'v1', groups: [] };
  return {
    kind: 'APIResourceList',
    groupVersion: 'v1',
    resources: [{
      name: 'nodes', singularName: 'node', namespaced: false, kind: 'Node', shortNames: ['no'],
      verbs: ['create', 'delete', 'get', 'list', 'patch', 'update', 'watch'],
    }],
  };
}

const NODE_FIELDS = new Set(['apiVersion', 'kind', 'metadata', 'spec', 'status']);

/** `fieldValidation=Strict` (kubectl's default): an unknown top-level field is an error, not dropped. */
function checkKnownFields(input: JsonValue): void {
  if (!isPlainObject(input)) return;
  const unknown = Object.keys(input).filter((k) => !NODE_FIELDS.has(k));
  if (unknown.length > 0) fail(400, `strict decoding error: ${unknown.map((k) => `unknown field "${k}"`).join(', ')}`, 'BadRequest');
}

async function readBody(req: http.IncomingMessage): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req) {
    size += (chunk as Buffer).length;
    if (size > MAX_BODY_BYTES) fail(413, `request body larger than ${MAX_BODY_BYTES} bytes`);
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks);
}

function parseJson(body: Buffer): JsonValue {
  try {
    return JSON.parse(body.toString('utf8')) as JsonValue;
  } catch (err) {
    fail(400, `error decoding request body as JSON: ${(err as Error).message}`);
  }
}
