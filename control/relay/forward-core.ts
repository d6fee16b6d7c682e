/**
 * The relay's forwarding decisions for TURN-like port pairs (sans-I/O: datagram facts and a clock
 * in, what to do out; control/relay/forwarder.ts does the sockets).
 *
 * A relayed pair (A, B) has two ports on the relay: A sends to one, B to the other. The relay
 * cannot authenticate WireGuard (it holds no key), so it protects the pair in the ways it can:
 *
 * - a side's address is learned from a datagram on its port that looks like WireGuard (message
 *   type 1-4 with that type's size) and comes from an IP that side is known at (its own
 *   addresses, its NAT's public address, where the relay's data plane sees it); a later such
 *   datagram from a new port of the same IP re-learns it (a NAT that rebound);
 * - a datagram is forwarded only once the other side is learned, out of the other side's port,
 *   so each member sees the relay as one fixed endpoint;
 * - each pair has a byte budget per second (token bucket); the number of pairs is bounded by the
 *   allocation (control/mesh/relay.ts).
 *
 * Every datagram is counted: forwarded (datagrams and bytes, per direction) or dropped by reason.
 */

export type DropReason = 'not-wireguard' | 'unknown-source' | 'other-side-unknown' | 'rate-limited' | 'no-pair' | 'send-failed';
export const DROP_REASONS: readonly DropReason[] = ['not-wireguard', 'unknown-source', 'other-side-unknown', 'rate-limited', 'no-pair', 'send-failed'];

export interface PairCounters {
  /** Index 0: from the lower key's side to the higher's; 1: the other way. */
  datagrams: [number, number];
  bytes: [number, number];
  dropped: Record<DropReason, number>;
}

export interface PairConfig {
  id: string;
  ports: readonly [number, number];
  /** The IPs each side may send from (canonical text). */
  allowedSources: readonly [ReadonlySet<string>, ReadonlySet<string>];
}

export type ForwardDecision =
  | { action: 'forward'; fromPort: number; toHost: string; toPort: number }
  | { action: 'drop'; reason: DropReason };

interface PairState {
  config: PairConfig;
  learned: [{ host: string; port: number } | undefined, { host: string; port: number } | undefined];
  tokens: number;
  refilledAt: number;
  counters: PairCounters;
}

const WG_SIZES: Record<number, number> = { 1: 148, 2: 92, 3: 64 };

/** A WireGuard message by its header: type 1-3 at their fixed sizes, or transport data (type 4, at least 32 bytes). */
export function looksLikeWireGuard(first4: Uint8Array, length: number): boolean {
  if (length < 4 || first4[1] !== 0 || first4[2] !== 0 || first4[3] !== 0) return false;
  const type = first4[0];
  if (type === 4) return length >= 32;
  return WG_SIZES[type] === length;
}

export function newCounters(): PairCounters {
  return { datagrams: [0, 0], bytes: [0, 0], dropped: Object.fromEntries(DROP_REASONS.map((r) => [r, 0])) as Record<DropReason, number> };
}

export class RelayForwardCore {
  private readonly pairs = new Map<string, PairState>();
  private readonly byPort = new Map<number, { pair: PairState; side: 0 | 1 }>();
  /** Drops on ports no pair holds (a datagram racing a pair's removal). */
  unassigned = 0;

  constructor(private readonly options: { bytesPerSecond: number; nowMs: () => number }) {}

  /** Replaces the set of pairs; a pair that stays keeps what it learned and its counters. */
  setPairs(configs: readonly PairConfig[]): void {
    const keep = new Set(configs.map((c) => c.id));
    for (const id of [...this.pairs.keys()]) if (!keep.has(id)) this.pairs.delete(id);
    this.byPort.clear();
    for (const config of configs) {
      let state = this.pairs.get(config.id);
      if (!state || state.config.ports[0] !== config.ports[0] || state.config.ports[1] !== config.ports[1]) {
        state = { config, learned: [undefined, undefined], tokens: this.burst(), refilledAt: this.options.nowMs(), counters: state?.counters ?? newCounters() };
        this.pairs.set(config.id, state);
      } else {
        state.config = config;
      }
      this.byPort.set(config.ports[0], { pair: state, side: 0 });
      this.byPort.set(config.ports[1], { pair: state, side: 1 });
    }
  }

  /** A datagram arrived on `port` from `host:port`; its first four bytes and length decide. */
  onDatagram(port: number, fromHost: string, fromPort: number, first4: Uint8Array, length: number): ForwardDecision {
    const slot = this.byPort.get(port);
    if (!slot) {
      this.unassigned++;
      return { action: 'drop', reason: 'no-pair' };
    }
    const { pair, side } = slot;
    const drop = (reason: DropReason): ForwardDecision => {
      pair.counters.dropped[reason]++;
      return { action: 'drop', reason };
    };
    if (!looksLikeWireGuard(first4, length)) return drop('not-wireguard');
    if (!pair.config.allowedSources[side].has(fromHost)) return drop('unknown-source');
    const known = pair.learned[side];
    if (!known || known.host !== fromHost || known.port !== fromPort) pair.learned[side] = { host: fromHost, port: fromPort };
    const other = pair.learned[side === 0 ? 1 : 0];
    if (!other) return drop('other-side-unknown');
    if (!this.take(pair, length)) return drop('rate-limited');
    pair.counters.datagrams[side]++;
    pair.counters.bytes[side] += length;
    return { action: 'forward', fromPort: pair.config.ports[side === 0 ? 1 : 0], toHost: other.host, toPort: other.port };
  }

  /** A forward the socket could not send (full queue, error). */
  sendFailed(port: number): void {
    const slot = this.byPort.get(port);
    if (slot) slot.pair.counters.dropped['send-failed']++;
  }

  counters(): Map<string, PairCounters> {
    return new Map([...this.pairs].map(([id, s]) => [id, s.counters]));
  }

  /** Where each side was learned (status, tests). */
  learned(id: string): ReadonlyArray<{ host: string; port: number } | undefined> | undefined {
    return this.pairs.get(id)?.learned;
  }

  private burst(): number {
    // A quarter second of the rate, at least a few full-size datagrams.
    return Math.max(this.options.bytesPerSecond / 4, 4 * 65536);
  }

  private take(pair: PairState, bytes: number): boolean {
    if (this.options.bytesPerSecond <= 0) return true;
    const now = this.options.nowMs();
    pair.tokens = Math.min(this.burst(), pair.tokens + ((now - pair.refilledAt) / 1000) * this.options.bytesPerSecond);
    pair.refilledAt = now;
    if (pair.tokens < bytes) return false;
    pair.tokens -= bytes;
    return true;
  }
}
