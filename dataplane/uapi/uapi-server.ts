/**
 * The control socket: a unix stream socket at /var/run/wireguard/IFNAME.sock speaking the UAPI
 * text protocol, which `wg` (and wg-quick through it) uses to configure and inspect the device.
 *
 * Lifecycle, as wireguard-go does it: the directory is created with mode 0755 when missing; the
 * socket is created under umask 077 (owner only); if the path is taken, a connect decides — an
 * answer means another process serves this interface (start fails), a refusal means a stale file
 * left by a dead process (it is replaced). The daemon is told when its socket file disappears
 * (`onSocketDeleted`), which by the cross-platform rules means "exit".
 *
 * Framing: a connection carries any number of operations. Each starts with a `get=1` or `set=1`
 * line (or roamguard's `get=roamguard-stats`, when the handler has counters: uapi-stats.ts) and
 * ends with an empty line; each answer ends with `errno=N` and an empty line. Any other first
 * line closes the connection, as in wireguard-go. Bytes are split into lines here, so lines may arrive in any
 * number of chunks.
 *
 * Abuse limits: line length, request size and line count, peer sections per request, a deadline
 * for each request (a client that starts one and stalls is disconnected), a connection cap, and
 * backpressure both ways (a client that sends faster than we apply, or never reads its answers).
 */
import { chmodSync, lstatSync, mkdirSync, unlinkSync, watch, type FSWatcher } from 'node:fs';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { basename, join } from 'node:path';
import { wipe } from '../noise/keys.ts';
import type { UapiHandler } from './uapi-device.ts';
import { UAPI_ERRNO, describeLine, formatErrno, formatGetResponse, parseSetRequest } from './uapi-protocol.ts';
import { STATS_OPERATION, formatStatsResponse } from './uapi-stats.ts';

export type { UapiHandler } from './uapi-device.ts';

/** Where wireguard-go, boringtun and `wg` keep the control sockets. */
export const UAPI_SOCKET_DIR = '/var/run/wireguard';

export interface UapiLimits {
  /** Longest line accepted, in bytes; a longer one closes the connection. Default 64 KiB. */
  maxLineBytes: number;
  /** Largest `set` body, in bytes. Default 16 MiB. */
  maxRequestBytes: number;
  /** Most lines in one `set` body. Default 1 Mi. */
  maxRequestLines: number;
  /** Most peer sections in one `set`. Default 65536. */
  maxPeersPerRequest: number;
  /**
   * A client must send each complete request within this many ms of connecting or of its
   * previous answer, and must read each answer within as long, else it is disconnected (an idle
   * connection too). Time spent applying a request does not count. Default 30 s.
   */
  requestTimeoutMs: number;
  /** Simultaneous connections; more are refused. Default 1024. */
  maxConnections: number;
}

export const DEFAULT_UAPI_LIMITS: Readonly<UapiLimits> = {
  maxLineBytes: 64 * 1024,
  maxRequestBytes: 16 * 1024 * 1024,
  maxRequestLines: 1024 * 1024,
  maxPeersPerRequest: 65536,
  requestTimeoutMs: 30_000,
  maxConnections: 1024,
};

export interface UapiServerOptions {
  /** Socket directory; default /var/run/wireguard (override for tests). */
  dir?: string;
  /**
   * Called once when the socket file is deleted or replaced by another file (the daemon should
   * then exit). Not called for the server's own close().
   */
  onSocketDeleted?: () => void;
  /** Told about rejected requests and misbehaving clients. */
  log?: (message: string) => void;
  limits?: Partial<UapiLimits>;
}

export interface UapiServer {
  readonly path: string;
  /** Open client connections. */
  readonly connectionCount: number;
  /** Stops listening, drops the clients and removes the socket file (if it is still ours). */
  close(): Promise<void>;
}

