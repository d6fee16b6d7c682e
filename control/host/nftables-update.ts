/**
 * Bringing the node's nftables table from what was last applied to what is wanted, by what
 * changed: at 5 000 Nodes the pod-CIDR sets hold ~10 000 elements, and re-rendering and replacing
 * the whole table on every pass cost the agent ~100 ms a pass even when one Node came or went.
 *
 * {@link planRulesetUpdate} is pure. It compares the wanted options with an {@link AppliedRuleset}
 * (what the last successful apply left) and answers one of:
 *
 *   'table'     the whole table, exactly {@link renderRuleset}'s text: on a first run, when asked
 *               for a full pass, or when anything but set contents differs (chains depend on those
 *               options). Replacing the table also restores one that someone flushed or edited.
 *   'elements'  one `nft -f` transaction of `delete element` lines followed by `add element` lines,
 *               for just the elements that differ after summarizing. Summarizing can merge
 *               neighbours (a new /24 next to an existing one turns two elements into one /23),
 *               so a change may delete elements that are still covered; the deletes come first
 *               because interval sets refuse an element that overlaps one still present.
 *   'none'      nothing to do, no script.
 *
 * The caller's contract:
 *
 *     const plan = planRulesetUpdate(applied, options, { full });
 *     try {
 *       if (plan.script) await applyRuleset(plan.script, runner);
 *       applied = plan.applied;          // only after nft succeeded
 *     } catch (err) {
 *       applied = undefined;             // the next plan replaces the whole table
 *       throw err;
 *     }
 *
 * An 'elements' script fails as a whole when the kernel's set is not what `applied` says (someone
 * deleted an element or the table; `delete element` of a missing element is an error), and
 * forgetting `applied` turns the next pass into a whole-table replacement that repairs it.
 * Element additions alone cannot notice a set that was flushed behind our back: passes with
 * `full: true` (which the agent already makes on a schedule) are what restore such a set.
 *
 * Cost: the set contents are the same as renderRuleset's (same parsing, this node's CIDRs in the
 * cluster sets, same summarizing), but an entry of an input list that is unchanged since the last
 * plan is not parsed again, a set whose inputs are unchanged is not summarized again, and only
 * the elements that differ are formatted. The whole table's text is only built for 'table'.
 * (The nft process is another matter: nft 1.0.6 reads every element of the table's sets before
 * running any script, ~70 ms at 10 000 elements, so an 'elements' apply is cheaper than a whole
 * table but does not yet shrink to the size of the change.)
 */
import { formatPrefix, type Prefix } from '../../dataplane/net/ip.ts';
import { comparePrefixes, parseCidr, prefixFamily, summarizePrefixes } from './cidrs.ts';
import {
  SET_NAMES, checkCidrLists, checkRulesetShape, familyPrefixes, renderTable,
  type RulesetOptions, type RulesetSetElements, type RulesetShape,
} from './nftables.ts';

/** The four sets, named as in {@link SET_NAMES}: `clusterV4` is the set `pod-cidrs-v4`. */
export type RulesetSetKey = keyof RulesetSetElements;
const SET_KEYS: readonly RulesetSetKey[] = ['clusterV4', 'clusterV6', 'localV4', 'localV6'];

/** The four input lists of {@link RulesetOptions}, named by where they come from. */
type ListKey = 'clusterV4' | 'clusterV6' | 'localV4' | 'localV6';

/** One input list as last given, each entry parsed, so the next plan parses only new entries. */
interface ParsedList {
  readonly texts: readonly string[];
  readonly prefixes: readonly Prefix[];
}

/** One set's summarized elements in canonical order, as prefixes (to compare) and as text (to write). */
interface SetElements {
  readonly prefixes: readonly Prefix[];
  readonly texts: readonly string[];
}

/** What the last successful apply left in the kernel, as far as this module is concerned. */
export interface AppliedRuleset {
  /** Everything but set contents (table name, masquerade, filter, clampMssTo, mark) as one comparable key. */
  readonly shapeKey: string;
  /** The table's name, for element scripts. */
  readonly table: string;
  /** Each set's elements: summarized, canonical CIDR text, in canonical order, no duplicates. */
  readonly sets: Readonly<Record<RulesetSetKey, readonly string[]>>;
  /** Kept for the next plan only (parsed inputs and summarized prefixes); not part of the comparison. */
  readonly reuse: {
    readonly lists: Readonly<Record<ListKey, ParsedList>>;
    readonly sets: Readonly<Record<RulesetSetKey, SetElements>>;
  };
}

export type RulesetUpdateKind = 'none' | 'elements' | 'table';

export interface RulesetUpdate {
  kind: RulesetUpdateKind;
  /** `nft -f` input for {@link applyRuleset}; absent for 'none'. */
  script?: string;
  /** What the kernel holds once `script` applied successfully; keep it only then. */
  applied: AppliedRuleset;
}

