/**
 * A UDP relay that makes two WireGuard handshake initiations cross, for
 * crossed-handshakes.test.ts. Run inside a namespace as
 *
 *   node --import tsx test/system/crossing-relay.ts FRONT_A FRONT_B TARGET_A TARGET_B
 *
 * (each `ip:port`). Side A's daemon is given FRONT_A as its peer's endpoint and side B's FRONT_B:
 * what arrives on FRONT_A goes to TARGET_B from FRONT_B, and what arrives on FRONT_B goes to
 * TARGET_A from FRONT_A, so each daemon sees its peer at the endpoint it was given.
 *
 * Every datagram passes at once, except a handshake initiation (message type 1) while the other
 * side has sent none: it is held until the other side's arrives, and then both are sent on
 * together (once: later initiations, the daemons' retries, pass at once). The two initiations are then in flight at the same time, each sent before the other
 * arrived: the crossing that two nodes produce when both start a handshake at the same moment
 * (a key rotation, a relay's direct trial). It prints `ready` once listening and
 * `crossed` when it released the pair.
 */
import { createSocket, type Socket } from 'node:dgram';

const MESSAGE_INITIATION = 1;

function parse(text: string): { host: string; port: number } {
  const m = /^([0-9.]+):(\d+)$/.exec(text);
  if (!m) throw new Error(`expected an IPv4 ip:port, got ${JSON.stringify(text)}`);
  return { host: m[1], port: Number(m[2]) };
}

function bind(address: { host: string; port: number }): Promise<Socket> {
  return new Promise((resolve, reject) => {
    const socket = createSocket('udp4');
    socket.once('error', reject);
    socket.bind(address.port, address.host, () => resolve(socket));
  });
}

async function main(): Promise<void> {
  const [frontA, frontB, targetA, targetB] = process.argv.slice(2).map(parse);
  if (!targetB) throw new Error('usage: crossing-relay.ts FRONT_A FRONT_B TARGET_A TARGET_B');
  const sockets = { a: await bind(frontA), b: await bind(frontB) };
  /** An initiation from each side, held until the other side's arrives. */
  const held: { a?: Buffer; b?: Buffer } = {};
  let crossed = false;
  const forward = (from: 'a' | 'b', datagram: Buffer) => {
    // From A's front to B's daemon (sent from B's front), and the other way round.
    if (from === 'a') sockets.b.send(datagram, targetB.port, targetB.host);
    else sockets.a.send(datagram, targetA.port, targetA.host);
  };
  for (const side of ['a', 'b'] as const) {
    const other = side === 'a' ? 'b' : 'a';
    sockets[side].on('message', (datagram) => {
      if (datagram.length === 0 || datagram[0] !== MESSAGE_INITIATION) {
        forward(side, datagram);
        return;
      }
      if (crossed) {
        forward(side, datagram); // one crossing only: the daemons' retries pass
        return;
      }
      const waiting = held[other];
      if (waiting === undefined) {
        held[side] = datagram; // a newer one replaces an older one: the daemon retried
        return;
      }
      held[other] = undefined;
      crossed = true;
      forward(other, waiting);
      forward(side, datagram);
      process.stdout.write('crossed\n');
    });
  }
  process.stdout.write('ready\n');
}

main().catch((err: Error) => {
  process.stderr.write(`crossing-relay: ${err.message}\n`);
  process.exit(1);
});
