/**
 * Kernel routes and addresses of the tunnel interface, reconciled with `ip`:
 *
 * - Routes: every remote pod CIDR goes `dev <tunnel>`; the WireGuard daemon then picks the peer by
 *   its allowed IPs. Our routes carry a protocol number of their own ({@link DEFAULT_ROUTE_PROTOCOL}),
 *   and we only ever list and delete routes with that number on that device — never the kernel's,
 *   an admin's, or another agent's.
 * - Addresses: the tunnel carries the gateway address (network + 1) of each local pod CIDR as a
 *   /32 or /128, so traffic the node itself sends into the tunnel has a source inside the pod
 *   network (which the remote node's filter accepts and its masquerade leaves alone).
 * - Link: MTU and up.
 *
 * Reconciling is list → diff → change, per family; listing again finds nothing to do. Routes can
 * also be reconciled against what the previous pass left ({@link AppliedRoutes}) instead of a
 * listing, so that a pass at 5 000 Nodes costs what changed rather than what exists.
 */
import { formatIp, formatPrefix, parseIp, parsePrefix, type Prefix } from '../../dataplane/net/ip.ts';
import { canonicalPrefixes, gatewayAddress, parseCidr, parseCidrList, summarizePrefixes } from './cidrs.ts';
import { runChecked, systemRunner, type CommandRunner } from './runner.ts';

/**
 * Route protocol (rtm_protocol) that marks routes as roamguard's. iproute2 and common routing
 * daemons use 0–18, 42, 99 and 186–192; 147 is in none of their lists.
 */
export const DEFAULT_ROUTE_PROTOCOL = 147;

export interface ReconcileReport {
  /** What was added, canonical ("10.244.2.0/24", "10.244.1.1/32"). */
  added: string[];
  /** What was removed. */
  removed: string[];
}

/** Linux interface names: 1–15 bytes, no '/', no blanks (we also refuse ':' and other oddities). */
export function validateDeviceName(device: string): string {
  if (typeof device !== 'string' || !/^[A-Za-z0-9_.-]{1,15}$/.test(device)) {
    throw new Error(`bad interface name ${JSON.stringify(device)}: 1-15 letters, digits, "_", "." or "-"`);
  }
  return device;
}

function validateProtocol(protocol: number): number {
  // 0–4 are the kernel's own meanings (unspec, redirect, kernel, boot, static).
  if (!Number.isInteger(protocol) || protocol < 5 || protocol > 255) {
    throw new Error(`route protocol must be an integer 5..255, got ${protocol}`);
  }
  return protocol;
}

function parseJsonArray(text: string, what: string): unknown[] {
  let value: unknown;
  try {
    // iproute2 prints nothing at all (not "[]") for some empty listings.
    value = text.trim() === '' ? [] : JSON.parse(text);
  } catch (err) {
    throw new Error(`cannot parse ${what}: ${(err as Error).message}`);
  }
  if (!Array.isArray(value)) throw new Error(`cannot parse ${what}: expected a JSON array`);
  return value;
}

/**
 * Every entry of a sequence of JSON arrays, as `ip -j -batch` prints them: one array per command,
 * one after another. Which array belongs to which command is not needed (entries name their
 * destination), and could not be told anyway: some iproute2 versions print nothing at all for an
 * empty result. Strings are skipped over, so an interface name holding "][" cannot cut an array.
 */
export function parseJsonArrays(text: string, what: string): unknown[] {
  const out: unknown[] = [];
  let depth = 0;
  let start = -1;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (inString) {
      if (c === '\\') i++;
      else if (c === '"') inString = false;
    } else if (c === '"') inString = true;
    else if (c === '[' || c === '{') {
      if (depth++ === 0) start = i;
    } else if (c === ']' || c === '}') {
      if (--depth < 0) throw new Error(`cannot parse ${what}: unbalanced "${c}" at offset ${i}`);
      if (depth === 0) out.push(...parseJsonArray(text.slice(start, i + 1), what));
    } else if (depth === 0 && !/\s/.test(c)) {
      throw new Error(`cannot parse ${what}: unexpected ${JSON.stringify(c)} at offset ${i} between arrays`);
    }
  }
  if (depth !== 0 || inString) throw new Error(`cannot parse ${what}: it ends inside an array`);
  return out;
}

