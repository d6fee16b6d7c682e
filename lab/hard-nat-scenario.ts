/**
 * The demo's `hard-nat` scenario check (`roamguard demo --once --scenario hard-nat`): once every
 * pod reaches every pod, the peer table must show the pairs that cannot meet directly (home and
 * café, both behind port-randomising NATs) going through a relay, both sides through the same one.
 */
import { takeSnapshot } from './demo.ts';
import type { ScenarioStep } from './demo-scenarios.ts';

export const checkRelayedPairs: ScenarioStep = async (world, pods, step) => {
  step('checking that the home and café nodes reach each other through a relay');
  const snapshot = await takeSnapshot(world, pods);
  const relayed = snapshot.peers.filter((p) => p.path === 'relay');
  const lines = relayed.map((p) => `  ${p.from} → ${p.to}: ${p.endpoint} (relay via ${p.via})`);
  const both = relayed.filter((p) => p.from === 'k1' && p.to === 'h1').concat(relayed.filter((p) => p.from === 'h1' && p.to === 'k1'));
  const ok = both.length === 2 && both[0].via === both[1].via;
  return {
    ok,
    report: ok
      ? `RELAYS: ${relayed.length} peer entries go through a relay; h1 ↔ k1 both via ${both[0].via}\n${lines.join('\n')}`
      : `RELAYS: h1 ↔ k1 is not relayed on both sides (${relayed.length} relayed entries)\n${lines.join('\n')}`,
  };
};
