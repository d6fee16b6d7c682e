/**
 * Worker-thread plumbing shared by the TUN readers and the UDP reader: starting a worker from a
 * TypeScript module on either runtime, waking blocked threads when the process exits, and
 * Atomics.waitAsync with its types.
 */
import { Worker, type TransferListItem } from 'node:worker_threads';

export const isBun = typeof (globalThis as { Bun?: unknown }).Bun !== 'undefined';

/** Atomics.waitAsync (ES2024; Node 20 and Bun have it, the project's lib setting is ES2022). */
export const waitAsync = (Atomics as unknown as {
  waitAsync(array: Int32Array, index: number, value: number, timeout?: number):
    { async: false; value: string } | { async: true; value: Promise<string> };
}).waitAsync.bind(Atomics);

/**
 * Node runs the TypeScript sources through tsx, whose loader hooks are registered in the main
 * thread only: a worker first registers them itself, then imports the real entry module. Bun
 * runs TypeScript natively and starts the entry module directly.
 */
const NODE_TS_TRAMPOLINE = `
const { workerData } = require('node:worker_threads');
import(workerData.tsxApi)
  .then((api) => { api.register(); return import(workerData.entry); });
`;

/** tsx's API module, or undefined when tsx is not installed (a Node that strips types by itself then loads the entry). */
function resolveTsx(): string | undefined {
  try {
    return import.meta.resolve('tsx/esm/api');
  } catch {
    return undefined;
  }
}

/**
 * Starts a worker running `entry` (a module next to the caller, `.ts` in the sources or `.js` when
 * built) with `workerData`; the worker reads its configuration from workerData as usual.
 */
export function startWorker(entry: URL, workerData: Record<string, unknown>, transferList?: TransferListItem[]): Worker {
  const tsxApi = !isBun && entry.pathname.endsWith('.ts') ? resolveTsx() : undefined;
  return tsxApi
    ? new Worker(NODE_TS_TRAMPOLINE, { eval: true, workerData: { ...workerData, entry: entry.href, tsxApi }, transferList })
    : new Worker(entry, { workerData, transferList });
}

const exitWakers = new Set<() => void>();
let wakingAtExit = false;

/**
 * Registers how to wake a thread that blocks in a system call (the readers wait in poll(2)) when
 * the process exits; returns the function that unregisters it, to call before closing what the
 * waker writes to. Node ends a process by joining every worker thread, and terminating a worker
 * cannot interrupt a thread blocked outside JavaScript: before this, any uncaught exception (the
 * UDP bind raises one on purpose when its reader fails, so that the daemon does not go on deaf)
 * left the daemon hanging for ever, its main thread in pthread_join, its socket and interface in
 * place. Wakers must be synchronous: 'exit' listeners cannot wait.
 */
export function wakeAtExit(wake: () => void): () => void {
  if (!wakingAtExit) {
    wakingAtExit = true;
    process.on('exit', wakeBlockedThreads);
  }
  exitWakers.add(wake);
  return () => { exitWakers.delete(wake); };
}

function wakeBlockedThreads(): void {
  for (const wake of exitWakers) {
    try {
      wake();
    } catch {
      // The process is ending: the other threads must still be woken.
    }
  }
}
