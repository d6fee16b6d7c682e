/**
 * The cross-platform userspace control protocol ("UAPI") that `wg` speaks over
 * /var/run/wireguard/IFNAME.sock: pure text in, structures out, no I/O.
 *
 * - `parseSetRequest` turns the body of a `set=1` operation (lines of `key=value`, ending at the
 *   first empty line) into a fully validated {@link SetRequest}, or an error carrying the errno
 *   to answer with. Nothing is applied here: a request that fails validation anywhere can be
 *   rejected as a whole (wireguard-go applies the lines before a bad one; we apply none).
 * - `formatGetResponse` writes the answer to `get=1` from a {@link DeviceSnapshot}, in the
 *   order `wg` reads it, ending with `errno=0` and an empty line.
 * - `formatSetRequest` / `parseGetResponse` are the client side of the same protocol (used by the
 *   tests, and by anything in this project that drives a device through its socket).
 *
 * Errno values are negative, as wireguard-go sends them: `wg set` reads `errno=` as a signed
 * number and reports `strerror(-errno)`; `wg show` reads it unsigned, so a get answers 0.
 */
import { Endpoint } from '../net/endpoint.ts';
import { formatPrefix, parsePrefix, type Prefix } from '../net/ip.ts';
import { KEY_LENGTH, isZeroKey, keyFromHex, keyToHex } from '../noise/keys.ts';

/** Errno values sent in `errno=` lines (negative, like wireguard-go). */
export const UAPI_ERRNO = {
  /** Reading the request failed (connection closed in the middle of a request). */
  EIO: -5,
  /** A line without `=`. */
  EPROTO: -71,
  /** A bad key or value: unknown key, malformed hex/number/address, boolean other than `true`… */
  EINVAL: -22,
  /** The listen port could not be bound. */
  EADDRINUSE: -98,
  /** A request over the size limits (line, request or peer count). Not used by wireguard-go. */
  EMSGSIZE: -90,
  /** Any other failure (wireguard-go's "unknown" error, ENOBUFS). */
  UNKNOWN: -55,
} as const;

/** One `allowed_ip=` line: add the prefix to the peer, or (with a leading `-`) remove it. */
export interface AllowedIpChange {
  prefix: Prefix;
  remove: boolean;
}

/** One peer section of a `set`, starting at its `public_key=` line. */
export interface PeerChange {
  publicKey: Uint8Array;
  /** `remove=true`: delete the peer; every other key of the section is validated and ignored. */
  remove: boolean;
  /** `update_only=true`: change the peer only if it exists; never create it. */
  updateOnly: boolean;
  /** 32 bytes; all zeros means "no preshared key". */
  presharedKey?: Uint8Array;
  endpoint?: Endpoint;
  /** Seconds, 0..65535; 0 disables. */
  persistentKeepalive?: number;
  /** `replace_allowed_ips=true`: clear the peer's prefixes before applying `allowedIps`. */
  replaceAllowedIps: boolean;
  /** In request order; applied after the optional clearing. */
  allowedIps: AllowedIpChange[];
}

/** A validated `set` request. Fields that were not in the request are absent. */
export interface SetRequest {
  /** 32 bytes; all zeros clears the private key. */
  privateKey?: Uint8Array;
  listenPort?: number;
  /** 0 disables. */
  fwmark?: number;
  /** `replace_peers=true`: remove every existing peer before applying `peers`. */
  replacePeers: boolean;
  /** In request order (a key may appear in several sections; they apply in turn). */
  peers: PeerChange[];
}

export type SetParseResult =
  | { ok: true; request: SetRequest; consumedLines: number }
  | { ok: false; errno: number; message: string; consumedLines: number };

export interface SetParseOptions {
  /** Peer sections allowed in one request; more → EMSGSIZE. Default 65536. */
  maxPeers?: number;
}

export const DEFAULT_MAX_PEERS_PER_REQUEST = 65536;

/** One peer as `get` reports it. */
export interface PeerSnapshot {
  publicKey: Uint8Array;
  /** All zeros when there is none. */
  presharedKey: Uint8Array;
  endpoint?: Endpoint;
  /** Wall-clock ms since the Unix epoch of the last completed handshake; 0 = never. */
  lastHandshakeWallMs: number;
  txBytes: number;
  rxBytes: number;
  /** Seconds; 0 = off. */
  persistentKeepalive: number;
  /** In the peer's entry order. */
  allowedIps: Prefix[];
}

