/**
 * Protocol constants, named as in the WireGuard whitepaper (§6) and wireguard-go's constants.
 * Times are in milliseconds because the core's Clock speaks milliseconds.
 *
 * Tests that need faster timers pass a modified copy through `Timings` (session/timings.ts);
 * these production values are never edited at run time.
 */

export const REKEY_AFTER_MESSAGES = 2n ** 60n;
export const REJECT_AFTER_MESSAGES = 2n ** 64n - 2n ** 13n - 1n;

/**
 * JavaScript numbers are exact up to 2^53 - 1, so counters are kept as numbers and every counter
 * that a number cannot hold counts as "past the limit". The real limits (2^60 and 2^64 - 2^13 - 1)
 * are unreachable in practice: at 10 million packets a second 2^53 takes 28 years.
 */
export const REKEY_AFTER_MESSAGES_SAFE = Number.MAX_SAFE_INTEGER - 2 ** 13;
export const REJECT_AFTER_MESSAGES_SAFE = Number.MAX_SAFE_INTEGER;

export const REKEY_AFTER_TIME = 120_000;
export const REJECT_AFTER_TIME = 180_000;
export const REKEY_ATTEMPT_TIME = 90_000;
export const REKEY_TIMEOUT = 5_000;
/** Retransmissions get 0..333 ms of random jitter so that peers don't synchronise. */
export const REKEY_TIMEOUT_JITTER_MAX = 334;
export const KEEPALIVE_TIMEOUT = 10_000;
export const COOKIE_REFRESH_TIME = 120_000;
/** A peer may send at most one initiation per 20 ms; faster ones are treated as a flood. */
export const HANDSHAKE_INITIATION_RATE = 20;
export const MAX_TIMER_HANDSHAKES = REKEY_ATTEMPT_TIME / REKEY_TIMEOUT; // 18
/** Keys are wiped after three times the reject time without a new handshake. */
export const ZERO_KEY_MATERIAL_AFTER = REJECT_AFTER_TIME * 3;
/** Once the handshake queue has been this long, the device stays "under load" for UNDER_LOAD_AFTER_TIME. */
export const UNDER_LOAD_QUEUE_LENGTH = 1024 / 8;
export const UNDER_LOAD_AFTER_TIME = 1_000;
/** Without a handshake queue to measure, this many handshake messages in one second mean "under load". */
export const UNDER_LOAD_HANDSHAKES_PER_SECOND = 256;
/**
 * While overloaded (the device's receive queue overflowed within UNDER_LOAD_AFTER_TIME: see
 * WireGuardCore.reportReceiveOverflow), cookie replies per source address (IPv4, or IPv6 /64) and second, with this
 * burst; the rest are shed (counted, not answered). Generous for peers behind one NAT address
 * (each retries every 5 s), a small fraction of a flood.
 */
export const OVERLOADED_COOKIE_REPLIES_PER_SECOND = 10;
export const OVERLOADED_COOKIE_REPLY_BURST = 10;

export const PADDING_MULTIPLE = 16;
export const DEFAULT_MTU = 1420;
/** The largest plaintext a transport message can carry (a UDP payload minus WireGuard's overhead). */
export const MAX_CONTENT_SIZE = 65535 - 32;

/** How many outbound packets a peer keeps while it waits for a handshake (oldest dropped first). */
export const MAX_STAGED_PACKETS = 128;

/**
 * How long before a keypair's reject-after time the threads that use it on their own stop doing
 * so (the receiving thread's delivery, the sending thread's sealing): they have no clock of ours,
 * and the main thread's timer, which runs at that moment (core.nextDeadline), takes the keypair
 * back from them this early.
 */
export const THREAD_KEYPAIR_MARGIN_MS = 1000;

/**
 * The time-based constants as one object, so a test can run the real state machine with shorter
 * timers (e.g. a rekey every 2 s) without touching the production values above.
 */
export interface Timings {
  rekeyAfterTime: number;
  rejectAfterTime: number;
  rekeyAttemptTime: number;
  rekeyTimeout: number;
  rekeyTimeoutJitterMax: number;
  keepaliveTimeout: number;
  cookieRefreshTime: number;
  handshakeInitiationRate: number;
}

/** The timers a test may shorten (ROAMGUARD_TEST_TIMINGS, dataplane/settings.ts). */
export const TIMING_NAMES: readonly (keyof Timings)[] = [
  'rekeyAfterTime', 'rejectAfterTime', 'rekeyAttemptTime', 'rekeyTimeout', 'rekeyTimeoutJitterMax',
  'keepaliveTimeout', 'cookieRefreshTime', 'handshakeInitiationRate',
];

export const PRODUCTION_TIMINGS: Readonly<Timings> = Object.freeze({
  rekeyAfterTime: REKEY_AFTER_TIME,
  rejectAfterTime: REJECT_AFTER_TIME,
  rekeyAttemptTime: REKEY_ATTEMPT_TIME,
  rekeyTimeout: REKEY_TIMEOUT,
  rekeyTimeoutJitterMax: REKEY_TIMEOUT_JITTER_MAX,
  keepaliveTimeout: KEEPALIVE_TIMEOUT,
  cookieRefreshTime: COOKIE_REFRESH_TIME,
  handshakeInitiationRate: HANDSHAKE_INITIATION_RATE,
});

/** Handshake attempts before giving up: RekeyAttemptTime / RekeyTimeout (18 in production). */
export function maxTimerHandshakes(t: Timings): number {
  return Math.floor(t.rekeyAttemptTime / t.rekeyTimeout);
}