export interface PlanOptions {
  /** Replace the whole table whatever `applied` says (a periodic full pass repairs outside edits). */
  full: boolean;
}

/**
 * Plans the smallest update from `applied` (undefined: unknown, e.g. first run or after a failed
 * apply) to `next`. Throws renderRuleset's errors for bad options. Pure: `applied` is not changed.
 */
export function planRulesetUpdate(applied: AppliedRuleset | undefined, next: RulesetOptions, options: PlanOptions): RulesetUpdate {
  checkApplied(applied);
  if (!options || typeof options !== 'object' || typeof options.full !== 'boolean') {
    throw new Error(`planRulesetUpdate needs options {full: boolean}, got ${JSON.stringify(options)}`);
  }
  const shape = checkRulesetShape(next, 'planRulesetUpdate');
  const shapeKey = keyOf(shape);
  const lists = parseLists(next, applied?.reuse.lists);

  const previousSets = applied?.reuse.sets;
  const changes = {
    // This node's CIDRs are part of the cluster sets, exactly as in renderRuleset.
    clusterV4: updateSet(previousSets?.clusterV4, [lists.clusterV4, lists.localV4]),
    clusterV6: updateSet(previousSets?.clusterV6, [lists.clusterV6, lists.localV6]),
    localV4: updateSet(previousSets?.localV4, [lists.localV4]),
    localV6: updateSet(previousSets?.localV6, [lists.localV6]),
  };
  const sets = mapSets((key) => changes[key].elements);
  const nextApplied = makeApplied(shape, shapeKey, lists, sets);

  if (options.full || !applied || applied.shapeKey !== shapeKey) {
    return { kind: 'table', script: renderTable(shape, nextApplied.sets), applied: nextApplied };
  }
  const script = elementScript(shape.table, changes);
  return script === undefined ? { kind: 'none', applied: nextApplied } : { kind: 'elements', script, applied: nextApplied };
}

/** Refuses anything but undefined or an earlier plan's `applied` (a hand-made one would mislead the diff). */
function checkApplied(applied: unknown): void {
  if (applied === undefined) return;
  const a = applied as Partial<AppliedRuleset> | null;
  const complete = !!a && typeof a === 'object' && typeof a.shapeKey === 'string' && typeof a.table === 'string'
    && !!a.sets && !!a.reuse && !!a.reuse.lists && !!a.reuse.sets
    && SET_KEYS.every((k) => Array.isArray(a.sets![k]) && !!a.reuse!.sets[k] && !!a.reuse!.lists[k]);
  if (!complete) {
    throw new Error('applied must be undefined or the `applied` of an earlier planRulesetUpdate (after its script was applied)');
  }
}

/** Every option that decides chains and rules, in a fixed order, so equal shapes give equal keys. */
function keyOf(shape: RulesetShape): string {
  const { table, masquerade, filter, mark, clampMssTo } = shape;
  return JSON.stringify([table, masquerade.ipv4, masquerade.ipv6, filter.ipv4, filter.ipv6, mark, clampMssTo ?? null]);
}

function mapSets<T>(f: (key: RulesetSetKey) => T): Record<RulesetSetKey, T> {
  return { clusterV4: f('clusterV4'), clusterV6: f('clusterV6'), localV4: f('localV4'), localV6: f('localV6') };
}

type ParsedLists = Record<ListKey, ParsedList & { changed: boolean }>;

/** Parses the four input lists in renderRuleset's order, so the first bad list named is the same. */
function parseLists(next: RulesetOptions, previous: Readonly<Record<ListKey, ParsedList>> | undefined): ParsedLists {
  checkCidrLists(next);
  const localV4 = parseList(next.localPodCidrs.v4, 4, 'localPodCidrs.v4', previous?.localV4);
  const localV6 = parseList(next.localPodCidrs.v6, 6, 'localPodCidrs.v6', previous?.localV6);
  const clusterV4 = parseList(next.clusterPodCidrs.v4, 4, 'clusterPodCidrs.v4', previous?.clusterV4);
  const clusterV6 = parseList(next.clusterPodCidrs.v6, 6, 'clusterPodCidrs.v6', previous?.clusterV6);
  return { clusterV4, clusterV6, localV4, localV6 };
}

/**
 * Parses `texts`, taking the prefix of an entry that is textually identical to the previous
 * list's entry at the aligned position instead of parsing it again. Alignment only decides how
 * much is reused, never the result: lists normally arrive in canonical order, and skipping the
 * previous entries that sort before a new entry keeps the rest aligned after an insertion or a
 * removal. Any bad entry falls back to {@link familyPrefixes}, which throws renderRuleset's
 * error naming every bad entry.
 */
