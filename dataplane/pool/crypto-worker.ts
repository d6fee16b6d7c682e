/**
 * A crypto worker thread (run by piscina): seals or opens one PacketBatch per task, in place in
 * shared memory. It picks its crypto provider the same way the main thread does.
 */
import { selectCrypto } from '../crypto/select.ts';
import { openBatch, sealBatch } from './batch-crypto.ts';

export interface CryptoTask {
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

const crypto = await selectCrypto();

export default function run(task: CryptoTask): number {
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
