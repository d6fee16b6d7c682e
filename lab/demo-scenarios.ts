/**
 * The worlds `roamguard demo --scenario NAME` can build. 'nat' (the default) is the NAT world of
 * the scenario suite; other scenarios plug in here with their own builder (and, for --once, may
 * add what they check), and the command line and the help list them from this table.
 */
import type { Scope } from './netns.ts';
import { buildNatWorld, HOME, INTERNET, OFFICE, type NatWorldOptions } from './nat-topology.ts';
import type { World } from './world.ts';

export interface DemoScenario {
  /** One line for `roamguard demo --help`. */
  summary: string;
  /** What the demo prints before building. */
  intro: string;
  build(scope: Scope, options: NatWorldOptions): Promise<World>;
}

export const DEFAULT_SCENARIO = 'nat';

export const DEMO_SCENARIOS: Record<string, DemoScenario> = {
  nat: {
    summary: 'two cloud nodes, an office NAT with two nodes behind one address, a home NAT with one',
    intro: `Building the demo world: internet ${INTERNET.ipv4}, office NAT ${OFFICE.ipv4}, home NAT ${HOME.ipv4}`,
    build: (scope, options) => buildNatWorld(scope, options),
  },
};
