/**
 * Start-up time and idle cost (memory, CPU, wake-ups) of one tunnel daemon, per subject. The daemon is started alone
 * (nothing else of the bench runs meanwhile) in the foreground in a namespace, and timed from the
 * spawn to the first complete answer of its control socket to `get=1`, polled every 5 ms: the
 * moment `wg` and wg-quick can configure it. Then it is left idle, unconfigured, for `idleMs`
 * and its VmRSS and thread count are read; then what staying idle costs it over the next
 * IDLE_CPU_WINDOW_MS: CPU time and wake-ups (the times its threads ran) a second, from every
 * thread's schedstat. Repeated `runs` times; the summary takes medians.
 */
import { join } from 'node:path';
import { UapiClient } from '../../dataplane/uapi/uapi-client.ts';
import { WG_SOCKET_DIR, uniqueName, type Namespace, type Scope } from '../../test/system/netns.ts';
import { launchSpec, type Implementation } from '../../test/system/userspace-wg.ts';
import { memoryStatus, schedRates, threadSched } from './procfs.ts';
import { IDLE_CPU_WINDOW_MS } from './results.ts';
import { requireCompiled, type SubjectSpec } from './subjects.ts';

export interface StartupSample {
  /** Spawn to the first complete `get=1` answer, ms. */
  readyMs: number;
  /** VmRSS after `idleMs` idle, bytes. */
  idleRssBytes: number;
  threads: number;
  /** CPU time idle, ms a second, all threads (over IDLE_CPU_WINDOW_MS after the RSS reading). */
  idleCpuMsPerSecond: number;
  /** Times its threads ran idle, a second: each is a wake-up of a thread (or a return after preemption). */
  idleRunsPerSecond: number;
}

export interface StartupRecord {
  idleMs: number;
  samples: StartupSample[];
}

const POLL_MS = 5;
const START_TIMEOUT_MS = 30_000;

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

function implementationOf(spec: SubjectSpec): Implementation {
  if (spec.kind === 'wireguard-go') return spec.build === 'modern' ? 'wireguard-go-modern' : 'wireguard-go';
  return spec.runtime === 'bun' ? 'roamguard-bun' : 'roamguard-node';
}

/** Polls the control socket until it answers `get=1` completely, or the process exits. */
async function untilAnswering(socket: string, running: () => boolean, label: string): Promise<void> {
  const deadline = performance.now() + START_TIMEOUT_MS;
  const client = new UapiClient(socket, 2000);
  for (;;) {
    if (!running()) throw new Error(`${label} exited before its control socket answered`);
    try {
      await client.exchange('get=1\n\n');
      return;
    } catch { /* not listening yet */ }
    if (performance.now() > deadline) throw new Error(`${label}: no answer on ${socket} within ${START_TIMEOUT_MS} ms`);
    await sleep(POLL_MS);
  }
}

/** One start, idle period and stop of `spec`'s daemon in `ns`. */
async function sampleOnce(scope: Scope, ns: Namespace, spec: SubjectSpec, idleMs: number): Promise<StartupSample> {
  requireCompiled(spec);
  const ifname = uniqueName('rgs');
  const socket = join(WG_SOCKET_DIR, `${ifname}.sock`);
  scope.removeFileAtCleanup(socket);
  const launched = launchSpec(implementationOf(spec), ifname, { threads: spec.threads, env: spec.env, logLevel: 'error' });
  // A baseline subject runs another checkout's entry point with the same arguments.
  const launch = spec.bin ? { ...launched, command: spec.bin } : launched;
  const started = performance.now();
  const proc = scope.spawn(ns, launch.command, launch.args, { env: launch.env, label: launch.label });
  try {
    await untilAnswering(socket, () => proc.running, launch.label);
    const readyMs = performance.now() - started;
    const idleFor = async (ms: number) => {
      await sleep(ms);
      if (!proc.running) throw new Error(`${launch.label} exited while idle\n${proc.describe()}`);
    };
    await idleFor(idleMs);
    const memory = memoryStatus(proc.pid);
    const before = threadSched(proc.pid);
    await idleFor(IDLE_CPU_WINDOW_MS);
    const idle = schedRates(before, threadSched(proc.pid), IDLE_CPU_WINDOW_MS / 1000);
    return { readyMs, idleRssBytes: memory.rssBytes, threads: memory.threads, idleCpuMsPerSecond: idle.cpuMsPerSecond, idleRunsPerSecond: idle.runsPerSecond };
  } finally {
    await proc.stop();
  }
}

/** `runs` starts of `spec`'s daemon, one after another. */
export async function measureStartup(scope: Scope, ns: Namespace, spec: SubjectSpec, runs: number, idleMs: number): Promise<StartupRecord> {
  const samples: StartupSample[] = [];
  for (let i = 0; i < runs; i++) samples.push(await sampleOnce(scope, ns, spec, idleMs));
  return { idleMs, samples };
}