/** A route the agent wants on the tunnel: a destination and, when the path to it is narrower, its MTU. */
export interface WantedRoute {
  dst: string;
  mtu?: number;
}

/**
 * A destination as the kernel prints it ("10.9.1.0/24", "10.9.1.5", "fd00::/64") in canonical
 * form with its length, or undefined when it is no address. The kernel prints IPv4 destinations
 * canonically already, and a listing holds ~10 000 of them at 5 000 Nodes: those are only
 * checked, not parsed and formatted again.
 */
function canonicalRouteDestination(text: string): string | undefined {
  const ipv4 = text.includes('/') ? text : `${text}/32`;
  if (ipv4Key(ipv4) !== undefined) return ipv4;
  try {
    return formatPrefix(parsePrefix(text));
  } catch {
    return undefined;
  }
}

/**
 * Routes in `ip -j route show` output, destinations canonical ("10.9.1.5" → "10.9.1.5/32"), with
 * their MTU metric when they have one. Entries without a destination address ("default",
 * "unreachable", multicast) are not ours and skipped.
 */
export function parseRoutes(json: string): WantedRoute[] {
  const out: WantedRoute[] = [];
  for (const entry of parseJsonArray(json, '`ip -j route` output')) {
    const e = entry as { dst?: unknown; metrics?: unknown };
    if (typeof e.dst !== 'string' || e.dst === 'default') continue;
    const dst = canonicalRouteDestination(e.dst);
    if (dst === undefined) continue; // not an address route
    const metrics = Array.isArray(e.metrics) ? e.metrics as Array<{ mtu?: unknown }> : [];
    const mtu = metrics.map((m) => m?.mtu).find((m): m is number => typeof m === 'number');
    out.push(mtu === undefined ? { dst } : { dst, mtu });
  }
  return out;
}

/** Destinations in `ip -j route show` output, canonical (see {@link parseRoutes}). */
export function parseRouteDestinations(json: string): string[] {
  return parseRoutes(json).map((r) => r.dst);
}

export interface RouteReconcileOptions {
  /** The tunnel interface. */
  device: string;
  /**
   * Remote pod CIDRs (either family), each optionally with the MTU its route carries; summarized
   * before use (only routes with the same MTU are merged).
   */
  cidrs: ReadonlyArray<string | WantedRoute>;
  /** Default {@link DEFAULT_ROUTE_PROTOCOL}. */
  protocol?: number;
  runner?: CommandRunner;
  /**
   * What the previous successful call left (its `report.applied`): our routes are then taken from
   * it instead of being listed. Pass it only on passes that are not meant to resync with the
   * kernel, and drop it after any failure (see {@link reconcileRoutes}).
   */
  applied?: AppliedRoutes;
}

/**
 * Our routes as a successful {@link reconcileRoutes} left them on the kernel, per family:
 * destination (canonical) → MTU, undefined where the route carries none. Only what that call
 * listed or did is in it: it is true as long as nobody else adds, changes or deletes routes with
 * our protocol on the device, and the device is not recreated (the kernel drops a device's routes
 * with it).
 */
export interface AppliedRoutes {
  /** The device and protocol the routes were reconciled for; a call for others refuses them. */
  readonly device: string;
  readonly protocol: number;
  readonly v4: ReadonlyMap<string, number | undefined>;
  readonly v6: ReadonlyMap<string, number | undefined>;
}

/** Our routes (this protocol) on `device` of one family, canonical, with their MTUs. */
export async function listOwnRoutes(device: string, family: 4 | 6, protocol = DEFAULT_ROUTE_PROTOCOL, runner: CommandRunner = systemRunner): Promise<WantedRoute[]> {
  validateDeviceName(device);
  validateProtocol(protocol);
  const result = await runChecked(runner, `list routes on ${device}`, 'ip', ['-j', `-${family}`, 'route', 'show', 'dev', device, 'proto', String(protocol)]);
  return parseRoutes(result.stdout);
}

