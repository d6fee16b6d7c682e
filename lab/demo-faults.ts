/**
 * The faults a newcomer can cause while `roamguard demo` runs, typed in its terminal as a short
 * command ("r office") or pressed as a button on its page. This file is the list and the parser
 * (pure, unit-tested); lab/demo-session.ts carries them out on the world.
 */

export type FaultKind = 'restart-router' | 'flush-router' | 'kill-dataplane' | 'restart-agent' | 'add-node' | 'remove-node' | 'cut-site';

export interface FaultCommand {
  kind: FaultKind;
  /** A router (= its site's name), a node or a site. */
  target: string;
  /** cut-site: how long the site stays cut off. */
  seconds?: number;
}

export interface FaultSpec {
  kind: FaultKind;
  /** What to type: the key, then the arguments. */
  key: string;
  args: 'ROUTER' | 'NODE' | 'SITE SECONDS';
  summary: string;
}

export const FAULTS: readonly FaultSpec[] = [
  { kind: 'restart-router', key: 'r', args: 'ROUTER', summary: 'restart a NAT router: every mapping lost, new public ports' },
  { kind: 'flush-router', key: 'f', args: 'ROUTER', summary: 'flush a router\'s conntrack: mappings forgotten, rules kept' },
  { kind: 'kill-dataplane', key: 'k', args: 'NODE', summary: 'kill a node\'s data plane (roamguard wg); its agent starts a new one' },
  { kind: 'restart-agent', key: 'a', args: 'NODE', summary: 'restart a node\'s agent (the data plane keeps forwarding)' },
  { kind: 'add-node', key: 'n', args: 'ROUTER', summary: 'add a node (with a pod) behind that router\'s NAT' },
  { kind: 'remove-node', key: 'x', args: 'NODE', summary: 'remove a node: agent and data plane stopped, Node deleted' },
  { kind: 'cut-site', key: 'c', args: 'SITE SECONDS', summary: 'cut a site off the internet for that many seconds' },
];

/** What the demo has right now, to check a command's target against. */
export interface FaultTargets {
  routers: readonly string[];
  nodes: readonly string[];
  sites: readonly string[];
}

export const MAX_CUT_SECONDS = 600;

export type ParsedLine =
  | { command: FaultCommand }
  | { help: true }
  | { quit: true }
  | { empty: true }
  | { error: string };

/** One line typed in the demo's terminal (or sent by its page). */
export function parseFaultLine(line: string, targets: FaultTargets): ParsedLine {
  const words = line.trim().split(/\s+/).filter(Boolean);
  if (words.length === 0) return { empty: true };
  const [key, ...args] = words;
  if (key === 'h' || key === '?' || key === 'help') return { help: true };
  if (key === 'q' || key === 'quit' || key === 'exit') return { quit: true };
  const spec = FAULTS.find((f) => f.key === key || f.kind === key);
  if (!spec) return { error: `unknown command ${JSON.stringify(key)} (h lists them)` };
  const usage = `usage: ${spec.key} ${spec.args}`;
  const [target, secondsText, ...rest] = args;
  const wanted = spec.args === 'SITE SECONDS' ? 2 : 1;
  if (args.length !== wanted || rest.length > 0) return { error: usage };
  const among = (what: string, list: readonly string[]) => list.includes(target) ? undefined : `no ${what} ${JSON.stringify(target)} (${list.length > 0 ? list.join(', ') : 'none'})`;
  const problem = spec.args === 'ROUTER' ? among('router', targets.routers) : spec.args === 'NODE' ? among('node', targets.nodes) : among('site', targets.sites);
  if (problem) return { error: `${problem}; ${usage}` };
  if (spec.args !== 'SITE SECONDS') return { command: { kind: spec.kind, target } };
  const seconds = Number(secondsText);
  if (!Number.isInteger(seconds) || seconds < 1 || seconds > MAX_CUT_SECONDS) return { error: `SECONDS must be a whole number from 1 to ${MAX_CUT_SECONDS}; ${usage}` };
  return { command: { kind: spec.kind, target, seconds } };
}

/** The command as one would type it (what the page's buttons send). */
export function faultLine(command: FaultCommand): string {
  const spec = FAULTS.find((f) => f.kind === command.kind)!;
  return [spec.key, command.target, ...(command.seconds === undefined ? [] : [String(command.seconds)])].join(' ');
}

/** A short human name: "restart office router", "cut home off for 10 s". */
export function faultLabel(command: FaultCommand): string {
  switch (command.kind) {
    case 'restart-router': return `restart ${command.target} router`;
    case 'flush-router': return `flush ${command.target} router's conntrack`;
    case 'kill-dataplane': return `kill ${command.target}'s data plane`;
    case 'restart-agent': return `restart ${command.target}'s agent`;
    case 'add-node': return `add a node behind ${command.target}`;
    case 'remove-node': return `remove ${command.target}`;
    case 'cut-site': return `cut ${command.target} off for ${command.seconds} s`;
  }
}

/** The help block shown under the demo's tables. */
export function faultHelp(targets: FaultTargets): string[] {
  const example = (spec: FaultSpec) => {
    const pick = spec.args === 'ROUTER' ? targets.routers[0] : spec.args === 'NODE' ? targets.nodes.at(-1) : targets.sites.at(-1);
    return pick === undefined ? '' : `   e.g. ${spec.key} ${pick}${spec.args === 'SITE SECONDS' ? ' 10' : ''}`;
  };
  return [
    'FAULTS (type a command and Enter; q quits)',
    ...FAULTS.map((f) => `  ${`${f.key} ${f.args}`.padEnd(15)} ${f.summary}${example(f)}`),
  ];
}