/** The device as `get` reports it. */
export interface DeviceSnapshot {
  /** Undefined (or all zeros) when the device has no private key. */
  privateKey?: Uint8Array;
  /** 0 = not listening / unknown (omitted from the answer). */
  listenPort: number;
  /** 0 = off (omitted from the answer). */
  fwmark: number;
  peers: PeerSnapshot[];
}

const ZERO_KEY = new Uint8Array(KEY_LENGTH);

class UapiParseError extends Error {
  constructor(readonly errno: number, message: string) {
    super(message);
  }
}

function invalid(message: string): never {
  throw new UapiParseError(UAPI_ERRNO.EINVAL, message);
}

// --- what error messages may quote --------------------------------------------------------------
// Messages end up in the daemon's log, and a control-socket line may carry a key (a private or
// preshared key pasted into the wrong field, a key line sent without `set=1`). So no message
// quotes a value that could hold part of one: a key is 64 hex digits (or 44 base64 characters
// where a user copied `wg genkey` output), so any run of 8 or more characters of those alphabets
// is withheld, and only the length is said. Addresses, ports and words still show, which is
// what a user needs to find the mistake.

/** Eight or more characters in a row that a hex or base64 key could contain. */
const KEY_LIKE_RUN = /[A-Za-z0-9+/_=-]{8,}/;
/** What a UAPI key name looks like (all of them are lowercase words joined by '_'). */
const KEY_NAME = /^[a-z][a-z_]{0,39}$/;

/** `value` in quotes when it cannot hold part of a key, else only its length. */
export function quoteValue(value: string): string {
  const text = value.slice(0, 80);
  return KEY_LIKE_RUN.test(text) ? `a value of ${value.length} characters (not shown)` : JSON.stringify(text);
}

/** A key name in quotes when it looks like one, else only its length (it could be a secret). */
export function quoteKeyName(key: string): string {
  return KEY_NAME.test(key) ? JSON.stringify(key) : `of ${key.length} characters (not shown)`;
}

/**
 * How a control-socket line is named in a log: its key name (when it looks like one), never its
 * value; a line without '=' only by its length.
 */
export function describeLine(line: string): string {
  const eq = line.indexOf('=');
  if (eq < 0) return `a line of ${line.length} characters without "=" (not shown)`;
  return `a line with key ${quoteKeyName(line.slice(0, eq))} (value not shown)`;
}

/** A strict unsigned decimal (digits only, no sign, no spaces) no larger than `max`. */
function parseUnsigned(key: string, value: string, max: number): number {
  // Leading zeros are fine (as with Go's ParseUint); the length bound only keeps Number() exact.
  if (!/^[0-9]{1,32}$/.test(value)) invalid(`${key}: not an unsigned decimal number: ${quoteValue(value)}`);
  const n = Number(value);
  if (n > max) invalid(`${key}: ${quoteValue(value)} is larger than ${max}`);
  return n;
}

function parseKey(key: string, value: string): Uint8Array {
  try {
    return keyFromHex(value);
  } catch {
    // Never echo the value: it may be (most of) a private key, and messages end up in logs.
    return invalid(`${key}: not a 32-byte key in hex (64 hex digits; got ${value.length} characters)`);
  }
}

function parseTrue(key: string, value: string): true {
  if (value !== 'true') invalid(`${key}: the only accepted value is "true", got ${quoteValue(value)}`);
  return true;
}

function parseAllowedIp(value: string): AllowedIpChange {
  const remove = value.startsWith('-');
  const text = remove ? value.slice(1) : value;
  // Like wireguard-go (netip.ParsePrefix), the prefix length is required.
  if (!text.includes('/')) invalid(`allowed_ip: missing prefix length in ${quoteValue(value)}`);
  try {
    return { prefix: parsePrefix(text), remove };
  } catch (err) {
    // The parser's message quotes its input: only passed on when the input may be quoted.
    return invalid(`allowed_ip: ${KEY_LIKE_RUN.test(value) ? `not a prefix: ${quoteValue(value)}` : (err as Error).message}`);
  }
}

