/**
 * Why packets were dropped, counted by reason. Every drop in the data plane goes through here, so
 * nothing disappears silently; the counters are exported as metrics by later layers.
 */
export const DROP_REASONS = [
  // Before the data plane saw them: the kernel dropped them from a full socket receive queue
  'receive-queue-overflow',
  // Datagram shape (noise/messages.ts)
  'too-short', 'unknown-type', 'bad-length',
  // Handshake messages
  'bad-mac1', 'cookie-required', 'cookie-reply-shed', 'rate-limited', 'handshake-failed', 'handshake-replay',
  'handshake-flood', 'unknown-peer', 'bad-cookie-reply',
  // Transport messages
  'unknown-index', 'expired-keypair', 'counter-limit', 'decryption-failed', 'replay',
  'bad-inner-packet', 'allowed-ips-mismatch',
  // A datagram queued for a keypair that was retired before it was opened or delivered (keypair.ts)
  'keypair-retired',
  // Outbound
  'no-route', 'no-endpoint', 'staged-overflow', 'handshake-gave-up', 'packet-too-large',
  // The floor under the keypair rule: sealing or opening with an all-zero key refused (session/transport.ts)
  'zero-key',
] as const;

export type DropReason = typeof DROP_REASONS[number];

export class DropCounters {
  private readonly counts = new Map<DropReason, number>(DROP_REASONS.map((r) => [r, 0]));

  count(reason: DropReason, n = 1): void {
    this.counts.set(reason, (this.counts.get(reason) ?? 0) + n);
  }

  get(reason: DropReason): number {
    return this.counts.get(reason) ?? 0;
  }

  total(): number {
    let sum = 0;
    for (const n of this.counts.values()) sum += n;
    return sum;
  }

  /** Non-zero counters, for status output and tests. */
  snapshot(): Partial<Record<DropReason, number>> {
    const out: Partial<Record<DropReason, number>> = {};
    for (const [reason, n] of this.counts) if (n > 0) out[reason] = n;
    return out;
  }
}
