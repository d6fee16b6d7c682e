/**
 * No part of a key reaches the daemon's log through the control socket. A UAPI server over a real
 * device, with a logger that keeps every line, is sent key-carrying lines both valid and
 * malformed: keys in the right fields, keys pasted into the wrong ones (ports, endpoints,
 * prefixes, flags), keys as key names, key lines sent without `set=1`, keys in base64 where hex
 * is expected, truncated keys. No log line may contain any 8-character piece of any of those
 * secrets, in hex or base64. And the keys a set request brought are wiped once applied.
 */
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import { generatePrivateKey, keyToHex } from '../../dataplane/noise/keys.ts';
import { createUapiHandler, type UapiHandler } from '../../dataplane/uapi/uapi-device.ts';
import type { SetRequest } from '../../dataplane/uapi/uapi-protocol.ts';
import { startUapiServer, type UapiServer } from '../../dataplane/uapi/uapi-server.ts';
import { makeDevicePair } from '../helpers/device-pair.ts';

/** Sends `text` on a fresh connection, half-closes, and resolves with everything answered. */
function exchange(path: string, text: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = connect(path);
    let answer = '';
    socket.setEncoding('utf8');
    socket.on('data', (chunk: string) => { answer += chunk; });
    socket.on('error', reject);
    socket.on('close', () => resolve(answer));
    socket.on('connect', () => socket.end(text));
  });
}

