/**
 * Timing helpers shared by the microbenchmarks (bench/*-micro.ts and the suite's child process
 * bench/suite/micro-child.ts): operations per second of a synchronous operation, best of several
 * timed runs after a warm-up, on one thread.
 */

export interface TimingOptions {
  /** Length of one timed run, milliseconds. */
  measureMs: number;
  /** Timed runs; the best is reported (the others absorb GC pauses and other processes). */
  runs: number;
}

/**
 * Operations per second of `op`, best of `runs` timed runs of about `measureMs` each. The clock is
 * read once per `batch` calls; `batch` calls before the first run warm the JIT up.
 */
export function opsPerSecond(op: () => void, batch: number, timing: TimingOptions): number {
  for (let i = 0; i < batch; i++) op();
  let best = 0;
  for (let run = 0; run < timing.runs; run++) {
    let count = 0;
    const start = performance.now();
    let now = start;
    while (now - start < timing.measureMs) {
      for (let i = 0; i < batch; i++) op();
      count += batch;
      now = performance.now();
    }
    best = Math.max(best, (count * 1000) / (now - start));
  }
  return best;
}

/** True under Bun. */
export const ON_BUN = typeof (globalThis as { Bun?: unknown }).Bun !== 'undefined';

/** `bun 1.4.5` or `node v20.20.2`. */
export function runtimeLabel(): string {
  return ON_BUN ? `bun ${process.versions.bun}` : `node ${process.version}`;
}

/** A full garbage collection when the runtime exposes one (Node with --expose-gc, Bun); else false. */
export function collectGarbage(): boolean {
  const bun = (globalThis as { Bun?: { gc(force: boolean): void } }).Bun;
  if (bun) {
    bun.gc(true);
    return true;
  }
  const gc = (globalThis as { gc?: () => void }).gc;
  if (typeof gc === 'function') {
    gc();
    gc();
    return true;
  }
  return false;
}
