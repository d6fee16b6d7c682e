/**
 * Where the agent finds the Kubernetes API, in this order:
 *
 * 1. an explicit API server URL (`KUBE_API_SERVER`). A CNI agent starts before kube-proxy has
 *    programmed the `kubernetes` Service, so the in-cluster ClusterIP is not reachable yet; the
 *    node can still reach a real apiserver address. The URL replaces only the server: the
 *    credentials still come from the kubeconfig (if one is given) or the pod's service account
 *    (if mounted), else the requests are anonymous.
 * 2. a kubeconfig file: `kubeconfigPath`, else `$KUBECONFIG` (a path list, merged as kubectl does).
 * 3. in-cluster: `KUBERNETES_SERVICE_HOST`/`_PORT` and the service account token and CA.
 *    The token is re-read from its file by client-node, so bound-token rotation is safe.
 *
 * Plain http:// is refused whenever credentials would go with the requests (a kubeconfig user
 * with a token, client certificate, password, exec or auth provider; the service account token):
 * anyone on the path would read a token that may patch Nodes. http:// stays usable anonymously
 * (a local test server).
 *
 * Unlike `KubeConfig.loadFromDefault()` this never falls back to ~/.kube/config or to
 * http://localhost:8080 silently: an agent talking to the wrong cluster is worse than one that
 * refuses to start with a message saying what it tried.
 */
import fs from 'node:fs';
import net from 'node:net';
import path from 'node:path';
import { KubeConfig } from './kube-client.ts';

export const SERVICE_ACCOUNT_DIR = '/var/run/secrets/kubernetes.io/serviceaccount';

export interface LoadKubeConfigOptions {
  /** Explicit API server URL (http:// or https://); wins over everything else. Empty = unset. */
  apiServer?: string;
  /** A kubeconfig file; when unset or empty, `$KUBECONFIG` is used. */
  kubeconfigPath?: string;
  /** Environment to read (default `process.env`); for tests. */
  env?: Record<string, string | undefined>;
  /**
   * Prefix of the service account directory, as for `KubeConfig.loadFromCluster(pathPrefix)`:
   * the files are read from `${pathPrefix}/var/run/secrets/kubernetes.io/serviceaccount`. For tests.
   */
  pathPrefix?: string;
}

export type KubeConfigSource = 'api-server' | 'kubeconfig' | 'in-cluster';

export interface LoadedKubeConfig {
  kubeConfig: KubeConfig;
  /** What decided the server. */
  source: KubeConfigSource;
  /** The API server URL requests go to. */
  server: string;
  /** Where the credentials come from, for the startup log line. */
  credentials: 'kubeconfig' | 'service-account' | 'none';
}

function parseServerUrl(text: string): string {
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    throw new Error(`Kubernetes API server ${JSON.stringify(text)} is not a URL (expected e.g. https://10.0.0.1:6443)`);
  }
  if (url.protocol !== 'https:' && url.protocol !== 'http:') {
    throw new Error(`Kubernetes API server ${JSON.stringify(text)} must start with https:// or http://`);
  }
  if (url.hostname === '') throw new Error(`Kubernetes API server ${JSON.stringify(text)} has no host`);
  if (url.search !== '' || url.hash !== '') throw new Error(`Kubernetes API server ${JSON.stringify(text)} must not have a query or fragment`);
  // client-node appends request paths to the server text, so a trailing slash would double.
  return text.replace(/\/+$/, '');
}

