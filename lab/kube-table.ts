/**
 * Server-side printing for the lab API server: kubectl asks for lists, objects and watch events
 * "as=Table" (meta.k8s.io) and prints the cells the server computed, so `kubectl get nodes`
 * shows STATUS, ROLES, AGE, VERSION (and with -o wide the addresses and node info) only if the
 * server fills them in. The columns and cell rules follow kube-apiserver's Node printer.
 */
import type { JsonObject, JsonValue, KubeNode } from './kube-api-server.ts';

export type TableGroupVersion = 'meta.k8s.io/v1' | 'meta.k8s.io/v1beta1';

/**
 * Which Table version an Accept header asks for, if any. kubectl sends, in order of preference,
 * `application/json;as=Table;v=v1;g=meta.k8s.io`, the v1beta1 one, then plain JSON.
 */
export function tableVersionAccepted(accept: string | undefined): TableGroupVersion | undefined {
  for (const range of (accept ?? '').split(',')) {
    const [type, ...params] = range.split(';').map((p) => p.trim());
    if (type !== 'application/json' && type !== '*/*') continue;
    const p = Object.fromEntries(params.map((kv) => kv.split('=').map((s) => s.trim()) as [string, string]));
    if (p.as === undefined) return undefined; // plain JSON preferred over the rest
    if (p.as === 'Table' && p.g === 'meta.k8s.io' && (p.v === 'v1' || p.v === 'v1beta1')) return `meta.k8s.io/${p.v}`;
  }
  return undefined;
}

const COLUMNS: Array<{ name: string; type: string; format: string; priority: number; description: string }> = [
  { name: 'Name', type: 'string', format: 'name', priority: 0, description: 'The node\'s name' },
  { name: 'Status', type: 'string', format: '', priority: 0, description: 'The Ready condition, and whether scheduling is disabled' },
  { name: 'Roles', type: 'string', format: '', priority: 0, description: 'The node-role.kubernetes.io/* labels' },
  { name: 'Age', type: 'string', format: '', priority: 0, description: 'Time since creation' },
  { name: 'Version', type: 'string', format: '', priority: 0, description: 'status.nodeInfo.kubeletVersion' },
  { name: 'Internal-IP', type: 'string', format: '', priority: 1, description: 'The first InternalIP address' },
  { name: 'External-IP', type: 'string', format: '', priority: 1, description: 'The first ExternalIP address' },
  { name: 'OS-Image', type: 'string', format: '', priority: 1, description: 'status.nodeInfo.osImage' },
  { name: 'Kernel-Version', type: 'string', format: '', priority: 1, description: 'status.nodeInfo.kernelVersion' },
  { name: 'Container-Runtime', type: 'string', format: '', priority: 1, description: 'status.nodeInfo.containerRuntimeVersion' },
];

/** kube-apiserver's short ages: 45s, 3m20s, 12m, 5h3m, 20h, 3d4h, 40d, 2y. */
export function humanAge(ms: number): string {
  const s = Math.floor(ms / 1000);
  if (s < 0) return '<invalid>';
  if (s < 120) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 10) return s % 60 === 0 ? `${m}m` : `${m}m${s % 60}s`;
  if (m < 180) return `${m}m`;
  const h = Math.floor(m / 60);
  if (h < 8) return m % 60 === 0 ? `${h}h` : `${h}h${m % 60}m`;
  if (h < 48) return `${h}h`;
  const d = Math.floor(h / 24);
  if (d < 8) return h % 24 === 0 ? `${d}d` : `${d}d${h % 24}h`;
  if (d < 730) return `${d}d`;
  return `${Math.floor(d / 365)}y`;
}

function record(value: JsonValue | undefined): JsonObject {
  return typeof value === 'object' && value !== null && !Array.isArray(value) ? value : {};
}

function text(value: JsonValue | undefined, otherwise: string): string {
  return typeof value === 'string' && value !== '' ? value : otherwise;
}

/** One Node's cells, in COLUMNS order. */
export function nodeCells(node: KubeNode, nowMs: number): string[] {
  const status = record(node.status);
  const conditions = Array.isArray(status.conditions) ? status.conditions.map(record) : [];
  const ready = conditions.find((c) => c.type === 'Ready');
  const states = [ready === undefined ? 'Unknown' : ready.status === 'True' ? 'Ready' : 'NotReady'];
  if (record(node.spec).unschedulable === true) states.push('SchedulingDisabled');
  const roles = new Set<string>();
  for (const [key, value] of Object.entries(node.metadata.labels ?? {})) {
    if (key.startsWith('node-role.kubernetes.io/') && key.length > 'node-role.kubernetes.io/'.length) roles.add(key.slice('node-role.kubernetes.io/'.length));
    else if (key === 'kubernetes.io/role' && value !== '') roles.add(value);
  }
  const addresses = Array.isArray(status.addresses) ? status.addresses.map(record) : [];
  const address = (type: string) => text(addresses.find((a) => a.type === type)?.address, '<none>');
  const info = record(status.nodeInfo);
  const created = Date.parse(node.metadata.creationTimestamp);
  return [
    node.metadata.name,
    states.join(','),
    roles.size === 0 ? '<none>' : [...roles].sort().join(','),
    Number.isFinite(created) ? humanAge(nowMs - created) : '<unknown>',
    text(info.kubeletVersion, ''),
    address('InternalIP'),
    address('ExternalIP'),
    text(info.osImage, '<unknown>'),
    text(info.kernelVersion, '<unknown>'),
    text(info.containerRuntimeVersion, '<unknown>'),
  ];
}

export type IncludeObject = 'None' | 'Metadata' | 'Object';

/** The `includeObject` query parameter (default Metadata, as kube-apiserver's). */
export function parseIncludeObject(value: string | null): IncludeObject {
  if (value === null || value === '' || value === 'Metadata') return 'Metadata';
  if (value === 'None' || value === 'Object') return value;
  throw new Error(`includeObject: unsupported value ${JSON.stringify(value)} (None, Metadata or Object)`);
}

/** A meta.k8s.io Table of `nodes`, as kube-apiserver answers a list, a get or one watch event. */
export function nodeTable(nodes: readonly KubeNode[], options: { version: TableGroupVersion; resourceVersion?: string; include: IncludeObject; nowMs?: number }): JsonObject {
  const now = options.nowMs ?? Date.now();
  const rows = nodes.map((node) => {
    const row: JsonObject = { cells: nodeCells(node, now) };
    if (options.include === 'Object') row.object = structuredClone(node) as unknown as JsonObject;
    else if (options.include === 'Metadata') {
      row.object = { kind: 'PartialObjectMetadata', apiVersion: options.version, metadata: structuredClone(node.metadata) as unknown as JsonObject };
    }
    return row;
  });
  return {
    kind: 'Table',
    apiVersion: options.version,
    metadata: options.resourceVersion === undefined ? {} : { resourceVersion: options.resourceVersion },
    columnDefinitions: COLUMNS as unknown as JsonValue[],
    rows,
  };
}
