/**
 * Under Node, V8 optimizes a function, or a loop on the stack (OSR), once it has run through its
 * "interrupt budget" (bytes of bytecode executed) a few times. Every data thread has an isolate
 * of its own and warms up on its own traffic. A TUN queue that carried a transfer is optimized
 * within a second; the queue an idle ping's flow hashes to may carry nothing but that ping, and
 * at 100 packets a second its read loop and seal-and-send were still baseline code after a 2 s
 * transfer and 1 300 pings (perf with --perf-basic-prof: `JS:^readLoop`, `^handle`, `^sealSlots`).
 * With a budget 1/16 of V8's default the functions the loop calls are optimized sooner (a
 * running worker's hot function after 10 calls instead of 32, jit-tiering.test.ts); at 100 pings
 * a second that still takes 1.5-3 s, and the endless read loop itself stays baseline code, as
 * only on-stack replacement could reach it. Compiling runs on V8's background threads. Measured
 * in docs/performance.md (issue 14, idle ping).
 *
 * V8's flags are process-wide and read at every tier-up check, so setting this once the threads
 * have booted reaches their isolates too, and leaves start-up code (run once) alone. Bun's
 * JavaScriptCore tiers up on counts of its own (lowering them through BUN_JSC_* thresholds
 * changed nothing measurable), so under Bun this does nothing.
 */
import { setFlagsFromString } from 'node:v8';
import { isBun } from './threads.ts';

/** Bytes of bytecode between V8's tier-up checks (V8 11's default: 67 584). */
export const DATA_PATH_INTERRUPT_BUDGET = 4096;

/** Lowers V8's interrupt budget for every isolate of this process from now on (Node only). */
export function optimizeDataPathSooner(): void {
  if (isBun) return;
  setFlagsFromString(`--interrupt-budget=${DATA_PATH_INTERRUPT_BUDGET}`);
}
