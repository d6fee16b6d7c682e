/**
 * Worker-thread plumbing shared by the TUN reader, the UDP reader and the crypto pool: starting a
 * worker from a TypeScript module on either runtime, and Atomics.waitAsync with its types.
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
