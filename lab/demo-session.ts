/**
 * A running playground: the demo's world, its pods, and the faults done to it. The terminal and
 * the page both hand it command lines (lab/demo-faults.ts); it carries them out one at a time,
 * records each (lab/demo-recovery.ts) and measures the recovery with every snapshot. It also
 * follows the API: a Node deleted with kubectl takes that node out of the demo, as a cloud
 * controller would delete the machine.
 */
import { EventEmitter } from 'node:events';
import { AGENT_READY_TIMEOUT_MS, cellsDown, type DemoSnapshot } from './demo.ts';
import { faultHelp, faultLabel, parseFaultLine, type FaultCommand, type FaultTargets } from './demo-faults.ts';
import { describeRecord, newRecord, observe, recordState, type FaultRecord } from './demo-recovery.ts';
import { INTERNET } from './nat-topology.ts';
import type { Pod, Router, World, WorldNode } from './world.ts';

/** How long a router stays down when it "restarts" (the NAT suite's restart does the same). */
const ROUTER_REBOOT_MS = 2000;
const KEPT_RECORDS = 12;

export type SubmitResult = { ok: true; message: string; record?: FaultRecord } | { ok: false; message: string; quit?: boolean };

export class DemoSession extends EventEmitter {
  records: FaultRecord[] = [];
  latest: DemoSnapshot | undefined;
  /** The last answer to a command, shown on the screen. */
  lastMessage = '';
  #nextId = 1;
  #busy: string | undefined;
  #restarts = new Map<string, number>();
  #removing = new Set<string>();

  constructor(readonly world: World, readonly pods: Map<string, Pod>) {
    super();
  }

  targets(): FaultTargets {
    return {
      routers: [...this.world.routers.keys()],
      nodes: this.world.nodes.map((n) => n.name),
      sites: [INTERNET.name, ...this.world.routers.keys()],
    };
  }

  help(): string[] { return faultHelp(this.targets()); }

  /** The fault log, newest last. */
  log(): string[] { return this.records.map(describeRecord); }

  /** One command line, from the terminal or the page. Starts the fault and returns at once. */
  submit(line: string): SubmitResult {
    const parsed = parseFaultLine(line, this.targets());
    let result: SubmitResult;
    if ('empty' in parsed) return { ok: true, message: '' };
    if ('help' in parsed) result = { ok: true, message: this.help().join('\n') };
    else if ('quit' in parsed) result = { ok: false, message: 'quitting', quit: true };
    else if ('error' in parsed) result = { ok: false, message: parsed.error };
    else if (this.#busy) result = { ok: false, message: `busy: "${this.#busy}" is still being done; try again in a moment` };
    else {
      const record = this.#start(parsed.command);
      result = { ok: true, message: `${record.label}: started`, record };
    }
    this.lastMessage = result.message;
    this.emit('update');
    return result;
  }

  /** Feeds one snapshot to the open records. */
  observe(snapshot: DemoSnapshot): void {
    this.latest = snapshot;
    const before = this.records.map(recordState);
    this.records = observe(this.records, { startedAt: snapshot.startedAt ?? snapshot.takenAt.getTime(), finishedAt: snapshot.takenAt.getTime(), down: cellsDown(snapshot), allGreen: snapshot.allGreen });
    this.records.forEach((r, i) => { if (recordState(r) === 'recovered' && before[i] !== 'recovered') this.emit('recovered', r); });
    this.emit('update');
  }

  /** Nodes whose Node object is gone (kubectl delete node): shut them down and forget them. */
  async followApi(): Promise<void> {
    for (const node of [...this.world.nodes]) {
      if (this.#removing.has(node.name) || this.world.api.getNode(node.name)) continue;
      const { id } = this.#record(`Node ${node.name} deleted through the API`);
      this.#removing.add(node.name);
      try {
        await this.#shutDown(node);
        this.#note(id, 'the demo stopped its agent and data plane; the other agents drop its peer');
      } finally {
        this.#removing.delete(node.name);
        this.#change(id, { appliedAt: Date.now() });
      }
    }
  }

  /** Records are replaced by observe(): changes go to the current object of that id. */
  #change(id: number, changes: Partial<FaultRecord>): void {
    const current = this.records.find((r) => r.id === id);
    if (current) Object.assign(current, changes);
    this.emit('update');
  }

  #note(id: number, note: string): void {
    const current = this.records.find((r) => r.id === id);
    if (current) this.#change(id, { notes: [...current.notes, note] });
  }

  #record(label: string): FaultRecord {
    const record = newRecord(this.#nextId++, label, Date.now());
    this.records.push(record);
    if (this.records.length > KEPT_RECORDS) this.records.splice(0, this.records.length - KEPT_RECORDS);
    return record;
  }

