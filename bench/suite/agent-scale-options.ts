/** Command-line options of `roamguard bench --agent-scale` (the agent-scale run alone). */
import { MAX_SIMULATED_NODES } from './agent-scale-cluster.ts';
import { AGENT_SCALE_DEFAULTS, type AgentScaleSettings } from './agent-scale.ts';

export const AGENT_SCALE_USAGE = `roamguard bench --agent-scale [--nodes N[,N...]] [--churn-rate R] [--churn-seconds S]
                [--steady-seconds S] [--nat-every K] [--seed X] [--out DIR]

The agent-scale run alone: our API-compatible server holding N simulated Nodes (pod CIDRs of both
families, addresses, roamguard.io annotations with real keys, every K-th node behind NAT with a
discovered mapping), one real \`roamguard agent\` with its real data plane in a namespace, then
S s without changes and S s of R changes/s (Nodes added and deleted, listen-port changed, key
rotated, NAT mapping moved). Per N: start-up until the data plane holds every peer, change →
data plane (median, p99; observed with get=1 on its control socket), full resync time and CPU,
agent and data plane RSS, control-socket bytes and time per reconcile pass, the agent's API
requests per minute, and whether the final peer set equals what the Nodes say.

  --nodes LIST       simulated Nodes, one run per entry (default 1000,5000; at most ${MAX_SIMULATED_NODES})
  --churn-rate R     changes per second during churn (default ${AGENT_SCALE_DEFAULTS.churnRate})
  --churn-seconds S  (default ${AGENT_SCALE_DEFAULTS.churnSeconds})
  --steady-seconds S (default ${AGENT_SCALE_DEFAULTS.steadySeconds})
  --nat-every K      every K-th simulated node is behind NAT; 0 = none (default ${AGENT_SCALE_DEFAULTS.natEvery})
  --seed X           seed of the churn's choices (default 18)
  --poll-ms MS       pause between the observer's get=1 reads (default ${AGENT_SCALE_DEFAULTS.pollIntervalMs}; each read is 2 MB at 5 000 peers, and the
                     data plane and the bench spend CPU on it that the agent then lacks)
  --agent-env K=V    extra environment for the agent (repeatable; e.g. NODE_OPTIONS=--cpu-prof)
  --resync-seconds S the agent's RESYNC_INTERVAL (default ${AGENT_SCALE_DEFAULTS.resyncIntervalS}; the product's default is 60)
  --agent-log FILE   write the agent's whole log to FILE (with several --nodes, FILE.<N>)
  --out DIR          also save the raw figures as DIR/<date>-agent-scale.json and the table as .md`;

export interface AgentScaleOptions {
  runs: AgentScaleSettings[];
  outDir?: string;
}

export function parseAgentScaleArgs(args: readonly string[]): AgentScaleOptions {
  let nodes = [1000, 5000];
  const base: Omit<AgentScaleSettings, 'nodes'> = { ...AGENT_SCALE_DEFAULTS, seed: 18 };
  let outDir: string | undefined;
  let agentLog: string | undefined;
  const number = (text: string | undefined, name: string, min: number, max: number): number => {
    const n = Number(text);
    if (text === undefined || !Number.isFinite(n) || n < min || n > max) throw new Error(`${name} needs a number from ${min} to ${max}, got ${JSON.stringify(text)}`);
    return n;
  };
  for (let i = 0; i < args.length; i++) {
    const arg = args[i];
    const [name, inline] = arg.includes('=') ? [arg.slice(0, arg.indexOf('=')), arg.slice(arg.indexOf('=') + 1)] : [arg, undefined];
    const take = () => inline ?? args[++i];
    switch (name) {
      case '--agent-scale': break;
      case '--nodes': {
        const text = take();
        if (text === undefined) throw new Error('--nodes needs a value');
        nodes = text.split(',').map((t) => Math.round(number(t.trim(), '--nodes', 1, MAX_SIMULATED_NODES)));
        break;
      }
      case '--churn-rate': base.churnRate = number(take(), name, 0.1, 1000); break;
      case '--churn-seconds': base.churnSeconds = number(take(), name, 1, 3600); break;
      case '--steady-seconds': base.steadySeconds = number(take(), name, 1, 3600); break;
      case '--nat-every': base.natEvery = Math.round(number(take(), name, 0, 1000)); break;
      case '--seed': base.seed = Math.round(number(take(), name, 0, 2 ** 31)); break;
      case '--agent-env': {
        const pair = take();
        const eq = pair?.indexOf('=') ?? -1;
        if (!pair || eq < 1) throw new Error(`--agent-env needs NAME=value, got ${JSON.stringify(pair)}`);
        base.agentEnv = { ...base.agentEnv, [pair.slice(0, eq)]: pair.slice(eq + 1) };
        break;
      }
      case '--poll-ms': base.pollIntervalMs = Math.round(number(take(), name, 10, 60_000)); break;
      case '--resync-seconds': base.resyncIntervalS = Math.round(number(take(), name, 1, 86400)); break;
      case '--agent-log': agentLog = take(); if (!agentLog) throw new Error('--agent-log needs a file'); break;
      case '--out': outDir = take(); if (!outDir) throw new Error('--out needs a directory'); break;
      default: throw new Error(`unknown argument ${arg} with --agent-scale (see roamguard bench --help)`);
    }
  }
  const logFor = (n: number) => (agentLog === undefined ? undefined : nodes.length > 1 ? `${agentLog}.${n}` : agentLog);
  return { runs: nodes.map((n) => ({ ...base, nodes: n, agentLog: logFor(n) })), outDir };
}