/** Wanted routes summarized, per family, each list in the order reconcile adds them. */
export interface SummarizedRoutes {
  v4: WantedRoute[];
  v6: WantedRoute[];
}

/** One entry of `cidrs`, checked: a CIDR string or `{ dst, mtu? }` with a sane MTU. */
function wantedRouteAt(entry: unknown, index: number): WantedRoute {
  if (typeof entry === 'string') return { dst: entry };
  const route = entry as WantedRoute | null;
  if (typeof route !== 'object' || route === null || typeof route.dst !== 'string') {
    throw new Error(`route CIDRs[${index}] must be a CIDR string or { dst, mtu }, got ${JSON.stringify(entry)}`);
  }
  if (route.mtu !== undefined && (!Number.isInteger(route.mtu) || route.mtu < 576 || route.mtu > 65535)) {
    throw new Error(`route MTU must be an integer 576..65535, got ${route.mtu} for ${route.dst}`);
  }
  return route;
}

// IPv4 prefixes as one number, address * 64 + length: sorting the numbers is the canonical order
// (by address, then shorter first), and the numbers sort as a Float64Array without a comparator.
// Every step of the generic path (bytes, masks, comparisons) allocates; at 10 000 wanted routes
// parsing and summarizing through it took ~25 ms per call, this way ~3 ms.
const IPV4_CIDR = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})\/(\d{1,2})$/;

/**
 * The key of a plainly written IPv4 CIDR ("10.244.2.0/24": no leading zeros, no host bits), or
 * undefined for anything else, which then goes through the strict parser (it accepts or explains).
 */
function ipv4Key(text: string): number | undefined {
  const m = IPV4_CIDR.exec(text);
  if (!m) return undefined;
  let address = 0;
  for (let i = 1; i <= 5; i++) if (m[i].length > 1 && m[i][0] === '0') return undefined;
  for (let i = 1; i <= 4; i++) {
    const octet = Number(m[i]);
    if (octet > 255) return undefined;
    address = address * 256 + octet;
  }
  const bits = Number(m[5]);
  if (bits > 32 || address % 2 ** (32 - bits) !== 0) return undefined;
  return address * 64 + bits;
}

function ipv4Mask(address: number, bits: number): number {
  const size = 2 ** (32 - bits);
  return address - (address % size);
}

function formatIpv4Key(address: number, bits: number): string {
  // `>>>` works on the address as an unsigned 32-bit integer, which it is.
  return `${address >>> 24}.${(address >>> 16) & 255}.${(address >>> 8) & 255}.${address & 255}/${bits}`;
}

/** {@link summarizePrefixes} on IPv4 keys (the same two steps), as canonical CIDR strings. */
function summarizeIpv4Keys(keys: readonly number[]): string[] {
  const sorted = Float64Array.from(keys).sort();
  const addresses: number[] = [];
  const lengths: number[] = [];
  // Drop what the last kept prefix covers (in canonical order it is the only candidate).
  for (const key of sorted) {
    const bits = key % 64;
    const address = (key - bits) / 64;
    const last = addresses.length - 1;
    if (last >= 0 && lengths[last] <= bits && ipv4Mask(address, lengths[last]) === addresses[last]) continue;
    addresses.push(address);
    lengths.push(bits);
  }
  // Merge sibling halves into their parent, repeatedly.
  const mergedAddresses: number[] = [];
  const mergedLengths: number[] = [];
  for (let i = 0; i < addresses.length; i++) {
    let address = addresses[i];
    let bits = lengths[i];
    for (;;) {
      const top = mergedAddresses.length - 1;
      if (top < 0 || bits === 0 || mergedLengths[top] !== bits || mergedAddresses[top] === address) break;
      const parent = ipv4Mask(address, bits - 1);
      if (ipv4Mask(mergedAddresses[top], bits - 1) !== parent) break;
      mergedAddresses.pop();
      mergedLengths.pop();
      address = parent;
      bits -= 1;
    }
    mergedAddresses.push(address);
    mergedLengths.push(bits);
  }
  return mergedAddresses.map((address, i) => formatIpv4Key(address, mergedLengths[i]));
}

