/**
 * A ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1) evaluated as the API server does,
 * for the policy in deploy/roamguard.yaml: its CEL runs here with an npm CEL implementation
 * (@marcbachmann/cel-js), so the unit tests check the expressions that are shipped, and the lab's
 * API server (kube-api-server.ts) enforces them on Node writes.
 *
 * What is modelled: matchConstraints.resourceRules (operations and resources), matchConditions
 * (all must be true, else the policy does not apply), variables (as `variables.<name>`),
 * validations (each must be true; the first false one's reason and message decide the answer),
 * failurePolicy Fail (an expression that errors or yields a non-bool denies). Not modelled:
 * params, namespace/object selectors, messageExpression, auditAnnotations, type checking.
 *
 * Tests only (its CEL library and yaml are devDependencies): the demo never imports it.
 */
import { readFileSync } from 'node:fs';
import { evaluate } from '@marcbachmann/cel-js';
import { parseAllDocuments } from 'yaml';

export interface UserInfo {
  username: string;
  uid?: string;
  groups?: string[];
  extra?: Record<string, string[]>;
}

export interface AdmissionRequest {
  operation: 'CREATE' | 'UPDATE' | 'DELETE' | 'CONNECT';
  /** e.g. 'nodes' or 'nodes/status'. */
  resource: string;
  name: string;
  userInfo: UserInfo;
  object: unknown;
  oldObject: unknown;
}

export type AdmissionDecision =
  | { matched: false }
  | { matched: true; allowed: true }
  | { matched: true; allowed: false; reason: 'Forbidden' | 'Invalid' | 'Unauthorized' | 'RequestEntityTooLarge'; message: string };

interface PolicySpec {
  failurePolicy?: 'Fail' | 'Ignore';
  matchConstraints?: { resourceRules?: Array<{ operations?: string[]; resources?: string[] }> };
  matchConditions?: Array<{ name: string; expression: string }>;
  variables?: Array<{ name: string; expression: string }>;
  validations: Array<{ expression: string; reason?: string; message?: string }>;
}

export interface ValidatingAdmissionPolicy {
  metadata: { name: string };
  spec: PolicySpec;
}

function ruleMatches(rules: NonNullable<PolicySpec['matchConstraints']>['resourceRules'], request: AdmissionRequest): boolean {
  return (rules ?? []).some((rule) =>
    (rule.operations ?? []).some((op) => op === '*' || op === request.operation)
    && (rule.resources ?? []).some((r) => r === '*' || r === request.resource));
}

/** The policy's answer for `request`; `bindingName` goes into the message as a real server's does. */
export function admit(policy: ValidatingAdmissionPolicy, request: AdmissionRequest, bindingName = policy.metadata.name): AdmissionDecision {
  const spec = policy.spec;
  if (!ruleMatches(spec.matchConstraints?.resourceRules, request)) return { matched: false };
  // Plain JSON copies: the expressions see data, never the server's live objects.
  const context: Record<string, unknown> = {
    request: JSON.parse(JSON.stringify({ operation: request.operation, name: request.name, resource: { resource: request.resource }, userInfo: request.userInfo })),
    object: request.object === undefined ? null : JSON.parse(JSON.stringify(request.object)),
    oldObject: request.oldObject === undefined ? null : JSON.parse(JSON.stringify(request.oldObject)),
  };
  const denied = (reason: string | undefined, message: string): AdmissionDecision => ({
    matched: true,
    allowed: false,
    reason: (reason ?? 'Invalid') as 'Invalid',
    message: `ValidatingAdmissionPolicy '${policy.metadata.name}' with binding '${bindingName}' denied request: ${message}`,
  });
  const fail = spec.failurePolicy !== 'Ignore';
  const run = (expression: string): boolean | Error => {
    try {
      const value = evaluate(expression, context);
      return typeof value === 'boolean' ? value : new Error(`expression returned ${typeof value}, not bool`);
    } catch (err) {
      return err as Error;
    }
  };
  for (const condition of spec.matchConditions ?? []) {
    const result = run(condition.expression);
    if (result instanceof Error) {
      if (fail) return denied('Forbidden', `matchCondition ${condition.name}: ${result.message}`);
      return { matched: false };
    }
    if (!result) return { matched: false };
  }
  const variables: Record<string, unknown> = {};
  context.variables = variables;
  for (const variable of spec.variables ?? []) {
    try {
      variables[variable.name] = evaluate(variable.expression, context);
    } catch (err) {
      if (fail) return denied('Invalid', `variable ${variable.name}: ${(err as Error).message}`);
      return { matched: true, allowed: true };
    }
  }
  for (const validation of spec.validations) {
    const result = run(validation.expression);
    if (result instanceof Error) {
      if (fail) return denied(validation.reason, `expression '${validation.expression}' resulted in error: ${result.message}`);
      continue;
    }
    if (!result) return denied(validation.reason, validation.message ?? `failed expression: ${validation.expression}`);
  }
  return { matched: true, allowed: true };
}

/** deploy/roamguard.yaml (or `manifestPath`): its ValidatingAdmissionPolicy and the binding's name. */
export function loadDeployPolicy(manifestPath = new URL('../deploy/roamguard.yaml', import.meta.url)): { policy: ValidatingAdmissionPolicy; bindingName: string } {
  const docs = parseAllDocuments(readFileSync(manifestPath, 'utf8')).map((d) => d.toJS() as { kind?: string; metadata?: { name: string }; spec?: { policyName?: string } } | null);
  const policy = docs.find((d) => d?.kind === 'ValidatingAdmissionPolicy') as unknown as ValidatingAdmissionPolicy | undefined;
  if (!policy) throw new Error(`${String(manifestPath)}: no ValidatingAdmissionPolicy`);
  const binding = docs.find((d) => d?.kind === 'ValidatingAdmissionPolicyBinding' && d.spec?.policyName === policy.metadata.name);
  if (!binding) throw new Error(`${String(manifestPath)}: no binding for policy ${policy.metadata.name}`);
  return { policy, bindingName: binding.metadata!.name };
}

/** An admission hook for the lab's API server that enforces deploy/roamguard.yaml's policy. */
export function deployPolicyAdmission(manifestPath?: URL): (request: AdmissionRequest) => AdmissionDecision {
  const { policy, bindingName } = loadDeployPolicy(manifestPath);
  return (request) => admit(policy, request, bindingName);
}
