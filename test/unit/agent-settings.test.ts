/** The agent's settings: defaults, every variable's accepted values, and one-line errors naming the variable. */
import { spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { SETTINGS, SettingError, loadSettings, settingsTable } from '../../control/config/settings.ts';
import { settingErrorFor, testRefusedWithOneLine } from '../helpers/setting-cases.ts';

const base = { NODE_NAME: 'node-a' };

const errorLoad = (env: Record<string, string>) => loadSettings({ ...base, ...env });
const errorFor = (env: Record<string, string>): SettingError => settingErrorFor(errorLoad, env);

describe('agent settings', () => {
  test('defaults', () => {
    const s = loadSettings(base);
    assert.equal(s.nodeName, 'node-a');
    assert.equal(s.interfaceName, 'roamguard0');
    assert.equal(s.listenPort, 51820);
    assert.equal(s.persistentKeepalive, 25);
    assert.equal(s.mtu, undefined, 'auto: derived from the uplink');
    assert.equal(s.pathMtuDiscovery, true);
    assert.equal(s.wgIpFamily, 'dualstack');
    assert.equal(s.privateKeyPath, '/var/lib/roamguard/private.key');
    assert.equal(s.cniConfigPath, '/etc/cni/net.d/10-roamguard.conflist');
    assert.deepEqual(s.masquerade, { ipv4: true, ipv6: true });
    assert.deepEqual(s.filter, { ipv4: false, ipv6: false });
    assert.deepEqual(s.nativeRouting, { ipv4: false, ipv6: false });
    assert.equal(s.firewallOnly, false);
    assert.deepEqual(s.podCidrSource, { ipv4: 'spec', ipv6: 'spec' });
    assert.deepEqual(s.nodeIpInterfaces, []);
    assert.equal(s.dataplane, 'roamguard');
    assert.equal(s.socketDir, '/var/run/wireguard');
    assert.equal(s.nftTable, 'roamguard');
  });

  test('NODE_NAME is required', () => {
    assert.throws(() => loadSettings({}), (err: Error) => err instanceof SettingError && /^NODE_NAME="" is not valid: expected .*downward API/.test(err.message));
    assert.match(errorFor({ NODE_NAME: 'Bad_Name' }).message, /^NODE_NAME="Bad_Name" is not valid/);
  });

  test('values are parsed', () => {
    const s = loadSettings({
      ...base, WG_INTERFACE: 'wg-pods', WG_LISTEN_PORT: '4000', WG_PERSISTENT_KEEPALIVE: '0', WG_MTU: '1380',
      WG_IP_FAMILY: 'IPv6', MASQUERADE_IPV4: 'false', MASQUERADE_IPV6: '0', FILTER_IPV4: 'yes', FILTER_IPV6: 'on',
      NATIVE_ROUTING_IPV6: '1', FIREWALL_ONLY: 'true', POD_CIDR_SOURCE_IPV4: 'file', POD_CIDR_SOURCE_IPV6: 'none',
      POD_CIDR_SOURCE_PATH: '/etc/roamguard/cidrs.txt', NODE_IP_INTERFACES: 'eth0, eth1', WG_DATAPLANE: 'wireguard-go',
      KUBE_API_SERVER: 'https://10.0.0.1:6443', RESYNC_INTERVAL: '5', METRICS_ADDRESS: '127.0.0.1:9000',
    });
    assert.equal(s.interfaceName, 'wg-pods');
    assert.equal(s.listenPort, 4000);
    assert.equal(s.persistentKeepalive, 0);
    assert.equal(s.mtu, 1380);
    assert.equal(s.wgIpFamily, 'ipv6');
    assert.deepEqual(s.masquerade, { ipv4: false, ipv6: false });
    assert.deepEqual(s.filter, { ipv4: true, ipv6: true });
    assert.deepEqual(s.nativeRouting, { ipv4: false, ipv6: true });
    assert.equal(s.firewallOnly, true);
    assert.deepEqual(s.podCidrSource, { ipv4: 'file', ipv6: 'none' });
    assert.deepEqual(s.nodeIpInterfaces, ['eth0', 'eth1']);
    assert.equal(s.dataplane, 'wireguard-go');
    assert.equal(s.apiServer, 'https://10.0.0.1:6443');
    assert.equal(s.resyncInterval, 5);
    assert.deepEqual(s.podCidrAllowedRanges, []);
  });

  test('POD_CIDR_ALLOWED_RANGES: canonical prefixes, duplicates dropped', () => {
    const s = loadSettings({ ...base, POD_CIDR_ALLOWED_RANGES: ' 10.250.0.0/16, fd00:0250:0::/48,10.250.0.0/16 ' });
    assert.deepEqual(s.podCidrAllowedRanges, ['10.250.0.0/16', 'fd00:250::/48']);
  });

  test('KEY_ROTATION_INTERVAL: off by default, seconds or a unit s/m/h/d', () => {
    assert.equal(loadSettings(base).keyRotationInterval, 0);
    const seconds = (v: string) => loadSettings({ ...base, KEY_ROTATION_INTERVAL: v }).keyRotationInterval;
    assert.equal(seconds('0'), 0);
    assert.equal(seconds('3600'), 3600);
    assert.equal(seconds('90m'), 5400);
    assert.equal(seconds('12H'), 43200);
    assert.equal(seconds('30d'), 2_592_000);
    assert.equal(seconds('10s'), 10);
  });

  // One bad value per variable: the message names the variable, repeats the value, says what is accepted.
  const bad: Array<[string, string, RegExp]> = [
    ['WG_INTERFACE', 'a-name-longer-than-15', /interface name of 1-15/],
    ['WG_INTERFACE', 'has space', /interface name/],
    ['WG_LISTEN_PORT', '0', /integer from 1 to 65535/],
    ['WG_LISTEN_PORT', '70000', /integer from 1 to 65535/],
    ['WG_LISTEN_PORT', 'http', /integer from 1 to 65535/],
    ['WG_PERSISTENT_KEEPALIVE', '-1', /integer from 0 to 65535/],
    ['WG_MTU', '576', /auto or an integer from 1280 to 65535/],
    ['WG_MTU', 'automatic', /auto or an integer from 1280 to 65535/],
    ['PATH_MTU_DISCOVERY', 'sometimes', /true\/false/],
    ['WG_IP_FAMILY', 'ipv5', /one of ipv4, ipv6, dualstack/],
    ['PRIVATE_KEY_PATH', 'relative/key', /absolute path/],
    ['KEY_ROTATION_INTERVAL', '5', /0 \(off\) or a duration such as 3600, 90m, 12h or 30d \(at least 10 s/],
    ['KEY_ROTATION_INTERVAL', '1w', /a duration/],
    ['KEY_ROTATION_INTERVAL', '-1d', /a duration/],
    ['KEY_ROTATION_INTERVAL', '4000d', /at most 3650d/],
    ['CNI_CONFIG_PATH', 'x.conflist', /absolute path/],
    ['CNI_IPAM_DATA_DIR', 'state', /absolute path or empty/],
    ['MASQUERADE_IPV4', 'maybe', /true\/false/],
    ['MASQUERADE_IPV6', '2', /true\/false/],
    ['FILTER_IPV4', 'enabled', /true\/false/],
    ['FILTER_IPV6', 'nope', /true\/false/],
    ['NATIVE_ROUTING_IPV4', 'y', /true\/false/],
    ['NATIVE_ROUTING_IPV6', 't', /true\/false/],
    ['FIREWALL_ONLY', 'sometimes', /true\/false/],
    ['POD_CIDR_SOURCE_IPV4', 'expression', /one of none, spec, file/],
    ['POD_CIDR_SOURCE_IPV6', 'cel', /one of none, spec, file/],
    ['POD_CIDR_SOURCE_PATH', 'cidrs.txt', /absolute path or empty/],
    ['POD_CIDR_ALLOWED_RANGES', '10.250.0.0/16,banana', /comma-separated CIDRs with host bits zero/],
    ['POD_CIDR_ALLOWED_RANGES', '10.250.1.0/16', /host bits zero/],
    ['POD_CIDR_ALLOWED_RANGES', '10.250.0.0', /comma-separated CIDRs/],
    ['POD_CIDR_ALLOWED_RANGES', '0.0.0.0/0', /IPv4 \/8 or longer/],
    ['POD_CIDR_ALLOWED_RANGES', '::/8', /IPv6 \/16 or longer/],
    ['NODE_IP_INTERFACES', 'eth0,,bad name', /comma-separated list of interface names/],
    ['KUBECONFIG', '~/.kube/config', /absolute path or empty/],
    ['KUBE_API_SERVER', '10.0.0.1:6443', /http:\/\/ or https:\/\/ URL/],
    ['LOG_LEVEL', 'loud', /one of debug, info, warn, error, silent/],
    ['LOG_FORMAT', 'yaml', /one of auto, json, text/],
    ['WG_DATAPLANE', 'kernel', /one of roamguard, wireguard-go, external/],
    ['WG_SOCKET_DIR', 'run/wg', /absolute path/],
    ['NFT_TABLE', '1table', /table name/],
    ['RESYNC_INTERVAL', '0', /integer from 1 to 86400/],
    ['AGENT_HEAP_MIB', '32', /integer from 64 to 65536/],
    ['RELAY', 'sometimes', /true\/false/],
    ['RELAY_PORTS', '52000', /a port range such as 51900-51999/],
    ['RELAY_PORTS', '52000-51000', /at least two ports/],
    ['RELAY_PORTS', '0-10', /1-65535/],
    ['RELAY_MAX_PAIRS', '-1', /integer from 0 to 10000/],
    ['RELAY_PAIR_MBIT', 'fast', /integer from 0 to 1000000/],
    ['METRICS_ADDRESS', 'localhost', /host:port/],
  ];
  testRefusedWithOneLine(errorLoad, bad);

  test('every setting has a bad-value case above, a default and a doc line', () => {
    const covered = new Set(bad.map(([name]) => name));
    for (const name of Object.keys(SETTINGS)) {
      if (name === 'NODE_NAME') continue; // its own test
      assert.ok(covered.has(name), `no bad-value test for ${name}`);
    }
    const table = settingsTable();
    for (const name of Object.keys(SETTINGS)) assert.match(table, new RegExp(`\\| \`${name}\` \\|`));
  });

  test('a file source needs POD_CIDR_SOURCE_PATH', () => {
    const err = errorFor({ POD_CIDR_SOURCE_IPV6: 'file' });
    assert.equal(err.variable, 'POD_CIDR_SOURCE_PATH');
    assert.match(err.message, /because a POD_CIDR_SOURCE_\* is "file"/);
  });

  test('empty values take the defaults', () => {
    const s = loadSettings({ ...base, WG_LISTEN_PORT: '', MASQUERADE_IPV4: ' ' });
    assert.equal(s.listenPort, 51820);
    assert.equal(s.masquerade.ipv4, true);
  });
});

describe('AGENT_HEAP_MIB', () => {
  const roamguard = fileURLToPath(new URL('../../bin/roamguard', import.meta.url));
  /** The heap limit the agent reports at start (it then stops: its kubeconfig does not exist). */
  const reportedLimit = (heap: string | undefined): number => {
    const env: NodeJS.ProcessEnv = { ...process.env, ROAMGUARD_RUNTIME: 'node', NODE_NAME: 'heap-test', KUBECONFIG: '/nonexistent/kubeconfig', METRICS_ADDRESS: '', LOG_FORMAT: 'json' };
    delete env.AGENT_HEAP_MIB;
    delete env.NODE_OPTIONS;
    if (heap !== undefined) env.AGENT_HEAP_MIB = heap;
    const run = spawnSync(roamguard, ['agent'], { env, encoding: 'utf8', timeout: 60_000 });
    const line = `${run.stdout}\n${run.stderr}`.split('\n').find((l) => l.includes('starting the agent'));
    assert.ok(line, `no start line in: ${run.stdout}${run.stderr}`);
    return JSON.parse(line).heapLimitMiB;
  };

  test('bin/roamguard starts the agent with it as the V8 heap limit (old generation, plus a young one of a few MiB)', { timeout: 120_000 }, () => {
    const small = reportedLimit('200');
    assert.ok(small >= 200 && small <= 230, `AGENT_HEAP_MIB=200 gave a ${small} MiB heap limit`);
    const byDefault = reportedLimit(undefined);
    assert.ok(byDefault >= 384 && byDefault <= 420, `the default gave a ${byDefault} MiB heap limit`);
  });
});