/**
 * Summarizes the wanted routes, each MTU's on their own (merging two routes must not change
 * either's MTU), split by family. Per family the list runs MTU group by MTU group in the order the
 * MTUs first appear, canonical within a group. Every bad CIDR is named in one error.
 */
export function summarizeWanted(cidrs: ReadonlyArray<string | WantedRoute>): SummarizedRoutes {
  if (!Array.isArray(cidrs)) throw new Error('route CIDRs must be an array of CIDR strings or { dst, mtu } routes');
  const groups = new Map<number | undefined, { v4: number[]; v6: Prefix[] }>();
  const problems: string[] = [];
  cidrs.forEach((entry, index) => {
    const route = wantedRouteAt(entry, index);
    let group = groups.get(route.mtu);
    if (!group) groups.set(route.mtu, group = { v4: [], v6: [] });
    const key = ipv4Key(route.dst);
    if (key !== undefined) {
      group.v4.push(key);
      return;
    }
    try {
      const prefix = parseCidr(route.dst);
      if (prefix.address.length === 4) group.v4.push(ipv4Key(formatPrefix(prefix))!);
      else group.v6.push(prefix);
    } catch (err) {
      problems.push(`[${index}] ${(err as Error).message}`);
    }
  });
  if (problems.length > 0) throw new Error(`bad route CIDRs:\n  ${problems.join('\n  ')}`);
  const out: SummarizedRoutes = { v4: [], v6: [] };
  const withMtu = (dst: string, mtu: number | undefined): WantedRoute => (mtu === undefined ? { dst } : { dst, mtu });
  for (const [mtu, group] of groups) {
    for (const dst of summarizeIpv4Keys(group.v4)) out.v4.push(withMtu(dst, mtu));
    for (const prefix of summarizePrefixes(group.v6)) out.v6.push(withMtu(formatPrefix(prefix), mtu));
  }
  return out;
}

/** A route to a destination we wanted that belongs to someone else (the kernel, an admin, a daemon). */
export interface RouteConflict {
  dst: string;
  /** How the other route is described (`dev eth0 proto kernel`). */
  existing: string;
}

/**
 * The routes among `entries` (`ip -j route show` of the main table) that go to one of `dsts` and
 * are not ours: a route with a protocol other than ours, or ours on another device. `ip route
 * replace` would silently take such a route over (in a namespace test it replaced the kernel's
 * connected route of a LAN), so reconcile leaves the destination alone instead. Keyed by
 * destination; each entry is canonicalized once, however many destinations are asked about.
 */
function foreignRoutesTo(entries: readonly unknown[], dsts: ReadonlySet<string>, family: 4 | 6, device: string, protocol: number): Map<string, RouteConflict[]> {
  const out = new Map<string, RouteConflict[]>();
  for (const entry of entries) {
    const e = entry as { dst?: unknown; dev?: unknown; protocol?: unknown; type?: unknown };
    if (typeof e.dst !== 'string') continue;
    const dst = e.dst === 'default' ? (family === 6 ? '::/0' : '0.0.0.0/0') : canonicalRouteDestination(e.dst);
    if (dst === undefined || !dsts.has(dst)) continue;
    const proto = e.protocol === undefined ? 'boot' : String(e.protocol);
    if (proto === String(protocol) && e.dev === device) continue;
    let list = out.get(dst);
    if (!list) out.set(dst, list = []);
    list.push({ dst, existing: [e.type && e.type !== 'unicast' ? String(e.type) : '', e.dev ? `dev ${String(e.dev)}` : '', `proto ${proto}`].filter(Boolean).join(' ') });
  }
  return out;
}

/** Routes in `ip -j route show` output to exactly `dst` (canonical) that are not ours (see {@link foreignRoutesTo}). */
export function foreignRoutes(json: string, dst: string, device: string, protocol: number): RouteConflict[] {
  const entries = parseJsonArrays(json, '`ip -j route show exact` output');
  return foreignRoutesTo(entries, new Set([dst]), dst.includes(':') ? 6 : 4, device, protocol).get(dst) ?? [];
}

