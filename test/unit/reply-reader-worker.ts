/**
 * The helper side of ring-stress.test.ts's shared-queue test: a thread that, like the UDP reader
 * after a TUN write, keeps trying to read a queue itself (tun/reply-reader.ts) while the queue's
 * own reader thread (tun/reader-worker.ts) reads it too, at random moments and in bursts, until
 * the main thread sets STOP. What it reads goes into the queue's ring as the queue's thread would
 * put it; the main thread checks that every item comes out once and in order.
 */
import { workerData } from 'node:worker_threads';
import { loadLibc } from '../../dataplane/sys/libc.ts';
import { ReplyReader } from '../../dataplane/tun/reply-reader.ts';
import type { TunQueueRing } from '../../dataplane/tun/tun.ts';

export interface ReplyHelperConfig {
  /** Its own descriptor of the queue (a dup): it closes it at the end. */
  fd: number;
  queue: TunQueueRing;
  /** Int32Array[2]: [0] = 1 asks the helper to stop; [1] = the packets it read (it counts). */
  control: SharedArrayBuffer;
  seed: number;
}

const config = workerData as ReplyHelperConfig;
const libc = await loadLibc();
const control = new Int32Array(config.control);
const reader = new ReplyReader(libc, [config.fd], [config.queue], false, undefined);
const touched = new Uint8Array(1);
let state = config.seed >>> 0;
const random = () => {
  state = (state * 1664525 + 1013904223) >>> 0;
  return state / 2 ** 32;
};
while (Atomics.load(control, 0) === 0) {
  // Mostly a short pause (a UDP reader between datagrams), sometimes a burst of attempts.
  const r = random();
  if (r < 0.7) Atomics.wait(control, 0, 0, random() * 0.3);
  touched[0] = 1;
  Atomics.add(control, 1, reader.readReplies(touched));
}
libc.close(config.fd);