describe('control socket: secrets never reach the log, nor outlive a request', () => {
  let dir: string;
  const servers: UapiServer[] = [];
  before(() => { dir = mkdtempSync(join(tmpdir(), 'rg-uapi-secrets-')); });
  after(async () => {
    for (const s of servers) await s.close();
    rmSync(dir, { recursive: true, force: true });
  });

  test('valid and malformed key-carrying lines: no 8-character piece of a secret in any log line', async () => {
    const crypto = await selectCrypto();
    const pair = await makeDevicePair(crypto);
    const logs: string[] = [];
    const log = (message: string) => { logs.push(message); };
    try {
      const server = await startUapiServer(`rgsec${process.pid % 10000}`, createUapiHandler(pair.a.device, { log }), { dir, log });
      servers.push(server);
      const secrets = [generatePrivateKey(crypto), generatePrivateKey(crypto), generatePrivateKey(crypto)];
      const [priv, psk, other] = secrets.map((k) => keyToHex(k));
      const [priv64, psk64] = secrets.map((k) => Buffer.from(k).toString('base64'));
      const peer = keyToHex(pair.b.device.core.ourPublicKey!);
      const set = (...lines: string[]) => `set=1\n${lines.join('\n')}\n\n`;
      const requests = [
        // Valid: accepted, nothing to log, but still nothing may leak.
        set(`private_key=${priv}`, `public_key=${peer}`, `preshared_key=${psk}`),
        // Key lines without set=1 (the operation line is what used to be quoted).
        `private_key=${priv}\n\n`, `preshared_key=${psk}\n\n`, `public_key=${other}\n\n`, `${priv}\n\n`, `${priv64}\n\n`,
        `${priv}=1\n\n`, `${priv.toUpperCase()}\n\n`,
        // Malformed keys in their own fields.
        set(`private_key=${priv.slice(0, 63)}`), set(`private_key=${priv}0`), set(`private_key=${priv64}`),
        set(`public_key=${peer}`, `preshared_key=${psk64}`), set(`public_key=${peer}`, `preshared_key=${psk.slice(1)}`),
        set(`public_key=${other.slice(2)}`), set(`private_key= ${priv}`),
        // Keys pasted into other fields.
        set(`listen_port=${priv}`), set(`fwmark=${psk}`), set(`replace_peers=${priv}`),
        set(`listen_port=${priv.replace(/[a-f]/g, '7')}`), set(`fwmark=${'9'.repeat(20)}${psk}`),
        set(`public_key=${peer}`, `endpoint=${psk}`), set(`public_key=${peer}`, `endpoint=${psk}:51820`),
        set(`public_key=${peer}`, `endpoint=[${psk}]:1`), set(`public_key=${peer}`, `allowed_ip=${priv}`),
        set(`public_key=${peer}`, `allowed_ip=${priv}/32`), set(`public_key=${peer}`, `allowed_ip=-${psk64}`),
        set(`public_key=${peer}`, `persistent_keepalive_interval=${psk}`), set(`public_key=${peer}`, `protocol_version=${priv}`),
        set(`public_key=${peer}`, `remove=${psk}`), set(`public_key=${peer}`, `update_only=${psk64}`),
        // Keys as key names, and lines without '='.
        set(`${priv}=1`), set(`public_key=${peer}`, `${psk}=1`), set(`${psk64}`), set('listen_port=1', `${priv}`),
        // Trailing garbage after get=1.
        `get=1\n${priv}\n`,
      ];
      for (const text of requests) await exchange(server.path, text);
      assert.ok(logs.length >= requests.length - 2, `every rejected request was logged (${logs.length} lines)`);
      const forms = secrets.flatMap((k) => [keyToHex(k), keyToHex(k).toUpperCase(), Buffer.from(k).toString('base64')]);
      for (const line of logs) {
        for (const secret of forms) {
          for (let i = 0; i + 8 <= secret.length; i++) {
            const piece = secret.slice(i, i + 8);
            assert.ok(!line.includes(piece), `log line ${JSON.stringify(line)} contains ${piece}, a piece of a secret`);
          }
        }
      }
      // The messages still say what was wrong.
      assert.ok(logs.some((l) => /listen_port: not an unsigned decimal number/.test(l)), logs.join('\n'));
      assert.ok(logs.some((l) => /invalid operation, a line with key "private_key"/.test(l)), logs.join('\n'));
    } finally {
      await pair.close();
    }
  });

  test('the keys parsed from a set request are wiped once applied; a replaced preshared key leaves no copy', async () => {
    const crypto = await selectCrypto();
    const pair = await makeDevicePair(crypto);
    try {
      const device = createUapiHandler(pair.a.device);
      const seen: SetRequest[] = [];
      const handler: UapiHandler = { get: () => device.get(), set: (request) => { seen.push(request); return device.set(request); } };
      const server = await startUapiServer(`rgwipe${process.pid % 10000}`, handler, { dir });
      servers.push(server);
      const peerKey = pair.b.device.core.ourPublicKey!;
      const peer = pair.a.device.core.getPeer(peerKey)!;
      const [priv, psk1, psk2] = [generatePrivateKey(crypto), generatePrivateKey(crypto), generatePrivateKey(crypto)];
      const set = (lines: string[]) => exchange(server.path, `set=1\n${lines.join('\n')}\n\n`);
      assert.match(await set([`private_key=${keyToHex(priv)}`, `public_key=${keyToHex(peerKey)}`, `preshared_key=${keyToHex(psk1)}`]), /errno=0/);
      assert.equal(keyToHex(pair.a.device.core.ourPrivateKey!), keyToHex(priv), 'applied');
      const held = peer.presharedKey;
      assert.equal(keyToHex(held), keyToHex(psk1), 'applied');
      const [request] = seen;
      assert.ok(request.privateKey!.every((b) => b === 0), 'the parsed private key is zero');
      assert.ok(request.peers[0].presharedKey!.every((b) => b === 0), 'the parsed preshared key is zero');
      assert.match(await set([`public_key=${keyToHex(peerKey)}`, `preshared_key=${keyToHex(psk2)}`]), /errno=0/);
      assert.ok(held.every((b) => b === 0), 'the old preshared key was zeroed where it was held');
      assert.equal(keyToHex(peer.presharedKey), keyToHex(psk2));
      assert.ok(seen[1].peers[0].presharedKey!.every((b) => b === 0));
    } finally {
      await pair.close();
    }
  });
});
