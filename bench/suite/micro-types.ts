/** What the microbenchmark child process (micro-child.ts) reports, per runtime. */

export interface MicroSettings {
  /** Shorter runs (the `--quick` suite). */
  quick: boolean;
  /** Peers added for the heap-per-peer figure. */
  peers: number;
}

export interface AeadResult {
  provider: string;
  size: number;
  /** 10^6 plaintext bytes per second, one thread. */
  sealMBps: number;
  openMBps: number;
  /** The same, sealing BATCH_SLOTS packets per call (Aead.sealSlots, as the data path does). */
  batchSealMBps?: number;
}

export interface AllowedIpsResult {
  family: 4 | 6;
  prefixes: number;
  lookupsPerSecond: number;
  hitRatio: number;
  /** Trie nodes of the table. */
  nodes: number;
}

export interface MicroRuntimeResult {
  runtime: 'node' | 'bun';
  /** e.g. `node v20.20.2`. */
  version: string;
  /** What selectCrypto() picks per group in this runtime. */
  selected: Record<string, string>;
  aead: AeadResult[];
  /** Providers that could not be measured, with the reason. */
  aeadErrors: Record<string, string>;
  handshakes?: { perSecond: number; count: number };
  allowedIps: AllowedIpsResult[];
  peerMemory?: { peers: number; heapBytesPerPeer: number };
  /** Parts that failed, with the message. */
  errors: Record<string, string>;
  elapsedSeconds: number;
}

/** One line of the child's stdout. */
export type MicroMessage =
  | { type: 'progress'; text: string }
  | { type: 'result'; result: MicroRuntimeResult };
