/**
 * The worker side of test/unit/send-table.test.ts's thread test: reads one peer's entry over and
 * over while the main thread keeps switching it between the states of SEND_STATES (and clearing
 * it), as a sending thread would. Any read that is not wholly one of them is torn. Counts:
 * torn reads (must stay 0), reads that named a keypair, reads.
 */
import { workerData } from 'node:worker_threads';
import { newSendTarget, readSendTarget, sendChunkViews, type SendTarget } from '../../dataplane/session/send-table.ts';

export interface SendTableWorkerConfig {
  chunk: SharedArrayBuffer;
  /** The entry's index in the chunk ("entry" is the trampoline's: threads.ts startWorker). */
  index: number;
  /** [stop, torn, sendable, reads] */
  control: SharedArrayBuffer;
}

/** The states the main thread publishes: two endpoints of different families, one with a sticky source. */
export const SEND_STATES = [
  { slot: 7, generation: 70, remoteIndex: 0x11223344, host: '198.51.100.7', port: 51820, local: undefined },
  { slot: 300, generation: 3, remoteIndex: -5, host: 'fd00:1:2:3::99', port: 1234, local: 'fd00:1:2:3::1' },
] as const;

/** Whether `t` is exactly SEND_STATES[i] (addresses compared byte by byte, as written). */
export function matchesState(t: SendTarget, i: number, address: Uint8Array, local: Uint8Array | undefined): boolean {
  const s = SEND_STATES[i];
  if (t.keySlot !== s.slot || t.keyGeneration !== s.generation || t.remoteIndex !== s.remoteIndex || t.port !== s.port) return false;
  if (t.family !== (address.length === 4 ? 4 : 6)) return false;
  for (let b = 0; b < 16; b++) if (t.address[b] !== (address[b] ?? 0)) return false;
  if (local === undefined) return t.sourceFamily === 0 && t.sourceAddress.every((b) => b === 0);
  if (t.sourceFamily !== 6) return false;
  for (let b = 0; b < 16; b++) if (t.sourceAddress[b] !== local[b]) return false;
  return true;
}

export interface EncodedStates { addresses: Uint8Array[]; locals: (Uint8Array | undefined)[] }

function run(config: SendTableWorkerConfig & EncodedStates): void {
  const control = new Int32Array(config.control);
  const words = sendChunkViews(config.chunk);
  const out = newSendTarget();
  while (Atomics.load(control, 0) === 0) {
    const sendable = readSendTarget(words, config.index, out);
    if (sendable) {
      if (!matchesState(out, 0, config.addresses[0], config.locals[0]) && !matchesState(out, 1, config.addresses[1], config.locals[1])) Atomics.add(control, 1, 1);
      Atomics.add(control, 2, 1);
    } else if (out.family !== 0 || out.port !== 0 || out.sourceFamily !== 0) {
      Atomics.add(control, 1, 1); // a cleared entry names nothing
    }
    Atomics.add(control, 3, 1);
  }
}

if (workerData && (workerData as Partial<SendTableWorkerConfig>).control) run(workerData as SendTableWorkerConfig & EncodedStates);
