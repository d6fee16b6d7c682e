/**
 * `roamguard demo [--once] [--refresh S] [--page-port P | --no-page] [--scenario NAME]`: a NAT'd
 * cluster on this machine in network namespaces, kubectl-able, with faults on demand and a live
 * page (see lab/demo.ts). Needs root.
 */
import type { Command } from '../roamguard.ts';

const DEFAULT_PAGE_PORT = 8020;

export const demo: Command = {
  summary: 'build a small NAT\'d cluster in namespaces on this machine, show the mesh live and let you break it (root)',
  usage: `roamguard demo [--once] [--refresh SECONDS] [--timeout SECONDS] [--page-port PORT | --no-page] [--scenario NAME]

Builds, in network namespaces on this machine: an embedded Kubernetes-API-compatible server,
two cloud nodes, an office NAT router with two nodes behind one public address, a home NAT
router with one node, and a pod on each node; every node runs roamguard agent and roamguard wg.
Then shows nodes, peers, endpoints (LAN or NAT mapping), handshakes, transfer and a pod-to-pod
reachability matrix, refreshed until Ctrl-C, which removes everything.

While it runs: it prints an "export KUBECONFIG=…" line for kubectl (get, describe, annotate,
label, create -f, delete: the agents react), serves a live page on 127.0.0.1 (URL printed), and
takes fault commands typed in its terminal (listed on screen: restart a router, flush its
conntrack, kill a data plane, restart an agent, add or remove a node, cut a site off); the fault
log shows how long everything took to recover.

  --once           print the table once the matrix is all green (or the timeout passes) and exit:
                   0 when every pod reaches every pod over IPv4 and IPv6, 1 otherwise; no
                   kubeconfig, page or commands
  --refresh S      seconds between refreshes (default 3)
  --timeout S      with --once, how long to wait for an all-green matrix (default 150)
  --page-port P    port of the live page on 127.0.0.1 (default ${DEFAULT_PAGE_PORT}; 0 = any free port)
  --no-page        no live page
  --scenario NAME  which world to build (default nat)`,
  async run(args) {
    const { DEMO_SCENARIOS, DEFAULT_SCENARIO } = await import('../../lab/demo-scenarios.ts');
    let once = false, refreshS = 3, settleTimeoutS = 150, scenario = DEFAULT_SCENARIO;
    let webPort: number | undefined = DEFAULT_PAGE_PORT;
    for (let i = 0; i < args.length; i++) {
      const arg = args[i];
      const number = (name: string) => {
        const v = Number(args[++i]);
        if (!Number.isFinite(v) || v <= 0) throw new Error(`${name} needs a positive number of seconds`);
        return v;
      };
      try {
        if (arg === '--once') once = true;
        else if (arg === '--refresh') refreshS = number(arg);
        else if (arg === '--timeout') settleTimeoutS = number(arg);
        else if (arg === '--no-page') webPort = undefined;
        else if (arg === '--page-port') {
          const v = Number(args[++i]);
          if (!Number.isInteger(v) || v < 0 || v > 65535) throw new Error('--page-port needs a port number (0 = any free port)');
          webPort = v;
        } else if (arg === '--scenario') {
          const name = args[++i];
          if (name === undefined || !(name in DEMO_SCENARIOS)) throw new Error(`--scenario needs one of: ${Object.keys(DEMO_SCENARIOS).join(', ')}`);
          scenario = name;
        } else throw new Error(`unknown argument ${arg} (see roamguard demo --help)`);
      } catch (err) {
        console.error(`roamguard demo: ${(err as Error).message}`);
        return 2;
      }
    }
    const { runDemo } = await import('../../lab/demo.ts');
    const tty = process.stdout.isTTY === true;
    return runDemo({
      once, refreshS, settleTimeoutS, scenario, webPort: once ? undefined : webPort, input: once ? undefined : process.stdin,
      write: (t) => process.stdout.write(t), color: tty, clearScreen: tty,
    });
  },
};