/** Interface names as the kernel and `wg` accept them: 1 to 15 characters, no '/' or spaces. */
const IFNAME = /^[A-Za-z0-9_=+.-]{1,15}$/;
/** sun_path is 108 bytes on Linux, including the terminating NUL. */
const MAX_SOCKET_PATH = 107;
/** Queued but unprocessed input above which the socket is paused. */
const INPUT_HIGH_WATER = 1024 * 1024;
/** How long a closing connection may take to read its last answer before it is destroyed. */
const LINGER_MS = 2000;
/** Fallback check of the socket file, in case file-system events are missed. */
const DELETION_POLL_MS = 2000;

export function uapiSocketPath(ifname: string, dir: string = UAPI_SOCKET_DIR): string {
  return join(dir, `${ifname}.sock`);
}

function errorCode(err: unknown): string | undefined {
  const code = (err as { code?: unknown } | null)?.code;
  return typeof code === 'string' ? code : undefined;
}

/** Whether something accepts connections on the unix socket at `path`. */
function socketAnswers(path: string, timeoutMs = 2000): Promise<boolean> {
  return new Promise((resolve) => {
    const probe = connect(path);
    const done = (answer: boolean) => {
      clearTimeout(timer);
      probe.destroy();
      resolve(answer);
    };
    // No answer in time (e.g. a full backlog) means somebody is there: never delete it then.
    const timer = setTimeout(() => done(true), timeoutMs);
    probe.once('connect', () => done(true));
    probe.once('error', (err) => {
      const code = errorCode(err);
      done(!(code === 'ECONNREFUSED' || code === 'ENOENT'));
    });
  });
}

/** server.listen(path) with umask 077, so the socket is created owner-only. */
function listenOwnerOnly(server: Server, path: string): Promise<void> {
  return new Promise((resolve, reject) => {
    const onError = (err: Error) => {
      server.off('listening', onListening);
      reject(err);
    };
    const onListening = () => {
      server.off('error', onError);
      resolve();
    };
    server.once('error', onError);
    server.once('listening', onListening);
    let previous: number | undefined;
    try {
      previous = process.umask(0o077);
    } catch {
      // Worker threads cannot change the umask; the chmod after listening still applies.
    }
    try {
      server.listen(path); // the bind happens synchronously, under the umask
    } finally {
      if (previous !== undefined) process.umask(previous);
    }
  });
}

function ensureDirectory(dir: string): void {
  const created = mkdirSync(dir, { recursive: true, mode: 0o755 });
  // mkdir's mode is filtered by the umask; make the directory we created exactly 0755.
  if (created !== undefined) chmodSync(dir, 0o755);
}

/**
 * Starts serving the control socket of interface `ifname`. Rejects when the name is unusable,
 * the directory cannot be made, or another live process serves the same interface.
 */
