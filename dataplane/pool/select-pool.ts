/**
 * Which crypto worker pool the daemon uses: `ring` (WorkerCryptoPool: task descriptors through
 * shared-memory rings, no message per task; the default) or `piscina` (PiscinaCryptoPool: one
 * structured-cloned message per task). The environment variable ROAMGUARD_POOL chooses when no
 * kind is passed. The bench suite's `node-piscina` subject measures the difference in one run.
 */
import { WorkerCryptoPool, type CryptoPool, type WorkerPoolOptions } from './crypto-pool.ts';
import { PiscinaCryptoPool } from './piscina-pool.ts';

export type PoolKind = 'ring' | 'piscina';

export function createWorkerPool(
  threads: number, kind: string = process.env.ROAMGUARD_POOL ?? 'ring', options: WorkerPoolOptions = {},
): CryptoPool & { readonly queueDepth: number } {
  switch (kind) {
    case '':
    case 'ring':
      return new WorkerCryptoPool(threads, options);
    case 'piscina':
      return new PiscinaCryptoPool(threads);
    default:
      throw new Error(`ROAMGUARD_POOL="${kind}" is not valid: expected ring or piscina`);
  }
}