  #start(command: FaultCommand): FaultRecord {
    const record = this.#record(faultLabel(command));
    this.#busy = record.label;
    this.emit('update');
    const { id } = record;
    void this.#apply(command, id)
      .then(() => { this.#busy = undefined; this.#change(id, { appliedAt: Date.now() }); })
      .catch((err: Error) => { this.#busy = undefined; this.#change(id, { error: err.message.split('\n')[0] }); });
    return record;
  }

  async #apply(command: FaultCommand, id: number): Promise<void> {
    const { world } = this;
    switch (command.kind) {
      case 'restart-router': return this.#restartRouter(this.#router(command.target), id);
      case 'flush-router': return world.flushRouterState(this.#router(command.target));
      case 'kill-dataplane': {
        const node = world.node(command.target);
        const pid = await world.dataplanePid(node);
        if (pid === undefined) throw new Error(`${node.name} has no data plane running`);
        process.kill(pid, 'SIGKILL');
        this.#note(id, `killed pid ${pid}; the agent notices at its next resync`);
        return;
      }
      case 'restart-agent': {
        const node = world.node(command.target);
        const started = Date.now();
        await world.stopAgent(node);
        world.setNodeReady(node, false, 'RoamguardAgentStopped', 'the roamguard agent is not running');
        await world.startAgent(node, {}, { readyTimeoutMs: AGENT_READY_TIMEOUT_MS });
        world.setNodeReady(node, true, 'RoamguardAgentReady', 'the roamguard agent is ready');
        this.#note(id, `agent ready again after ${((Date.now() - started) / 1000).toFixed(1)} s`);
        return;
      }
      case 'add-node': {
        const node = await this.#addNode(command.target);
        this.#change(id, { label: `add ${node.name} behind ${command.target}` });
        return;
      }
      case 'remove-node': {
        const node = world.node(command.target);
        this.#removing.add(node.name);
        try {
          await this.#shutDown(node);
        } finally {
          this.#removing.delete(node.name);
        }
        return;
      }
      case 'cut-site': {
        const links = this.#siteLinks(command.target);
        for (const { ns, ifname } of links) await ns.ip(['link', 'set', ifname, 'down']);
        await new Promise((r) => setTimeout(r, command.seconds! * 1000));
        for (const { ns, ifname } of links) await ns.ip(['link', 'set', ifname, 'up']);
        this.#note(id, `${command.target} back after ${command.seconds} s`);
        return;
      }
    }
  }

  #router(name: string): Router {
    const router = this.world.routers.get(name);
    if (!router) throw new Error(`no router ${name}`);
    return router;
  }

  /**
   * As the NAT suite's restart: rules and NAT state gone, the WAN link down for a moment, then
   * the rules back. Every other restart also moves the router's UDP mappings into a new port
   * range (as a router that does not keep source ports would), so the mappings really change.
   */
  async #restartRouter(router: Router, id: number): Promise<void> {
    const count = (this.#restarts.get(router.name) ?? 0) + 1;
    this.#restarts.set(router.name, count);
    await router.ns.exec('nft', ['delete', 'table', 'inet', 'router'], { allowFailure: true });
    await this.world.flushRouterState(router);
    await router.ns.ip(['link', 'set', router.wan.ifname, 'down']);
    await new Promise((r) => setTimeout(r, ROUTER_REBOOT_MS));
    await router.ns.ip(['link', 'set', router.wan.ifname, 'up']);
    const base = 40000 + 200 * (count % 10);
    const portRange = count % 2 === 1 ? `${base}-${base + 99}` : undefined;
    await this.world.applyRouterRules(router, portRange ? { portRange } : {});
    this.#note(id, portRange ? `UDP mappings now from ports ${portRange}` : 'mappings keep the nodes\' source ports again');
  }

  /** The links to cut for a site: its router's WAN leg, or (the internet) each node's uplink there. */
  #siteLinks(site: string): Array<{ ns: WorldNode['ns']; ifname: string }> {
    const router = this.world.routers.get(site);
    if (router) return [{ ns: router.ns, ifname: router.wan.ifname }];
    const nodes = this.world.nodes.filter((n) => n.segment.spec.name === site);
    if (nodes.length === 0) throw new Error(`no node on ${site}`);
    return nodes.map((n) => ({ ns: n.ns, ifname: n.uplink }));
  }

  async #addNode(site: string): Promise<WorldNode> {
    const { world } = this;
    const onSite = world.nodes.filter((n) => n.segment.spec.name === site);
    const prefix = site[0];
    let number = 1;
    const taken = new Set([...world.nodes.map((n) => n.name), ...world.api.listNodes().map((n) => n.metadata.name)]);
    while (taken.has(`${prefix}${number}`)) number++;
    const name = `${prefix}${number}`;
    const indices = new Set(onSite.map((n) => Number(n.ipv4.split('.').at(-1))));
    let index = 11;
    while (indices.has(index)) index++;
    const port = Math.max(51820, ...world.nodes.map((n) => n.listenPort)) + 1;
    const node = await world.addNode(name, site, index, { listenPort: port });
    await world.startAgent(node, {}, { readyTimeoutMs: AGENT_READY_TIMEOUT_MS });
    world.setNodeReady(node, true, 'RoamguardAgentReady', 'the roamguard agent is ready');
    this.pods.set(node.name, await world.addPod(node));
    return node;
  }

  /** Agent and data plane stopped, uplink removed (its address can be reused), Node deleted. */
  async #shutDown(node: WorldNode): Promise<void> {
    await this.world.stopAgent(node);
    const pid = await this.world.dataplanePid(node);
    if (pid !== undefined) {
      try { process.kill(pid, 'SIGTERM'); } catch { /* already gone */ }
    }
    await node.ns.ip(['link', 'del', node.uplink], { allowFailure: true });
    this.world.removeNode(node);
    this.pods.delete(node.name);
  }
}