function parseList(texts: readonly string[] | undefined, family: 4 | 6, what: string, previous: ParsedList | undefined): ParsedList & { changed: boolean } {
  if (!Array.isArray(texts) || !previous) {
    // For a list that is not an array, familyPrefixes throws renderRuleset's error.
    const prefixes = familyPrefixes(texts, family, what);
    return { texts: texts!.slice(), prefixes, changed: true };
  }
  const prefixes: Prefix[] = [];
  let changed = texts.length !== previous.texts.length;
  let i = 0;
  for (const text of texts) {
    if (i < previous.texts.length && previous.texts[i] === text) {
      prefixes.push(previous.prefixes[i++]);
      continue;
    }
    changed = true;
    const parsed = parseOne(text, family);
    if (!parsed) return { texts: texts.slice(), prefixes: familyPrefixes(texts, family, what), changed: true };
    while (i < previous.prefixes.length && comparePrefixes(previous.prefixes[i], parsed) < 0) i++;
    // The same range written differently ("FD00::/64" for "fd00::/64") takes that entry's place.
    if (i < previous.prefixes.length && comparePrefixes(previous.prefixes[i], parsed) === 0) i++;
    prefixes.push(parsed);
  }
  // A copy: the caller may reuse and change its array after this plan.
  return { texts: texts.slice(), prefixes, changed };
}

function parseOne(text: string, family: 4 | 6): Prefix | undefined {
  try {
    const prefix = parseCidr(text);
    return prefixFamily(prefix) === family ? prefix : undefined;
  } catch {
    return undefined;
  }
}

interface SetChange {
  elements: SetElements;
  /** Canonical text, canonical order. */
  removed: readonly string[];
  added: readonly string[];
}

/** Summarizes a set's inputs (unless none changed) and compares the result with the previous elements. */
function updateSet(previous: SetElements | undefined, inputs: ReadonlyArray<ParsedList & { changed: boolean }>): SetChange {
  if (previous && !inputs.some((list) => list.changed)) return { elements: previous, removed: [], added: [] };
  return compareElements(previous, summarizePrefixes(inputs.flatMap((list) => list.prefixes)));
}

/**
 * Walks the previous and next elements together; both are summarized, hence disjoint and in
 * canonical order. Elements present in both keep their previous text, so only the differences
 * are formatted.
 */
function compareElements(previous: SetElements | undefined, next: readonly Prefix[]): SetChange {
  const old = previous ?? { prefixes: [], texts: [] };
  const texts: string[] = [];
  const removed: string[] = [];
  const added: string[] = [];
  let i = 0;
  for (const prefix of next) {
    while (i < old.prefixes.length && comparePrefixes(old.prefixes[i], prefix) < 0) removed.push(old.texts[i++]);
    if (i < old.prefixes.length && comparePrefixes(old.prefixes[i], prefix) === 0) {
      texts.push(old.texts[i++]);
    } else {
      const text = formatPrefix(prefix);
      added.push(text);
      texts.push(text);
    }
  }
  while (i < old.prefixes.length) removed.push(old.texts[i++]);
  return { elements: { prefixes: next, texts }, removed, added };
}

function makeApplied(shape: RulesetShape, shapeKey: string, lists: ParsedLists, sets: Record<RulesetSetKey, SetElements>): AppliedRuleset {
  const keep = (l: ParsedList): ParsedList => ({ texts: l.texts, prefixes: l.prefixes });
  return Object.freeze({
    shapeKey,
    table: shape.table,
    sets: Object.freeze(mapSets((key) => sets[key].texts)),
    reuse: Object.freeze({
      lists: Object.freeze({ clusterV4: keep(lists.clusterV4), clusterV6: keep(lists.clusterV6), localV4: keep(lists.localV4), localV6: keep(lists.localV6) }),
      sets: Object.freeze(sets),
    }),
  });
}

/**
 * One transaction: every delete of every set, then every add. Deletes first because summarizing
 * may replace elements by a larger one that overlaps them, and an interval set refuses an element
 * overlapping one that is still there. Undefined when nothing differs.
 */
function elementScript(table: string, changes: Record<RulesetSetKey, SetChange>): string | undefined {
  const lines = [
    ...SET_KEYS.flatMap((key) => elementLine('delete', table, SET_NAMES[key], changes[key].removed)),
    ...SET_KEYS.flatMap((key) => elementLine('add', table, SET_NAMES[key], changes[key].added)),
  ];
  return lines.length === 0 ? undefined : `${lines.join('\n')}\n`;
}

/** `{ }` is a syntax error in nft, so an empty list makes no line at all. */
function elementLine(verb: 'add' | 'delete', table: string, set: string, elements: readonly string[]): string[] {
  return elements.length === 0 ? [] : [`${verb} element inet ${table} ${set} { ${elements.join(', ')} }`];
}