/**
 * Up to this many destinations to add are looked up one by one (`route show exact`, all in one
 * `ip -batch`); more are checked against one listing of the whole main table. The kernel filters
 * a route dump by table, protocol and device but not by destination, so each lookup still walks
 * the table (iproute2 picks the match), only without printing it. Measured through `ip netns
 * exec` with 10 000 routes: one process with n lookups ~12 + 1.7·n ms (32: ~66 ms), the listing
 * ~52 ms plus ~33 ms to parse its ~800 kB of JSON; the two cost the same at about 40 lookups.
 */
export const EXACT_LOOKUP_LIMIT = 32;

/**
 * The routes that are not ours to the destinations about to be added, keyed by destination.
 * One command whatever the count: a batch of exact lookups for a few, the table for many.
 */
async function findForeignRoutes(runner: CommandRunner, family: 4 | 6, dsts: readonly string[], device: string, protocol: number): Promise<Map<string, RouteConflict[]>> {
  let entries: unknown[];
  if (dsts.length > EXACT_LOOKUP_LIMIT) {
    const table = await runChecked(runner, `list the IPv${family} main routing table`, 'ip', ['-j', `-${family}`, 'route', 'show', 'table', 'main']);
    entries = parseJsonArray(table.stdout, '`ip -j route show table main` output');
  } else {
    const lookups = await runChecked(runner, `look up ${dsts.length} destination(s) in the IPv${family} main routing table`, 'ip', ['-j', `-${family}`, '-batch', '-'], {
      input: dsts.map((dst) => `route show exact ${dst} table main\n`).join(''),
    });
    entries = parseJsonArrays(lookups.stdout, '`ip -j -batch` output of `route show exact`');
  }
  return foreignRoutesTo(entries, new Set(dsts), family, device, protocol);
}

export interface RouteReport extends ReconcileReport {
  /** Ours already, with another MTU now (`ip route change`). */
  changed: string[];
  /** Wanted destinations left alone because a route that is not ours already goes there. */
  conflicts: RouteConflict[];
  /** Our routes after this call: the `applied` to pass to the next one. */
  applied: AppliedRoutes;
}

/** Destination → MTU of routes as listed or wanted. */
function routeMap(routes: readonly WantedRoute[]): Map<string, number | undefined> {
  return new Map(routes.map((r) => [r.dst, r.mtu]));
}

function mtuText(route: WantedRoute): string {
  return route.mtu === undefined ? '' : ` mtu ${route.mtu}`;
}

/** Refuses an `applied` that is not a previous report's for this device and protocol. */
function checkApplied(applied: AppliedRoutes, device: string, protocol: number): AppliedRoutes {
  if (typeof applied !== 'object' || applied === null || !(applied.v4 instanceof Map) || !(applied.v6 instanceof Map)) {
    throw new Error('applied must be the `applied` of a previous reconcileRoutes report (per family a Map of destination to MTU)');
  }
  if (applied.device !== device || applied.protocol !== protocol) {
    throw new Error(`applied routes are those of device ${applied.device} protocol ${applied.protocol}, not of ${device} protocol ${protocol}: reconcile without them to list the device's routes`);
  }
  return applied;
}

/** What one family needs: routes to add, ours to give another MTU, ours no longer wanted. */
interface RouteDiff {
  missing: WantedRoute[];
  retuned: WantedRoute[];
  extra: string[];
}

function diffRoutes(want: readonly WantedRoute[], have: ReadonlyMap<string, number | undefined>): RouteDiff {
  const wanted = new Set<string>();
  const missing: WantedRoute[] = [];
  const retuned: WantedRoute[] = [];
  for (const route of want) {
    wanted.add(route.dst);
    if (!have.has(route.dst)) missing.push(route);
    else if (have.get(route.dst) !== route.mtu) retuned.push(route);
  }
  const extra = [...have.keys()].filter((dst) => !wanted.has(dst));
  return { missing, retuned, extra };
}

/** What every step of one call shares. */
interface RouteContext {
  device: string;
  protocol: number;
  runner: CommandRunner;
  report: RouteReport;
}

