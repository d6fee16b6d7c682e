/**
 * One parsed prefix and one parsed address per text across the agent. At 5 000 Nodes the agent
 * holds the same 30 000 prefixes in the Node facts, the desired mesh and its model of the data
 * plane; parsed separately, each is a small array of its own (about 180 bytes with its buffer),
 * 100 000 of them. Shared: never modify what these return.
 */
import { parseIp, parsePrefix, type Prefix } from '../../dataplane/net/ip.ts';
import type { SnapshotInterning } from '../../dataplane/uapi/uapi-protocol.ts';
import { TextCache } from './text-cache.ts';

const prefixes = new TextCache(parsePrefix);
const addresses = new TextCache(parseIp);

/** The prefix a text names (throws, like parsePrefix, on one that is not). */
export const parsedPrefix = (text: string): Prefix => prefixes.get(text);

/** The address a text names (throws, like parseIp, on one that is not). */
export const parsedAddress = (text: string): Uint8Array => addresses.get(text);

/** The preshared key of every peer without one (all zeros). */
export const NO_PRESHARED_KEY = new Uint8Array(32);

/** For the agent's control-socket reads: their allowed IPs become the prefixes above. */
export const snapshotInterning: SnapshotInterning = {
  prefix: (text, parsed) => prefixes.remember(text, parsed),
  zeroKey: NO_PRESHARED_KEY,
};
