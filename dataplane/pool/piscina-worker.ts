/**
 * A crypto worker of PiscinaCryptoPool (piscina-pool.ts): seals or opens one PacketBatch per
 * task, in place in shared memory, with the crypto provider the main thread would pick.
 */
import { workerData } from 'node:worker_threads';
import { selectCrypto, type SelectOptions } from '../crypto/select.ts';
import { openBatch, sealBatch } from './batch-crypto.ts';

/** One task as piscina hands it over (structured-cloned: the buffers are shared, not copied). */
export interface PiscinaCryptoTask {
  op: 'seal' | 'open';
  data: SharedArrayBuffer;
  lengths: SharedArrayBuffer;
  counters: SharedArrayBuffer;
  slotSize: number;
  count: number;
  key: Uint8Array;
  receiverIndex: number;
  mtu: number;
}

const crypto = await selectCrypto((workerData ?? {}) as Pick<SelectOptions, 'only' | 'libsodium'>);

export default function run(task: PiscinaCryptoTask): number {
  const batch = {
    data: new Uint8Array(task.data),
    lengths: new Int32Array(task.lengths),
    counters: new Float64Array(task.counters),
    slotSize: task.slotSize,
    count: task.count,
  };
  if (task.op === 'seal') sealBatch(crypto, task.key, task.receiverIndex, task.mtu, batch);
  else openBatch(crypto, task.key, batch);
  return task.count;
}
