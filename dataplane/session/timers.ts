/**
 * The per-peer timer rules of the whitepaper (§6) as a pure state machine over deadlines.
 *
 * Nothing here runs by itself: events call the hooks below (named after the events, as in
 * wireguard-go's timers.go), which arm or cancel deadlines; `poll(now)` runs whatever is due.
 * The device calls `poll` from one interval timer for all peers (or at `nextDeadline()`), and
 * tests drive it with a manual clock.
 */
import { maxTimerHandshakes, type Timings } from '../constants.ts';

/** What expiring timers ask the peer to do. */
export interface TimerActions {
  sendHandshakeInitiation(isRetry: boolean): void;
  sendKeepalive(): void;
  /** Gave up after RekeyAttemptTime: drop packets waiting for the handshake. */
  flushStagedPackets(): void;
  /** Wipe all keys and handshake state (nothing heard for 3 × RejectAfterTime). */
  zeroKeyMaterial(): void;
  /** Forget the cached local source address so the kernel may pick a new route. */
  clearSourceAddress(): void;
}

const OFF = Infinity;

export class PeerTimers {
  retransmitHandshakeAt = OFF;
  sendKeepaliveAt = OFF;
  newHandshakeAt = OFF;
  zeroKeyMaterialAt = OFF;
  persistentKeepaliveAt = OFF;

  handshakeAttempts = 0;
  needAnotherKeepalive = false;
  sentLastMinuteHandshake = false;
  /** Seconds; 0 disables persistent keepalive. */
  persistentKeepaliveInterval = 0;

  constructor(
    private readonly timings: Timings,
    private readonly actions: TimerActions,
    private readonly random: () => number = Math.random,
  ) {}

  private jitter(): number {
    return Math.floor(this.random() * this.timings.rekeyTimeoutJitterMax);
  }

  // --- Event hooks ---

  /** A data packet (not a keepalive) was sent: expect an answer within Keepalive + RekeyTimeout. */
  dataSent(now: number): void {
    if (this.newHandshakeAt === OFF) {
      this.newHandshakeAt = now + this.timings.keepaliveTimeout + this.timings.rekeyTimeout + this.jitter();
    }
  }

  /** A data packet was received: acknowledge it with a keepalive if we send nothing else soon. */
  dataReceived(now: number): void {
    if (this.sendKeepaliveAt === OFF) this.sendKeepaliveAt = now + this.timings.keepaliveTimeout;
    else this.needAnotherKeepalive = true;
  }

  /** Any authenticated packet (data, keepalive, handshake) was sent: no separate keepalive needed. */
  anyAuthenticatedPacketSent(): void {
    this.sendKeepaliveAt = OFF;
  }

  /** Any authenticated packet was received: the peer is alive, no new handshake needed for that. */
  anyAuthenticatedPacketReceived(): void {
    this.newHandshakeAt = OFF;
  }

  /** An authenticated packet went either way: restart the persistent keepalive interval. */
  anyAuthenticatedPacketTraversal(now: number): void {
    if (this.persistentKeepaliveInterval > 0) {
      this.persistentKeepaliveAt = now + this.persistentKeepaliveInterval * 1000;
    }
  }

  handshakeInitiated(now: number): void {
    this.retransmitHandshakeAt = now + this.timings.rekeyTimeout + this.jitter();
  }

  handshakeComplete(): void {
    this.retransmitHandshakeAt = OFF;
    this.handshakeAttempts = 0;
    this.sentLastMinuteHandshake = false;
  }

  /** New keys exist: wipe everything if no newer handshake happens within 3 × RejectAfterTime. */
  sessionDerived(now: number): void {
    this.zeroKeyMaterialAt = now + this.timings.rejectAfterTime * 3;
  }

  /** The peer was stopped or removed. */
  stopAll(): void {
    this.retransmitHandshakeAt = this.sendKeepaliveAt = this.newHandshakeAt = OFF;
    this.zeroKeyMaterialAt = this.persistentKeepaliveAt = OFF;
    this.handshakeAttempts = 0;
    this.needAnotherKeepalive = false;
    this.sentLastMinuteHandshake = false;
  }

  /** The earliest armed deadline, or Infinity. */
  nextDeadline(): number {
    return Math.min(this.retransmitHandshakeAt, this.sendKeepaliveAt, this.newHandshakeAt,
      this.zeroKeyMaterialAt, this.persistentKeepaliveAt);
  }

  // --- Expiry ---

  /** Runs every timer whose deadline has passed. */
  poll(now: number): void {
    if (now >= this.retransmitHandshakeAt) { this.retransmitHandshakeAt = OFF; this.retransmitHandshakeExpired(now); }
    if (now >= this.sendKeepaliveAt) { this.sendKeepaliveAt = OFF; this.sendKeepaliveExpired(now); }
    if (now >= this.newHandshakeAt) { this.newHandshakeAt = OFF; this.newHandshakeExpired(); }
    if (now >= this.zeroKeyMaterialAt) { this.zeroKeyMaterialAt = OFF; this.actions.zeroKeyMaterial(); }
    if (now >= this.persistentKeepaliveAt) {
      this.persistentKeepaliveAt = OFF;
      if (this.persistentKeepaliveInterval > 0) this.actions.sendKeepalive();
    }
  }

  /** No response to our initiation within RekeyTimeout: try again, up to RekeyAttemptTime. */
  private retransmitHandshakeExpired(now: number): void {
    if (this.handshakeAttempts > maxTimerHandshakes(this.timings)) {
      this.sendKeepaliveAt = OFF;
      this.actions.flushStagedPackets();
      // Keep the keys a while for packets still in flight, but not forever.
      if (this.zeroKeyMaterialAt === OFF) this.zeroKeyMaterialAt = now + this.timings.rejectAfterTime * 3;
      return;
    }
    this.handshakeAttempts++;
    this.actions.clearSourceAddress();
    this.actions.sendHandshakeInitiation(true);
  }

  private sendKeepaliveExpired(now: number): void {
    this.actions.sendKeepalive();
    if (this.needAnotherKeepalive) {
      this.needAnotherKeepalive = false;
      this.sendKeepaliveAt = now + this.timings.keepaliveTimeout;
    }
  }

  /** We sent data and heard nothing back for Keepalive + RekeyTimeout: the session may be dead. */
  private newHandshakeExpired(): void {
    this.actions.clearSourceAddress();
    this.actions.sendHandshakeInitiation(false);
  }
}
