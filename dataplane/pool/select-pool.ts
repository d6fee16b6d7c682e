/**
 * Which crypto worker pool the daemon uses: `ring` (WorkerCryptoPool: task descriptors through
 * shared-memory rings, no message per task; the default) or `piscina` (PiscinaCryptoPool: one
 * structured-cloned message per task). The daemon passes ROAMGUARD_POOL (dataplane/settings.ts). The bench suite's `node-piscina` subject measures the difference in one run.
 */
import { WorkerCryptoPool, type CryptoPool, type WorkerPoolOptions } from './crypto-pool.ts';
import { PiscinaCryptoPool } from './piscina-pool.ts';

export type PoolKind = 'ring' | 'piscina';

export function createWorkerPool(
  threads: number, kind: PoolKind = 'ring', options: WorkerPoolOptions = {},
): CryptoPool & { readonly queueDepth: number } {
  switch (kind) {
    case 'ring':
      return new WorkerCryptoPool(threads, options);
    case 'piscina':
      return new PiscinaCryptoPool(threads, options.crypto);
    default:
      throw new Error(`unknown crypto pool ${JSON.stringify(kind)} (use 'ring' or 'piscina')`);
  }
}
