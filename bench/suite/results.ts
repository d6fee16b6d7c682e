/** The shape of a benchmark run's results (the JSON file) and the figures derived per subject. */
import type { MicroRuntimeResult } from './micro-types.ts';
import type { CpuSplit } from './procfs.ts';
import type { ScaleResult } from './scale.ts';
import type { StartupRecord } from './startup.ts';
import type { SweepStop } from './sweep.ts';
import type { IperfRun, PingResult, UdpProbe } from './tools.ts';

/** How long each start's idle cost is measured, after its RSS reading (startup.ts). */
export const IDLE_CPU_WINDOW_MS = 2000;

export interface RunRecord {
  direction: 'a-to-b' | 'b-to-a';
  /** Parallel TCP streams (1 unless the run is one of `parallelRuns`). */
  streams?: number;
  gbps: number;
  retransmits: number;
  /** Payload bytes of the whole run, warm-up included. */
  totalBytes: number;
  wallSeconds: number;
  /** CPU seconds of all tunnel processes (both sides, all threads) during the run. */
  tunnelCpuSeconds: number;
  /** CPU seconds per tunnel process during the run, by side. */
  tunnelCpuBySide: Record<string, number>;
  /**
   * The tunnel processes' CPU during the run by kind (threads that lived through the whole run):
   * user space, kernel, and the busiest single thread. Absent in results saved before it existed.
   */
  tunnelCpuSplit?: CpuSplit;
  /** CPU seconds of processes outside the bench during the run (a lower bound): competing load. */
  foreignCpuSeconds: number;
  foreignTop: Array<{ process: string; seconds: number }>;
  iperf: IperfRun;
}

export interface ProcessRecord {
  side: string;
  comm: string;
  pid: number;
  ifname: string;
  peakRssBytes: number;
  threads: number;
}

export interface SubjectResult {
  id: string;
  label: string;
  kind: string;
  status: 'ok' | 'failed' | 'skipped';
  /** Why it was skipped or how it failed. */
  note?: string;
  info: Record<string, string>;
  /** TCP, one stream (A→B, and B→A with --reverse). */
  runs: RunRecord[];
  /** TCP, several streams (`iperf3 -P`), A→B. */
  parallelRuns?: RunRecord[];
  /** The UDP rate sweep. */
  udp?: UdpSweepRecord;
  ping?: Omit<PingResult, 'rttsMs'> & { rttsMs: number[] };
  /** The warm-up echoes before each idle-ping series (--ping-warmup), merged: a just-started daemon's answers. */
  pingFresh?: Omit<PingResult, 'rttsMs'> & { rttsMs: number[] };
  processes: ProcessRecord[];
  /** Starts of one daemon alone: time until its control socket answers, idle RSS (bench/suite/startup.ts). */
  startup?: StartupRecord;
  /** Goodput of the unrecorded priming transfer (cold start), Gbit/s. */
  primeGbps?: number;
  /**
   * Standing queues outside the tunnel processes, sampled once a second during the A→B runs
   * (after the warm-up): bytes by place ('tun A qdisc', 'udp B Recv-Q', …), median and max.
   */
  queues?: Record<string, { median: number; max: number }>;
  /** The UDP sockets' receive buffer sizes seen (skmem rb), bytes, by side. */
  udpReceiveBuffer?: Record<string, number>;
  /** Kernel counters over the measured runs: UDP per namespace, packets/drops per interface. */
  counters: Record<string, Record<string, number>>;
  summary?: SubjectSummary;
}

export interface UdpSweepRecord {
  payloadBytes: number;
  probeSeconds: number;
  /** Loss below which a probe passes (0.01). */
  maxLoss: number;
  /** The rate the search started from, bits per second. */
  startBps: number;
  probes: UdpProbe[];
  /** The passing probe with the highest received rate. */
  best?: UdpProbe;
  passingBps?: number;
  failingBps?: number;
  stoppedBy: SweepStop;
}

