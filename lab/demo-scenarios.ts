/**
 * The worlds `roamguard demo --scenario NAME` can build. 'nat' (the default) is the NAT world of
 * the scenario suite; other scenarios plug in here with their own builder (and, for --once, may
 * add what they check), and the command line and the help list them from this table.
 */
import type { Scope } from './netns.ts';
import { buildHardNatWorld, buildNatWorld, CAFE, HOME, INTERNET, OFFICE, type NatWorldOptions } from './nat-topology.ts';
import type { Pod, World } from './world.ts';

export interface DemoScenario {
  /** One line for `roamguard demo --help`. */
  summary: string;
  /** What the demo prints before building. */
  intro: string;
  build(scope: Scope, options: NatWorldOptions): Promise<World>;
  /**
   * Run once, when the matrix is first all green; the demo then shows the table again with the
   * report, and `--once` exits 0 only when this passed and the matrix is green again.
   */
  afterGreen?: () => Promise<ScenarioStep>;
}

export type ScenarioStep = (world: World, pods: ReadonlyMap<string, Pod>, step: (what: string) => void) => Promise<{ ok: boolean; report: string }>;

export const DEFAULT_SCENARIO = 'nat';

export const DEMO_SCENARIOS: Record<string, DemoScenario> = {
  nat: {
    summary: 'two cloud nodes, an office NAT with two nodes behind one address, a home NAT with one',
    intro: `Building the demo world: internet ${INTERNET.ipv4}, office NAT ${OFFICE.ipv4}, home NAT ${HOME.ipv4}`,
    build: (scope, options) => buildNatWorld(scope, options),
  },
  'key-rotation': {
    summary: 'the nat world; once all green, every node\'s key is rotated once under 50 pings/s (pings lost reported)',
    intro: `Building the demo world (then rotating every node's key): internet ${INTERNET.ipv4}, office NAT ${OFFICE.ipv4}, home NAT ${HOME.ipv4}`,
    build: (scope, options) => buildNatWorld(scope, options),
    afterGreen: async () => (await import('./key-rotation-scenario.ts')).runKeyRotationScenario,
  },
  'small-mtu': {
    summary: 'the nat world with a 1280-byte hop on the home router\'s uplink that drops ICMP; once all green, path MTUs and iperf3 across it',
    intro: `Building the demo world with a narrow hop (1280, ICMP dropped) on the home router's uplink: internet ${INTERNET.ipv4}, office NAT ${OFFICE.ipv4}, home NAT ${HOME.ipv4}`,
    build: async (scope, options) => (await import('./small-mtu-scenario.ts')).buildSmallMtuWorld(scope, options),
    afterGreen: async () => (await import('./small-mtu-scenario.ts')).runSmallMtuScenario,
  },
  'hard-nat': {
    summary: 'the nat world with a port-randomising home NAT and a café behind another one: those pairs go through a relay on a cloud node',
    intro: `Building the demo world with hard NATs: internet ${INTERNET.ipv4}, office NAT ${OFFICE.ipv4}, home NAT ${HOME.ipv4} and café NAT ${CAFE.ipv4} (both a random port per flow)`,
    build: (scope, options) => buildHardNatWorld(scope, options),
    afterGreen: async () => (await import('./hard-nat-scenario.ts')).checkRelayedPairs,
  },
};
