/**
 * The simulated peer set of the scale run, run inside the bench's namespace A:
 *
 *   node --import tsx bench/suite/scale-child.ts < config.json-line
 *
 * One WireGuardCore per simulated peer, each with its own key and its own UDP socket bound to its
 * own source address (so the daemon sees them as separate hosts, as real nodes would be), all
 * initiating a handshake to the one daemon at once (or at `rate` per second). The cores run on
 * the system clock with their timers ticked every 50 ms, so cookie replies and retransmissions
 * follow the protocol. Completes when every core has consumed a response (and sent the keepalive
 * that confirms the session to the daemon), or at the timeout. Writes JSON lines to stdout.
 */
import { createSocket, type Socket } from 'node:dgram';
import { createInterface } from 'node:readline';
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import { WireGuardCore } from '../../dataplane/core.ts';
import { Endpoint } from '../../dataplane/net/endpoint.ts';
import { keyFromHex } from '../../dataplane/noise/keys.ts';
import { MESSAGE_COOKIE_REPLY, MESSAGE_INITIATION, MESSAGE_RESPONSE } from '../../dataplane/noise/messages.ts';
import { percentile } from './stats.ts';
import type { ScaleChildConfig, ScaleChildMessage, ScaleChildResult } from './scale-types.ts';

const send = (message: ScaleChildMessage) => process.stdout.write(`${JSON.stringify(message)}\n`);

async function readConfig(): Promise<ScaleChildConfig> {
  const lines = createInterface({ input: process.stdin });
  for await (const line of lines) {
    if (line.trim()) { lines.close(); return JSON.parse(line) as ScaleChildConfig; }
  }
  throw new Error('no configuration on stdin');
}

function bind(socket: Socket, address: string): Promise<void> {
  return new Promise((resolve, reject) => {
    socket.once('error', reject);
    socket.bind({ address, port: 0, exclusive: true }, () => { socket.off('error', reject); resolve(); });
  });
}

async function main(): Promise<void> {
  const config = await readConfig();
  const n = config.privateKeysHex.length;
  if (config.sourceAddresses.length !== n) throw new Error('one source address per key');
  const crypto = await selectCrypto();
  const daemon = new Endpoint(config.daemon.host, config.daemon.port);
  const daemonKey = keyFromHex(config.daemon.publicKeyHex);

  let t0 = 0;
  const doneAt = new Float64Array(n).fill(Number.NaN);
  /** Initiations each simulated peer sent before its handshake completed. */
  const attempts = new Uint16Array(n);
  let completed = 0, initiationsSent = 0, responsesReceived = 0, cookieRepliesReceived = 0;
  let finish!: () => void;
  const allDone = new Promise<void>((resolve) => { finish = resolve; });

  const sockets: Socket[] = [];
  const cores: WireGuardCore[] = [];
  for (let i = 0; i < n; i++) {
    const socket = createSocket({ type: 'udp4' });
    const core = new WireGuardCore({
      crypto, privateKey: keyFromHex(config.privateKeysHex[i]),
      outputs: {
        sendDatagram(to, datagram) {
          if (datagram[0] === MESSAGE_INITIATION) { initiationsSent++; if (Number.isNaN(doneAt[i])) attempts[i]++; }
          socket.send(Buffer.from(datagram), to.port, to.host);
        },
        deliverPacket() { /* no data in this run */ },
        handshakeCompleted() {
          if (!Number.isNaN(doneAt[i])) return;
          doneAt[i] = performance.now() - t0;
          if (++completed === n) finish();
        },
      },
    });
    core.addPeer(daemonKey, { endpoint: daemon, allowedIps: [] });
    socket.on('message', (msg, rinfo) => {
      if (msg[0] === MESSAGE_RESPONSE) responsesReceived++;
      else if (msg[0] === MESSAGE_COOKIE_REPLY) cookieRepliesReceived++;
      core.receiveDatagram(new Uint8Array(msg.buffer, msg.byteOffset, msg.length), new Endpoint(rinfo.address, rinfo.port));
    });
    await bind(socket, config.sourceAddresses[i]);
    sockets.push(socket);
    cores.push(core);
  }

  const ticker = setInterval(() => { for (const core of cores) core.tick(); }, 50);
  const stats = () => ({ completed, elapsedMs: performance.now() - t0, initiationsSent, cookieRepliesReceived });
  const reporter = setInterval(() => send({ type: 'progress', ...stats() }), 1000);

  t0 = performance.now();
  send({ type: 'started' });
  let burstMs = 0;
  const initiate = (i: number) => cores[i].getPeer(daemonKey)!.initiateHandshake();
  if (config.rate > 0) {
    // Paced: a slice every 10 ms.
    const perSlice = Math.max(1, Math.round(config.rate / 100));
    await new Promise<void>((resolve) => {
      let next = 0;
      const slicer = setInterval(() => {
        for (let k = 0; k < perSlice && next < n; k++) initiate(next++);
        if (next >= n) { clearInterval(slicer); resolve(); }
      }, 10);
    });
  } else {
    for (let i = 0; i < n; i++) initiate(i);
  }
  burstMs = performance.now() - t0;

  let timedOut = false;
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([allDone, new Promise<void>((resolve) => { timer = setTimeout(() => { timedOut = true; resolve(); }, config.timeoutMs); })]);
  clearTimeout(timer);
  clearInterval(ticker);
  clearInterval(reporter);

  const times = Array.from(doneAt).filter((t) => !Number.isNaN(t));
  const result: ScaleChildResult = {
    peers: n,
    completed,
    allDoneMs: times.length > 0 ? Math.max(...times) : Number.NaN,
    p50Ms: percentile(times, 50),
    p90Ms: percentile(times, 90),
    firstRound: Array.from(attempts).filter((a, i) => a === 1 && !Number.isNaN(doneAt[i])).length,
    burstMs,
    initiationsSent,
    responsesReceived,
    cookieRepliesReceived,
    elapsedMs: performance.now() - t0,
    timedOut,
  };
  // Let the last keepalives leave before the sockets close.
  await new Promise((resolve) => setTimeout(resolve, 200));
  send({ type: 'result', result });
  for (const s of sockets) s.close();
}

main().then(() => process.exit(0), (err: unknown) => {
  process.stderr.write(`scale-child: ${(err as Error)?.stack ?? String(err)}\n`);
  process.exit(1);
});
