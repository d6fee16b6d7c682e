/**
 * `roamguard rotate-key [--wait SECONDS]`: gives this node a new WireGuard key. It writes the new
 * key over PRIVATE_KEY_PATH (atomically, 0600) and nothing else: the running agent follows the
 * file — publishes the new public key, switches the data plane, and every peer's agent follows
 * the Node annotation (control/agent/key-rotation.ts). Then it waits until the data plane at
 * WG_SOCKET_DIR/WG_INTERFACE.sock holds the new key, so the exit status says whether the
 * rotation happened. Settings come from the agent's environment (PRIVATE_KEY_PATH,
 * WG_INTERFACE, WG_SOCKET_DIR), so `kubectl exec ds/roamguard -c agent -- roamguard rotate-key`
 * works as is. Only public keys are printed.
 */
import type { Command } from '../roamguard.ts';
import { SETTINGS, SettingError } from '../../control/config/settings.ts';

type Name = keyof typeof SETTINGS;
function setting<N extends Name>(name: N): ReturnType<(typeof SETTINGS)[N]['parse']> {
  const spec = SETTINGS[name];
  const raw = process.env[name];
  return spec.parse(raw === undefined || raw.trim() === '' ? spec.default : raw, name) as ReturnType<(typeof SETTINGS)[N]['parse']>;
}

export const rotateKey: Command = {
  summary: 'give this node a new WireGuard key; the agent publishes it and every peer switches to it',
  usage: `roamguard rotate-key [--wait SECONDS]

Writes a new private key over $PRIVATE_KEY_PATH (default /var/lib/roamguard/private.key),
atomically and with mode 0600. The running agent publishes the new public key on this Node,
switches the data plane to it and wipes the old key; every peer's agent replaces this node's peer
when it sees the new key. Pod traffic pauses for about the time a Node watch event takes to reach
the other agents. While the API server cannot be reached the node keeps its current key and
traffic, and switches once the key is published.

  --wait S   seconds to wait for the data plane ($WG_SOCKET_DIR/$WG_INTERFACE.sock) to hold the
             new key (default 60); 0 = return once the file is written. Exit 1 when it does not
             within S seconds (the rotation is not lost: the agent completes it when it can).`,
  async run(args) {
    let waitS = 60;
    for (let i = 0; i < args.length; i++) {
      if (args[i] === '--wait') {
        const v = Number(args[++i]);
        if (!Number.isFinite(v) || v < 0) {
          console.error('roamguard rotate-key: --wait needs a number of seconds (0 or more)');
          return 2;
        }
        waitS = v;
      } else {
        console.error(`roamguard rotate-key: unknown argument ${args[i]} (see roamguard rotate-key --help)`);
        return 2;
      }
    }
    let path: string, interfaceName: string, socketDir: string;
    try {
      path = setting('PRIVATE_KEY_PATH');
      interfaceName = setting('WG_INTERFACE');
      socketDir = setting('WG_SOCKET_DIR');
    } catch (err) {
      if (err instanceof SettingError) {
        console.error(`roamguard rotate-key: ${err.message}`);
        return 2;
      }
      throw err;
    }
    const { readPrivateKeyFile, replacePrivateKeyFile } = await import('../../control/identity/private-key.ts');
    const { newPrivateKey } = await import('../../control/agent/key-rotation.ts');
    const { selectCrypto } = await import('../../dataplane/crypto/select.ts');
    const { keyToBase64 } = await import('../../dataplane/noise/keys.ts');
    const crypto = await selectCrypto();
    let previous: string;
    try {
      // Only a node that has a key rotates it (a missing file is the agent's to create).
      const old = readPrivateKeyFile(path);
      previous = keyToBase64(crypto.publicKey(old));
      old.fill(0);
    } catch (err) {
      console.error(`roamguard rotate-key: ${(err as Error).message}`);
      return 1;
    }
    const key = newPrivateKey();
    const publicKey = crypto.publicKey(key);
    try {
      replacePrivateKeyFile(path, key);
    } catch (err) {
      console.error(`roamguard rotate-key: ${(err as Error).message}`);
      return 1;
    } finally {
      key.fill(0);
    }
    const shown = keyToBase64(publicKey);
    console.log(`wrote a new private key to ${path}: public key ${shown} (was ${previous})`);
    if (waitS === 0) return 0;

    const { UapiClient } = await import('../../dataplane/uapi/uapi-client.ts');
    const client = UapiClient.forInterface(socketDir, interfaceName);
    const started = performance.now();
    let lastError = '';
    while (performance.now() - started < waitS * 1000) {
      try {
        const device = await client.get();
        const held = device.privateKey ? keyToBase64(crypto.publicKey(device.privateKey)) : '';
        device.privateKey?.fill(0);
        if (held === shown) {
          console.log(`the agent published it and the data plane of ${interfaceName} switched to it after ${((performance.now() - started) / 1000).toFixed(2)} s; peers follow through their Node watch`);
          return 0;
        }
        lastError = '';
      } catch (err) {
        lastError = `: ${(err as Error).message}`;
      }
      await new Promise((r) => setTimeout(r, 50));
    }
    console.error(`roamguard rotate-key: the data plane of ${interfaceName} does not hold the new key after ${waitS} s${lastError}. The key file does; the agent switches once it has published the key (is it running, and is the API server reachable?)`);
    return 1;
  },
};
