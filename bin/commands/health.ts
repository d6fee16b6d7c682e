/**
 * `roamguard health [--max-stall SECONDS] [IFNAME]`: the data plane container's liveness probe.
 * Exit 0 when the daemon answers on its control socket and its pipeline is not stalled; exit 1
 * when nothing answers, or when a stall (dataplane/watchdog.ts: a queue between reading, crypto
 * and writing holding work without progress) has lasted SECONDS or longer. The watchdog recovers
 * a stall within a few seconds (re-collect, re-kick, restart a worker); one that outlasts that
 * is a data plane that answers `wg show` and forwards nothing, which only a restart mends.
 *
 * A data plane without roamguard's counters (wireguard-go) is judged by its answer alone.
 */
import type { Command } from '../roamguard.ts';
import { UapiClient } from '../../dataplane/uapi/uapi-client.ts';
import { UAPI_SOCKET_DIR, uapiSocketPath } from '../../dataplane/uapi/uapi-server.ts';
import type { DeviceStats } from '../../dataplane/uapi/uapi-stats.ts';

/** Default --max-stall: well past the watchdog's own recovery (~1-3 s). */
const DEFAULT_MAX_STALL_S = 10;
const ANSWER_TIMEOUT_MS = 5000;

export interface HealthVerdict {
  healthy: boolean;
  message: string;
}

/** The verdict on what the socket answered (`stats` undefined: no counters offered). */
export function judgeHealth(stats: DeviceStats | undefined, maxStallMs: number): HealthVerdict {
  if (stats === undefined) return { healthy: true, message: 'the data plane answers (no pipeline counters offered)' };
  const stalledMs = stats.pipelineStalledMs ?? 0;
  const detail = `pipeline_stalls=${stats.pipelineStalls ?? 0} worker_restarts=${stats.workerRestarts ?? 0} worker_queue_depth=${stats.workerQueueDepth}`;
  if (stalledMs >= maxStallMs) {
    return { healthy: false, message: `the data plane's pipeline has been stalled for ${(stalledMs / 1000).toFixed(1)} s (${detail})` };
  }
  return { healthy: true, message: `ok (${detail}${stalledMs > 0 ? `, a stall of ${stalledMs} ms being recovered` : ''})` };
}

export async function checkHealth(socketPath: string, maxStallMs: number): Promise<HealthVerdict> {
  const client = new UapiClient(socketPath, ANSWER_TIMEOUT_MS);
  let stats: DeviceStats | undefined;
  try {
    stats = await client.stats();
    if (stats === undefined && !(await client.alive())) return { healthy: false, message: `${socketPath}: the data plane does not answer` };
  } catch (err) {
    return { healthy: false, message: `${socketPath}: the data plane does not answer: ${err instanceof Error ? err.message : String(err)}` };
  }
  return judgeHealth(stats, maxStallMs);
}

export const health: Command = {
  summary: 'liveness probe of the data plane: it answers on its control socket and its pipeline is not stalled',
  usage: `roamguard health [--max-stall SECONDS] [IFNAME]

  --max-stall S  fail when a pipeline stall has lasted S seconds (default ${DEFAULT_MAX_STALL_S})
  IFNAME         the interface (default: $WG_INTERFACE, else roamguard0)

Reads $WG_SOCKET_DIR/IFNAME.sock (default ${UAPI_SOCKET_DIR}). Exit 0: healthy; 1: not; 2: usage.`,
  async run(args) {
    let maxStallS = DEFAULT_MAX_STALL_S;
    const rest: string[] = [];
    for (let i = 0; i < args.length; i++) {
      const arg = args[i];
      if (arg === '--max-stall') {
        maxStallS = Number(args[++i]);
        if (!(maxStallS > 0) || !Number.isFinite(maxStallS)) {
          console.error(`roamguard health: --max-stall must be a positive number of seconds, got ${args[i]}`);
          return 2;
        }
      } else if (arg.startsWith('-')) {
        console.error(`roamguard health: unknown option ${arg} (see roamguard health --help)`);
        return 2;
      } else rest.push(arg);
    }
    if (rest.length > 1) {
      console.error('roamguard health: at most one interface name');
      return 2;
    }
    const ifname = rest[0] ?? (process.env.WG_INTERFACE?.trim() || 'roamguard0');
    const dir = process.env.WG_SOCKET_DIR?.trim() || UAPI_SOCKET_DIR;
    const verdict = await checkHealth(uapiSocketPath(ifname, dir), maxStallS * 1000);
    (verdict.healthy ? console.log : console.error)(`roamguard health: ${ifname}: ${verdict.message}`);
    return verdict.healthy ? 0 : 1;
  },
};
