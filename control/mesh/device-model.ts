/**
 * What the data plane holds after a `set`, worked out without asking it: the last `get=1`
 * snapshot with the requests sent since applied the way a WireGuard device applies them. The
 * agent plans a Node change against this model instead of reading every peer back (at 5 000
 * peers a `get=1` is 2 MB and takes the data plane a large fraction of a second); it still reads
 * the device on every full pass and every discovery interval, which also catches what the model
 * cannot know (roaming endpoints, handshakes, a restarted data plane).
 *
 * Semantics followed (wireguard-go's and the kernel's): `replace_peers` drops every peer;
 * `remove` drops one; `update_only` never creates a peer; a new peer starts with no endpoint, no
 * handshake and no allowed IPs; `replace_allowed_ips` clears the peer's prefixes before the
 * section's own apply in order; an allowed IP given to one peer leaves any other peer that held it.
 */
import { formatPrefix, type Prefix } from '../../dataplane/net/ip.ts';
import type { DeviceSnapshot, PeerSnapshot, SetRequest } from '../../dataplane/uapi/uapi-protocol.ts';
import { NO_PRESHARED_KEY } from './interned.ts';
import { keyText } from './key-text.ts';


/**
 * Prefix text → key of the peer holding it, per model snapshot: built once from a `get=1` (20 000
 * prefixes at 5 000 peers), then handed from each snapshot to the one a `set` makes of it, so a
 * Node change does not format every prefix again. A snapshot gives its index away when applied:
 * applying to it a second time builds a fresh one.
 */
const ownerIndexes = new WeakMap<DeviceSnapshot, Map<string, string>>();

/** `snapshot` with `request` applied (a new object; the input is left as it was). Peers keep their order, new ones at the end. */
export function applySetToSnapshot(snapshot: DeviceSnapshot, request: SetRequest): DeviceSnapshot {
  const peers = new Map<string, PeerSnapshot>();
  if (!request.replacePeers) for (const p of snapshot.peers) peers.set(keyText(p.publicKey), p);
  /** Prefix text → key of the peer holding it; taken over from the snapshot, or built on the first allowed IP added. */
  let owners: Map<string, string> | undefined = request.replacePeers ? undefined : ownerIndexes.get(snapshot);
  ownerIndexes.delete(snapshot);
  const ownerIndex = () => {
    if (!owners) {
      owners = new Map();
      for (const [key, p] of peers) for (const prefix of p.allowedIps) owners.set(formatPrefix(prefix), key);
    }
    return owners;
  };
  /** Peers copied in this call (so the input snapshot's peers are never changed). */
  const copied = new Set<string>();
  const writable = (key: string): PeerSnapshot => {
    const p = peers.get(key)!;
    if (copied.has(key)) return p;
    const copy = { ...p, allowedIps: [...p.allowedIps] };
    peers.set(key, copy);
    copied.add(key);
    return copy;
  };
  const dropPrefixes = (key: string, drop: (prefix: Prefix, text: string) => boolean) => {
    const p = writable(key);
    p.allowedIps = p.allowedIps.filter((prefix) => {
      const text = formatPrefix(prefix);
      if (!drop(prefix, text)) return true;
      if (owners?.get(text) === key) owners.delete(text);
      return false;
    });
  };

  for (const change of request.peers) {
    const key = keyText(change.publicKey);
    if (change.remove) {
      const gone = peers.get(key);
      if (gone && owners) for (const prefix of gone.allowedIps) if (owners.get(formatPrefix(prefix)) === key) owners.delete(formatPrefix(prefix));
      peers.delete(key);
      continue;
    }
    if (!peers.has(key)) {
      if (change.updateOnly) continue;
      peers.set(key, {
        publicKey: change.publicKey, presharedKey: NO_PRESHARED_KEY, lastHandshakeWallMs: 0, txBytes: 0, rxBytes: 0,
        persistentKeepalive: 0, allowedIps: [],
      });
      copied.add(key);
    }
    const p = writable(key);
    if (change.presharedKey !== undefined) p.presharedKey = change.presharedKey;
    if (change.endpoint !== undefined) p.endpoint = change.endpoint;
    if (change.persistentKeepalive !== undefined) p.persistentKeepalive = change.persistentKeepalive;
    if (change.replaceAllowedIps) dropPrefixes(key, () => true);
    for (const ip of change.allowedIps) {
      const text = formatPrefix(ip.prefix);
      if (ip.remove) {
        dropPrefixes(key, (_, t) => t === text);
        continue;
      }
      const index = ownerIndex();
      const holder = index.get(text);
      if (holder === key) continue;
      if (holder !== undefined && peers.has(holder)) dropPrefixes(holder, (_, t) => t === text);
      writable(key).allowedIps.push(ip.prefix);
      index.set(text, key);
    }
  }
  const out: DeviceSnapshot = { ...snapshot, peers: [...peers.values()] };
  if (owners) ownerIndexes.set(out, owners);
  if (request.privateKey !== undefined) out.privateKey = request.privateKey;
  if (request.listenPort !== undefined) out.listenPort = request.listenPort;
  if (request.fwmark !== undefined) out.fwmark = request.fwmark;
  return out;
}
