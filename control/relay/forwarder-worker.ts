/**
 * The relay's sockets in a thread of their own (started by forwarder-thread.ts): relayed
 * datagrams never wait for the agent's passes. A pass over the Node list and the data plane
 * blocks the agent's event loop for tens to hundreds of milliseconds, and a relay port's
 * receive buffer (about 200 KiB: some 150 full-size datagrams) overflows within milliseconds of
 * a transfer; every loss then halves the pair's TCP windows.
 *
 * Messages in: `{ kind: 'set', seq, configs }`, `{ kind: 'close' }`. Out: `{ kind: 'set-done',
 * seq, ready, unusable, counters }`, `{ kind: 'counters', counters }` every second while pairs
 * are served, `{ kind: 'port-error', port, message }`.
 */
import { parentPort, workerData } from 'node:worker_threads';
import { RelayForwarder } from './forwarder.ts';
import type { ThreadConfig, ToThread, FromThread, WirePairConfig } from './forwarder-messages.ts';
import { fromWire } from './forwarder-messages.ts';

const config = workerData as ThreadConfig;
const port = parentPort!;
const post = (message: FromThread) => port.postMessage(message);

const forwarder = new RelayForwarder({
  bytesPerSecond: config.bytesPerSecond,
  bindAddress: config.bindAddress,
  onError: (p, err) => post({ kind: 'port-error', port: p, message: err.message }),
});

const ticker = setInterval(() => post({ kind: 'counters', counters: [...forwarder.counters()] }), config.countersIntervalMs);

port.on('message', (message: ToThread) => {
  if (message.kind === 'close') {
    clearInterval(ticker);
    forwarder.close();
    port.close();
    return;
  }
  void forwarder.setPairs(message.configs.map((c: WirePairConfig) => fromWire(c))).then((ready) => post({
    kind: 'set-done', seq: message.seq, ready: ready.map((c) => c.id), unusable: [...forwarder.unusable], counters: [...forwarder.counters()],
  }));
});
