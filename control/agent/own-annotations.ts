/**
 * This node's own `roamguard.io/*` annotations: what the agent publishes, and what changed when
 * someone else wrote them (pure).
 *
 * Whoever holds a token that may patch this Node (a stolen service-account token) can rewrite
 * them: a different `public-key` makes every peer encrypt to the thief, `pod-cidrs` moves pod
 * traffic. The agent owns every annotation it publishes, so it compares them with what it last
 * wrote on every pass and puts back each one that differs, with a WARN naming the field.
 *
 * `force-endpoint` is the operator's (a port forward on a NAT router), so the agent never writes
 * it; a change is still reported (`forceEndpointChange`), because a stolen token can redirect
 * everyone's traffic for this node with it — what the agent cannot undo, it makes visible.
 */
import { Endpoint } from '../../dataplane/net/endpoint.ts';
import { ANNOTATION, formatOwnAnnotations, type NodeObject } from '../mesh/annotations.ts';
import { nodeFacts } from '../mesh/desired-peers.ts';

/** Annotation name → value; null = the annotation must be absent. */
export type AnnotationPatch = Record<string, string | null>;

export interface OwnFacts {
  publicKey: string;
  listenPort: number;
  podCidrs: readonly string[];
  nodeIps: readonly string[];
  /** A firewall-only node is no peer: it publishes no key. */
  firewallOnly: boolean;
}

/** The annotations this node publishes about itself (a merge patch of exactly these keys). */
export function ownAnnotations(facts: OwnFacts): AnnotationPatch {
  const out: AnnotationPatch = formatOwnAnnotations(facts);
  if (facts.firewallOnly) out[ANNOTATION.publicKey] = null;
  return out;
}

export interface AnnotationDrift {
  field: string;
  /** What the agent wrote (null: absent). */
  expected: string | null;
  /** What the Node carries now (null: absent). */
  found: string | null;
}

/** The fields of `wanted` that `current` does not carry as written. */
export function annotationDrift(wanted: AnnotationPatch, current: Readonly<Record<string, string>> | null | undefined): AnnotationDrift[] {
  const drift: AnnotationDrift[] = [];
  for (const [field, expected] of Object.entries(wanted)) {
    const found = current?.[field] ?? null;
    if (found !== expected) drift.push({ field, expected, found });
  }
  return drift;
}

/** The patch that restores the drifted fields. */
export function restorePatch(drift: readonly AnnotationDrift[]): AnnotationPatch {
  return Object.fromEntries(drift.map((d) => [d.field, d.expected]));
}

/**
 * A change of this Node's `force-endpoint` since the last look (`previous` undefined: first
 * look, nothing to compare with). Never restored: the value is the operator's.
 */
export function forceEndpointChange(previous: string | null | undefined, current: Readonly<Record<string, string>> | null | undefined): { from: string | null; to: string | null } | undefined {
  const now = current?.[ANNOTATION.forceEndpoint] ?? null;
  if (previous === undefined || previous === now) return undefined;
  return { from: previous, to: now };
}

/**
 * The address family of this Node's force-endpoint, when it has a usable one: peers that obey it
 * reach this node in that family, so roams into it are kept (control/mesh/roam-back.ts). A
 * malformed one is no family: peers reject this Node for it anyway.
 */
export function ownForcedFamily(own: NodeObject | undefined): 4 | 6 | undefined {
  if (!own) return undefined;
  const parsed = nodeFacts(own).annotations;
  const forced = parsed.ok ? parsed.value.forceEndpoint : undefined;
  return forced === undefined ? undefined : Endpoint.parse(forced).family;
}