export async function startUapiServer(
  ifname: string, handler: UapiHandler, options: UapiServerOptions = {},
): Promise<UapiServer> {
  if (!IFNAME.test(ifname) || ifname === '.' || ifname === '..') {
    throw new Error(`bad interface name ${JSON.stringify(ifname)}: 1 to 15 characters of [A-Za-z0-9_=+.-]`);
  }
  const limits: UapiLimits = { ...DEFAULT_UAPI_LIMITS, ...options.limits };
  const log = options.log ?? (() => {});
  const dir = options.dir ?? UAPI_SOCKET_DIR;
  const path = uapiSocketPath(ifname, dir);
  if (Buffer.byteLength(path) > MAX_SOCKET_PATH) {
    throw new Error(`control socket path too long for a unix socket (${Buffer.byteLength(path)} > ${MAX_SOCKET_PATH} bytes): ${path}`);
  }
  ensureDirectory(dir);

  const connections = new Set<Connection>();
  const server = createServer({ allowHalfOpen: true }, (socket) => {
    const connection = new Connection(socket, handler, limits, log, () => connections.delete(connection));
    connections.add(connection);
  });
  server.maxConnections = limits.maxConnections;

  try {
    await listenOwnerOnly(server, path);
  } catch (err) {
    if (errorCode(err) !== 'EADDRINUSE') {
      throw new Error(`cannot create control socket ${path}: ${(err as Error).message}`);
    }
    let isSocket = false;
    try {
      isSocket = lstatSync(path).isSocket();
    } catch {
      isSocket = true; // vanished meanwhile: nothing to delete, just retry
    }
    if (!isSocket) throw new Error(`cannot create control socket ${path}: a file that is not a socket is in the way`);
    if (await socketAnswers(path)) {
      throw new Error(`interface ${ifname} is already served by another process (${path} answers)`);
    }
    try {
      unlinkSync(path); // a stale socket from a process that died
    } catch (unlinkErr) {
      if (errorCode(unlinkErr) !== 'ENOENT') {
        throw new Error(`cannot remove stale control socket ${path}: ${(unlinkErr as Error).message}`);
      }
    }
    try {
      await listenOwnerOnly(server, path);
    } catch (retryErr) {
      throw new Error(`cannot create control socket ${path}: ${(retryErr as Error).message}`);
    }
  }

  // From now on, errors of the listener (e.g. accept failing with EMFILE) are logged, not thrown.
  server.on('error', (err) => log(`control socket ${path}: ${err.message}`));

  let identity: { dev: number; ino: number };
  try {
    chmodSync(path, 0o700);
    const st = lstatSync(path);
    identity = { dev: st.dev, ino: st.ino };
  } catch (err) {
    server.close();
    throw new Error(`cannot set up control socket ${path}: ${(err as Error).message}`);
  }
  /** What is at `path` now: our socket, nothing, or another file (e.g. a newer daemon's socket). */
  const pathState = (): 'ours' | 'absent' | 'other' => {
    try {
      const st = lstatSync(path);
      return st.isSocket() && st.dev === identity.dev && st.ino === identity.ino ? 'ours' : 'other';
    } catch (err) {
      return errorCode(err) === 'ENOENT' ? 'absent' : 'other';
    }
  };
  const stillOurs = () => pathState() === 'ours';

  let closing: Promise<void> | undefined;
  let watcher: FSWatcher | undefined;
  let poll: ReturnType<typeof setInterval> | undefined;
  const onDeleted = options.onSocketDeleted;
  if (onDeleted) {
    let fired = false;
    const check = () => {
      if (fired || closing || stillOurs()) return;
      fired = true;
      watcher?.close();
      if (poll) clearInterval(poll);
      log(`control socket ${path} was deleted`);
      try {
        onDeleted();
      } catch (err) {
        log(`onSocketDeleted failed: ${(err as Error)?.message ?? err}`);
      }
    };
    const name = basename(path);
    try {
      watcher = watch(dir, { persistent: false }, (_event, filename) => {
        if (filename === null || filename === undefined || String(filename) === name) check();
      });
      watcher.on('error', () => check());
    } catch (err) {
      log(`cannot watch ${dir} (${(err as Error).message}); polling the socket file instead`);
    }
    poll = setInterval(check, DELETION_POLL_MS);
    poll.unref();
  }

  return {
    path,
    get connectionCount() {
      return connections.size;
    },
    close(): Promise<void> {
      closing ??= (async () => {
        watcher?.close();
        if (poll) clearInterval(poll);
        for (const connection of [...connections]) connection.destroy();
        if (pathState() !== 'other') {
          await new Promise<void>((resolve) => server.close(() => resolve()));
          // Node's close unlinks the path itself; make sure on runtimes that do not.
          if (stillOurs()) {
            try { unlinkSync(path); } catch { /* gone already */ }
          }
        } else {
          // Closing the listener would unlink the path by name (libuv does), and the file there
          // now belongs to someone else: only stop holding the process open. Nobody can reach
          // the old socket any more (it has no name); its descriptor goes with the process.
          server.unref();
        }
      })();
      return closing;
    },
  };
}

/** One client: splits its bytes into lines and runs its operations one after another. */
class Connection {
  /** Bytes of an incomplete line. */
  private partial: Buffer[] = [];
  private partialBytes = 0;
  /** Complete lines not yet consumed, from `head` on. */
  private lines: string[] = [];
  private head = 0;
  private queuedBytes = 0;
  private paused = false;
  private wake: (() => void) | undefined;
  private ended = false;
  private closed = false;
  private aborted = false;
  private deadline: ReturnType<typeof setTimeout> | undefined;

