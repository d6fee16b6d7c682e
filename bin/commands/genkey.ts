/** `roamguard genkey` / `roamguard pubkey`: the same key handling as `wg genkey` / `wg pubkey`. */
import type { Command } from '../roamguard.ts';
import { selectCrypto } from '../../dataplane/crypto/select.ts';
import { clampPrivateKey, generatePrivateKey, keyFromBase64, keyToBase64 } from '../../dataplane/noise/keys.ts';

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  for await (const chunk of process.stdin) chunks.push(chunk as Buffer);
  return Buffer.concat(chunks).toString('utf8');
}

export const genkey: Command = {
  summary: 'print a new private key (base64), like `wg genkey`',
  usage: 'roamguard genkey',
  async run() {
    const crypto = await selectCrypto();
    process.stdout.write(`${keyToBase64(generatePrivateKey(crypto))}\n`);
    return 0;
  },
};

export const pubkey: Command = {
  summary: 'read a private key on stdin and print its public key, like `wg pubkey`',
  usage: 'roamguard pubkey < private.key',
  async run() {
    const crypto = await selectCrypto();
    let key: Uint8Array;
    try {
      key = keyFromBase64(await readStdin());
    } catch (err) {
      console.error(`roamguard pubkey: ${(err as Error).message}`);
      return 1;
    }
    process.stdout.write(`${keyToBase64(crypto.publicKey(clampPrivateKey(key)))}\n`);
    return 0;
  },
};
