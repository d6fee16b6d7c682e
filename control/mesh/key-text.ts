/** A peer's public key as the mesh names it (base64), worked out once per key array. */
import { keyToBase64 } from '../../dataplane/noise/keys.ts';

/** Base64 texts of public keys seen before (keys of the data plane's entries are never modified). */
const keyTexts = new WeakMap<Uint8Array, string>();

/** keyToBase64, remembered per key array: every plan names the same 5 000 keys. */
export function keyText(key: Uint8Array): string {
  let text = keyTexts.get(key);
  if (text === undefined) {
    text = keyToBase64(key);
    keyTexts.set(key, text);
  }
  return text;
}