  constructor(
    private readonly socket: Socket,
    private readonly handler: UapiHandler,
    private readonly limits: UapiLimits,
    private readonly log: (message: string) => void,
    private readonly onClose: () => void,
  ) {
    socket.on('data', (chunk: Buffer) => this.receive(chunk));
    socket.on('end', () => {
      this.ended = true;
      this.notify();
    });
    socket.on('error', () => { /* 'close' follows */ });
    socket.on('close', () => {
      this.closed = true;
      this.stopDeadline();
      this.notify();
      this.onClose();
    });
    void this.run();
  }

  destroy(): void {
    this.socket.destroy();
  }

  private notify(): void {
    const wake = this.wake;
    this.wake = undefined;
    wake?.();
  }

  private receive(chunk: Buffer): void {
    if (this.aborted) return;
    let start = 0;
    for (;;) {
      const newline = chunk.indexOf(10, start);
      if (newline < 0) break;
      const piece = chunk.subarray(start, newline);
      if (this.partialBytes + piece.length > this.limits.maxLineBytes) return this.abortLineTooLong();
      const line = this.partial.length === 0 ? piece : Buffer.concat([...this.partial, piece]);
      this.partial = [];
      this.partialBytes = 0;
      const text = line.toString('utf8');
      this.lines.push(text);
      this.queuedBytes += text.length + 1;
      start = newline + 1;
    }
    if (start < chunk.length) {
      const rest = chunk.subarray(start);
      if (this.partialBytes + rest.length > this.limits.maxLineBytes) return this.abortLineTooLong();
      this.partial.push(Buffer.from(rest)); // a copy: do not pin the whole chunk
      this.partialBytes += rest.length;
    }
    if (this.queuedBytes > INPUT_HIGH_WATER && !this.paused) {
      this.paused = true;
      this.socket.pause();
    }
    this.notify();
  }

  private abortLineTooLong(): void {
    this.log(`control socket: line longer than ${this.limits.maxLineBytes} bytes; closing the connection`);
    this.abort(UAPI_ERRNO.EMSGSIZE);
  }

  /** Answers `errno` (if given) and closes, ignoring whatever else the client sends. */
  private abort(errno?: number): void {
    if (this.aborted) return;
    this.aborted = true;
    this.lines = [];
    this.head = 0;
    this.partial = [];
    this.stopDeadline();
    if (this.paused) this.socket.resume(); // keep reading (and discarding) so our answer can flush
    this.finish(errno === undefined ? undefined : formatErrno(errno));
    this.notify();
  }

  /** Ends our side (after `text`), and destroys the socket once flushed or after a short linger. */
  private finish(text?: string): void {
    const socket = this.socket;
    if (socket.destroyed) return;
    const linger = setTimeout(() => socket.destroy(), LINGER_MS);
    linger.unref();
    socket.once('close', () => clearTimeout(linger));
    if (socket.writable) socket.end(text ?? '', () => socket.destroy());
    else socket.destroy();
  }

  private async nextLine(): Promise<string | null> {
    for (;;) {
      if (this.aborted || this.closed) return null;
      if (this.head < this.lines.length) {
        const line = this.lines[this.head++];
        this.queuedBytes -= line.length + 1;
        if (this.head === this.lines.length) {
          this.lines = [];
          this.head = 0;
        }
        if (this.paused && this.queuedBytes < INPUT_HIGH_WATER / 2) {
          this.paused = false;
          this.socket.resume();
        }
        return line;
      }
      if (this.ended) return null;
      await new Promise<void>((resolve) => { this.wake = resolve; });
    }
  }

  private startDeadline(): void {
    this.stopDeadline();
    this.deadline = setTimeout(() => {
      this.log(`control socket: client too slow (no complete request, or its answer not read, within ${this.limits.requestTimeoutMs} ms); closing the connection`);
      this.abort();
    }, this.limits.requestTimeoutMs);
    this.deadline.unref();
  }

  private stopDeadline(): void {
    if (this.deadline !== undefined) clearTimeout(this.deadline);
    this.deadline = undefined;
  }

