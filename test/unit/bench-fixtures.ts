/** Hand-made benchmark results for the report and chart tests (not a test file itself). */
import type { BenchResults, SubjectResult, SubjectSummary } from '../../bench/suite/results.ts';

export function summary(fields: Partial<SubjectSummary>): SubjectSummary {
  return { gbps: Number.NaN, gbpsMin: Number.NaN, gbpsMax: Number.NaN, retransmits: 0, foreignCpuLoad: 0, ...fields };
}

export function subject(id: string, label: string, kind: string, fields?: Partial<SubjectSummary>, extra: Partial<SubjectResult> = {}): SubjectResult {
  return {
    id, label, kind, status: fields ? 'ok' : 'skipped', info: {}, runs: [], processes: [], counters: {},
    ...(fields ? { summary: summary(fields) } : {}), ...extra,
  };
}

/** raw 15 / 12 Gbit/s and UDP ≥ 0.9 (sender-limited), node, bun and wireguard-go figures. */
export function sampleResults(): BenchResults {
  return {
    meta: {
      command: 'roamguard bench --quick', started: '2026-11-30T07:36:00.000Z', finished: '2026-11-30T07:38:00.000Z', elapsedSeconds: 102,
      host: 'vm & <test>', kernel: '6.1', cpu: 'EPYC', cores: 2, memoryBytes: 4 * 2 ** 30,
      versions: { node: 'v20', bun: '1.4.5', iperf3: 'iperf 3.12', 'wireguard-tools': 'v1', 'wireguard-go': 'v0.0.2022' },
      options: {
        duration: 3, omit: 1, prime: 2, runs: 1, pings: 50, pingInterval: 0.01, reverse: false, quick: true, subjects: ['raw', 'node', 'bun', 'wireguard-go'],
        parallel: true, streams: 4, udp: true, udpSize: 1200, udpProbeSeconds: 1, udpProbes: 5,
      },
      topology: 'two namespaces', foreignLoadBefore: 0, loadAverage: [0, 0, 0],
    },
    subjects: [
      subject('raw', 'raw veth link', 'raw', { gbps: 15, parallelGbps: 12, parallelRetransmits: 400, udpMbps: 900, udpPps: 93_750, udpStoppedBy: 'sender-limited' }),
      subject('node', 'roamguard node', 'roamguard', { gbps: 0.2, parallelGbps: 0.15, parallelRetransmits: 0, udpMbps: 90, udpPps: 9375, udpStoppedBy: 'converged' }),
      subject('bun', 'roamguard bun', 'roamguard', { gbps: 0.3, parallelGbps: 0.3, udpMbps: 100, udpPps: 10_400, udpStoppedBy: 'converged' }),
      subject('wireguard-go', 'wireguard-go', 'wireguard-go', { gbps: 0.25, parallelGbps: 0.3, parallelRetransmits: 17000, udpMbps: 180, udpPps: 18_750, udpStoppedBy: 'converged' }),
      subject('node-t0', 'roamguard node --threads 0', 'roamguard', undefined, { status: 'failed', note: 'tunnel died' }),
    ],
  };
}