function parseEndpoint(value: string): Endpoint {
  try {
    return Endpoint.parse(value);
  } catch (err) {
    return invalid(`endpoint: ${KEY_LIKE_RUN.test(value) ? `not ip:port nor [ipv6]:port: ${quoteValue(value)}` : (err as Error).message}`);
  }
}

function newPeerChange(publicKey: Uint8Array): PeerChange {
  return { publicKey, remove: false, updateOnly: false, replaceAllowedIps: false, allowedIps: [] };
}

function applyPeerLine(peer: PeerChange, key: string, value: string): void {
  switch (key) {
    case 'update_only':
      peer.updateOnly = parseTrue(key, value);
      return;
    case 'remove':
      peer.remove = parseTrue(key, value);
      return;
    case 'preshared_key':
      peer.presharedKey = parseKey(key, value);
      return;
    case 'endpoint':
      peer.endpoint = parseEndpoint(value);
      return;
    case 'persistent_keepalive_interval':
      peer.persistentKeepalive = parseUnsigned(key, value, 65535);
      return;
    case 'replace_allowed_ips':
      parseTrue(key, value);
      // Clearing happens first when the request is applied. Prefixes this section added before
      // the clearing still took them away from their previous owners, so they become "add, then
      // remove" (the net effect of the lines in order); removals before it are moot.
      peer.allowedIps = peer.allowedIps.flatMap((change) =>
        change.remove ? [] : [change, { prefix: change.prefix, remove: true }]);
      peer.replaceAllowedIps = true;
      return;
    case 'allowed_ip':
      peer.allowedIps.push(parseAllowedIp(value));
      return;
    case 'protocol_version':
      if (value !== '1') invalid(`protocol_version: only version 1 exists, got ${quoteValue(value)}`);
      return;
    default:
      invalid(`unknown peer key ${quoteKeyName(key)}`);
  }
}

/** Splits protocol text into lines (on `\n`); a final `\n` does not start another line. */
export function splitLines(text: string): string[] {
  const lines = text.split('\n');
  if (lines.length > 0 && lines[lines.length - 1] === '' && text.endsWith('\n')) lines.pop();
  return lines;
}

/**
 * Parses the body of a `set=1` operation: the lines after `set=1`, without their `\n`. The body
 * ends at the first empty line (so a leading empty line makes an empty request, as in every
 * implementation) or at the end of `body`; `consumedLines` counts what was read, including the
 * terminating empty line. A string is split on `\n` first.
 */
export function parseSetRequest(body: string | readonly string[], options: SetParseOptions = {}): SetParseResult {
  const lines = typeof body === 'string' ? splitLines(body) : body;
  const maxPeers = options.maxPeers ?? DEFAULT_MAX_PEERS_PER_REQUEST;
  const request: SetRequest = { replacePeers: false, peers: [] };
  let peer: PeerChange | undefined;
  let index = 0;
  try {
    for (; index < lines.length; index++) {
      const line = lines[index];
      if (line === '') {
        index++;
        break;
      }
      const eq = line.indexOf('=');
      // The line is not quoted in the message: it could hold a key.
      if (eq < 0) throw new UapiParseError(UAPI_ERRNO.EPROTO, `line ${index + 1} has no "="`);
      const key = line.slice(0, eq);
      const value = line.slice(eq + 1);
      if (key === 'public_key') {
        if (request.peers.length >= maxPeers) {
          throw new UapiParseError(UAPI_ERRNO.EMSGSIZE, `more than ${maxPeers} peers in one request`);
        }
        peer = newPeerChange(parseKey(key, value));
        request.peers.push(peer);
        continue;
      }
      if (peer) {
        applyPeerLine(peer, key, value);
        continue;
      }
      switch (key) {
        case 'private_key':
          request.privateKey = parseKey(key, value);
          break;
        case 'listen_port':
          request.listenPort = parseUnsigned(key, value, 65535);
          break;
        case 'fwmark':
          request.fwmark = parseUnsigned(key, value, 0xffffffff);
          break;
        case 'replace_peers':
          request.replacePeers = parseTrue(key, value);
          break;
        default:
          invalid(`unknown device key ${quoteKeyName(key)}`);
      }
    }
  } catch (err) {
    if (!(err instanceof UapiParseError)) throw err;
    const where = err.errno === UAPI_ERRNO.EPROTO ? '' : `line ${index + 1}: `;
    return { ok: false, errno: err.errno, message: `${where}${err.message}`, consumedLines: index + 1 };
  }
  return { ok: true, request, consumedLines: index };
}