  /** Writes an answer; waits while the client does not read (so it cannot make us buffer). */
  private async respond(text: string): Promise<void> {
    const socket = this.socket;
    if (this.aborted || socket.destroyed || !socket.writable) return;
    if (socket.write(text)) return;
    await new Promise<void>((resolve) => {
      const done = () => {
        socket.off('drain', done);
        socket.off('close', done);
        resolve();
      };
      socket.on('drain', done);
      socket.on('close', done);
    });
  }

  private async run(): Promise<void> {
    try {
      for (;;) {
        this.startDeadline();
        const operation = await this.nextLine();
        if (operation === null) break;
        const isStats = operation === STATS_OPERATION && this.handler.stats !== undefined;
        if (operation === 'get=1' || isStats) {
          const terminator = await this.nextLine();
          if (terminator === null) break;
          this.stopDeadline();
          if (terminator !== '') {
            this.log(`control socket: trailing characters after ${operation}`);
            this.startDeadline();
            await this.respond(formatErrno(UAPI_ERRNO.EINVAL));
            break;
          }
          const answer = isStats ? await this.stats() : await this.get();
          this.startDeadline(); // the client must also read its answer in time
          await this.respond(answer);
        } else if (operation === 'set=1') {
          const body: string[] = [];
          let bytes = 0;
          let complete = false;
          for (;;) {
            const line = await this.nextLine();
            if (line === null) break;
            if (line === '') {
              complete = true;
              break;
            }
            bytes += line.length + 1;
            if (body.length >= this.limits.maxRequestLines || bytes > this.limits.maxRequestBytes) {
              this.log('control socket: set request over the size limit; closing the connection');
              this.abort(UAPI_ERRNO.EMSGSIZE);
              return;
            }
            body.push(line);
          }
          this.stopDeadline();
          if (!complete) {
            // The client stopped sending in the middle: apply nothing.
            this.startDeadline();
            if (!this.aborted && !this.closed) await this.respond(formatErrno(UAPI_ERRNO.EIO));
            break;
          }
          const errno = await this.set(body);
          this.startDeadline();
          await this.respond(formatErrno(errno));
        } else {
          // Never a part of the line: it may be a key line sent without `set=1`.
          this.log(`control socket: invalid operation, ${describeLine(operation)}; closing the connection`);
          break;
        }
      }
    } catch (err) {
      this.log(`control socket: connection failed: ${(err as Error)?.message ?? err}`);
    }
    this.stopDeadline();
    if (!this.aborted) {
      this.aborted = true;
      this.finish();
    }
  }

  private async get(): Promise<string> {
    try {
      const answer = await this.handler.get();
      return typeof answer === 'string' ? answer : formatGetResponse(answer);
    } catch (err) {
      this.log(`control socket: get failed: ${(err as Error)?.message ?? err}`);
      return formatErrno(UAPI_ERRNO.UNKNOWN);
    }
  }

  private async stats(): Promise<string> {
    try {
      const answer = await this.handler.stats!();
      return typeof answer === 'string' ? answer : formatStatsResponse(answer);
    } catch (err) {
      this.log(`control socket: stats failed: ${(err as Error)?.message ?? err}`);
      return formatErrno(UAPI_ERRNO.UNKNOWN);
    }
  }

  private async set(body: readonly string[]): Promise<number> {
    const parsed = parseSetRequest(body, { maxPeers: this.limits.maxPeersPerRequest });
    if (!parsed.ok) {
      this.log(`control socket: set rejected (errno ${parsed.errno}): ${parsed.message}`);
      return parsed.errno;
    }
    const request = parsed.request;
    try {
      const errno = await this.handler.set(request);
      return Number.isInteger(errno) ? errno : UAPI_ERRNO.UNKNOWN;
    } catch (err) {
      this.log(`control socket: set failed: ${(err as Error)?.message ?? err}`);
      return UAPI_ERRNO.UNKNOWN;
    } finally {
      // The device copied what it keeps; the parsed secrets are not needed any more.
      wipe(request.privateKey, ...request.peers.map((peer) => peer.presharedKey));
    }
  }
}
