/**
 * `roamguard demo [--once] [--refresh S]`: a NAT'd cluster on this machine in network namespaces
 * (see lab/demo.ts). Needs root.
 */
import type { Command } from '../roamguard.ts';

export const demo: Command = {
  summary: 'build a small NAT\'d cluster in namespaces on this machine and show the mesh live (root)',
  usage: `roamguard demo [--once] [--refresh SECONDS] [--timeout SECONDS] [--scenario NAME]

Builds, in network namespaces on this machine: an embedded Kubernetes-API-compatible server,
two cloud nodes, an office NAT router with two nodes behind one public address, a home NAT
router with one node, and a pod on each node; every node runs roamguard agent and roamguard wg.
Then shows nodes, peers, endpoints (LAN or NAT mapping), handshakes, transfer and a pod-to-pod
reachability matrix, refreshed until Ctrl-C, which removes everything.

  --once           print the table once the matrix is all green (or the timeout passes) and exit:
                   0 when every pod reaches every pod over IPv4 and IPv6, 1 otherwise
  --refresh S      seconds between refreshes (default 5)
  --timeout S      with --once, how long to wait for an all-green matrix (default 150)
  --scenario NAME  once the matrix is all green, run a scenario and report it:
                   key-rotation = rotate every node's key once under 50 pings/s (pings lost)`,
  async run(args) {
    let once = false, refreshS = 5, settleTimeoutS = 150;
    let scenario: string | undefined;
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
        else if (arg === '--scenario') {
          scenario = args[++i];
          const { DEMO_SCENARIOS } = await import('../../lab/demo.ts');
          if (!scenario || !(scenario in DEMO_SCENARIOS)) throw new Error(`--scenario needs one of: ${Object.keys(DEMO_SCENARIOS).join(', ')}`);
        }
        else throw new Error(`unknown argument ${arg} (see roamguard demo --help)`);
      } catch (err) {
        console.error(`roamguard demo: ${(err as Error).message}`);
        return 2;
      }
    }
    const { runDemo } = await import('../../lab/demo.ts');
    const tty = process.stdout.isTTY === true;
    return runDemo({ scenario, once, refreshS, settleTimeoutS, write: (t) => process.stdout.write(t), color: tty, clearScreen: tty });
  },
};
