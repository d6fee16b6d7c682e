/**
 * The demo's page server, on loopback only: `/` the page (lab/demo-page.ts), `/events` the live
 * fragments as server-sent events, `POST /faults` a command line for the session, `/state.json`
 * the latest snapshot and fault log as data.
 *
 * A fault is a write, so `POST /faults` takes only `Content-Type: application/json` (a form on
 * another site cannot send that without a CORS preflight, which is never answered) and refuses a
 * request whose Origin is not this server.
 */
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { renderFaultButtons, renderLive, renderShell, type PageView } from './demo-page.ts';
import type { DemoSession } from './demo-session.ts';

const MAX_BODY = 4096;

export interface DemoWeb {
  url: string;
  close(): Promise<void>;
}

export async function startDemoWeb(session: DemoSession, options: { port: number; kubectl?: string }): Promise<DemoWeb> {
  const clients = new Set<http.ServerResponse>();
  const view = (): PageView => ({ snapshot: session.latest, records: session.records, targets: session.targets(), message: session.lastMessage, kubectl: options.kubectl });
  const frames = () => {
    const v = view();
    return `event: live\ndata: ${JSON.stringify(renderLive(v))}\n\nevent: buttons\ndata: ${JSON.stringify(renderFaultButtons(v.targets))}\n\n`;
  };
  // Many updates can come at once (a snapshot, a fault's progress): send at most one frame per tick.
  let pending = false;
  const onUpdate = () => {
    if (pending) return;
    pending = true;
    setImmediate(() => {
      pending = false;
      const text = frames();
      for (const res of clients) res.write(text);
    });
  };
  session.on('update', onUpdate);

  const server = http.createServer((req, res) => {
    res.on('error', () => { /* the browser went away */ });
    const url = new URL(req.url ?? '/', 'http://localhost');
    const send = (code: number, type: string, body: string) => {
      res.writeHead(code, { 'Content-Type': type, 'Cache-Control': 'no-store', 'Content-Length': Buffer.byteLength(body) });
      res.end(body);
    };
    if (req.method === 'GET' && url.pathname === '/') return send(200, 'text/html; charset=utf-8', renderShell(options.kubectl));
    if (req.method === 'GET' && url.pathname === '/events') {
      res.writeHead(200, { 'Content-Type': 'text/event-stream', 'Cache-Control': 'no-store', Connection: 'keep-alive' });
      res.write(`retry: 2000\n\n${frames()}`);
      clients.add(res);
      req.on('close', () => clients.delete(res));
      return;
    }
    if (req.method === 'GET' && url.pathname === '/state.json') {
      return send(200, 'application/json', JSON.stringify({ snapshot: session.latest ?? null, records: session.records, log: session.log(), targets: session.targets() }));
    }
    if (url.pathname === '/faults' && req.method === 'POST') {
      const origin = req.headers.origin;
      if (origin !== undefined && origin !== `http://${req.headers.host}`) return send(403, 'application/json', JSON.stringify({ message: 'faults only from this page' }));
      if ((req.headers['content-type'] ?? '').split(';')[0].trim() !== 'application/json') return send(415, 'application/json', JSON.stringify({ message: 'send JSON: {"command": "r office"}' }));
      let body = '';
      let tooLarge = false;
      req.setEncoding('utf8');
      req.on('data', (chunk: string) => { body += chunk; if (body.length > MAX_BODY) { tooLarge = true; req.destroy(); } });
      req.on('end', () => {
        if (tooLarge) return;
        let command: unknown;
        try { command = (JSON.parse(body) as { command?: unknown }).command; } catch { /* answered below */ }
        if (typeof command !== 'string') return send(400, 'application/json', JSON.stringify({ message: 'expected {"command": "…"}' }));
        const result = session.submit(command);
        // "q" is for the terminal; the page cannot stop the demo.
        if ('quit' in result && result.quit) return send(400, 'application/json', JSON.stringify({ message: 'the demo stops from its terminal (Ctrl-C)' }));
        return send(result.ok ? 202 : 400, 'application/json', JSON.stringify({ message: result.message }));
      });
      return;
    }
    send(404, 'text/plain; charset=utf-8', 'not found\n');
  });
  server.on('clientError', (_err, socket) => socket.destroy());
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port, '127.0.0.1', () => { server.off('error', reject); resolve(); });
  });
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}/`,
    async close() {
      session.off('update', onUpdate);
      for (const res of clients) res.end();
      clients.clear();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
