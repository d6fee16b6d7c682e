/**
 * The agent's host lane (control/agent/host-lane.ts): routes and nftables applied beside the
 * passes. States handed in while one is applied replace each other (only the newest is applied),
 * a full state stays full, the table changes by set elements between full states, and a failure
 * forgets what was applied so the next state is applied from scratch.
 */
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { HostLane, type HostState } from '../../control/agent/host-lane.ts';
import type { CommandResult, CommandRunner } from '../../control/host/runner.ts';
import type { AgentLogger } from '../../control/log.ts';

const quiet: AgentLogger = { debug() {}, info() {}, warn() {}, error() {} } as unknown as AgentLogger;

/** Records `nft` scripts and `ip` commands; `gate` holds every nft run until released; `failNft` fails the next one. */
function host() {
  const nft: string[] = [];
  const ip: string[] = [];
  let release: (() => void) | undefined;
  let gate: Promise<void> | undefined;
  const state = { failNft: false };
  const ok = (stdout = ''): CommandResult => ({ command: '', code: 0, signal: null, stdout, stderr: '' });
  const runner: CommandRunner = async (cmd, args, options) => {
    if (cmd === 'nft') {
      if (gate) await gate;
      if (state.failNft) {
        state.failNft = false;
        return { command: 'nft -f -', code: 1, signal: null, stdout: '', stderr: 'Error: Could not process rule' };
      }
      nft.push(options?.input ?? '');
      return ok();
    }
    ip.push(`${args.join(' ')}${options?.input ? ` <<${options.input.trim().split('\n').join('; ')}` : ''}`);
    return ok(args.includes('-j') ? '[]' : '');
  };
  return {
    runner, nft, ip, state,
    hold() { gate = new Promise((r) => { release = r; }); },
    release() { gate = undefined; release?.(); },
  };
}

function wanted(clusterV4: string[], full = false): HostState {
  return {
    routes: { device: 'rgt0', cidrs: clusterV4.map((dst) => ({ dst })) },
    ruleset: {
      tableName: 'rglane', masquerade: { ipv4: true, ipv6: false }, filter: { ipv4: false, ipv6: false },
      clusterPodCidrs: { v4: clusterV4, v6: [] }, localPodCidrs: { v4: ['10.99.0.0/24'], v6: [] },
    },
    full,
  };
}

const lane = (h: ReturnType<typeof host>, errors: Error[] = []) => new HostLane({ runner: h.runner, log: quiet, onRouteConflicts() {}, onError: (e) => errors.push(e) });

test('the first state replaces the whole table; later ones change set elements', async () => {
  const h = host();
  const l = lane(h);
  await l.apply(wanted(['10.1.0.0/24']));
  assert.equal(h.nft.length, 1);
  assert.match(h.nft[0], /delete table inet rglane/);
  await l.apply(wanted(['10.1.0.0/24', '10.3.0.0/24']));
  assert.equal(h.nft.length, 2);
  assert.doesNotMatch(h.nft[1], /delete table/);
  assert.match(h.nft[1], /add element inet rglane pod-cidrs-v4 \{ 10\.3\.0\.0\/24 \}/);
  await l.apply(wanted(['10.1.0.0/24', '10.3.0.0/24']));
  assert.equal(h.nft.length, 2, 'nothing changed: no nft run');
});

test('states handed in while one is applied: only the newest is applied, and a full one stays full', async () => {
  const h = host();
  const l = lane(h);
  await l.apply(wanted(['10.1.0.0/24']));
  h.hold();
  const first = l.apply(wanted(['10.1.0.0/24', '10.2.0.0/24']));
  // Let the lane reach nft with the first state, then hand in three more while it waits.
  await new Promise((r) => setTimeout(r, 20));
  void l.apply(wanted(['10.1.0.0/24', '10.4.0.0/24'], true));
  void l.apply(wanted(['10.1.0.0/24', '10.5.0.0/24']));
  const last = l.apply(wanted(['10.1.0.0/24', '10.6.0.0/24']));
  h.release();
  await Promise.all([first, last]);
  assert.equal(h.nft.length, 3, 'the first state, then only the newest');
  assert.match(h.nft[1], /add element .*10\.2\.0\.0\/24/);
  assert.match(h.nft[2], /delete table inet rglane/, 'a full state handed in meanwhile keeps the newest full');
  assert.match(h.nft[2], /10\.1\.0\.0\/24, 10\.6\.0\.0\/24/);
  assert.doesNotMatch(h.nft[2], /10\.5\.0\.0/);
});

test('a failure is reported, and the next state is applied from scratch', async () => {
  const h = host();
  const errors: Error[] = [];
  const l = lane(h, errors);
  await l.apply(wanted(['10.1.0.0/24']));
  const listingsBefore = h.ip.filter((c) => c.includes('route show dev')).length;
  h.state.failNft = true;
  await l.apply(wanted(['10.1.0.0/24', '10.2.0.0/24']));
  assert.equal(errors.length, 1);
  assert.equal(l.failures, 1);
  await l.apply(wanted(['10.1.0.0/24', '10.2.0.0/24']));
  assert.match(h.nft.at(-1)!, /delete table inet rglane/, 'the whole table again');
  assert.ok(h.ip.filter((c) => c.includes('route show dev')).length > listingsBefore, 'routes listed again');
});

test('idle() waits for the state being applied', async () => {
  const h = host();
  const l = lane(h);
  h.hold();
  void l.apply(wanted(['10.1.0.0/24']));
  let idle = false;
  const waiting = l.idle().then(() => { idle = true; });
  await new Promise((r) => setTimeout(r, 20));
  assert.equal(idle, false);
  h.release();
  await waiting;
  assert.equal(h.nft.length, 1);
});
