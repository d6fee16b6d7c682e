/**
 * The `roamguard wg` daemon in the foreground: TUN interface, UDP bind, crypto pool, device and
 * control socket, and the exit rules every userspace WireGuard follows: exit on SIGINT/SIGTERM,
 * when the control socket file is deleted, and when the TUN interface is removed.
 */
import { availableParallelism } from 'node:os';
import { selectCrypto } from '../crypto/select.ts';
import { DEFAULT_MTU } from '../constants.ts';
import { cryptoSelection, type DataplaneSettings } from '../settings.ts';
import { FfiUdpBind } from '../bind/ffi-udp-bind.ts';
import { openTun } from '../tun/tun.ts';
import { createLogger, surviveLostStderr, type LogLevel } from '../log.ts';
import { createUapiHandler } from '../uapi/uapi-device.ts';
import { startUapiServer, type UapiServer } from '../uapi/uapi-server.ts';
import { Device } from './device.ts';
import { optimizeDataPathSooner } from '../sys/jit-tiering.ts';

export interface DaemonOptions {
  ifname: string;
  logLevel: LogLevel;
  /** Data threads: TUN queues, each read, sealed and sent by its own thread (0 = one queue). */
  threads?: number;
  mtu?: number;
  /** Control socket directory (tests); default /var/run/wireguard. */
  socketDir?: string;
  /** Called once the interface and the control socket are ready. */
  onReady?: () => void;
  /** The data plane's settings, read once from the environment by the caller (dataplane/settings.ts). */
  settings: DataplaneSettings;
}

/** The default number of data threads (TUN queues): one per core, one queue on a single-core host. */
export function defaultThreads(): number {
  const cores = availableParallelism();
  return cores > 1 ? cores : 0;
}

/** Runs until one of the exit conditions; resolves with the process exit code. */
export async function runDaemon(options: DaemonOptions): Promise<number> {
  const { settings } = options;
  surviveLostStderr();
  const log = createLogger(options.logLevel, options.ifname);
  const crypto = await selectCrypto(cryptoSelection(settings));
  log.verbose(`crypto providers: ${Object.entries(crypto.providers).map(([g, p]) => `${g}=${p}`).join(', ')}`);
  // One TUN queue per data thread: its reader seals and sends what it reads (tun/tun-queue.ts).
  const threads = options.threads ?? defaultThreads();
  const tun = await openTun(options.ifname, { mtu: options.mtu ?? DEFAULT_MTU, offload: settings.tunOffload, queues: Math.max(1, threads) });
  const timings = settings.testTimings;
  if (timings) log.error(`TEST TIMERS IN USE (not for production): ${JSON.stringify(timings)}`);
  const device = new Device({
    tun, bind: new FfiUdpBind({ offload: settings.udpOffload }), crypto, logger: log,
    timings, cryptoSelection: cryptoSelection(settings),
  });

  let uapi: UapiServer | undefined;
  let finish!: (code: number) => void;
  const finished = new Promise<number>((resolve) => { finish = resolve; });
  let stopping = false;
  const stop = (why: string, code = 0) => {
    if (stopping) return;
    stopping = true;
    log.verbose(`shutting down: ${why}`);
    void (async () => {
      try {
        await uapi?.close();
        await device.close();
      } catch (err) {
        log.error(`error while shutting down: ${(err as Error).message}`);
      }
      finish(code);
    })();
  };

  try {
    // Ready (the control socket answers) once the device takes configuration and traffic, not
    // once its threads have booted: they load what the main thread has just loaded and
    // self-tested (the crypto provider, libc), and booting them took about a third of the start
    // on two cores. What arrives meanwhile waits for them; a thread that still fails to start
    // ends the daemon below, with its error.
    await device.open(0);
    uapi = await startUapiServer(tun.name, createUapiHandler(device, { log: (m) => log.verbose(m) }), {
      dir: options.socketDir,
      onSocketDeleted: () => stop('control socket deleted'),
      log: (m) => log.verbose(m),
    });
  } catch (err) {
    await device.close().catch(() => {});
    throw err;
  }
  tun.onClose(() => stop('interface removed'));
  const onSignal = (signal: NodeJS.Signals) => stop(`received ${signal}`);
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);
  log.verbose(`interface ${tun.name} is up; control socket ${uapi.path}`);
  options.onReady?.();
  device.running().then(
    // Booted: from here V8 optimizes the threads' packet paths sooner (sys/jit-tiering.ts). Not
    // before: start-up code runs once, and optimizing it sooner delayed ready by 25 ms.
    () => optimizeDataPathSooner(),
    (err: unknown) => {
      log.error(`a data-plane thread could not start: ${err instanceof Error ? err.message : String(err)}`);
      stop('a data-plane thread could not start', 1);
    },
  );

  const code = await finished;
  process.off('SIGINT', onSignal);
  process.off('SIGTERM', onSignal);
  return code;
}
