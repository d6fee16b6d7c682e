/**
 * The node's tunnel routes and nftables table, brought to what the latest pass wants, beside the
 * passes. At 5 000 Nodes one `nft -f` takes 70-140 ms however small the change (nft reads every
 * element of the table's sets first) and `ip` about as long; a pass that waited for them held
 * the next Node change back by that much. So a pass hands its wanted host state here and goes
 * on; the lane applies the newest state it was given (states handed in while it works replace
 * each other: under churn only the latest matters), one at a time, in order.
 *
 * What was applied is remembered, so a state is applied by what changed (routes: the summarized
 * differences; nftables: set elements, nftables-update.ts). A `full` state is applied from
 * scratch (routes listed, the whole table replaced), which also repairs what someone else
 * changed; the agent's resync passes ask for that, and wait for it. A failure forgets what was
 * applied (the next state is applied from scratch) and is reported to the agent, which retries.
 */
import type { AgentLogger } from '../log.ts';
import { applyRuleset, type RulesetOptions } from '../host/nftables.ts';
import { planRulesetUpdate, type AppliedRuleset } from '../host/nftables-update.ts';
import { reconcileRoutes, type AppliedRoutes, type RouteConflict, type WantedRoute } from '../host/routes.ts';
import type { CommandRunner } from '../host/runner.ts';

export interface HostState {
  /** The tunnel's routes; absent without a tunnel (firewall-only). */
  routes?: { device: string; cidrs: WantedRoute[] };
  ruleset: RulesetOptions;
  /** Apply from scratch, not by difference (a resync; after the data plane came back fresh). */
  full: boolean;
}

export interface HostLaneDeps {
  runner: CommandRunner;
  log: AgentLogger;
  /** Wanted routes left alone because a route that is not ours goes there (every apply's list). */
  onRouteConflicts(conflicts: readonly RouteConflict[]): void;
  /** An apply failed; what was applied is forgotten, and the agent should try again. */
  onError(err: Error): void;
}

export class HostLane {
  private pending: HostState | undefined;
  private draining: Promise<void> | undefined;
  /** The routes last applied (JSON of the wanted list); '' when unknown. */
  private routesKey = '';
  /** What the last route reconcile left (routes.ts): the next one changes only the difference. */
  private routesApplied: AppliedRoutes | undefined;
  private ruleset: AppliedRuleset | undefined;
  /** Applies that failed, so far. */
  failures = 0;

  constructor(private readonly deps: HostLaneDeps) {}

  /**
   * Queues `state` in place of a queued one not yet started (a full one stays full). Resolves once
   * it, or a state handed in after it, has been applied or has failed.
   */
  apply(state: HostState): Promise<void> {
    this.pending = this.pending ? { ...state, full: state.full || this.pending.full } : state;
    this.draining ??= this.drain().finally(() => { this.draining = undefined; });
    return this.draining;
  }

  /** Resolves when nothing is queued or being applied. */
  async idle(): Promise<void> {
    while (this.draining) await this.draining;
  }

  private async drain(): Promise<void> {
    while (this.pending) {
      const state = this.pending;
      this.pending = undefined;
      try {
        await this.applyOne(state);
      } catch (err) {
        this.routesKey = '';
        this.routesApplied = undefined;
        this.ruleset = undefined;
        this.failures++;
        this.deps.onError(err as Error);
      }
    }
  }

  private async applyOne(state: HostState): Promise<void> {
    const { runner, log } = this.deps;
    if (state.routes) {
      const key = JSON.stringify(state.routes.cidrs);
      if (state.full || key !== this.routesKey) {
        this.routesKey = '';
        const applied = state.full ? undefined : this.routesApplied;
        this.routesApplied = undefined;
        const report = await reconcileRoutes({ device: state.routes.device, cidrs: state.routes.cidrs, runner, applied });
        this.routesApplied = report.applied;
        this.routesKey = key;
        this.deps.onRouteConflicts(report.conflicts);
      }
    }
    const plan = planRulesetUpdate(this.ruleset, state.ruleset, { full: state.full });
    if (plan.script !== undefined) {
      this.ruleset = undefined;
      await applyRuleset(plan.script, runner);
      if (plan.kind === 'table' && !state.full) log.info('applied the nftables table', { table: plan.applied.table });
    }
    this.ruleset = plan.applied;
  }
}
