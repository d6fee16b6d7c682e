/**
 * `roamguard status [--json] [IFNAME]`: per peer, the node, short key, endpoint (and whether it
 * was learned by roaming), allowed IPs, last handshake, transfer and state, from the local
 * control socket and the Node objects (control/status/). Settings come from the same environment
 * as the agent's: WG_INTERFACE, WG_SOCKET_DIR, KUBECONFIG / KUBE_API_SERVER, WG_IP_FAMILY,
 * WG_LISTEN_PORT, NODE_NAME (optional here).
 */
import type { Command } from '../roamguard.ts';
import { SETTINGS, SettingError } from '../../control/config/settings.ts';

const API_TIMEOUT_MS = 5000;

type Name = keyof typeof SETTINGS;
function setting<N extends Name>(name: N): ReturnType<(typeof SETTINGS)[N]['parse']> {
  const spec = SETTINGS[name];
  const raw = process.env[name];
  return spec.parse(raw === undefined || raw.trim() === '' ? spec.default : raw, name) as ReturnType<(typeof SETTINGS)[N]['parse']>;
}

export const status: Command = {
  summary: 'show each peer of this node: node, key, endpoint, allowed IPs, handshake, transfer, state',
  usage: `roamguard status [--json] [IFNAME]

  --json   machine-readable output
  IFNAME   the interface (default: $WG_INTERFACE, else roamguard0)

Reads the control socket in $WG_SOCKET_DIR (default /var/run/wireguard) and the Node objects
(KUBECONFIG, KUBE_API_SERVER or the pod's service account); without the API, names show as '-'.`,
  async run(args) {
    let json = false;
    const rest: string[] = [];
    for (const arg of args) {
      if (arg === '--json') json = true;
      else if (arg.startsWith('-')) {
        console.error(`roamguard status: unknown option ${arg} (see roamguard status --help)`);
        return 2;
      } else rest.push(arg);
    }
    if (rest.length > 1) {
      console.error('roamguard status: at most one interface name');
      return 2;
    }
    let settings;
    try {
      if (rest[0] !== undefined) SETTINGS.WG_INTERFACE.parse(rest[0], 'IFNAME');
      settings = {
        interfaceName: rest[0] ?? setting('WG_INTERFACE'),
        socketDir: setting('WG_SOCKET_DIR'),
        kubeconfig: setting('KUBECONFIG'),
        apiServer: setting('KUBE_API_SERVER'),
        wgIpFamily: setting('WG_IP_FAMILY'),
        listenPort: setting('WG_LISTEN_PORT'),
        nodeName: (process.env.NODE_NAME ?? '').trim() === '' ? undefined : setting('NODE_NAME'),
      };
    } catch (err) {
      if (err instanceof SettingError) {
        console.error(`roamguard status: ${err.message}`);
        return 2;
      }
      throw err;
    }
    const { UapiClient } = await import('../../dataplane/uapi/uapi-client.ts');
    const { buildStatus, listNodes, publicKeyOf } = await import('../../control/status/status.ts');
    const { formatStatusJson, formatStatusTable } = await import('../../control/status/format.ts');
    const { loadKubeConfig } = await import('../../control/kube/kube-config.ts');

    const client = UapiClient.forInterface(settings.socketDir, settings.interfaceName);
    const nodesPromise = (async () => {
      try {
        const kc = loadKubeConfig({ kubeconfigPath: settings.kubeconfig || undefined, apiServer: settings.apiServer || undefined });
        return { nodes: await listNodes(kc, API_TIMEOUT_MS) };
      } catch (err) {
        return { error: (err as Error).message.split('\n')[0].slice(0, 300) };
      }
    })();
    let snapshot;
    try {
      snapshot = await client.get();
    } catch (err) {
      console.error(`roamguard status: no data plane answers for ${settings.interfaceName}: ${(err as Error).message}`);
      return 1;
    }
    const stats = await client.stats().catch(() => undefined);
    const routes = await readTunnelRoutes(settings.interfaceName);
    const api = await nodesPromise;
    const now = Date.now();
    const report = buildStatus({
      interfaceName: settings.interfaceName, snapshot, stats, publicKey: await publicKeyOf(snapshot.privateKey),
      nodes: api.nodes, apiError: api.error, nodeName: settings.nodeName, routes,
      wgIpFamily: settings.wgIpFamily, defaultListenPort: settings.listenPort, nowWallMs: now,
    });
    process.stdout.write(json ? formatStatusJson(report) : formatStatusTable(report, now));
    return 0;
  },
};

/** The tunnel's MTU and the agent's routes on it (their MTUs are the learned path MTUs); undefined when `ip` cannot tell. */
async function readTunnelRoutes(device: string): Promise<{ tunnelMtu: number; own: Array<{ dst: string; mtu?: number }> } | undefined> {
  const { listOwnRoutes } = await import('../../control/host/routes.ts');
  const { systemRunner } = await import('../../control/host/runner.ts');
  try {
    const link = await systemRunner('ip', ['-j', 'link', 'show', 'dev', device]);
    const mtu = link.code === 0 ? (JSON.parse(link.stdout) as Array<{ mtu?: unknown }>)[0]?.mtu : undefined;
    if (typeof mtu !== 'number') return undefined;
    const own = [...await listOwnRoutes(device, 4), ...await listOwnRoutes(device, 6)];
    return { tunnelMtu: mtu, own };
  } catch {
    return undefined;
  }
}
