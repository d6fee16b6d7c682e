/**
 * `roamguard bench`: the throughput, latency, microbenchmark and scale suite (bench/suite/).
 * Builds its own network namespaces and removes them afterwards; needs root.
 */
import { relative } from 'node:path';
import type { Command } from '../roamguard.ts';
import { USAGE, parseBenchArgs, type BenchOptions } from '../../bench/suite/options.ts';
import { AGENT_SCALE_USAGE, parseAgentScaleArgs, type AgentScaleOptions } from '../../bench/suite/agent-scale-options.ts';

export const bench: Command = {
  summary: 'benchmark roamguard (Node, Bun) against wireguard-go and the raw link in network namespaces, plus microbenchmarks and a 1 000-peer scale run; --agent-scale: one agent against N simulated Nodes (root)',
  usage: `${USAGE}\n\n${AGENT_SCALE_USAGE}`,
  async run(args) {
    let opts!: BenchOptions;
    let agentScale: AgentScaleOptions | undefined;
    try {
      if (args.includes('--agent-scale')) agentScale = parseAgentScaleArgs(args);
      else opts = parseBenchArgs(args);
    } catch (err) {
      console.error(`roamguard bench: ${(err as Error).message}`);
      return 2;
    }
    if (process.platform !== 'linux') {
      console.error(`roamguard bench: needs Linux network namespaces (this is ${process.platform})`);
      return 1;
    }
    if (typeof process.getuid === 'function' && process.getuid() !== 0) {
      console.error(`roamguard bench: must run as root: it creates network namespaces, a veth pair and TUN interfaces (running as uid ${process.getuid()})`);
      return 1;
    }
    const { requireRoot } = await import('../../test/system/netns.ts');
    try {
      await requireRoot({ binaries: ['wg', 'iperf3', 'ping', 'ss'], tun: true });
    } catch (err) {
      console.error(`roamguard bench: ${(err as Error).message}`);
      return 1;
    }
    if (agentScale) return runAgentScaleCommand(agentScale, args);
    const { runBench } = await import('../../bench/suite/runner.ts');
    const { renderMarkdown, saveResults } = await import('../../bench/suite/report.ts');
    const { renderBarChartSvg, throughputChart } = await import('../../bench/suite/chart.ts');

    // Said before the namespace helpers' own handlers run their last-resort cleanup and re-raise.
    for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
      process.once(signal, () => process.stderr.write(`\nroamguard bench: ${signal}: stopping the tunnel processes and removing the namespaces\n`));
    }

    const command = ['roamguard', ...(process.env.ROAMGUARD_RUNTIME === 'bun' ? ['--runtime', 'bun'] : []), 'bench', ...args].join(' ');
    const results = await runBench(opts, command, (line) => process.stderr.write(`${line}\n`));
    const markdown = renderMarkdown(results);
    process.stdout.write(`\n${markdown}`);
    if (opts.outDir) {
      const paths = saveResults(results, markdown, opts.outDir, renderBarChartSvg(throughputChart(results)));
      const shown = (p: string) => relative(process.cwd(), p) || p;
      process.stderr.write(`\nsaved ${shown(paths.json)}, ${shown(paths.markdown)} and ${shown(paths.svg!)}\n`);
    }
    const failed = [
      ...results.subjects.filter((s) => s.status === 'failed').map((s) => s.id),
      ...(results.micro?.failures ?? []).map((f) => `microbenchmarks (${f.runtime})`),
      ...(results.scaleError ? ['scale run'] : []),
    ];
    if (failed.length > 0) {
      process.stderr.write(`roamguard bench: ${failed.length} part(s) failed: ${failed.join(', ')}\n`);
      return 1;
    }
    return 0;
  },
};

/** `roamguard bench --agent-scale`: one agent-scale run per N, then the table (and the raw figures with --out). */
async function runAgentScaleCommand(options: AgentScaleOptions, args: readonly string[]): Promise<number> {
  const { runAgentScale, renderAgentScale } = await import('../../bench/suite/agent-scale.ts');
  const { mkdirSync, writeFileSync } = await import('node:fs');
  const { join } = await import('node:path');
  const command = ['roamguard', 'bench', ...args].join(' ');
  const results = [];
  for (const settings of options.runs) {
    process.stderr.write(`agent-scale run with ${settings.nodes} simulated Nodes\n`);
    try {
      results.push(await runAgentScale(settings, (line) => process.stderr.write(`${line}\n`)));
    } catch (err) {
      process.stderr.write(`roamguard bench: the agent-scale run with ${settings.nodes} Nodes failed: ${(err as Error).message}\n`);
      return 1;
    }
  }
  const markdown = renderAgentScale(results, command);
  process.stdout.write(`\n${markdown}`);
  if (options.outDir) {
    mkdirSync(options.outDir, { recursive: true });
    const stem = join(options.outDir, `${new Date().toISOString().slice(0, 10)}-agent-scale`);
    writeFileSync(`${stem}.json`, `${JSON.stringify(results, null, 2)}\n`);
    writeFileSync(`${stem}.md`, markdown);
    process.stderr.write(`saved ${stem}.json and ${stem}.md\n`);
  }
  return 0;
}
