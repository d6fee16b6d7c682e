/**
 * A byte relay between two stream sockets, TCP or Unix. Network namespaces do not share TCP
 * ports, but they do share the file system, so a Unix socket carries a connection from one
 * namespace to another: the system tests and the local demo use it to let agents inside node
 * namespaces reach the API server that runs in the test (or demo) process on loopback, without
 * any traffic leaving the namespaces they create.
 *
 * Run as a program: `node --import tsx lab/socket-relay.ts LISTEN TARGET`, where each address is
 * `unix:/path` or `host:port` / `[v6]:port`; it prints `ready` once listening.
 */
import { connect, createServer, type Server, type Socket } from 'node:net';
import { rmSync } from 'node:fs';

export type SocketAddress = { path: string } | { host: string; port: number };

export function parseSocketAddress(text: string): SocketAddress {
  if (text.startsWith('unix:')) {
    const path = text.slice(5);
    if (!path.startsWith('/')) throw new Error(`unix socket address needs an absolute path: ${JSON.stringify(text)}`);
    return { path };
  }
  const m = /^(?:\[([0-9a-fA-F:.]+)\]|([^:\s]+)):(\d{1,5})$/.exec(text);
  if (!m || Number(m[3]) > 65535) throw new Error(`bad socket address ${JSON.stringify(text)}: expected unix:/path, host:port or [v6]:port`);
  return { host: m[1] ?? m[2], port: Number(m[3]) };
}

export interface Relay {
  close(): Promise<void>;
}

export async function startRelay(listen: SocketAddress, target: SocketAddress): Promise<Relay> {
  const open = new Set<Socket>();
  const server: Server = createServer((inbound) => {
    const outbound = 'path' in target ? connect(target.path) : connect(target.port, target.host);
    open.add(inbound).add(outbound);
    const end = () => { inbound.destroy(); outbound.destroy(); open.delete(inbound); open.delete(outbound); };
    inbound.on('error', end).on('close', end);
    outbound.on('error', end).on('close', end);
    inbound.pipe(outbound);
    outbound.pipe(inbound);
  });
  if ('path' in listen) rmSync(listen.path, { force: true });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    if ('path' in listen) server.listen(listen.path, resolve);
    else server.listen(listen.port, listen.host, resolve);
  });
  return {
    close: () => new Promise<void>((resolve) => {
      for (const s of open) s.destroy();
      server.close(() => resolve());
    }),
  };
}

if (process.argv[1] && import.meta.url.endsWith(process.argv[1].split('/').pop()!) && process.argv.length === 4) {
  const relay = await startRelay(parseSocketAddress(process.argv[2]), parseSocketAddress(process.argv[3]));
  process.stdout.write('ready\n');
  const stop = () => { void relay.close().then(() => process.exit(0)); };
  process.on('SIGTERM', stop);
  process.on('SIGINT', stop);
  // The parent holds our stdin: when it goes away, so do we.
  process.stdin.on('end', stop).resume();
}