function loadKubeconfigFiles(paths: string[]): KubeConfig {
  const kc = new KubeConfig();
  paths.forEach((file, i) => {
    try {
      fs.accessSync(file, fs.constants.R_OK);
    } catch (err) {
      throw new Error(`kubeconfig ${file} is not readable: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
    }
    const one = new KubeConfig();
    try {
      one.loadFromFile(file);
    } catch (err) {
      throw new Error(`kubeconfig ${file} could not be loaded: ${(err as Error).message}`);
    }
    // Like kubectl: the first file's current-context wins; later files add entries.
    if (i === 0) kc.loadFromOptions({ clusters: one.getClusters(), users: one.getUsers(), contexts: one.getContexts(), currentContext: one.getCurrentContext() });
    else kc.mergeConfig(one, true);
  });
  if (!kc.getCurrentContext()) throw new Error(`kubeconfig ${paths.join(path.delimiter)} has no current-context`);
  if (!kc.getCurrentCluster()) throw new Error(`kubeconfig ${paths.join(path.delimiter)}: current-context ${JSON.stringify(kc.getCurrentContext())} names no known cluster`);
  return kc;
}

/** The in-cluster URL, computed as client-node's `loadFromCluster` does, from `env`. */
function inClusterServer(env: Record<string, string | undefined>): string | undefined {
  const host = env.KUBERNETES_SERVICE_HOST;
  const port = env.KUBERNETES_SERVICE_PORT;
  if (!host || !port) return undefined;
  const scheme = port === '80' || port === '8080' || port === '8001' ? 'http' : 'https';
  return `${scheme}://${net.isIPv6(host) ? `[${host}]` : host}:${port}`;
}

/** Whether requests made with `kc`'s current user carry credentials. */
function userHasCredentials(kc: KubeConfig): boolean {
  const user = kc.getCurrentUser();
  if (!user) return false;
  return [user.token, user.certData, user.certFile, user.keyData, user.keyFile, user.username, user.password, user.exec, user.authProvider]
    .some((v) => v !== undefined && v !== null && v !== '');
}

/** Throws, naming `setting`, when `server` is plain HTTP and credentials would be sent to it. */
function refusePlainHttpWithCredentials(server: string, credentials: LoadedKubeConfig['credentials'], setting: string): void {
  if (credentials === 'none' || !server.startsWith('http:')) return;
  const what = credentials === 'service-account' ? 'the service account token' : 'the kubeconfig user\'s credentials';
  throw new Error(`${setting}: API server ${server} is plain http:// and ${what} would be sent in clear; use https://`);
}

/** A copy of `kc` whose current cluster talks to `server`. */
function withServer(kc: KubeConfig, server: string): KubeConfig {
  const current = kc.getCurrentCluster();
  if (!current) throw new Error('internal: no current cluster to point at the API server');
  // client-node refuses http:// unless skipTLSVerify is set; there is no TLS to verify then.
  const skipTLSVerify = server.startsWith('http:') ? true : current.skipTLSVerify;
  const clusters = kc.getClusters().map((c) => (c.name === current.name ? { ...c, server, skipTLSVerify } : c));
  const out = new KubeConfig();
  out.loadFromOptions({ clusters, users: kc.getUsers(), contexts: kc.getContexts(), currentContext: kc.getCurrentContext() });
  return out;
}

/** The KubeConfig to use (see the file comment for the order); throws saying what was tried. */
export function loadKubeConfig(options: LoadKubeConfigOptions = {}): KubeConfig {
  return resolveKubeConfig(options).kubeConfig;
}

/** Like `loadKubeConfig`, also telling where the server and the credentials came from. */
export function resolveKubeConfig(options: LoadKubeConfigOptions = {}): LoadedKubeConfig {
  if (options === null || typeof options !== 'object') throw new TypeError('loadKubeConfig: options must be an object');
  const env = options.env ?? process.env;
  const apiServer = options.apiServer ? parseServerUrl(options.apiServer) : undefined;
  const kubeconfigPaths = options.kubeconfigPath
    ? [options.kubeconfigPath]
    : (env.KUBECONFIG ?? '').split(path.delimiter).filter((p) => p !== '');
  const prefix = options.pathPrefix ?? '';
  const tokenFile = `${prefix}${SERVICE_ACCOUNT_DIR}/token`;
  const hasServiceAccount = fs.existsSync(tokenFile);

  const checked = (loaded: LoadedKubeConfig, setting: string): LoadedKubeConfig => {
    refusePlainHttpWithCredentials(loaded.server, loaded.credentials, setting);
    return loaded;
  };

  if (kubeconfigPaths.length > 0) {
    const kc = loadKubeconfigFiles(kubeconfigPaths);
    const credentials = userHasCredentials(kc) ? 'kubeconfig' : 'none';
    if (apiServer) return checked({ kubeConfig: withServer(kc, apiServer), source: 'api-server', server: apiServer, credentials }, 'KUBE_API_SERVER');
    const cluster = kc.getCurrentCluster()!;
    return checked({ kubeConfig: kc, source: 'kubeconfig', server: cluster.server, credentials }, `KUBECONFIG (${kubeconfigPaths.join(path.delimiter)}, cluster ${JSON.stringify(cluster.name)})`);
  }

  if (hasServiceAccount) {
    const caFile = `${prefix}${SERVICE_ACCOUNT_DIR}/ca.crt`;
    const server = apiServer ?? inClusterServer(env);
    if (server?.startsWith('https:') && !fs.existsSync(caFile)) {
      throw new Error(`service account CA ${caFile} is missing: cannot verify the API server ${server}`);
    }
    if (server) refusePlainHttpWithCredentials(server, 'service-account', apiServer ? 'KUBE_API_SERVER' : 'KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT');
    const kc = new KubeConfig();
    kc.loadFromCluster(prefix);
    if (apiServer) return { kubeConfig: withServer(kc, apiServer), source: 'api-server', server: apiServer, credentials: 'service-account' };
    if (!server) {
      throw new Error('no Kubernetes API server: a service account is mounted but KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT are not set; set KUBE_API_SERVER');
    }
    return { kubeConfig: withServer(kc, server), source: 'in-cluster', server, credentials: 'service-account' };
  }

  if (apiServer) {
    const kc = new KubeConfig();
    kc.loadFromClusterAndUser({ name: 'explicit', server: apiServer, skipTLSVerify: apiServer.startsWith('http:') }, { name: 'anonymous' });
    return { kubeConfig: kc, source: 'api-server', server: apiServer, credentials: 'none' };
  }

  throw new Error(
    'no Kubernetes API configuration found: set KUBE_API_SERVER (an https:// URL), or KUBECONFIG (a kubeconfig file), ' +
    `or run in a pod with a service account (${tokenFile} does not exist` +
    `${inClusterServer(env) ? '' : ' and KUBERNETES_SERVICE_HOST/KUBERNETES_SERVICE_PORT are not set'})`,
  );
}