/** Our own routes (this protocol, this device) with another MTU: changed in place, which never cuts traffic. */
async function changeMtus(ctx: RouteContext, family: 4 | 6, routes: readonly WantedRoute[], state: Map<string, number | undefined>): Promise<void> {
  await runChecked(ctx.runner, `set the MTU of ${routes.length} route(s) through ${ctx.device}`, 'ip', [`-${family}`, '-batch', '-'], {
    input: routes.map((r) => `route change ${r.dst} dev ${ctx.device} proto ${ctx.protocol}${mtuText(r)}\n`).join(''),
  });
  for (const r of routes) state.set(r.dst, r.mtu);
  ctx.report.changed.push(...routes.map((r) => r.dst));
}

/**
 * Adds the missing routes whose destination is free; a destination with a route that is not ours
 * is a conflict. Returns our routes afterwards: `state` with the adds, or, when some add met a
 * route that appeared meanwhile, a fresh listing.
 */
async function addRoutes(ctx: RouteContext, family: 4 | 6, missing: readonly WantedRoute[], state: Map<string, number | undefined>): Promise<Map<string, number | undefined>> {
  const { device, protocol, runner, report } = ctx;
  const foreign = await findForeignRoutes(runner, family, missing.map((r) => r.dst), device, protocol);
  const free: WantedRoute[] = [];
  for (const route of missing) {
    const conflicts = foreign.get(route.dst);
    if (conflicts) report.conflicts.push(...conflicts);
    else free.push(route);
  }
  if (free.length === 0) return state;
  // `add`, not `replace`: should a route appear between the check and now, the kernel refuses
  // (EEXIST) and that is a conflict too. `-force` goes on past such a line.
  const added = await runner('ip', [`-${family}`, '-force', '-batch', '-'], { input: free.map((r) => `route add ${r.dst} dev ${device} proto ${protocol}${mtuText(r)}\n`).join('') });
  if (added.code === 0) {
    for (const r of free) state.set(r.dst, r.mtu);
    report.added.push(...free.map((r) => r.dst));
    return state;
  }
  const failures = added.stderr.split('\n').filter((line) => /^RTNETLINK answers:|^Error:/.test(line));
  if (failures.length === 0 || !failures.every((line) => /File exists/i.test(line))) {
    throw new Error(`cannot add routes through ${device}: ${added.command} exited ${added.code}: ${added.stderr.trim()}`);
  }
  // Which lines failed, the batch does not say: the listing does.
  const now = routeMap(await listOwnRoutes(device, family, protocol, runner));
  for (const { dst } of free) {
    if (now.has(dst)) report.added.push(dst);
    else report.conflicts.push({ dst, existing: 'a route created meanwhile' });
  }
  return now;
}

async function deleteRoutes(ctx: RouteContext, family: 4 | 6, extra: readonly string[], state: Map<string, number | undefined>): Promise<void> {
  await runChecked(ctx.runner, `remove ${extra.length} route(s) through ${ctx.device}`, 'ip', [`-${family}`, '-batch', '-'], {
    input: extra.map((dst) => `route del ${dst} dev ${ctx.device} proto ${ctx.protocol}\n`).join(''),
  });
  for (const dst of extra) state.delete(dst);
  ctx.report.removed.push(...extra);
}

/**
 * One family: our routes from `known` or else a listing, then the MTU changes, the adds and the
 * deletes. Returns our routes afterwards (`known` itself when nothing changed).
 */
async function reconcileFamily(ctx: RouteContext, family: 4 | 6, want: readonly WantedRoute[], known: ReadonlyMap<string, number | undefined> | undefined): Promise<ReadonlyMap<string, number | undefined>> {
  const have = known ?? routeMap(await listOwnRoutes(ctx.device, family, ctx.protocol, ctx.runner));
  const { missing, retuned, extra } = diffRoutes(want, have);
  if (missing.length === 0 && retuned.length === 0 && extra.length === 0) return have;
  let state = new Map(have);
  if (retuned.length > 0) await changeMtus(ctx, family, retuned, state);
  if (missing.length > 0) state = await addRoutes(ctx, family, missing, state);
  if (extra.length > 0) await deleteRoutes(ctx, family, extra, state);
  return state;
}

