/**
 * Resource use of a running process from /proc: CPU time of all its threads and its peak
 * resident set size. Read by pid; the bench only reads processes it started itself.
 */
import { spawnSync } from 'node:child_process';
import { readFileSync, readdirSync, readlinkSync, statSync } from 'node:fs';

let clockTicks: number | undefined;

/** Kernel clock ticks per second (the unit of utime/stime in /proc/PID/stat). */
function ticksPerSecond(): number {
  if (clockTicks === undefined) {
    const r = spawnSync('getconf', ['CLK_TCK'], { encoding: 'utf8' });
    const n = Number(typeof r.stdout === 'string' ? r.stdout.trim() : '');
    clockTicks = Number.isInteger(n) && n > 0 ? n : 100;
  }
  return clockTicks;
}

/**
 * CPU seconds (user + system) used so far by process `pid`, all threads included: for a thread
 * group leader the kernel sums the times of every thread, live and exited, into utime and stime.
 */
export function cpuSeconds(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  // The command name (field 2) may contain spaces and parentheses: split after the last ')'.
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  // fields[0] is field 3 (state); utime and stime are fields 14 and 15.
  const utime = Number(fields[11]);
  const stime = Number(fields[12]);
  if (!Number.isFinite(utime) || !Number.isFinite(stime)) throw new Error(`cannot parse /proc/${pid}/stat`);
  return (utime + stime) / ticksPerSecond();
}

/** CPU seconds of one thread: in user space and in the kernel (system calls). */
export interface ThreadCpu {
  user: number;
  system: number;
}

/**
 * CPU seconds of each live thread of process `pid`, by thread id. A thread that exits between
 * two readings is missing from the second; `cpuSplit` then leaves it out.
 */
export function threadCpu(pid: number): Map<number, ThreadCpu> {
  const ticks = ticksPerSecond();
  const out = new Map<number, ThreadCpu>();
  let tids: string[];
  try { tids = readdirSync(`/proc/${pid}/task`); } catch { return out; }
  for (const tid of tids) {
    let stat: string;
    try { stat = readFileSync(`/proc/${pid}/task/${tid}/stat`, 'utf8'); } catch { continue; }
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    out.set(Number(tid), { user: Number(fields[11]) / ticks, system: Number(fields[12]) / ticks });
  }
  return out;
}

/** How a span's CPU time divides: user space against kernel, and the share of the busiest thread. */
export interface CpuSplit {
  user: number;
  system: number;
  /** CPU seconds of the single busiest thread: when it nears the span's wall time, that thread is the limit. */
  busiestThread: number;
}

/** The CPU split between two `threadCpu` readings of the same processes (threads of both readings only). */
export function cpuSplit(before: ReadonlyArray<Map<number, ThreadCpu>>, after: ReadonlyArray<Map<number, ThreadCpu>>): CpuSplit {
  const split: CpuSplit = { user: 0, system: 0, busiestThread: 0 };
  after.forEach((threads, i) => {
    for (const [tid, now] of threads) {
      const then = before[i]?.get(tid);
      if (then === undefined) continue;
      const user = now.user - then.user;
      const system = now.system - then.system;
      split.user += user;
      split.system += system;
      split.busiestThread = Math.max(split.busiestThread, user + system);
    }
  });
  return split;
}

export interface MemoryStatus {
  /** Peak resident set size (VmHWM), bytes. */
  peakRssBytes: number;
  /** Current resident set size (VmRSS), bytes. */
  rssBytes: number;
  threads: number;
}

/** VmHWM, VmRSS and the thread count from /proc/PID/status. */
export function memoryStatus(pid: number): MemoryStatus {
  const status = readFileSync(`/proc/${pid}/status`, 'utf8');
  const field = (name: string): number => {
    const m = new RegExp(`^${name}:\\s+(\\d+)`, 'm').exec(status);
    if (!m) throw new Error(`no ${name} in /proc/${pid}/status`);
    return Number(m[1]);
  };
  return { peakRssBytes: field('VmHWM') * 1024, rssBytes: field('VmRSS') * 1024, threads: field('Threads') };
}

/** What the scheduler counted for one thread: CPU time, and how often the thread was put on a CPU. */
export interface ThreadSched {
  cpuNs: number;
  /** Times it ran: each wake-up, and each return after being preempted. */
  runs: number;
}

/**
 * /proc/PID/task/TID/schedstat of every live thread of `pid`, by thread id: nanoseconds on a CPU
 * and the count of times it ran. Finer than /proc/PID/stat's clock ticks, which an idle daemon's
 * few milliseconds a second fall through.
 */
