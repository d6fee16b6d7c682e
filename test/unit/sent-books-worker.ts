/**
 * The reader's side of test/unit/sent-books.test.ts's thread test: adds rounds of records to the
 * table as fast as it can, as a TUN reader would, while the main thread drains it. Counts, per
 * peer (0..PEERS-1), the datagrams and bytes of the rounds the table took, in `totals`; the rounds
 * it refused are counted apart (a reader publishes those through the ring instead).
 */
import { workerData } from 'node:worker_threads';
import { SentBooks } from '../../dataplane/tun/sent-books.ts';
import { RECORD_INTS, R_LENGTH, R_OUTCOME, R_PEER, SEALED } from '../../dataplane/session/transport-sealer.ts';

export interface SentBooksWorkerConfig {
  books: SharedArrayBuffer;
  /** [stop, rounds taken, rounds refused, then per peer: datagrams, bytes] */
  control: SharedArrayBuffer;
  peers: number;
}

const config = workerData as SentBooksWorkerConfig;
const control = new Int32Array(config.control);
const books = new SentBooks(config.books);
const slots = 256;
const records = new Int32Array(slots * RECORD_INTS);
let seed = 12345;
const next = () => (seed = (Math.imul(seed, 1103515245) + 12345) >>> 0);
let start = 0;
while (Atomics.load(control, 0) === 0) {
  const count = 1 + (next() % 64);
  const counted = new Float64Array(config.peers * 2);
  for (let i = 0; i < count; i++) {
    const r = ((start + i) & (slots - 1)) * RECORD_INTS;
    const peer = next() % config.peers;
    records[r + R_OUTCOME] = SEALED;
    records[r + R_PEER] = peer;
    records[r + R_LENGTH] = 60 + (next() % 1400);
    counted[peer * 2]++;
    counted[peer * 2 + 1] += records[r + R_LENGTH];
  }
  if (books.tryAdd(records, start & (slots - 1), count, slots - 1)) {
    Atomics.add(control, 1, 1);
    for (let p = 0; p < config.peers; p++) {
      Atomics.add(control, 3 + p * 2, counted[p * 2]);
      Atomics.add(control, 4 + p * 2, counted[p * 2 + 1]);
    }
  } else {
    Atomics.add(control, 2, 1);
  }
  start = (start + count) & (slots - 1);
}