export interface SubjectSummary {
  /** A→B median, min and max of the runs, Gbit/s. */
  gbps: number;
  gbpsMin: number;
  gbpsMax: number;
  retransmits: number;
  /** B→A (with --reverse). */
  reverseGbps?: number;
  reverseRetransmits?: number;
  /** Median over the runs of the sender's mean TCP RTT during the transfer (latency under load), ms. */
  loadedRttMs?: number;
  rttMedianMs?: number;
  rttP99Ms?: number;
  /** Median of the warm-up echoes (pingFresh). */
  rttFreshMedianMs?: number;
  pingLoss?: number;
  /** Tunnel CPU seconds per 10^9 payload bytes, all runs together; undefined for the raw link. */
  cpuSecondsPerGB?: number;
  /** Of cpuSecondsPerGB: user space and kernel (one-stream runs with a recorded split). */
  userCpuSecondsPerGB?: number;
  kernelCpuSecondsPerGB?: number;
  /** The busiest single thread of either tunnel process, percent of one core over the runs' wall time (median of the runs). */
  busiestThreadPercent?: number;
  /** Tunnel CPU use during the runs, percent of one core (both sides together). */
  cpuPercent?: number;
  /** The larger VmHWM of the two tunnel processes. */
  peakRssBytes?: number;
  /** Starts of one daemon alone: spawn to the control socket's first answer (median, min, max), ms. */
  startupMs?: number;
  startupMsMin?: number;
  startupMsMax?: number;
  /** Its VmRSS idle after the start, median, bytes; its threads then. */
  idleRssBytes?: number;
  idleThreads?: number;
  /** What staying idle costs it (medians of the starts): CPU ms a second, and wake-ups of its threads a second. */
  idleCpuMsPerSecond?: number;
  idleRunsPerSecond?: number;
  /** CPU seconds used by other processes during the runs, per second of run (0.5 = half a core). */
  foreignCpuLoad: number;
  /** TCP with `parallelStreams` streams: median, min, max Gbit/s and median retransmits of the runs. */
  parallelStreams?: number;
  parallelGbps?: number;
  parallelGbpsMin?: number;
  parallelGbpsMax?: number;
  parallelRetransmits?: number;
  /** Tunnel CPU seconds per 10^9 payload bytes in the parallel runs. */
  parallelCpuSecondsPerGB?: number;
  /** UDP: the best passing probe's received rate (Mbit/s of payload), datagrams/s and loss. */
  udpPayloadBytes?: number;
  udpMbps?: number;
  udpPps?: number;
  udpLoss?: number;
  /** Why the sweep stopped (sender-limited means iperf3's sender, not the path, was the limit). */
  udpStoppedBy?: SweepStop;
}

export interface BenchMeta {
  command: string;
  started: string;
  finished: string;
  elapsedSeconds: number;
  host: string;
  kernel: string;
  cpu: string;
  cores: number;
  memoryBytes: number;
  versions: Record<string, string>;
  options: {
    duration: number; omit: number; prime: number; runs: number; pings: number; pingWarmup?: number; pingInterval: number; reverse: boolean; quick: boolean; subjects: string[];
    parallel?: boolean; streams?: number; udp?: boolean; udpSize?: number; udpProbeSeconds?: number; udpProbes?: number;
    startups?: number; startupIdleMs?: number; micro?: boolean; scale?: boolean; peers?: number; scaleRate?: number; getSamples?: number;
  };
  topology: string;
  /** Other processes' CPU use measured for one second before the start, cores (0.5 = half a core). */
  foreignLoadBefore: number;
  loadAverage: number[];
}

export interface MicroSection {
  /** One entry per runtime that ran (Node, Bun). */
  runtimes: MicroRuntimeResult[];
  /** Runtimes whose child process failed, with the message. */
  failures: Array<{ runtime: string; error: string }>;
}

export interface BenchResults {
  meta: BenchMeta;
  subjects: SubjectResult[];
  micro?: MicroSection;
  scale?: ScaleResult;
  /** Why the scale run failed. */
  scaleError?: string;
}
