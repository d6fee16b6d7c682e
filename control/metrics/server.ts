/**
 * The agent's HTTP endpoint on METRICS_ADDRESS (default `:9474`; empty = off):
 *
 *   GET /metrics   Prometheus text (control/metrics/metrics.ts)
 *   GET /healthz   200 while the agent process runs its loop (liveness: an API server outage
 *                  does not fail it — the agent fails static and keeps the mesh); 503 once stopped
 *   GET /readyz    200 once the Node informer synced and the tunnel is configured, else 503
 *
 * Plain node:http, no framework. The server never holds the process open on its own.
 *
 * It listens on every address by default (Prometheus scrapes it from elsewhere), so anyone who
 * can reach the node can call it, as often as they like. What bounds them:
 * - /metrics answers from one shared reading of the data plane at most once a second
 *   (metrics.ts): a flood of scrapes costs the data plane's control socket nothing more;
 * - /healthz and /readyz read two fields of the agent, never the data plane;
 * - at most {@link MAX_CONNECTIONS} connections at once (more are closed at accept, counted in
 *   roamguard_metrics_refused_connections_total), so a flood cannot take the agent's file
 *   descriptors, which it needs for the control socket and the API server;
 * - a client has {@link HEADERS_TIMEOUT_MS} to send its request's headers (a connection that
 *   sends nothing counts too), {@link REQUEST_TIMEOUT_MS} for the whole request, and an idle
 *   keep-alive connection is closed after {@link KEEP_ALIVE_TIMEOUT_MS}: slow clients cannot
 *   pile up and hold the connection slots.
 */
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import type { AgentLogger } from '../log.ts';
import { AgentMetrics, type AgentMetricsOptions } from './metrics.ts';
import type { AgentStatusSource } from './status-source.ts';

export interface ListenAddress {
  /** Undefined: every address (IPv6 and IPv4). */
  host: string | undefined;
  port: number;
}

/** `:9474`, `0.0.0.0:9474`, `[::1]:9474`, `localhost:9474` → host and port. */
export function parseListenAddress(text: string): ListenAddress {
  const match = /^(?:\[([0-9a-fA-F:.]+)\]|([^\s:[\]]*)):(\d{1,5})$/.exec(text.trim());
  const port = Number(match?.[3]);
  if (!match || !(port >= 0 && port <= 65535)) throw new Error(`not a listen address (host:port, :port or [ipv6]:port): ${JSON.stringify(text)}`);
  const host = match[1] ?? match[2];
  return { host: host === '' ? undefined : host, port };
}

/** Prometheus, a few people and the kubelet's probes need a handful; a flood gets no more. */
export const MAX_CONNECTIONS = 64;
export const HEADERS_TIMEOUT_MS = 5000;
export const REQUEST_TIMEOUT_MS = 10_000;
export const KEEP_ALIVE_TIMEOUT_MS = 5000;
/** Requests carry no headers worth more than this (node's default is 16 KiB). */
const MAX_HEADER_BYTES = 8192;

export interface MetricsServerOptions extends AgentMetricsOptions {
  address: string;
  source: AgentStatusSource;
  log?: AgentLogger;
  /** For tests: the bounds above. */
  maxConnections?: number;
  headersTimeoutMs?: number;
  requestTimeoutMs?: number;
}

export interface MetricsServer {
  readonly metrics: AgentMetrics;
  /** The bound port (useful with port 0). */
  readonly port: number;
  close(): Promise<void>;
}

function reply(res: ServerResponse, status: number, body: string, contentType = 'text/plain; charset=utf-8'): void {
  res.writeHead(status, { 'content-type': contentType, 'cache-control': 'no-store' });
  res.end(body);
}

export async function startMetricsServer(options: MetricsServerOptions): Promise<MetricsServer> {
  const { host, port } = parseListenAddress(options.address);
  const metrics = new AgentMetrics(options.source, options);
  const source = options.source;
  const handle = async (req: IncomingMessage, res: ServerResponse) => {
    const path = (req.url ?? '/').split('?')[0];
    if (req.method !== 'GET' && req.method !== 'HEAD') return reply(res, 405, 'method not allowed\n');
    switch (path) {
      case '/metrics':
        try {
          return reply(res, 200, await metrics.scrape(), metrics.contentType);
        } catch (err) {
          options.log?.warn('collecting metrics failed', { error: (err as Error).message });
          return reply(res, 500, `collecting metrics failed: ${(err as Error).message}\n`);
        }
      case '/healthz':
        return source.state === 'stopped' ? reply(res, 503, 'stopped\n') : reply(res, 200, 'ok\n');
      case '/readyz': {
        if (source.ready) return reply(res, 200, 'ready\n');
        const why = source.informer?.synced ? 'the tunnel is not configured yet' : 'the Node list is not synced yet';
        return reply(res, 503, `not ready: ${why}\n`);
      }
      default:
        return reply(res, 404, 'not found: try /metrics, /healthz or /readyz\n');
    }
  };
  const headersTimeout = options.headersTimeoutMs ?? HEADERS_TIMEOUT_MS;
  const server: Server = createServer({
    headersTimeout,
    requestTimeout: Math.max(headersTimeout, options.requestTimeoutMs ?? REQUEST_TIMEOUT_MS),
    keepAliveTimeout: KEEP_ALIVE_TIMEOUT_MS,
    // How often node looks for requests past those timeouts (default 30 s: too lax for them).
    connectionsCheckingInterval: Math.min(1000, Math.max(100, headersTimeout / 4)),
    maxHeaderSize: MAX_HEADER_BYTES,
  }, (req, res) => { void handle(req, res); });
  server.maxConnections = options.maxConnections ?? MAX_CONNECTIONS;
  server.on('drop', () => metrics.countRefusedConnection());
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen({ host, port }, () => {
      server.off('error', reject);
      resolve();
    });
  });
  server.on('error', (err) => options.log?.warn('metrics server error', { error: err.message }));
  server.unref();
  const bound = (server.address() as AddressInfo).port;
  options.log?.info('serving /metrics, /healthz and /readyz', { address: options.address, port: bound });
  return {
    metrics,
    port: bound,
    close: () => new Promise<void>((resolve) => {
      server.close(() => resolve());
      server.closeAllConnections?.();
    }),
  };
}
