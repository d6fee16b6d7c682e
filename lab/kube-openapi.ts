/**
 * The sliver of OpenAPI v3 the lab API server publishes. kubectl create/apply validate a file
 * before sending it: they look up, in /openapi/v3/api/v1, whether the Node PATCH operation takes
 * the `fieldValidation` query parameter. If it does, kubectl leaves validation to the server
 * (which then rejects unknown fields, see kube-api-server.ts); if the document is missing,
 * kubectl tries to validate on its own side and fails with "failed to download openapi".
 */
import type { JsonObject } from './kube-api-server.ts';

export const OPENAPI_V3_ROOT = '/openapi/v3';
export const OPENAPI_V3_PATH = '/openapi/v3/api/v1';

const NODE_GVK = { group: '', version: 'v1', kind: 'Node' };

/** The core/v1 group's document: the Node operations and a Node schema, nothing else. */
export function openApiV3CoreV1(): JsonObject {
  const query = (name: string, description: string) => ({ name, in: 'query', description, schema: { type: 'string', uniqueItems: true } });
  const nodeRef = { $ref: '#/components/schemas/io.k8s.api.core.v1.Node' };
  const ok = { 200: { description: 'OK', content: { 'application/json': { schema: nodeRef } } } };
  const operation = (action: string, params: JsonObject[]) => ({
    operationId: `${action}CoreV1Node`,
    'x-kubernetes-action': action,
    'x-kubernetes-group-version-kind': NODE_GVK,
    parameters: params,
    responses: ok,
  });
  const writeParams = [
    query('dryRun', 'All: do not persist (not supported here)'),
    query('fieldManager', 'the name of the actor making the change'),
    query('fieldValidation', 'Ignore, Warn or Strict: what to do with unknown fields'),
  ];
  return {
    openapi: '3.0.0',
    info: { title: 'Kubernetes (roamguard lab API server)', version: 'v1.34.0' },
    paths: {
      '/api/v1/nodes': {
        get: operation('list', []),
        post: operation('post', writeParams),
      },
      '/api/v1/nodes/{name}': {
        parameters: [{ name: 'name', in: 'path', required: true, description: 'name of the Node', schema: { type: 'string', uniqueItems: true } }],
        get: operation('get', []),
        put: operation('put', writeParams),
        patch: operation('patch', writeParams),
        delete: operation('delete', []),
      },
    },
    components: {
      schemas: {
        'io.k8s.api.core.v1.Node': {
          description: 'Node is a worker node in Kubernetes.',
          type: 'object',
          properties: {
            apiVersion: { type: 'string' },
            kind: { type: 'string' },
            metadata: { type: 'object' },
            spec: { type: 'object' },
            status: { type: 'object' },
          },
          'x-kubernetes-group-version-kind': [NODE_GVK],
        },
      },
    },
  };
}