function unixTime(wallMs: number): { sec: number; nsec: number } {
  if (!(wallMs > 0) || !Number.isFinite(wallMs)) return { sec: 0, nsec: 0 };
  const sec = Math.floor(wallMs / 1000);
  // A double holding epoch milliseconds resolves about 0.2 µs: report whole microseconds.
  const nsec = Math.min(999_999, Math.max(0, Math.round((wallMs - sec * 1000) * 1000))) * 1000;
  return { sec, nsec };
}

/** A non-negative integer counter as decimal digits (never exponent notation). */
function counter(n: number): string {
  if (!(n > 0) || !Number.isFinite(n)) return '0';
  return BigInt(Math.floor(n)).toString();
}

/**
 * The complete answer to `get=1`: device lines, one block per peer, `errno=0` and an empty line.
 * `private_key`, `listen_port` and `fwmark` are left out when unset or zero.
 */
export function formatGetResponse(snapshot: DeviceSnapshot): string {
  const out: string[] = [];
  if (snapshot.privateKey && !isZeroKey(snapshot.privateKey)) out.push(`private_key=${keyToHex(snapshot.privateKey)}`);
  if (snapshot.listenPort > 0) out.push(`listen_port=${snapshot.listenPort}`);
  if (snapshot.fwmark > 0) out.push(`fwmark=${snapshot.fwmark >>> 0}`);
  for (const peer of snapshot.peers) {
    const handshake = unixTime(peer.lastHandshakeWallMs);
    out.push(`public_key=${keyToHex(peer.publicKey)}`);
    out.push(`preshared_key=${keyToHex(peer.presharedKey.length === KEY_LENGTH ? peer.presharedKey : ZERO_KEY)}`);
    out.push('protocol_version=1');
    if (peer.endpoint) out.push(`endpoint=${peer.endpoint.toString()}`);
    out.push(`last_handshake_time_sec=${handshake.sec}`);
    out.push(`last_handshake_time_nsec=${handshake.nsec}`);
    out.push(`tx_bytes=${counter(peer.txBytes)}`);
    out.push(`rx_bytes=${counter(peer.rxBytes)}`);
    out.push(`persistent_keepalive_interval=${peer.persistentKeepalive}`);
    for (const prefix of peer.allowedIps) out.push(`allowed_ip=${formatPrefix(prefix)}`);
  }
  out.push('errno=0', '', '');
  return out.join('\n');
}

/** The response to an operation that failed (or a `set` that succeeded, with errno 0). */
export function formatErrno(errno: number): string {
  return `errno=${Math.trunc(errno)}\n\n`;
}

// ---------------------------------------------------------------------------------------------
// client side

/** The complete `set=1` operation for `request`, ending with the empty line. */
export function formatSetRequest(request: SetRequest): string {
  const out = ['set=1'];
  if (request.privateKey) out.push(`private_key=${keyToHex(request.privateKey)}`);
  if (request.listenPort !== undefined) out.push(`listen_port=${request.listenPort}`);
  if (request.fwmark !== undefined) out.push(`fwmark=${request.fwmark}`);
  if (request.replacePeers) out.push('replace_peers=true');
  for (const peer of request.peers) {
    out.push(`public_key=${keyToHex(peer.publicKey)}`);
    if (peer.remove) {
      out.push('remove=true');
      continue;
    }
    if (peer.updateOnly) out.push('update_only=true');
    if (peer.presharedKey) out.push(`preshared_key=${keyToHex(peer.presharedKey)}`);
    if (peer.endpoint) out.push(`endpoint=${peer.endpoint.toString()}`);
    if (peer.persistentKeepalive !== undefined) out.push(`persistent_keepalive_interval=${peer.persistentKeepalive}`);
    if (peer.replaceAllowedIps) out.push('replace_allowed_ips=true');
    for (const change of peer.allowedIps) out.push(`allowed_ip=${change.remove ? '-' : ''}${formatPrefix(change.prefix)}`);
  }
  out.push('', '');
  return out.join('\n');
}

export type GetParseResult =
  | { ok: true; snapshot: DeviceSnapshot }
  | { ok: false; errno: number; message: string };

