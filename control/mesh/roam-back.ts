/**
 * When the agent takes back a roam of its data plane (pure).
 *
 * WireGuard moves a peer's endpoint to wherever the peer's last authenticated packet came from,
 * and reconcile keeps that: it is how a NAT'd peer's new mapping is followed. For a peer whose
 * endpoint the cluster states (an operator's force-endpoint, the address it publishes, its LAN
 * address), two kinds of roam are taken back, the stated endpoint written again and sent a
 * packet at once:
 *
 * - **A roam into the other address family.** Both ends follow each other: if a packet of the
 *   old family is in flight when one end is moved to the new one (the agent's write crossing the
 *   peer's ping), each end roams the other back, and the pair can settle on the old family for
 *   good, each end keeping what it learned (and stay there after that family's path dies, as
 *   IPv6 does when a router restarts without its address). The family is the cluster's choice
 *   (`WG_IP_FAMILY`, IPv4 first with dualstack, or a force-endpoint's), so a roam across it is a
 *   race to undo, not a move to follow. One exception: a node whose own force-endpoint names a
 *   family is reached in that family by every peer that obeys it, and answers there; taking
 *   those roams back would have the two ends undo each other for ever.
 * - **A roam whose session stopped** (the peer sent nothing within the liveness window, after a
 *   handshake). The roamed-to path died, as a peer's address does when it is removed; WireGuard
 *   would retry it for ever, and only the stated endpoint is known to lead to the peer. Only
 *   judged when there is a liveness window (persistent keepalive on: a quiet session without it
 *   says nothing about its path). A peer that never completed a handshake is left alone: an
 *   endpoint carried over from a rotated key (replaced-peer.ts) has not had its chance yet.
 *
 * A roam within the family of a working session is kept: that is NAT rebinding, or a peer
 * answering from a new address of its own.
 */
import type { Endpoint } from '../../dataplane/net/endpoint.ts';
import { STATED_SOURCES, type EndpointSource } from './desired-peers.ts';

export type RoamTakenBack = 'other-family' | 'stopped';

export interface RoamFacts {
  /** Where the desired peer says to reach it, and why. */
  wanted: Endpoint;
  source: EndpointSource | undefined;
  /** Where the data plane has it now (a roam when it differs from `wanted`). */
  current: Endpoint;
  /** The session received something within the liveness window; undefined when there is none. */
  live: boolean | undefined;
  /** The peer completed a handshake at some point. */
  everHandshook: boolean;
  /** The family of this node's own force-endpoint, when it has one. */
  ownForcedFamily?: 4 | 6;
}

/** Why the roam is taken back, or undefined when it is kept. */
export function roamToTakeBack(facts: RoamFacts): RoamTakenBack | undefined {
  if (!STATED_SOURCES.has(facts.source) || facts.current.equals(facts.wanted)) return undefined;
  const family = facts.current.family;
  if (family !== facts.wanted.family && family !== facts.ownForcedFamily) return 'other-family';
  if (facts.live === false && facts.everHandshook) return 'stopped';
  return undefined;
}