/**
 * Makes the routes with our protocol on `device` exactly the given CIDRs with their MTUs: missing
 * ones are added (`ip route add`), ours with another MTU changed (`ip route change`), extra ones
 * deleted. A destination that already has a route that is not ours is a conflict: reported,
 * nothing changed (never `replace`). Each family is listed and changed on its own.
 *
 * The number of commands does not grow with the number of routes changed (a Node joining or
 * leaving a 5 000-node cluster can re-split the summarized pod CIDRs into dozens of routes): per
 * family one listing of ours (none with `applied`), one command for the conflict check when
 * something is to be added (see {@link EXACT_LOOKUP_LIMIT}), and one `ip -batch` each for the MTU
 * changes, the adds and the deletes (plus a listing of ours when an add met a route that appeared
 * meanwhile).
 *
 * With `options.applied` our routes are not listed: the wanted routes are compared with what the
 * previous call left, so a pass that adds one route and removes another runs three short commands
 * (a lookup, an add, a delete), and a family where nothing changed runs none. The caller:
 * - passes the previous successful call's `report.applied`, and only on passes that are not meant
 *   to resync: the first pass, a periodic full pass and a pass after the tunnel device may have
 *   been recreated go without it, and so list and repair whatever changed behind our back;
 * - drops it after any failure: a call that throws may have run some of its batches, so what it
 *   left is unknown until the next listing.
 * A route of ours deleted by someone else is only re-added by a pass without `applied`; a delete
 * or MTU change of a route that vanished fails the call (and the caller then lists).
 */
export async function reconcileRoutes(options: RouteReconcileOptions): Promise<RouteReport> {
  const device = validateDeviceName(options.device);
  const protocol = validateProtocol(options.protocol ?? DEFAULT_ROUTE_PROTOCOL);
  const runner = options.runner ?? systemRunner;
  const known = options.applied === undefined ? undefined : checkApplied(options.applied, device, protocol);
  const desired = summarizeWanted(options.cidrs);
  for (const r of [...desired.v4, ...desired.v6]) {
    // A /0 through the tunnel would take the host's own default route, and its underlay with it.
    if (r.dst.endsWith('/0')) throw new Error(`refusing to route ${r.dst} through ${device}`);
  }
  const report: RouteReport = { added: [], removed: [], changed: [], conflicts: [], applied: { device, protocol, v4: new Map(), v6: new Map() } };
  const ctx: RouteContext = { device, protocol, runner, report };
  const v4 = await reconcileFamily(ctx, 4, desired.v4, known?.v4);
  const v6 = await reconcileFamily(ctx, 6, desired.v6, known?.v6);
  report.applied = { device, protocol, v4, v6 };
  return report;
}

/**
 * The tunnel addresses for this node's pod CIDRs: each gateway (network + 1) as /32 or /128,
 * canonical. Not summarized: merging two adjacent local CIDRs would lose one of their gateways.
 */
export function gatewayAddressesFor(localPodCidrs: readonly string[]): string[] {
  const addresses = canonicalPrefixes(parseCidrList(localPodCidrs, 'local pod CIDRs'))
    .map((p) => formatPrefix({ address: gatewayAddress(p), bits: p.address.length * 8 }));
  return addresses.filter((a, i) => addresses.indexOf(a) === i);
}

/** "address/length" with the address kept as given (host bits are the point of an interface address). */
function parseInterfaceAddress(text: string): string {
  const slash = typeof text === 'string' ? text.indexOf('/') : -1;
  if (slash < 0) throw new Error(`address ${JSON.stringify(text)} needs a prefix length, e.g. 10.244.1.1/32`);
  const address = parseIp(text.slice(0, slash));
  const bitsText = text.slice(slash + 1);
  if (!/^\d{1,3}$/.test(bitsText) || Number(bitsText) > address.length * 8) throw new Error(`bad prefix length in address ${JSON.stringify(text)}`);
  return `${formatIp(address)}/${Number(bitsText)}`;
}

