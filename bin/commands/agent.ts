/**
 * `roamguard agent [--cleanup]`: the node agent (see control/agent/agent.ts). Settings come from
 * the environment; a bad one stops start-up with one line naming it.
 */
import { getHeapStatistics } from 'node:v8';
import type { Command } from '../roamguard.ts';
import { SettingError, loadSettings, settingsTable } from '../../control/config/settings.ts';
import { createAgentLogger } from '../../control/log.ts';

export const agent: Command = {
  summary: 'run the node agent: Kubernetes Nodes → WireGuard mesh, routes, CNI config, nftables',
  usage: `roamguard agent [--cleanup]

  --cleanup   remove what the agent created (nftables table, routes, CNI config, tunnel) and exit

Settings (environment variables):
${settingsTable()}`,
  async run(args) {
    const unknown = args.filter((a) => a !== '--cleanup');
    if (unknown.length > 0) {
      console.error(`roamguard agent: unknown argument ${unknown[0]} (see roamguard agent --help)`);
      return 2;
    }
    let settings;
    try {
      settings = loadSettings();
    } catch (err) {
      if (err instanceof SettingError) {
        console.error(`roamguard agent: ${err.message}`);
        return 2;
      }
      throw err;
    }
    const log = createAgentLogger({ level: settings.logLevel, json: settings.logFormat === 'auto' ? undefined : settings.logFormat === 'json' });
    // Under Node.js, bin/roamguard sets the heap limit from AGENT_HEAP_MIB; Bun sizes its heap itself.
    log.info('starting the agent', { runtime: process.versions.bun ? 'bun' : 'node', heapLimitMiB: Math.round(getHeapStatistics().heap_size_limit / 2 ** 20) });
    const { Agent, cleanup } = await import('../../control/agent/agent.ts');
    if (args.includes('--cleanup')) {
      await cleanup(settings, log);
      return 0;
    }
    const instance = new Agent({ settings, log });
    // Started first, so the probes answer (not ready yet) while the agent starts.
    const { startMetricsServer } = await import('../../control/metrics/server.ts');
    const metrics = settings.metricsAddress === '' ? undefined : await startMetricsServer({ address: settings.metricsAddress, source: instance, log });
    let stopping = false;
    const done = new Promise<number>((resolve) => {
      const stop = (signal: string) => {
        if (stopping) return;
        stopping = true;
        log.info('stopping; rules, routes and the data plane stay in place', { signal });
        instance.stop().then(() => metrics?.close()).then(() => resolve(0), () => resolve(1));
      };
      process.on('SIGINT', () => stop('SIGINT'));
      process.on('SIGTERM', () => stop('SIGTERM'));
    });
    try {
      await instance.start();
    } catch (err) {
      console.error(`roamguard agent: ${(err as Error).message}`);
      return 1;
    }
    return done;
  },
};