export function threadSched(pid: number): Map<number, ThreadSched> {
  const out = new Map<number, ThreadSched>();
  let tids: string[];
  try { tids = readdirSync(`/proc/${pid}/task`); } catch { return out; }
  for (const tid of tids) {
    let fields: string[];
    try { fields = readFileSync(`/proc/${pid}/task/${tid}/schedstat`, 'utf8').trim().split(' '); } catch { continue; }
    out.set(Number(tid), { cpuNs: Number(fields[0]), runs: Number(fields[2]) });
  }
  return out;
}

/** CPU milliseconds and runs per second between two readings `seconds` apart (a thread new in the second counts from zero; one that ended is left out). */
export function schedRates(before: Map<number, ThreadSched>, after: Map<number, ThreadSched>, seconds: number): { cpuMsPerSecond: number; runsPerSecond: number } {
  let cpuNs = 0;
  let runs = 0;
  for (const [tid, now] of after) {
    const then = before.get(tid) ?? { cpuNs: 0, runs: 0 };
    cpuNs += now.cpuNs - then.cpuNs;
    runs += now.runs - then.runs;
  }
  return { cpuMsPerSecond: cpuNs / 1e6 / seconds, runsPerSecond: runs / seconds };
}

const PF_KTHREAD = 0x00200000;

/** CPU seconds per live user-space process, keyed by pid, with its network namespace inode. */
export interface ProcessCpuSnapshot {
  cpu: Map<number, { seconds: number; netns: number; comm: string }>;
}

/** The inode of a network namespace (as in /proc/PID/ns/net → `net:[INODE]`), or undefined. */
function netnsInode(pid: number): number | undefined {
  try {
    const link = readlinkSync(`/proc/${pid}/ns/net`);
    const m = /\[(\d+)\]/.exec(link);
    return m ? Number(m[1]) : undefined;
  } catch { return undefined; }
}

/** Every user-space process's CPU time now (kernel threads are left out). */
export function snapshotAllProcesses(): ProcessCpuSnapshot {
  const cpu: ProcessCpuSnapshot['cpu'] = new Map();
  const ticks = ticksPerSecond();
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    const pid = Number(entry);
    let stat: string;
    try { stat = readFileSync(`/proc/${pid}/stat`, 'utf8'); } catch { continue; }
    const close = stat.lastIndexOf(')');
    const fields = stat.slice(close + 2).split(' ');
    // fields[6] is field 9 (flags).
    if ((Number(fields[6]) & PF_KTHREAD) !== 0) continue;
    const seconds = (Number(fields[11]) + Number(fields[12])) / ticks;
    cpu.set(pid, { seconds, netns: netnsInode(pid) ?? 0, comm: stat.slice(stat.indexOf('(') + 1, close) });
  }
  return { cpu };
}

export interface ForeignCpu {
  /** CPU seconds of processes outside the bench (not in its namespaces, not the bench itself). */
  seconds: number;
  /** The busiest of them, e.g. { process: 'node (pid 4551)', seconds: 3.2 }. */
  top: Array<{ process: string; seconds: number }>;
}

/**
 * CPU used between two snapshots by processes that are not the bench's: not `selfPid`, not in one
 * of `ownNetns`. A process started in between counts with all its CPU time; one that exited in
 * between is missed, so this is a lower bound. Tells whether other work competed for the cores.
 */
export function foreignCpu(before: ProcessCpuSnapshot, after: ProcessCpuSnapshot, ownNetns: ReadonlySet<number>, selfPid: number): ForeignCpu {
  const users: Array<{ label: string; seconds: number }> = [];
  for (const [pid, now] of after.cpu) {
    if (pid === selfPid || ownNetns.has(now.netns)) continue;
    const seconds = now.seconds - (before.cpu.get(pid)?.seconds ?? 0);
    if (seconds > 0) users.push({ label: `${now.comm} (pid ${pid})`, seconds });
  }
  users.sort((a, b) => b.seconds - a.seconds);
  return {
    seconds: users.reduce((s, u) => s + u.seconds, 0),
    top: users.slice(0, 3).map((u) => ({ process: u.label, seconds: Math.round(u.seconds * 100) / 100 })),
  };
}

/** `node (pid 4551) 3.2 s, bun (pid 17) 0.4 s` */
export function formatTop(top: ForeignCpu['top']): string {
  return top.map((t) => `${t.process} ${t.seconds.toFixed(1)} s`).join(', ');
}

/** The inode of the network namespace `ip netns` calls `name`. */
export function namedNetnsInode(name: string): number {
  return statSync(`/run/netns/${name}`).ino;
}