/** Global-scope addresses in `ip -j addr show` output as "address/prefixlen" (link-local and host scope skipped). */
export function parseGlobalAddresses(json: string): string[] {
  const out: string[] = [];
  for (const link of parseJsonArray(json, '`ip -j addr` output')) {
    const infos = (link as { addr_info?: unknown }).addr_info;
    if (!Array.isArray(infos)) continue;
    for (const info of infos as Array<{ family?: unknown; local?: unknown; prefixlen?: unknown; scope?: unknown }>) {
      if ((info.family !== 'inet' && info.family !== 'inet6') || info.scope !== 'global') continue;
      if (typeof info.local !== 'string' || typeof info.prefixlen !== 'number') continue;
      out.push(`${formatIp(parseIp(info.local))}/${info.prefixlen}`);
    }
  }
  return out;
}

export interface AddressReconcileOptions {
  /** The tunnel interface; it belongs to roamguard, so any other global address on it is removed. */
  device: string;
  /** Wanted addresses with prefix length, e.g. from {@link gatewayAddressesFor}. */
  addresses: readonly string[];
  runner?: CommandRunner;
}

/**
 * Makes the global-scope addresses of `device` exactly `addresses` (link-local ones are left
 * alone). New addresses are added before stale ones are removed, so a pod CIDR change never leaves
 * the device without a source address. IPv6 addresses are added with `nodad`: duplicate address
 * detection would keep them tentative (unusable as a source) for a second or more, and they are
 * unique by construction.
 */
export async function reconcileAddresses(options: AddressReconcileOptions): Promise<ReconcileReport> {
  const device = validateDeviceName(options.device);
  const runner = options.runner ?? systemRunner;
  if (!Array.isArray(options.addresses)) throw new Error('addresses must be an array of "address/length" strings');
  const want = options.addresses.map(parseInterfaceAddress);
  const listing = await runChecked(runner, `list addresses of ${device}`, 'ip', ['-j', 'addr', 'show', 'dev', device]);
  const have = parseGlobalAddresses(listing.stdout);
  const report: ReconcileReport = { added: [], removed: [] };
  for (const address of want) {
    if (have.includes(address) || report.added.includes(address)) continue;
    const extra = address.includes(':') ? ['nodad'] : [];
    await runChecked(runner, `add address ${address} to ${device}`, 'ip', ['addr', 'add', address, 'dev', device, ...extra]);
    report.added.push(address);
  }
  for (const address of have) {
    if (want.includes(address)) continue;
    await runChecked(runner, `remove address ${address} from ${device}`, 'ip', ['addr', 'del', address, 'dev', device]);
    report.removed.push(address);
  }
  return report;
}

export interface LinkOptions {
  device: string;
  /** 1280..65535 (the tunnel carries IPv6 pod traffic, which needs at least 1280). */
  mtu: number;
  runner?: CommandRunner;
}

/** Sets the MTU and brings the link up, in one `ip link set`. */
export async function setLinkMtuUp(options: LinkOptions): Promise<void> {
  const device = validateDeviceName(options.device);
  const mtu = options.mtu;
  if (!Number.isInteger(mtu) || mtu < 1280 || mtu > 65535) throw new Error(`tunnel MTU must be an integer 1280..65535, got ${mtu}`);
  await runChecked(options.runner ?? systemRunner, `set ${device} mtu ${mtu} up`, 'ip', ['link', 'set', 'dev', device, 'mtu', String(mtu), 'up']);
}

export interface TunnelInterfaceOptions {
  device: string;
  mtu: number;
  /** This node's pod CIDRs; the tunnel gets their gateway addresses. */
  localPodCidrs: readonly string[];
  runner?: CommandRunner;
}

/**
 * Prepares the tunnel interface for routing: MTU and up, then exactly the gateway addresses of the
 * local pod CIDRs (see {@link gatewayAddressesFor}). Safe to repeat; returns the address changes.
 */
export async function configureTunnelInterface(options: TunnelInterfaceOptions): Promise<ReconcileReport> {
  await setLinkMtuUp({ device: options.device, mtu: options.mtu, runner: options.runner });
  return reconcileAddresses({ device: options.device, addresses: gatewayAddressesFor(options.localPodCidrs), runner: options.runner });
}

/** Removes every route with our protocol from `device` (cleanup); other routes stay. */
export async function removeRoutes(options: { device: string; protocol?: number; runner?: CommandRunner }): Promise<RouteReport> {
  return reconcileRoutes({ device: options.device, cidrs: [], protocol: options.protocol, runner: options.runner });
}
