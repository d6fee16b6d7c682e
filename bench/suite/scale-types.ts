/** The scale run's helper protocol (scale-child.ts) and its results. */

/** Simulated peers have source addresses 198.19.X.1–250: at most this many. */
export const MAX_SCALE_PEERS = 250 * 256;

/** The helper's configuration, one JSON line on its stdin (keys never go on a command line). */
export interface ScaleChildConfig {
  daemon: { publicKeyHex: string; host: string; port: number };
  /** One simulated peer per key, hex. */
  privateKeysHex: string[];
  /** The UDP source address of each simulated peer (same length as the keys). */
  sourceAddresses: string[];
  /** Initiations per second; 0 = all at once. */
  rate: number;
  /** Give up after this long, ms. */
  timeoutMs: number;
}

/** The helper's own figures. */
export interface ScaleChildResult {
  peers: number;
  /** Handshakes completed (responses consumed). */
  completed: number;
  /** From the first initiation to the last completed handshake, ms (NaN when none completed). */
  allDoneMs: number;
  /** Completion time of the median and the 90th-percentile peer, ms. */
  p50Ms: number;
  p90Ms: number;
  /** Completed on the first initiation (no cookie reply, no retransmission). */
  firstRound: number;
  /** Time to send the first initiation of every peer, ms. */
  burstMs: number;
  initiationsSent: number;
  responsesReceived: number;
  cookieRepliesReceived: number;
  elapsedMs: number;
  timedOut: boolean;
}

/** One line of the helper's stdout. */
export type ScaleChildMessage =
  | { type: 'started' }
  | { type: 'progress'; completed: number; elapsedMs: number; initiationsSent: number; cookieRepliesReceived: number }
  | { type: 'result'; result: ScaleChildResult };
