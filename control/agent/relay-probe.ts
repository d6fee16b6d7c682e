/**
 * Probes the relays through the tunnel, so that a relay lost mid-pair is noticed in seconds
 * instead of after two keepalive periods (control/mesh/relay.ts decides whom to probe and how long
 * a silence means dead).
 *
 * A probe is one byte of UDP to port 9 (discard) of the relay's tunnel gateway address, an address
 * of the relay's own tunnel interface: the relay's kernel answers "port unreachable" through the
 * tunnel, and that answer is what makes the relay's received bytes grow in the data plane's
 * counters. No raw socket and no process per probe; a lost answer costs nothing (the next probe
 * follows RELAY_PROBE_INTERVAL_MS later). Linux rate-limits these answers per destination to about
 * one a second with a burst of six: one probe every two seconds stays under that.
 */
import dgram from 'node:dgram';
import { isIP } from 'node:net';
import { RELAY_PROBE_INTERVAL_MS } from '../mesh/relay.ts';

const DISCARD_PORT = 9;
const PROBE = Buffer.from([0]);

/** Sends the probes; an in-memory double can stand in for `send` in tests. */
export class RelayProber {
  private targets: string[] = [];
  private timer: NodeJS.Timeout | undefined;
  private readonly sockets: { 4?: dgram.Socket; 6?: dgram.Socket } = {};
  /** Probes sent so far (the agent's metrics read it). */
  sent = 0;

  constructor(private readonly intervalMs = RELAY_PROBE_INTERVAL_MS, private readonly send?: (address: string) => void) {}

  /** The addresses to probe from now on (none stops the timer). */
  setTargets(addresses: readonly string[]): void {
    this.targets = [...addresses];
    if (this.targets.length === 0) {
      clearInterval(this.timer);
      this.timer = undefined;
      return;
    }
    if (this.timer) return;
    this.probeAll();
    this.timer = setInterval(() => this.probeAll(), this.intervalMs);
    this.timer.unref();
  }

  close(): void {
    clearInterval(this.timer);
    this.timer = undefined;
    this.targets = [];
    for (const socket of Object.values(this.sockets)) socket?.close();
    delete this.sockets[4];
    delete this.sockets[6];
  }

  private probeAll(): void {
    for (const address of this.targets) {
      this.sent++;
      if (this.send) this.send(address);
      else this.sendUdp(address);
    }
  }

  private sendUdp(address: string): void {
    const family = isIP(address) === 6 ? 6 : 4;
    let socket = this.sockets[family];
    if (!socket) {
      socket = dgram.createSocket(family === 6 ? 'udp6' : 'udp4');
      // A probe's outcome is read from the data plane's counters, never from this socket (an
      // unconnected socket hears nothing of the answer); a send that fails is a probe lost.
      socket.on('error', () => {});
      socket.unref();
      this.sockets[family] = socket;
    }
    socket.send(PROBE, DISCARD_PORT, address, () => {});
  }
}
