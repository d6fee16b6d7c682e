/**
 * What roamguard uses of the Kubernetes client library (@kubernetes/client-node), imported from
 * here only. The library's index loads every API group it generates: 20 MB of JavaScript source
 * that V8 keeps in the heap, 26 MiB of heap and 65 MiB of RSS before the agent reads one Node. The
 * install-time compile (scripts/compile.mjs) therefore bundles this module with what it uses of
 * the library, tree-shaken and minified (10 MiB of heap); run from the TypeScript sources, it is
 * the library itself.
 */
export {
  ApiException, CoreV1Api, KubeConfig, ListWatch, loadYaml, Observable, PatchStrategy, setHeaderOptions, Watch,
} from '@kubernetes/client-node';
export type {
  ConfigurationOptions, RequestContext, ResponseContext, V1Node, V1NodeList,
} from '@kubernetes/client-node';