/**
 * What a reader that keeps snapshots of many peers may share between them (the agent at 5 000
 * peers keeps one as its model of the data plane): each allowed IP and preshared key is otherwise
 * a small array of its own, about 180 bytes. What it returns is shared: never modify it.
 */
export interface SnapshotInterning {
  /** The prefix to keep for an `allowed_ip` text (`parsed` is the text, parsed and checked). */
  prefix(text: string, parsed: Prefix): Prefix;
  /** All zeros: the preshared key of every peer without one. */
  zeroKey: Uint8Array;
}

const ZERO_KEY_HEX = '0'.repeat(2 * KEY_LENGTH);

/**
 * Parses a `get` answer (up to and including `errno=`). Unknown keys are ignored, as `wg` does.
 * A non-zero errno, a missing errno line or a malformed value is an error.
 */
export function parseGetResponse(text: string, interning?: SnapshotInterning): GetParseResult {
  const snapshot: DeviceSnapshot = { listenPort: 0, fwmark: 0, peers: [] };
  let peer: PeerSnapshot | undefined;
  let handshakeSec = 0;
  const finishPeer = () => {
    if (peer) peer.lastHandshakeWallMs += handshakeSec * 1000;
    handshakeSec = 0;
  };
  try {
    for (const line of splitLines(text)) {
      if (line === '') throw new UapiParseError(UAPI_ERRNO.EPROTO, 'empty line before errno');
      const eq = line.indexOf('=');
      if (eq < 0) throw new UapiParseError(UAPI_ERRNO.EPROTO, 'line without "="');
      const key = line.slice(0, eq);
      const value = line.slice(eq + 1);
      if (key === 'errno') {
        finishPeer();
        if (!/^-?[0-9]{1,10}$/.test(value)) invalid(`errno: not a number: ${quoteValue(value)}`);
        const errno = Number(value);
        return errno === 0 ? { ok: true, snapshot } : { ok: false, errno, message: `the device answered errno=${errno}` };
      }
      if (key === 'public_key') {
        finishPeer();
        peer = {
          publicKey: parseKey(key, value), presharedKey: interning?.zeroKey ?? new Uint8Array(KEY_LENGTH), lastHandshakeWallMs: 0,
          txBytes: 0, rxBytes: 0, persistentKeepalive: 0, allowedIps: [],
        };
        snapshot.peers.push(peer);
        continue;
      }
      if (!peer) {
        if (key === 'private_key') snapshot.privateKey = parseKey(key, value);
        else if (key === 'listen_port') snapshot.listenPort = parseUnsigned(key, value, 65535);
        else if (key === 'fwmark') snapshot.fwmark = parseUnsigned(key, value, 0xffffffff);
        continue;
      }
      switch (key) {
        case 'preshared_key': peer.presharedKey = interning && value === ZERO_KEY_HEX ? interning.zeroKey : parseKey(key, value); break;
        case 'endpoint': peer.endpoint = parseEndpoint(value); break;
        case 'last_handshake_time_sec': handshakeSec = parseUnsigned(key, value, Number.MAX_SAFE_INTEGER); break;
        case 'last_handshake_time_nsec': peer.lastHandshakeWallMs = parseUnsigned(key, value, 999_999_999) / 1e6; break;
        case 'tx_bytes': peer.txBytes = parseUnsigned(key, value, Number.MAX_SAFE_INTEGER); break;
        case 'rx_bytes': peer.rxBytes = parseUnsigned(key, value, Number.MAX_SAFE_INTEGER); break;
        case 'persistent_keepalive_interval': peer.persistentKeepalive = parseUnsigned(key, value, 65535); break;
        case 'allowed_ip': {
          const change = parseAllowedIp(value);
          if (change.remove) invalid('allowed_ip: a get answer does not remove prefixes');
          peer.allowedIps.push(interning ? interning.prefix(value, change.prefix) : change.prefix);
          break;
        }
        default: break; // protocol_version and unknown keys
      }
    }
  } catch (err) {
    if (!(err instanceof UapiParseError)) throw err;
    return { ok: false, errno: err.errno, message: err.message };
  }
  return { ok: false, errno: UAPI_ERRNO.EPROTO, message: 'the answer ended without an errno line' };
}
